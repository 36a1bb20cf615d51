"""Resources fit (kube-scheduler's ``NodeResourcesFit``).

For each resource ``r`` the pod requests (``request[r] > 0``; cpu, memory,
ephemeral-storage and extended resources such as ``nvidia.com/gpu``, counted with init
containers and overhead as in :mod:`scheduler.model`)::

    insufficient[i, r] = request[r] > allocatable[i, r] − requested[i, r]
    too_many_pods[i]   = pods_on_node[i] + 1 > allocatable_pods[i]
    passed[i]          = ¬too_many_pods[i] ∧ ¬∃r insufficient[i, r]

A resource no node offers is insufficient everywhere. Reasons: ``Too many pods`` and
``Insufficient <resource>`` (every one that applies, as kube-scheduler lists them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scheduler.filters.base import FilterResult
from scheduler.model import PodInfo
from scheduler.quantity import CPU, EPHEMERAL_STORAGE, MEMORY, PODS
from scheduler.table import NodeTable

TOO_MANY_PODS = "Too many pods"
_ORDER = {CPU: 0, MEMORY: 1, EPHEMERAL_STORAGE: 2}


def insufficient_reason(resource: str) -> str:
    """kube-scheduler's wording for a node without room for ``resource``."""
    return f"Insufficient {resource}"


@dataclass(frozen=True, slots=True)
class _Plan:
    """What to compare for one set of requests: table rows, amounts, reasons."""

    rows: tuple[int, ...]
    amounts: tuple[int, ...]
    reasons: tuple[str, ...]


def resources_fit(table: NodeTable, pod: PodInfo) -> FilterResult:
    """Nodes with room for the pod's requests and one more pod."""
    key = ("resources", *pod.requests.items())
    plan = table.mask_cache.get(key)
    if not isinstance(plan, _Plan):
        # kube-scheduler checks (and lists) cpu, memory, ephemeral storage, then the rest
        wanted = sorted(pod.requests.items(), key=lambda item: (_ORDER.get(item[0], 3), item[0]))
        rows = [table.resource_row(r) for r in (PODS, *(r for r, _ in wanted))]
        reasons = (TOO_MANY_PODS, *(insufficient_reason(r) for r, _ in wanted))
        if None in rows:  # a resource no node has ever offered fails everywhere
            return FilterResult(
                "NodeResourcesFit",
                np.zeros(len(table), dtype=np.bool_),
                reasons,
                lambda: _unoffered(table, rows, [1, *(a for _, a in wanted)]),
            )
        plan = _Plan(tuple(r for r in rows if r is not None), (1, *(a for _, a in wanted)), reasons)
        table.remember(key, plan)
    free = table.free
    passed = free[plan.rows[0]] >= plan.amounts[0]
    for row, amount in zip(plan.rows[1:], plan.amounts[1:], strict=True):
        passed &= free[row] >= amount
    return FilterResult(
        "NodeResourcesFit",
        passed,
        plan.reasons,
        lambda: [free[r] < a for r, a in zip(plan.rows, plan.amounts, strict=True)],
    )


def _unoffered(
    table: NodeTable, rows: list[int | None], amounts: list[int]
) -> list[NDArray[np.bool_]]:
    return [
        np.ones(len(table), dtype=np.bool_) if row is None else table.free[row] < amount
        for row, amount in zip(rows, amounts, strict=True)
    ]
