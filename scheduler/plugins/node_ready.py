"""NodeReady (ours; kube-scheduler sees readiness only through the not-ready taint).

``passed = ready ∨ tolerates(node.kubernetes.io/not-ready:NoSchedule)`` with ``ready``:
the node's ``Ready`` condition is ``True``. kube-scheduler relies on the taint the node
controller adds; reading the condition too keeps pods off a node whose taint has not been
applied yet. Reason: ``node(s) were not ready``.
"""

from __future__ import annotations

from scheduler.model import NO_SCHEDULE, NOT_READY_TAINT_KEY, PodInfo, Taint
from scheduler.plugins.base import Filter, FilterResult, filter_by_table_and_pod
from scheduler.table import NodeTable

NAME = "NodeReady"
NOT_READY = "node(s) were not ready"
_NOT_READY_TAINT = Taint(NOT_READY_TAINT_KEY, "", NO_SCHEDULE)


def node_ready(table: NodeTable, pod: PodInfo) -> FilterResult | None:
    """Ready nodes; ``None`` (all nodes) if the pod tolerates the not-ready taint."""
    if any(t.tolerates(_NOT_READY_TAINT) for t in pod.tolerations):
        return None
    return FilterResult(NAME, table.ready.copy(), (NOT_READY,))


FILTER = Filter(
    name=NAME,
    explain="the node's Ready condition is True (or the pod tolerates the not-ready taint)",
    filter=filter_by_table_and_pod(node_ready),
    static=True,
)
