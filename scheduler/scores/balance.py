"""Least-allocated balance of CPU and memory (kube-scheduler's ``LeastAllocated``).

Per resource ``r`` ∈ {cpu, memory}, with requests counted as for scoring (containers
without a request count 100m CPU / 200Mi memory)::

    part[r] = 100 · max(0, 1 − (requested[r] + pod[r]) / allocatable[r])
              (0 where allocatable is 0)
    score   = (part[cpu] + part[memory]) / 2
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scheduler.model import PodInfo
from scheduler.quantity import CPU, MEMORY
from scheduler.table import NodeTable


def least_allocated(
    table: NodeTable, resource: str, requested: NDArray[np.float64], pod_request: float
) -> NDArray[np.float64]:
    """``part`` of the module formula for one resource."""
    inverse = table.inverse_allocatable(resource)
    key = ("balance_scale", resource)
    scale = table.alloc_cache.get(key)
    if scale is None:  # 100 where the node has the resource, else 0
        scale = np.where(inverse > 0, 100.0, 0.0)
        table.alloc_cache[key] = scale
    part = requested + pod_request
    part *= inverse
    np.subtract(1.0, part, out=part)
    np.maximum(part, 0.0, out=part)
    part *= scale
    return part


def balance_score(table: NodeTable, pod: PodInfo) -> NDArray[np.float64]:
    """0–100 per node, higher is emptier (see the module formula)."""
    score = least_allocated(table, CPU, table.nonzero_cpu_m, pod.nonzero_cpu_m)
    score += least_allocated(table, MEMORY, table.nonzero_memory, pod.nonzero_memory)
    score *= 0.5
    return score
