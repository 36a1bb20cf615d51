"""Required pod anti-affinity, any topology key (kube-scheduler's ``InterPodAffinity``, the
anti-affinity half; the affinity half is :mod:`scheduler.filters.pod_affinity`).

With ``dom_k(i)`` the value of node ``i``'s label ``k`` (none when it lacks the label):

- Existing pods' terms (checked first): ``existing_ok[i] = ¬∃ pod p on node n, term t of
  p (key k): t matches the incoming pod ∧ dom_k(i) = dom_k(n)`` → ``node(s) didn't
  satisfy existing pods anti-affinity rules``.
- The pod's own terms: ``own_ok[i] = ¬∃ term t of the pod (key k), pod q on node n: t
  matches q ∧ dom_k(i) = dom_k(n)`` → ``node(s) didn't match pod anti-affinity rules``.

A node without the label ``k`` is in no domain of ``k``: a term on ``k`` never rejects it
(nor do pods on it count). For ``kubernetes.io/hostname`` a node's own row is its domain.
A term matches a pod when the pod's namespace is in the term's namespaces (default: the
term owner's namespace) and its label selector matches the pod's labels.
``passed = existing_ok ∧ own_ok``; a node failing both reports only the first.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from scheduler.filters.base import FilterResult, all_pass
from scheduler.model import HOSTNAME_LABEL, PodInfo
from scheduler.table import ABSENT, NodeTable

EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
POD_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"


def pod_anti_affinity(table: NodeTable, pod: PodInfo) -> FilterResult:
    """Nodes where neither the pod's nor the placed pods' anti-affinity terms conflict."""
    existing_terms = table.anti_affinity_terms(pod.namespace, pod.labels)
    if not pod.anti_affinity and not existing_terms:
        return all_pass("InterPodAffinity", table)
    existing_ok = np.ones(len(table), dtype=np.bool_)
    for term, nodes in existing_terms:
        if term.matches(pod.namespace, pod.labels):
            _clear_domains(table, existing_ok, term.topology_key, nodes)
    own_ok = np.ones(len(table), dtype=np.bool_)
    for own in pod.anti_affinity:
        holding = {table.pod_node(p.key) or "" for p in table.pods_matching(own)}
        _clear_domains(table, own_ok, own.topology_key, holding)
    passed = existing_ok & own_ok

    def explain() -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        return ~existing_ok, existing_ok & ~own_ok

    return FilterResult(
        "InterPodAffinity", passed, (EXISTING_ANTI_AFFINITY, POD_ANTI_AFFINITY), explain
    )


def _clear_domains(
    table: NodeTable, mask: NDArray[np.bool_], key: str, nodes: Iterable[str]
) -> None:
    """Clear ``mask`` on every node sharing label ``key``'s value with one of ``nodes``."""
    rows = [row for row in (table.index_of(node) for node in nodes) if row is not None]
    if key == HOSTNAME_LABEL:
        mask[rows] = False
        return
    codes = table.label_column(key).codes
    taken = np.zeros(int(codes.max(initial=-1)) + 2, dtype=np.bool_)  # last entry: ABSENT
    taken[codes[rows]] = True
    taken[ABSENT] = False
    mask &= ~taken[codes]
