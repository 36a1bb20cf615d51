"""``spec.nodeSelector`` and required node affinity (kube-scheduler's ``NodeAffinity``).

``passed = selector ∧ affinity`` where

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
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scheduler.filters.base import FilterResult
from scheduler.model import NodeSelectorTerm, PodInfo, Requirement, parse_int64
from scheduler.table import ABSENT, LabelColumn, NodeTable

NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"


def node_affinity(table: NodeTable, pod: PodInfo) -> FilterResult:
    """Nodes matching the pod's node selector and required node affinity."""
    passed = np.ones(len(table), dtype=np.bool_)
    for key, value in pod.node_selector:
        passed &= requirement_mask(table.label_column(key), Requirement(key, "In", (value,)))
    if pod.required_node_affinity is not None:
        passed &= _terms_mask(table, pod.required_node_affinity)
    return FilterResult("NodeAffinity", passed, (NODE_AFFINITY,))


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
