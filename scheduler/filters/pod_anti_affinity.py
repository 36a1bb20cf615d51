"""Required pod anti-affinity on ``kubernetes.io/hostname`` (kube-scheduler's
``InterPodAffinity``, the parts this scheduler implements).

- Existing pods' terms (checked first): ``existing_ok[i] = ¬∃ pod p on node i, term t of
  p: t matches the incoming pod`` → ``node(s) didn't satisfy existing pods anti-affinity
  rules``.
- The pod's own terms: ``own_ok[i] = ¬∃ term t of the pod, pod q on node i: t matches q``
  → ``node(s) didn't match pod anti-affinity rules``.

A term matches a pod when the pod's namespace is in the term's namespaces (default: the
term owner's namespace) and its label selector matches the pod's labels.
``passed = existing_ok ∧ own_ok``; a node failing both reports only the first.
Anti-affinity on other topology keys is reported as unsupported by :mod:`scheduler.model`.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from scheduler.filters.base import FilterResult, all_pass
from scheduler.model import PodInfo
from scheduler.table import NodeTable

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
            _clear_rows(table, existing_ok, nodes)
    own_ok = np.ones(len(table), dtype=np.bool_)
    for term in pod.anti_affinity:
        _clear_rows(table, own_ok, {table.pod_node(p.key) or "" for p in table.pods_matching(term)})
    passed = existing_ok & own_ok

    def explain() -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        return ~existing_ok, existing_ok & ~own_ok

    return FilterResult(
        "InterPodAffinity", passed, (EXISTING_ANTI_AFFINITY, POD_ANTI_AFFINITY), explain
    )


def _clear_rows(table: NodeTable, mask: NDArray[np.bool_], nodes: Iterable[str]) -> None:
    for node in nodes:
        row = table.index_of(node)
        if row is not None:
            mask[row] = False
