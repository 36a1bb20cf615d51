"""Taints and tolerations (kube-scheduler's ``TaintToleration`` filter).

``passed[i] = ∀ taint t on node i with effect ∈ {NoSchedule, NoExecute}:
∃ toleration that tolerates t``, where a toleration tolerates a taint when its effect is
empty or equal, its key is empty or equal, and its operator is ``Exists`` or ``Equal``
with the same value. ``PreferNoSchedule`` never filters. A failing node reports its first
untolerated taint in the node's own order: ``node(s) had untolerated taint {key: value}``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scheduler.filters.base import FilterResult, any_per_node
from scheduler.model import NO_EXECUTE, NO_SCHEDULE, PodInfo, Taint
from scheduler.table import NodeTable

FILTERING_EFFECTS = frozenset({NO_SCHEDULE, NO_EXECUTE})


def untolerated_taint_reason(taint: Taint) -> str:
    """kube-scheduler's wording for a node rejected because of ``taint``."""
    return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"


def taint_toleration(table: NodeTable, pod: PodInfo) -> FilterResult:
    """Nodes whose NoSchedule/NoExecute taints the pod all tolerates."""
    columns = table.taint_columns()
    untolerated = [
        t
        for t, taint in enumerate(columns.taints)
        if taint.effect in FILTERING_EFFECTS
        and not any(tol.tolerates(taint) for tol in pod.tolerations)
    ]
    passed = ~any_per_node(columns.present[:, untolerated])
    untolerated_taints = {columns.taints[t] for t in untolerated}
    reasons = tuple(dict.fromkeys(untolerated_taint_reason(t) for t in untolerated_taints))
    reason_column = {reason: j for j, reason in enumerate(reasons)}

    def explain() -> list[NDArray[np.bool_]]:
        columns = [np.zeros(len(table), dtype=np.bool_) for _ in reasons]
        for row in np.flatnonzero(~passed).tolist():
            first = next(t for t in table.node(row).taints if t in untolerated_taints)
            columns[reason_column[untolerated_taint_reason(first)]][row] = True
        return columns

    return FilterResult("TaintToleration", passed, reasons, explain)
