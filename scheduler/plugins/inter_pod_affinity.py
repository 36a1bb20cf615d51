"""InterPodAffinity (kube-scheduler v1.36's plugin of that name): required pod affinity and
anti-affinity as a filter, preferred terms as a score, any topology key.

Terms are kube-scheduler's ``AffinityTerm`` (:class:`scheduler.api.objects.AntiAffinityTerm`):
a pod matches a term when its namespace is in the term's namespaces (or its namespace's
labels match the term's namespace selector) and its labels match the label selector.
The incoming pod's own namespace selectors are resolved against the Namespaces the
scheduler watches (:meth:`scheduler.api.namespaces.NamespaceCatalog.matching`); placed pods'
terms are matched against the incoming pod's namespace labels. ``dom_k(i)`` is the value
of node ``i``'s label ``k``; a node without the label is in no domain of ``k``. Pods on
nodes the table does not know count nowhere.

**Filter** (a node counts under the first reason it fails, in this order)::

    all_q        = placed pods matching every required affinity term of the pod
    count[k, v]  = Σ over terms t with key k, pods q ∈ all_q on a node n with dom_k(n) = v
    affinity[i]  = ∀ t: dom_{k_t}(i) exists ∧ (count[k_t, dom_{k_t}(i)] > 0
                   ∨ (no count at all ∧ the pod matches all its own terms))
                     → "node(s) didn't match pod affinity rules"
    anti[i]      = ¬∃ own anti-affinity term t, placed pod q matching t on a node n:
                   dom_{k_t}(n) = dom_{k_t}(i)
                     → "node(s) didn't match pod anti-affinity rules"
    existing[i]  = ¬∃ placed pod p on a node n, required anti-affinity term t of p matching
                   the pod: dom_{k_t}(n) = dom_{k_t}(i)
                     → "node(s) didn't satisfy existing pods anti-affinity rules"

The second clause of ``affinity`` lets the first pod of a group with affinity to itself
schedule. A required affinity term without a label selector matches no pod.

**Score** (over the feasible nodes)::

    topo[k, v] =   Σ own preferred affinity terms t (key k), pods q matching t on a node
                       n with dom_k(n) = v: weight_t
                 − Σ own preferred anti-affinity terms, likewise: weight_t
                 + Σ placed pods p on a node n with dom_k(n) = v, terms t of p matching the
                     pod: 1 (HardPodAffinityWeight) for p's required affinity terms,
                     weight_t for its preferred affinity, −weight_t for its preferred
                     anti-affinity terms
    raw[i]     = Σ_k topo[k, dom_k(i)]
    score[i]   = ⌊100 · (raw[i] − min raw) / (max raw − min raw)⌋   (0 when max = min)

with min and max over the feasible nodes, as kube-scheduler's ``NormalizeScore``; ``None``
(no preference) when no term is involved at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from numpy.typing import NDArray

from scheduler.api.events import Action, EventInterest
from scheduler.api.objects import HOSTNAME_LABEL, AntiAffinityTerm, PodInfo, WeightedTerm
from scheduler.api.selectors import LabelSelector
from scheduler.api.term_lookup import TermLookup
from scheduler.plugins.base import (
    Code,
    Filter,
    FilterResult,
    Score,
    filter_by_table_and_pod,
    score_by_table_pod_and_feasible,
)
from scheduler.signals.node_columns import ABSENT, LabelColumn
from scheduler.signals.table import NodeTable

NAME = "InterPodAffinity"
AFFINITY_RULES = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY_RULES = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
HARD_POD_AFFINITY_WEIGHT = 1
"""kube-scheduler's ``InterPodAffinityArgs.hardPodAffinityWeight`` default: what a placed
pod's required affinity term matching the incoming pod adds to its domain's score."""
MAX_SCORE = 100


class PlacedTerms:
    """This plugin's lookup of placed pods' terms: their required anti-affinity terms,
    required affinity terms (with a selector) and preferred terms (anti-affinity ones with
    negated weights), each filed so a pod only meets the terms that could match it."""

    def __init__(self) -> None:
        self.anti_affinity = TermLookup[AntiAffinityTerm](_same_term)
        self.affinity = TermLookup[AntiAffinityTerm](_same_term)
        self.preferred = TermLookup[WeightedTerm](_weighted_term)

    def add(self, pod: PodInfo, node: str) -> None:
        for term in pod.anti_affinity:
            self.anti_affinity.add(term, node)
        for term in _required_affinity(pod):
            self.affinity.add(term, node)
        for weighted in _preferred(pod):
            self.preferred.add(weighted, node)

    def remove(self, pod: PodInfo, node: str) -> None:
        for term in pod.anti_affinity:
            self.anti_affinity.remove(term, node)
        for term in _required_affinity(pod):
            self.affinity.remove(term, node)
        for weighted in _preferred(pod):
            self.preferred.remove(weighted, node)


def resolved(table: NodeTable, term: AntiAffinityTerm) -> AntiAffinityTerm:
    """``term`` with its namespace selector replaced by the namespaces it selects now."""
    if term.namespace_selector is None:
        return term
    selected = table.namespaces.matching(term.namespace_selector)
    namespaces = None if term.namespaces is None else term.namespaces | selected
    return AntiAffinityTerm(term.selector, namespaces, term.topology_key)


def inter_pod_affinity_filter(table: NodeTable, pod: PodInfo) -> FilterResult | None:
    """Nodes where the pod's required (anti-)affinity and placed pods' required
    anti-affinity allow it (see the module formula); ``None`` when none is involved."""
    namespace_labels = table.namespaces.labels(pod.namespace)
    existing = [
        (term, nodes)
        for term, nodes in table.lookup(NAME, PlacedTerms).anti_affinity.candidates(
            pod.namespace, pod.labels
        )
        if term.matches(pod.namespace, pod.labels, namespace_labels)
    ]
    if not pod.pod_affinity and not pod.anti_affinity and not existing:
        return None
    affinity_ok = _affinity_passed(table, pod) if pod.pod_affinity else table.everyone()
    anti_ok = np.ones(len(table), dtype=np.bool_)
    for own in pod.anti_affinity:
        holding = table.matching_per_node(resolved(table, own)) > 0
        _clear_domains(table, anti_ok, own.topology_key, holding)
    existing_ok = np.ones(len(table), dtype=np.bool_)
    for term, nodes in existing:
        _clear_domains(table, existing_ok, term.topology_key, _rows(table, nodes.keys()))
    passed = affinity_ok & anti_ok & existing_ok

    def explain() -> tuple[NDArray[np.bool_], ...]:
        return ~affinity_ok, affinity_ok & ~anti_ok, affinity_ok & anti_ok & ~existing_ok

    return FilterResult(
        NAME, passed, (AFFINITY_RULES, ANTI_AFFINITY_RULES, EXISTING_ANTI_AFFINITY), explain
    )


def inter_pod_affinity_score(
    table: NodeTable, pod: PodInfo, feasible: NDArray[np.bool_]
) -> NDArray[np.float64] | None:
    """0–100 per node (see the module formula); ``None`` when no term is involved."""
    n = len(table)
    weights: dict[str, NDArray[np.int64]] = {}  # topology key → weight added per node row

    def add(key: str) -> NDArray[np.int64]:
        found = weights.get(key)
        if found is None:
            found = weights[key] = np.zeros(n, dtype=np.int64)
        return found

    for sign, preferred in ((1, pod.preferred_affinity), (-1, pod.preferred_anti_affinity)):
        for weighted in preferred:
            counts = table.matching_per_node(resolved(table, weighted.term))
            add(weighted.term.topology_key)[:] += sign * weighted.weight * counts
    namespace_labels = table.namespaces.labels(pod.namespace)
    terms = table.lookup(NAME, PlacedTerms)
    placed: list[tuple[AntiAffinityTerm, int, Mapping[str, int]]] = [
        (term, HARD_POD_AFFINITY_WEIGHT, nodes)
        for term, nodes in terms.affinity.candidates(pod.namespace, pod.labels)
    ]
    placed += (
        (weighted.term, weighted.weight, nodes)
        for weighted, nodes in terms.preferred.candidates(pod.namespace, pod.labels)
    )
    for term, weight, nodes in placed:
        if term.matches(pod.namespace, pod.labels, namespace_labels):
            per_node = add(term.topology_key)
            for node, count in nodes.items():
                row = table.row_of(node)
                if row is not None:
                    per_node[row] += weight * count
    if not weights:
        return None
    raw = np.zeros(n)  # whole numbers: float64 sums are exact far beyond any weight total
    for key, per_row in weights.items():
        labelled, codes = _labelled(table, key)
        size = len(table.label_column(key).values)
        domains = np.bincount(codes, weights=per_row[labelled], minlength=size)
        raw[labelled] += domains[codes]
    score = np.zeros(n)
    if not feasible.any():
        return score
    candidates = raw[feasible]  # gathered once: each boolean gather of every node is ~5 µs
    low, high = candidates.min(), candidates.max()
    if high > low:  # Go: int64(100 · (float64(s − min) / float64(max − min)))
        score[feasible] = np.trunc(MAX_SCORE * ((candidates - low) / (high - low)))
    return score


def _affinity_passed(table: NodeTable, pod: PodInfo) -> NDArray[np.bool_]:
    """The ``affinity`` column of the module formula."""
    n = len(table)
    terms = [term.matcher() for term in pod.pod_affinity]
    matchers = [None if term is None else resolved(table, term) for term in terms]
    combined = _all_of(matchers)
    holding = (
        np.zeros(n, dtype=np.bool_) if combined is None else table.matching_per_node(combined) > 0
    )
    has_keys = np.ones(n, dtype=np.bool_)
    exist = np.ones(n, dtype=np.bool_)
    counted = False
    for key in dict.fromkeys(term.topology_key for term in pod.pod_affinity):
        column = table.label_column(key)
        codes = column.codes
        has_keys &= codes != ABSENT
        taken = _domains_of(column, holding)
        counted |= bool(taken.any())
        exist &= taken[codes]
    if not counted and all(
        m is not None and m.matches(pod.namespace, pod.labels) for m in matchers
    ):
        return has_keys  # the first pod of a group with affinity to itself
    return has_keys & exist


def _all_of(terms: list[AntiAffinityTerm | None]) -> AntiAffinityTerm | None:
    """One term matching exactly the pods every one of ``terms`` matches (``None``: none).

    Requirements are ANDed and namespace sets intersected; namespace selectors must be
    resolved already."""
    if any(term is None for term in terms):
        return None
    present = [term for term in terms if term is not None]
    if len(present) == 1:
        return present[0]
    namespaces: frozenset[str] | None = None
    for term in present:
        if term.namespaces is not None:
            namespaces = term.namespaces if namespaces is None else namespaces & term.namespaces
    requirements = tuple(r for term in present for r in term.selector.requirements)
    return AntiAffinityTerm(LabelSelector(requirements), namespaces, HOSTNAME_LABEL)


def _rows(table: NodeTable, nodes: Iterable[str]) -> NDArray[np.bool_]:
    """A node mask of ``nodes`` (names the table does not know are left out)."""
    mask = np.zeros(len(table), dtype=np.bool_)
    rows = [row for row in (table.row_of(node) for node in nodes) if row is not None]
    mask[rows] = True
    return mask


def _labelled(table: NodeTable, key: str) -> tuple[NDArray[np.bool_], NDArray[np.int32]]:
    """The nodes with label ``key`` and their codes (cached until labels change)."""
    return table.cached("constraints", (NAME, "labelled", key), _find_labelled, table, key)


def _find_labelled(table: NodeTable, key: str) -> tuple[NDArray[np.bool_], NDArray[np.int32]]:
    codes = table.label_column(key).codes
    labelled = codes != ABSENT
    return labelled, codes[labelled]


def _domains_of(column: LabelColumn, holding: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """Per label code (plus a last entry, for :data:`ABSENT`, always False): whether a
    ``holding`` node has that value."""
    taken = np.zeros(len(column.values) + 1, dtype=np.bool_)
    taken[column.codes[holding]] = True
    taken[ABSENT] = False
    return taken


def _clear_domains(
    table: NodeTable, mask: NDArray[np.bool_], key: str, holding: NDArray[np.bool_]
) -> None:
    """Clear ``mask`` on every node sharing label ``key``'s value with a ``holding`` node."""
    column = table.label_column(key)
    mask &= ~_domains_of(column, holding)[column.codes]


