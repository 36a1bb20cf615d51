"""Preferred node affinity (kube-scheduler's ``NodeAffinity`` score).

Over the nodes that passed every filter (``feasible``)::

    raw[i]   = Σ weight_t over the pod's preferred terms t that node i matches
               (terms as in required node affinity: expressions and fields ANDed)
    score[i] = ⌊100 · raw[i] / max raw⌋        (0 everywhere when max raw = 0)

with the maximum over the feasible nodes (kube-scheduler's ``DefaultNormalizeScore``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scheduler.filters.node_affinity import requirement_mask
from scheduler.model import NodeSelectorTerm, PodInfo
from scheduler.table import NodeTable

MAX_SCORE = 100


def node_affinity_score(
    table: NodeTable, pod: PodInfo, feasible: NDArray[np.bool_]
) -> NDArray[np.float64]:
    """0–100 per node (see the module formula); only the feasible nodes' values count."""
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
