"""Topology spread, ``whenUnsatisfiable: ScheduleAnyway`` (kube-scheduler's
``PodTopologySpread`` score): fewer matching pods in a node's domains scores higher.

Over the nodes that passed every filter (``feasible``); a feasible node missing the label
of any of the pod's soft constraints is *ignored* (scores 0). For constraint ``c``
(key ``k``, selector ``s``, ``maxSkew``)::

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

from scheduler.filters.topology_spread import matching_pods_per_node
from scheduler.model import HOSTNAME_LABEL, PodInfo
from scheduler.table import ABSENT, NodeTable

MAX_SCORE = 100


def topology_spread_score(
    table: NodeTable,
    pod: PodInfo,
    feasible: NDArray[np.bool_],
    node_affinity_passed: NDArray[np.bool_],
    taints_passed: NDArray[np.bool_],
) -> NDArray[np.float64]:
    """0–100 per node for the pod's ``ScheduleAnyway`` constraints (see the module formula);
    only the feasible nodes' values mean anything."""
    n = len(table)
    if not pod.soft_spread:
        return np.full(n, float(MAX_SCORE))
    columns = [table.label_column(c.topology_key).codes for c in pod.soft_spread]
    has_all_keys = np.ones(n, dtype=np.bool_)
    for codes in columns:
        has_all_keys &= codes != ABSENT
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
            counted = has_all_keys.copy()
            if constraint.honor_node_affinity:
                counted &= node_affinity_passed
            if constraint.honor_node_taints:
                counted &= taints_passed
            counts = np.bincount(codes[counted], weights=per_node[counted], minlength=domains)
            counts[~in_domain] = 0
            counts_here = np.where(codes == ABSENT, 0.0, counts[np.maximum(codes, 0)])
            size = int(np.count_nonzero(in_domain))
        raw += counts_here * np.log(size + 2) + (constraint.max_skew - 1)
    rounded = np.floor(raw + 0.5).astype(np.int64)  # Go's math.Round (raw ≥ 0)
    score = np.zeros(n)
    if not scored.any():
        return score
    low, high = int(rounded[scored].min()), int(rounded[scored].max())
    if high == 0:
        score[scored] = MAX_SCORE
    else:  # integer arithmetic, as kube-scheduler's int64 division
        score[scored] = MAX_SCORE * (high + low - rounded[scored]) // high
    return score
