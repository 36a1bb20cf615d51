"""NodeUnschedulable (kube-scheduler's plugin of that name): cordoned nodes.

``passed = ¬unschedulable ∨ tolerates(node.kubernetes.io/unschedulable:NoSchedule)`` — as
kube-scheduler, a pod that tolerates the cordon taint may still land on a cordoned node.
Reason: ``node(s) were unschedulable``.
"""

from __future__ import annotations

from scheduler.api.events import Action, EventInterest
from scheduler.api.objects import NO_SCHEDULE, UNSCHEDULABLE_TAINT_KEY, PodInfo, Taint
from scheduler.plugins.base import Filter, FilterResult, filter_by_table_and_pod
from scheduler.signals.table import NodeTable

NAME = "NodeUnschedulable"
UNSCHEDULABLE = "node(s) were unschedulable"
_CORDON_TAINT = Taint(UNSCHEDULABLE_TAINT_KEY, "", NO_SCHEDULE)


def node_unschedulable(table: NodeTable, pod: PodInfo) -> FilterResult | None:
    """Nodes that are not cordoned; ``None`` (all nodes) if the pod tolerates the cordon."""
    if any(t.tolerates(_CORDON_TAINT) for t in pod.tolerations):
        return None
    return FilterResult(NAME, ~table.unschedulable, (UNSCHEDULABLE,))


FILTER = Filter(
    name=NAME,
    explain="the node is not cordoned (or the pod tolerates the unschedulable taint)",
    filter=filter_by_table_and_pod(node_unschedulable),
    events=(EventInterest("Node", Action.ADD | Action.UPDATE_NODE_TAINT),),
    static=True,
)
