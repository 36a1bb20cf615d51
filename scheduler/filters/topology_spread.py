"""Topology spread, ``whenUnsatisfiable: DoNotSchedule`` (kube-scheduler's
``PodTopologySpread`` filter).

For each constraint ``c`` of the pod (key ``k``, selector ``s``, ``maxSkew``)::

    eligible[i]  = node i has the label of every constraint's key
                   ∧ (nodeAffinityPolicy Honor ⇒ i matches the pod's node selector/affinity)
                   ∧ (nodeTaintsPolicy Honor  ⇒ the pod tolerates i's NoSchedule/NoExecute taints)
    count[d]     = Σ over eligible nodes i in domain d (label k = d) of the pods on i in the
                   pod's namespace, not terminating, whose labels match s
    min          = min over domains d of an eligible node of count[d]
                   (0 when there are fewer such domains than minDomains)
    self         = 1 if the pod's own labels match s, else 0
    passed_c[i]  = i has label k ∧ count[label k of i] + self − min ≤ maxSkew

``passed = ∀ c passed_c`` (count of a domain without eligible nodes is 0). A node without
the key fails with ``node(s) didn't match pod topology spread constraints (missing
required label)``, any other failure with ``node(s) didn't match pod topology spread
constraints``. A constraint without a label selector matches no pod.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scheduler.filters.base import FilterResult, all_pass
from scheduler.model import AntiAffinityTerm, PodInfo, SpreadConstraint
from scheduler.table import ABSENT, NodeTable

SKEW = "node(s) didn't match pod topology spread constraints"
MISSING_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"


def topology_spread(
    table: NodeTable,
    pod: PodInfo,
    node_affinity_passed: NDArray[np.bool_],
    taints_passed: NDArray[np.bool_],
) -> FilterResult:
    """Nodes where placing the pod keeps every ``DoNotSchedule`` constraint within its skew.

    ``node_affinity_passed`` and ``taints_passed`` are the pod's NodeAffinity and
    TaintToleration masks (for the node inclusion policies).
    """
    if not pod.spread:
        return all_pass("PodTopologySpread", table)
    n = len(table)
    columns = [table.label_column(c.topology_key).codes for c in pod.spread]
    has_all_keys = np.ones(n, dtype=np.bool_)
    for codes in columns:
        has_all_keys &= codes != ABSENT
    missing = ~has_all_keys
    skewed = np.zeros(n, dtype=np.bool_)
    for constraint, codes in zip(pod.spread, columns, strict=True):
        eligible = has_all_keys.copy()
        if constraint.honor_node_affinity:
            eligible &= node_affinity_passed
        if constraint.honor_node_taints:
            eligible &= taints_passed
        skewed |= _skewed(table, pod, constraint, codes, eligible)
    skewed &= ~missing
    passed = ~(missing | skewed)

    def explain() -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        return skewed, missing

    return FilterResult("PodTopologySpread", passed, (SKEW, MISSING_LABEL), explain)


def matching_pods_per_node(
    table: NodeTable, pod: PodInfo, constraint: SpreadConstraint
) -> NDArray[np.int64]:
    """Per node, its pods that count for ``constraint``: in the pod's namespace, not
    terminating, labels matching the constraint's selector."""
    if constraint.selector is None:
        return np.zeros(len(table), dtype=np.int64)
    term = AntiAffinityTerm(constraint.selector, frozenset({pod.namespace}))
    return table.matching_per_node(term, skip_terminating=True)


def _skewed(
    table: NodeTable,
    pod: PodInfo,
    constraint: SpreadConstraint,
    codes: NDArray[np.int32],
    eligible: NDArray[np.bool_],
) -> NDArray[np.bool_]:
    """Nodes (with the key) where the pod would push its domain above ``maxSkew``."""
    domains = int(codes.max(initial=ABSENT)) + 1
    per_node = matching_pods_per_node(table, pod, constraint)
    eligible_codes = codes[eligible]
    counts = np.bincount(eligible_codes, weights=per_node[eligible], minlength=domains)
    present = np.bincount(eligible_codes, minlength=domains) > 0
    if int(np.count_nonzero(present)) < constraint.min_domains:
        minimum = 0.0
    else:
        minimum = float(counts[present].min())
    matches_itself = constraint.selector is not None and constraint.selector.matches(pod.labels)
    node_counts = counts[np.where(codes == ABSENT, 0, codes)] if domains else np.zeros(len(codes))
    skew = node_counts + (1 if matches_itself else 0) - minimum
    result: NDArray[np.bool_] = skew > constraint.max_skew
    return result
