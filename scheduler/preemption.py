"""How many nodes preemption would free for a pod (a lower bound; preemption itself is
kube-scheduler's, not done here): the ``FailedScheduling`` message says so."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scheduler.api.objects import PREEMPT_NEVER, PodInfo
from scheduler.quantity import PODS
from scheduler.table import NodeTable


def preemption_would_help(table: NodeTable, pod: PodInfo, candidates: NDArray[np.bool_]) -> int:
    """On how many ``candidates`` (nodes that failed only for resources) evicting every pod
    of lower priority than ``pod`` would make room::

        helps[i] = ∀ r ∈ requests: free[r, i] + Σ_{q on i, prio(q) < prio(pod)} req[q, r] ≥ req[r]
                   ∧ free[pods, i] + |{q on i, prio(q) < prio(pod)}| ≥ 1

    0 when the pod's ``preemptionPolicy`` is ``Never`` or no placed pod has a lower
    priority. Other filters a victim's eviction could also satisfy (anti-affinity, host
    ports) are not considered, so this is a lower bound on what kube-scheduler would find.
    """
    lowest = table.lowest_priority()
    if pod.preemption_policy == PREEMPT_NEVER or lowest is None or lowest >= pod.priority:
        return 0
    wanted: list[tuple[str, int, int]] = []  # resource, its table row, amount
    for resource, amount in pod.requests.items():
        row = table.resource_row(resource)
        if row is None:
            return 0  # a resource no node offers: no eviction makes room for it
        wanted.append((resource, row, amount))
    pods_row = table.resource_row(PODS)
    if pods_row is None:
        return 0
    free = table.free
    helpful = 0
    for node_row in np.flatnonzero(candidates).tolist():
        victims = [
            q
            for q in table.pods_on_node(table.names[node_row]).values()
            if q.priority < pod.priority
        ]
        if not victims or free[pods_row, node_row] + len(victims) < 1:
            continue
        if all(
            free[row, node_row] + sum(q.requests.get(resource, 0) for q in victims) >= amount
            for resource, row, amount in wanted
        ):
            helpful += 1
    return helpful
