"""Least-allocated balance of CPU and memory (kube-scheduler's ``LeastAllocated``).

Per resource ``r`` ∈ {cpu, memory}, with requests counted as for scoring (containers
without a request count 100m CPU / 200Mi memory)::

    part[r] = 100 · max(0, 1 − (requested[r] + pod[r]) / allocatable[r])
              (0 where allocatable is 0)
    score   = (part[cpu] + part[memory]) / 2

computed as ``max(0, room[r] − pod[r] · per_unit[r])`` with ``per_unit = 50 / allocatable``
(0 without allocatable) and ``room = 50 − requested · per_unit``, a column the table keeps
current row by row.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scheduler.model import PodInfo
from scheduler.quantity import CPU, MEMORY
from scheduler.table import NodeTable

_HALF = 50.0
"""Each resource's share of the 0–100 score."""


def least_allocated(
    table: NodeTable, resource: str, requested: NDArray[np.float64], pod_request: float
) -> NDArray[np.float64]:
    """Half of ``part`` of the module formula for one resource (the two halves add up)."""
    per_unit: NDArray[np.float64] = table.cached(
        "allocatable",
        ("NodeResourcesFit", "per_unit", resource),
        lambda: table.inverse_allocatable(resource) * _HALF,
    )

    def room() -> NDArray[np.float64]:
        left: NDArray[np.float64] = np.where(per_unit > 0, _HALF - requested * per_unit, 0.0)
        return left

    def room_at(row: int) -> float:
        unit: float = per_unit.item(row)  # Python floats: numpy's IEEE operations, faster
        return _HALF - requested.item(row) * unit if unit > 0 else 0.0

    part = per_unit * -pod_request
    part += table.derived(("balance_room", resource), room, room_at)
    np.maximum(part, 0.0, out=part)
    return part


def balance_score(table: NodeTable, pod: PodInfo) -> NDArray[np.float64]:
    """0–100 per node, higher is emptier (see the module formula)."""
    score = least_allocated(table, CPU, table.nonzero_cpu_m, pod.nonzero_cpu_m)
    score += least_allocated(table, MEMORY, table.nonzero_memory, pod.nonzero_memory)
    return score
