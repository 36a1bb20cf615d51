"""NodeAffinity (kube-scheduler's plugin of that name): ``spec.nodeSelector`` and node affinity.

Filter — ``nodeSelector`` and required node affinity: ``passed = selector ∧ affinity`` where

- ``selector``: every ``nodeSelector`` pair equals the node's label;
- ``affinity``: ``∃ term ∀ requirement holds`` — terms ORed, expressions and fields within
  a term ANDed; a term with no requirements matches nothing, and so does a term
  kube-scheduler cannot parse (:attr:`NodeSelectorTerm.parse_errors`: an ``In``/``NotIn``
  value that is not a valid label value, a ``Gt``/``Lt`` bound that is not a base-10 int64,
  …) while the other terms still count. Operators: ``In`` (label present and among values),
  ``NotIn`` (absent or not among values), ``Exists``, ``DoesNotExist``, ``Gt``/``Lt`` (label
  present, a base-10 int64 as Go's ``strconv.ParseInt`` reads it, and greater/less than the
  bound; any other label value fails the requirement); ``matchFields`` only on
  ``metadata.name`` (``In``/``NotIn``).

Failure reason: ``node(s) didn't match Pod's node affinity/selector``.

Score — preferred node affinity. Over the nodes that passed every filter (``feasible``)::

    raw[i]   = Σ weight_t over the pod's preferred terms t that node i matches
               (terms as in required node affinity: expressions and fields ANDed)
    score[i] = ⌊100 · raw[i] / max raw⌋        (0 everywhere when max raw = 0)

with the maximum over the feasible nodes (kube-scheduler's ``DefaultNormalizeScore``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scheduler.api.events import Action, EventInterest
from scheduler.api.objects import PodInfo
from scheduler.api.selectors import NodeSelectorTerm, Requirement, parse_int64
from scheduler.plugins.base import (
    Filter,
    FilterResult,
    Score,
    filter_by_table_and_pod,
    score_by_table_pod_and_feasible,
)
from scheduler.signals.node_columns import ABSENT, LabelColumn
from scheduler.signals.table import NodeTable

NAME = "NodeAffinity"
NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
MAX_SCORE = 100


def node_affinity(table: NodeTable, pod: PodInfo) -> FilterResult | None:
    """Nodes matching the pod's node selector and required node affinity; ``None`` when
    the pod has neither."""
    if not pod.node_selector and pod.required_node_affinity is None:
        return None
    passed = np.ones(len(table), dtype=np.bool_)
    for key, value in pod.node_selector:
        passed &= requirement_mask(table.label_column(key), Requirement(key, "In", (value,)))
    if pod.required_node_affinity is not None:
        passed &= _terms_mask(table, pod.required_node_affinity)
    return FilterResult(NAME, passed, (NODE_AFFINITY,))


def _terms_mask(table: NodeTable, terms: tuple[NodeSelectorTerm, ...]) -> NDArray[np.bool_]:
    matched = np.zeros(len(table), dtype=np.bool_)
    for term in terms:
        if term.parse_errors or not (term.match_expressions or term.match_fields):
            continue
        term_mask = np.ones(len(table), dtype=np.bool_)
        for requirement in term.match_expressions:
            term_mask &= requirement_mask(table.label_column(requirement.key), requirement)
        for requirement in term.match_fields:
            column = table.label_column(requirement.key, field=True)
            term_mask &= requirement_mask(column, requirement)
        matched |= term_mask
    return matched


def requirement_mask(column: LabelColumn, requirement: Requirement) -> NDArray[np.bool_]:
    """Nodes on which one node-selector requirement holds, from the label's column."""
    codes = column.codes
    present: NDArray[np.bool_] = codes != ABSENT
    op = requirement.operator
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        absent: NDArray[np.bool_] = ~present
        return absent
    if op in ("In", "NotIn"):
        wanted = [code for code, value in enumerate(column.values) if value in requirement.values]
        member = np.isin(codes, wanted)
        return member if op == "In" else ~member
    bound = parse_int64(requirement.values[0]) if len(requirement.values) == 1 else None
    if bound is None:  # never in a parsed term; kube's requirement matches nothing then
        return np.zeros(len(codes), dtype=np.bool_)
    holds = [_compare(value, op, bound) for value in column.values]
    lookup = np.array([*holds, False], dtype=np.bool_)  # ABSENT (-1) reads the last entry
    return lookup[codes]


def _compare(value: str, operator: str, bound: int) -> bool:
    number = parse_int64(value)
    if number is None:
        return False
    return number > bound if operator == "Gt" else number < bound


def node_affinity_score(
    table: NodeTable, pod: PodInfo, feasible: NDArray[np.bool_]
) -> NDArray[np.float64] | None:
    """0–100 per node (see the module formula); only the feasible nodes' values count.
    ``None`` for a pod without preferred terms."""
    if not pod.preferred_node_affinity:
        return None
    raw = np.zeros(len(table), dtype=np.int64)
    for weight, term in pod.preferred_node_affinity:
        raw[_term_mask(table, term)] += weight
    high = int(raw[feasible].max(initial=0))
    if high == 0:
        return np.zeros(len(table))
    score: NDArray[np.float64] = (MAX_SCORE * raw // high).astype(np.float64)
    return score


def _term_mask(table: NodeTable, term: NodeSelectorTerm) -> NDArray[np.bool_]:
    mask = np.ones(len(table), dtype=np.bool_)
    for requirement in term.match_expressions:
        mask &= requirement_mask(table.label_column(requirement.key), requirement)
    for requirement in term.match_fields:
        mask &= requirement_mask(table.label_column(requirement.key, field=True), requirement)
    return mask


FILTER = Filter(
    name=NAME,
    explain="the node matches the pod's nodeSelector and required node affinity",
    filter=filter_by_table_and_pod(node_affinity),
    events=(EventInterest("Node", Action.ADD | Action.UPDATE_NODE_LABEL),),
    static=True,
)
SCORE = Score(
    name=NAME,
    explain="the pod's preferred node affinity terms the node matches, by weight",
    score=score_by_table_pod_and_feasible(node_affinity_score),
    default_weight=2.0,  # kube-scheduler's default profile weight for NodeAffinity
    in_extender=False,  # kube-scheduler's own NodeAffinity scores it before the extender
)
