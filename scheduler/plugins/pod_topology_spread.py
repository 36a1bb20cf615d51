"""PodTopologySpread (kube-scheduler's plugin of that name): the pod's topology spread
constraints.

Filter — ``whenUnsatisfiable: DoNotSchedule``. For each constraint ``c`` of the pod (key
``k``, selector ``s``, ``maxSkew``)::

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

Score — ``whenUnsatisfiable: ScheduleAnyway``: fewer matching pods in a node's domains
scores higher. Over the nodes that passed every filter (``feasible``); a feasible node
missing the label of any of the pod's soft constraints is *ignored* (scores 0). For
constraint ``c`` (key ``k``, selector ``s``, ``maxSkew``)::

    domains_c  = label-k values of the feasible, not ignored nodes
                 (for kubernetes.io/hostname: those nodes themselves)
    count_c[d] = Σ over nodes i with every key, passing c's node inclusion policies, in
                 domain d ∈ domains_c, of i's pods matching s (pod's namespace, not
                 terminating); for kubernetes.io/hostname: the node's own matching pods
    weight_c   = ln(|domains_c| + 2)
    raw[i]     = round(Σ_c count_c[label k of i] · weight_c + (maxSkew_c − 1))
    score[i]   = 100                                   if max raw = 0
               = ⌊100 · (max raw + min raw − raw[i]) / max raw⌋    otherwise
                 (min and max over the feasible, not ignored nodes)

Counting by the pods' selector; kube-scheduler's shortcut of counting a controller's own
pods by owner reference and its default constraints for pods without any are not used.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scheduler.api.events import Action, EventInterest
from scheduler.api.objects import HOSTNAME_LABEL, AntiAffinityTerm, PodInfo, SpreadConstraint
from scheduler.plugins.base import Code, CycleState, Filter, FilterResult, Score
from scheduler.plugins.node_affinity import NAME as NODE_AFFINITY
from scheduler.plugins.taint_toleration import NAME as TAINT_TOLERATION
from scheduler.signals.node_columns import ABSENT
from scheduler.signals.table import NodeTable

NAME = "PodTopologySpread"
MAX_SCORE = 100
SKEW = "node(s) didn't match pod topology spread constraints"
MISSING_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"


def topology_spread(
    table: NodeTable,
    pod: PodInfo,
    node_affinity_passed: NDArray[np.bool_],
    taints_passed: NDArray[np.bool_],
) -> FilterResult | None:
    """Nodes where placing the pod keeps every ``DoNotSchedule`` constraint within its skew.

    ``node_affinity_passed`` and ``taints_passed`` are the pod's NodeAffinity and
    TaintToleration masks (for the node inclusion policies); ``None`` for a pod without
    ``DoNotSchedule`` constraints.
    """
    if not pod.spread:
        return None
    columns, has_all_keys = _key_columns(table, pod.spread)
    missing = ~has_all_keys
    skewed = np.zeros(len(table), dtype=np.bool_)
    for constraint, codes in zip(pod.spread, columns, strict=True):
        eligible = _eligible(constraint, has_all_keys, node_affinity_passed, taints_passed)
        skewed |= _skewed(table, pod, constraint, codes, eligible)
    skewed &= ~missing
    passed = ~(missing | skewed)

    def explain() -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        return skewed, missing

    return FilterResult(NAME, passed, (SKEW, MISSING_LABEL), explain)


def _key_columns(
    table: NodeTable, constraints: tuple[SpreadConstraint, ...]
) -> tuple[list[NDArray[np.int32]], NDArray[np.bool_]]:
    """Per constraint, its topology key's value codes per node; and the nodes that have
    the label of every constraint's key."""
    columns = [table.label_column(c.topology_key).codes for c in constraints]
    has_all_keys = np.ones(len(table), dtype=np.bool_)
    for codes in columns:
        has_all_keys &= codes != ABSENT
    return columns, has_all_keys