def _same_term(term: AntiAffinityTerm) -> AntiAffinityTerm:
    return term


def _weighted_term(weighted: WeightedTerm) -> AntiAffinityTerm:
    return weighted.term


def _required_affinity(pod: PodInfo) -> list[AntiAffinityTerm]:
    """The pod's required affinity terms that can match a pod (those with a selector)."""
    return [m for m in (t.matcher() for t in pod.pod_affinity) if m is not None]


def _preferred(pod: PodInfo) -> list[WeightedTerm]:
    """The pod's preferred affinity terms, then its preferred anti-affinity terms with
    their weights negated."""
    return [
        *pod.preferred_affinity,
        *(WeightedTerm(-w.weight, w.term) for w in pod.preferred_anti_affinity),
    ]


FILTER = Filter(
    name=NAME,
    explain="the pod's required pod affinity and anti-affinity, and placed pods' required "
    "anti-affinity against it, over each term's topology domains",
    filter=filter_by_table_and_pod(inter_pod_affinity_filter),
    events=(
        EventInterest("Pod", Action.ADD | Action.UPDATE_POD_LABEL | Action.DELETE),
        EventInterest("Node", Action.ADD | Action.UPDATE_NODE_LABEL),
        EventInterest("Namespace", Action.ADD | Action.UPDATE),
    ),
    status=Code.UNSCHEDULABLE,  # anti-affinity conflicts go away with the pods causing them
    statuses={AFFINITY_RULES: Code.UNSCHEDULABLE_AND_UNRESOLVABLE},
    in_extender=False,  # kube-scheduler runs its own InterPodAffinity before asking
    lookup=PlacedTerms,
)
SCORE = Score(
    name=NAME,
    explain="preferred pod affinity (+weight) and anti-affinity (−weight) of the pod and of "
    "placed pods, and placed pods' required affinity (+1), summed per topology domain",
    score=score_by_table_pod_and_feasible(inter_pod_affinity_score),
    default_weight=2,  # kube-scheduler's default profile weight for InterPodAffinity
    in_extender=False,  # kube-scheduler scores it itself before asking the extender
)
