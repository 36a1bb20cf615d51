"""Node readiness and cordon.

- ``NodeReady``: ``passed = ready ∨ tolerates(node.kubernetes.io/not-ready:NoSchedule)``
  (``ready``: the node's ``Ready`` condition is ``True``). kube-scheduler sees readiness
  only through the not-ready taint the node controller adds; reading the condition too
  keeps pods off a node whose taint has not been applied yet.
- ``NodeUnschedulable``: ``passed = ¬unschedulable ∨ tolerates(node.kubernetes.io/
  unschedulable:NoSchedule)`` — as kube-scheduler, a pod that tolerates the cordon taint
  may still land on a cordoned node.
"""

from __future__ import annotations

from scheduler.filters.base import FilterResult, all_pass
from scheduler.model import (
    NO_SCHEDULE,
    NOT_READY_TAINT_KEY,
    UNSCHEDULABLE_TAINT_KEY,
    PodInfo,
    Taint,
)
from scheduler.table import NodeTable

NOT_READY = "node(s) were not ready"
UNSCHEDULABLE = "node(s) were unschedulable"
_CORDON_TAINT = Taint(UNSCHEDULABLE_TAINT_KEY, "", NO_SCHEDULE)
_NOT_READY_TAINT = Taint(NOT_READY_TAINT_KEY, "", NO_SCHEDULE)


def node_ready(table: NodeTable, pod: PodInfo) -> FilterResult:
    """Ready nodes, or all nodes if the pod tolerates the not-ready taint."""
    if any(t.tolerates(_NOT_READY_TAINT) for t in pod.tolerations):
        return all_pass("NodeReady", table)
    return FilterResult("NodeReady", table.ready.copy(), (NOT_READY,))


def node_schedulable(table: NodeTable, pod: PodInfo) -> FilterResult:
    """Nodes that are not cordoned, or all nodes if the pod tolerates the cordon taint."""
    if any(t.tolerates(_CORDON_TAINT) for t in pod.tolerations):
        return all_pass("NodeUnschedulable", table)
    return FilterResult("NodeUnschedulable", ~table.unschedulable, (UNSCHEDULABLE,))