def _eligible(
    constraint: SpreadConstraint,
    has_all_keys: NDArray[np.bool_],
    node_affinity_passed: NDArray[np.bool_],
    taints_passed: NDArray[np.bool_],
) -> NDArray[np.bool_]:
    """Nodes whose pods count for ``constraint``: every key, and passing the node
    inclusion policies it honours (nodeAffinityPolicy, nodeTaintsPolicy)."""
    eligible = has_all_keys.copy()
    if constraint.honor_node_affinity:
        eligible &= node_affinity_passed
    if constraint.honor_node_taints:
        eligible &= taints_passed
    return eligible


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


def topology_spread_score(
    table: NodeTable,
    pod: PodInfo,
    feasible: NDArray[np.bool_],
    node_affinity_passed: NDArray[np.bool_],
    taints_passed: NDArray[np.bool_],
) -> NDArray[np.float64] | None:
    """0–100 per node for the pod's ``ScheduleAnyway`` constraints (see the module formula);
    only the feasible nodes' values mean anything. ``None`` for a pod without any."""
    if not pod.soft_spread:
        return None
    n = len(table)
    columns, has_all_keys = _key_columns(table, pod.soft_spread)
    scored = feasible & has_all_keys
    raw = np.zeros(n)
    for constraint, codes in zip(pod.soft_spread, columns, strict=True):
        per_node = matching_pods_per_node(table, pod, constraint)
        if constraint.topology_key == HOSTNAME_LABEL:
            counts_here = per_node.astype(np.float64)
            size = int(np.count_nonzero(scored))
        else:
            domains = int(codes.max(initial=ABSENT)) + 1
            in_domain = np.zeros(domains, dtype=np.bool_)
            in_domain[codes[scored]] = True
            counted = _eligible(constraint, has_all_keys, node_affinity_passed, taints_passed)
            counts = np.bincount(codes[counted], weights=per_node[counted], minlength=domains)
            counts[~in_domain] = 0
            counts_here = np.where(codes == ABSENT, 0.0, counts[np.maximum(codes, 0)])
            size = int(np.count_nonzero(in_domain))
        raw += counts_here * np.log(size + 2) + (constraint.max_skew - 1)
    rounded = np.floor(raw + 0.5).astype(np.int64)  # Go's math.Round (raw ≥ 0)
    score = np.zeros(n)
    if not scored.any():
        return score
    candidates = rounded[scored]  # gathered once: each boolean gather of every node is ~5 µs
    low, high = int(candidates.min()), int(candidates.max())
    if high == 0:
        score[scored] = MAX_SCORE
    else:  # integer arithmetic, as kube-scheduler's int64 division
        score[scored] = MAX_SCORE * (high + low - candidates) // high
    return score


def _filter(state: CycleState) -> FilterResult | None:
    if not state.pod.spread:
        return None
    affinity, taints = state.passed(NODE_AFFINITY), state.passed(TAINT_TOLERATION)
    return topology_spread(state.table, state.pod, affinity, taints)


def _score(state: CycleState, feasible: NDArray[np.bool_]) -> NDArray[np.float64] | None:
    if not state.pod.soft_spread:
        return None
    affinity, taints = state.passed(NODE_AFFINITY), state.passed(TAINT_TOLERATION)
    return topology_spread_score(state.table, state.pod, feasible, affinity, taints)


FILTER = Filter(
    name=NAME,
    explain="placing the pod keeps each DoNotSchedule spread constraint within its maxSkew",
    filter=_filter,
    events=(
        EventInterest("Pod", Action.ADD | Action.UPDATE_POD_LABEL | Action.DELETE),
        EventInterest(
            "Node",
            Action.ADD | Action.DELETE | Action.UPDATE_NODE_LABEL | Action.UPDATE_NODE_TAINT,
        ),
    ),
    status=Code.UNSCHEDULABLE,  # skew changes when pods are evicted
    statuses={MISSING_LABEL: Code.UNSCHEDULABLE_AND_UNRESOLVABLE},
    reads=(NODE_AFFINITY, TAINT_TOLERATION),  # the node inclusion policies
    in_extender=False,  # kube-scheduler's own PodTopologySpread runs before the extender
)
SCORE = Score(
    name=NAME,
    explain="ScheduleAnyway spread constraints: fewer matching pods in the node's domains",
    score=_score,
    default_weight=2.0,  # kube-scheduler's default profile weight for PodTopologySpread
    in_extender=False,
)
