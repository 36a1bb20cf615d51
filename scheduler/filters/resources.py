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
    unoffered: tuple[int, ...]
    """Positions in ``amounts`` of resources no node offers (their rows are left out)."""


def _plan(table: NodeTable, pod: PodInfo) -> _Plan:
    # kube-scheduler checks (and lists) cpu, memory, ephemeral storage, then the rest
    wanted = sorted(pod.requests.items(), key=lambda item: (_ORDER.get(item[0], 3), item[0]))
    rows = [table.resource_row(r) for r in (PODS, *(r for r, _ in wanted))]
    return _Plan(
        tuple(r for r in rows if r is not None),
        (1, *(a for _, a in wanted)),
        (TOO_MANY_PODS, *(insufficient_reason(r) for r, _ in wanted)),
        tuple(i for i, r in enumerate(rows) if r is None),
    )


def resources_fit(table: NodeTable, pod: PodInfo) -> FilterResult:
    """Nodes with room for the pod's requests and one more pod."""
    key = ("NodeResourcesFit", *pod.requests.items())
    # resource rows never move; one no node offers yet may come with any heartbeat
    plan = table.cached("constraints", key, lambda: _plan(table, pod), _all_offered)
    if plan.unoffered:  # a resource no node has ever offered fails everywhere
        return FilterResult(
            "NodeResourcesFit",
            np.zeros(len(table), dtype=np.bool_),
            plan.reasons,
            lambda: _unoffered(table, plan),
        )
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


def _all_offered(plan: _Plan) -> bool:
    return not plan.unoffered


def _unoffered(table: NodeTable, plan: _Plan) -> list[NDArray[np.bool_]]:
    rows = iter(plan.rows)
    return [
        np.ones(len(table), dtype=np.bool_) if i in plan.unoffered else table.free[next(rows)] < a
        for i, a in enumerate(plan.amounts)
    ]
