"""Required pod affinity, any topology key (kube-scheduler's ``InterPodAffinity``, the
affinity half; anti-affinity is :mod:`scheduler.filters.pod_anti_affinity`).

For the pod's required terms ``t`` (topology key ``k_t``)::

    count[(k, v)] = Σ over terms t with k_t = k, placed pods q matching t (namespace and
                    selector) on a node whose label k is v   (pairs from different terms
                    with the same key add up, as in kube-scheduler)
    has_keys[i]   = node i has the label of every term's key
    exist[i]      = ∀ t: count[(k_t, label k_t of i)] > 0
    first[i]      = no pair counted at all ∧ the pod matches every one of its own terms
                    (the first pod of a group with affinity to itself)
    passed[i]     = has_keys[i] ∧ (exist[i] ∨ first[i])

A term without a label selector matches no pod. Failure reason: ``node(s) didn't match pod
affinity rules``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scheduler.filters.base import FilterResult, all_pass
from scheduler.model import AntiAffinityTerm, PodInfo
from scheduler.table import ABSENT, NodeTable

POD_AFFINITY = "node(s) didn't match pod affinity rules"


def pod_affinity(table: NodeTable, pod: PodInfo) -> FilterResult:
    """Nodes whose domains hold pods the pod's required affinity terms ask for."""
    if not pod.pod_affinity:
        return all_pass("InterPodAffinity", table)
    n = len(table)
    has_keys = np.ones(n, dtype=np.bool_)
    # topology key → per domain code, whether it holds a match (last entry: ABSENT, False)
    found: dict[str, NDArray[np.bool_]] = {}
    columns = []
    for term in pod.pod_affinity:
        codes = table.label_column(term.topology_key).codes
        columns.append(codes)
        has_keys &= codes != ABSENT
        holding = found.get(term.topology_key)
        if holding is None:
            holding = found[term.topology_key] = np.zeros(int(codes.max(initial=-1)) + 2, bool)
        if term.selector is not None:
            matcher = AntiAffinityTerm(term.selector, term.namespaces)
            holding[codes[table.matching_per_node(matcher) > 0]] = True
            holding[ABSENT] = False
    exist = np.ones(n, dtype=np.bool_)
    for term, codes in zip(pod.pod_affinity, columns, strict=True):
        exist &= found[term.topology_key][codes]
    if not any(holding.any() for holding in found.values()) and all(
        t.matches(pod.namespace, pod.labels) for t in pod.pod_affinity
    ):
        exist[:] = True
    return FilterResult("InterPodAffinity", has_keys & exist, (POD_AFFINITY,))
