"""TaintToleration (kube-scheduler's plugin of that name, its filter): taints and tolerations.

``passed[i] = ∀ taint t on node i with effect ∈ {NoSchedule, NoExecute}:
∃ toleration that tolerates t``, where a toleration tolerates a taint when its effect is
empty or equal, its key is empty or equal, and its operator is ``Exists`` or ``Equal``
with the same value. ``PreferNoSchedule`` never filters. A failing node reports one
reason whatever its taints, as kube-scheduler v1.36 does: ``node(s) had untolerated
taint(s)`` (so every tainted node counts under the same reason in ``FailedScheduling``).
"""

from __future__ import annotations

from scheduler.api.events import Action, EventInterest
from scheduler.api.objects import NO_EXECUTE, NO_SCHEDULE, PodInfo
from scheduler.plugins.base import (
    Filter,
    FilterResult,
    any_per_node,
    filter_by_table_and_pod,
)
from scheduler.signals.table import NodeTable

NAME = "TaintToleration"
FILTERING_EFFECTS = frozenset({NO_SCHEDULE, NO_EXECUTE})
UNTOLERATED_TAINT = "node(s) had untolerated taint(s)"


def taint_toleration(table: NodeTable, pod: PodInfo) -> FilterResult | None:
    """Nodes whose NoSchedule/NoExecute taints the pod all tolerates; ``None`` (all nodes)
    when it tolerates every such taint of the table."""
    columns = table.taint_columns()
    untolerated = [
        t
        for t, taint in enumerate(columns.taints)
        if taint.effect in FILTERING_EFFECTS
        and not any(tol.tolerates(taint) for tol in pod.tolerations)
    ]
    if not untolerated:
        return None
    passed = ~any_per_node(columns.present[:, untolerated])
    return FilterResult(NAME, passed, (UNTOLERATED_TAINT,))


FILTER = Filter(
    name=NAME,
    explain="the pod tolerates every NoSchedule/NoExecute taint of the node",
    filter=filter_by_table_and_pod(taint_toleration),
    events=(EventInterest("Node", Action.ADD | Action.UPDATE_NODE_TAINT),),
    static=True,
)
