"""Lookups of placed pods by the affinity terms they carry and the terms they match.

A term (kube-scheduler's ``AffinityTerm``) can only match a pod in one of its namespaces
that carries one of the values of its first ``In`` requirement, so entries are filed
under ``(namespace, (key, value))`` pairs (``None``: any) and a pod only meets the
entries it could match. Used by the node table (per-node counts of pods matching a term,
for PodTopologySpread and InterPodAffinity) and by InterPodAffinity's own lookup of placed
pods' terms.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from scheduler.api.objects import AntiAffinityTerm, PodInfo
from scheduler.api.selectors import LabelSelector

K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Hashable)
H = TypeVar("H", bound=Hashable)
MATCH_COUNTS_LIMIT = 1024
"""Terms whose per-node counts are kept current at once (then they start over)."""


class TermLookup(Generic[H]):
    """Placed pods' terms, filed so a pod only meets terms that could match it.

    An entry (a term, or something holding one: ``term_of`` finds it) is filed under each
    namespace its term considers (``None``: all, or a namespace selector) and under the
    ``(key, value)`` pairs of its first ``In`` requirement (``None``: no ``In``), since a
    pod can only match it when it carries one of those labels.
    """

    def __init__(self, term_of: Callable[[H], AntiAffinityTerm]) -> None:
        self._term_of = term_of
        self._nodes: dict[H, Counter[str]] = {}
        self._filed: dict[tuple[str | None, tuple[str, str] | None], set[H]] = {}

    def add(self, entry: H, node: str) -> None:
        nodes = self._nodes.get(entry)
        if nodes is None:
            nodes = self._nodes[entry] = Counter()
            for key in filing_keys(self._term_of(entry)):
                self._filed.setdefault(key, set()).add(entry)
        nodes[node] += 1

    def remove(self, entry: H, node: str) -> None:
        decrement(self._nodes, entry, node)
        if entry not in self._nodes:
            for key in filing_keys(self._term_of(entry)):
                discard(self._filed, key, entry)

    def candidates(
        self, namespace: str, labels: Mapping[str, str]
    ) -> list[tuple[H, Mapping[str, int]]]:
        if not self._nodes:
            return []
        found: set[H] = set()
        for scope in (namespace, None):
            found.update(self._filed.get((scope, None), ()))
            for item in labels.items():
                found.update(self._filed.get((scope, item), ()))
        return [(entry, self._nodes[entry]) for entry in found]


class MatchCounts:
    """Per-node counts of placed pods matching a term (:meth:`NodeTable.matching_per_node`),
    updated as pods are added and removed. Entries are filed like :class:`TermLookup`
    terms, so a pod only meets the entries it could match."""

    def __init__(self) -> None:
        self._counts: dict[tuple[AntiAffinityTerm, bool], NDArray[np.int64]] = {}
        self._filed: dict[
            tuple[str | None, tuple[str, str] | None], set[tuple[AntiAffinityTerm, bool]]
        ] = {}

    def get(self, key: tuple[AntiAffinityTerm, bool]) -> NDArray[np.int64] | None:
        return self._counts.get(key)

    def put(self, key: tuple[AntiAffinityTerm, bool], counts: NDArray[np.int64]) -> None:
        if len(self._counts) >= MATCH_COUNTS_LIMIT:
            self.clear()
        self._counts[key] = counts
        for filing in filing_keys(key[0]):
            self._filed.setdefault(filing, set()).add(key)

    def update(self, pod: PodInfo, row: int, sign: int) -> None:
        if not self._counts:
            return
        for scope in (pod.namespace, None):
            for item in (None, *pod.labels.items()):
                for key in self._filed.get((scope, item), ()):
                    term, skip_terminating = key
                    if skip_terminating and pod.terminating:
                        continue
                    if term.matches(pod.namespace, pod.labels):
                        self._counts[key][row] += sign

    def clear(self) -> None:
        self._counts.clear()
        self._filed.clear()


def filing_keys(term: AntiAffinityTerm) -> list[tuple[str | None, tuple[str, str] | None]]:
    first_in = next((r for r in term.selector.requirements if r.operator == "In"), None)
    items: list[tuple[str, str] | None] = (
        [None] if first_in is None else [(first_in.key, v) for v in first_in.values]
    )
    scopes: Iterable[str | None] = (
        (None,)
        if term.namespaces is None or term.namespace_selector is not None
        else term.namespaces
    )
    return [(scope, item) for scope in scopes for item in items]


def positive_candidates(
    selector: LabelSelector, by_label: Mapping[tuple[str, str], set[str]]
) -> set[str] | None:
    """Pods that can match ``In`` requirements (intersection of unions); ``None`` if none."""
    result: set[str] | None = None
    for requirement in selector.requirements:
        if requirement.operator != "In":
            continue
        matching = set().union(
            *(by_label.get((requirement.key, v), set()) for v in requirement.values)
        )
        result = matching if result is None else result & matching
    return result


def discard(members_of: dict[K, set[V]], key: K, item: V) -> None:
    members = members_of.get(key)
    if members is not None:
        members.discard(item)
        if not members:
            del members_of[key]


def decrement(counters: dict[K, Counter[V]], key: K, item: V) -> None:
    counter = counters[key]
    counter[item] -= 1
    if counter[item] <= 0:
        del counter[item]
        if not counter:
            del counters[key]
