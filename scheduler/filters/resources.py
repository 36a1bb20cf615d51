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


def resources_fit(table: NodeTable, pod: PodInfo) -> FilterResult:
    """Nodes with room for the pod's requests and one more pod."""
    # kube-scheduler checks (and lists) cpu, memory, ephemeral storage, then the rest
    wanted = sorted(pod.requests.items(), key=lambda item: (_ORDER.get(item[0], 3), item[0]))
    resources = [PODS, *(r for r, _ in wanted)]
    amounts = [1, *(a for _, a in wanted)]
    rows = [table.resource_row(r) for r in resources]
    if None in rows:  # a resource no node has ever offered
        passed = np.zeros(len(table), dtype=np.bool_)
    else:
        free = table.free
        passed = free[rows[0]] >= amounts[0]
        for row, amount in zip(rows[1:], amounts[1:], strict=True):
            passed &= free[row] >= amount
    reasons = (TOO_MANY_PODS, *(insufficient_reason(r) for r in resources[1:]))

    def explain() -> NDArray[np.bool_]:
        matrix = np.ones((len(table), len(resources)), dtype=np.bool_)
        for j, (row, amount) in enumerate(zip(rows, amounts, strict=True)):
            if row is not None:
                matrix[:, j] = table.free[row] < amount
        return matrix

    return FilterResult("NodeResourcesFit", passed, reasons, explain)
