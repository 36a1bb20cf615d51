"""NodeReady (ours; kube-scheduler sees readiness only through the not-ready taint).

``passed = ready ∨ tolerates(node.kubernetes.io/not-ready:NoSchedule)`` with ``ready``:
the node's ``Ready`` condition is ``True``. kube-scheduler relies on the taint the node
controller adds; reading the condition too keeps pods off a node whose taint has not been
applied yet. Reason: ``node(s) were not ready``.

Also (fail closed, for every pod)::

    passed ∧= ¬holds_unreadable_pod

a node holding a placed pod whose requests, ports, labels or pod-affinity terms do not
parse is unknown territory: what is free there cannot be counted. Reason:
``node(s) had a pod the scheduler cannot read``; the scheduler's log names the pod.
"""

from __future__ import annotations

from scheduler.api.events import Action, EventInterest
from scheduler.api.objects import NO_SCHEDULE, NOT_READY_TAINT_KEY, PodInfo, Taint
from scheduler.plugins.base import Filter, FilterResult, filter_by_table_and_pod
from scheduler.signals.table import NodeTable

NAME = "NodeReady"
NOT_READY = "node(s) were not ready"
HOLDS_UNREADABLE_POD = "node(s) had a pod the scheduler cannot read"
_NOT_READY_TAINT = Taint(NOT_READY_TAINT_KEY, "", NO_SCHEDULE)


def node_ready(table: NodeTable, pod: PodInfo) -> FilterResult | None:
    """Ready nodes without unreadable pods; ``None`` (all nodes) if the pod tolerates the
    not-ready taint and no node holds an unreadable pod."""
    tolerated = any(t.tolerates(_NOT_READY_TAINT) for t in pod.tolerations)
    if not table.unreadable_pod_keys():
        return None if tolerated else FilterResult(NAME, table.ready.copy(), (NOT_READY,))
    unreadable = table.holds_unreadable_pod()
    if tolerated:
        return FilterResult(NAME, ~unreadable, (HOLDS_UNREADABLE_POD,))
    ready = table.ready.copy()
    return FilterResult(
        NAME,
        ready & ~unreadable,
        (NOT_READY, HOLDS_UNREADABLE_POD),
        explain=lambda: (~ready, unreadable),
    )


FILTER = Filter(
    name=NAME,
    explain="the node's Ready condition is True (or the pod tolerates the not-ready taint) "
    "and every pod placed on it could be read",
    filter=filter_by_table_and_pod(node_ready),
    events=(
        EventInterest("Node", Action.ADD | Action.UPDATE_NODE_CONDITION),
        EventInterest("Pod", Action.DELETE | Action.UPDATE),  # an unreadable pod fixed or gone
    ),
    static=True,
)
