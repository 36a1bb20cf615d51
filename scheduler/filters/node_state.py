"""Node readiness and cordon.

- ``NodeReady``: ``passed = ready`` (the node's ``Ready`` condition is ``True``).
- ``NodeUnschedulable``: ``passed = ¬unschedulable ∨ tolerates(node.kubernetes.io/
  unschedulable:NoSchedule)`` — as kube-scheduler, a pod that tolerates the cordon taint
  may still land on a cordoned node.
"""

from __future__ import annotations

from scheduler.filters.base import FilterResult, all_pass
from scheduler.model import NO_SCHEDULE, UNSCHEDULABLE_TAINT_KEY, PodInfo, Taint
from scheduler.table import NodeTable

NOT_READY = "node(s) were not ready"
UNSCHEDULABLE = "node(s) were unschedulable"
_CORDON_TAINT = Taint(UNSCHEDULABLE_TAINT_KEY, "", NO_SCHEDULE)


def node_ready(table: NodeTable) -> FilterResult:
    """Nodes whose ``Ready`` condition is ``True``."""
    return FilterResult("NodeReady", table.ready.copy(), (NOT_READY,))


def node_schedulable(table: NodeTable, pod: PodInfo) -> FilterResult:
    """Nodes that are not cordoned, or all nodes if the pod tolerates the cordon taint."""
    if any(t.tolerates(_CORDON_TAINT) for t in pod.tolerations):
        return all_pass("NodeUnschedulable", table)
    return FilterResult("NodeUnschedulable", ~table.unschedulable, (UNSCHEDULABLE,))
