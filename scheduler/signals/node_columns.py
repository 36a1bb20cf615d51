"""Per-node columns built from the Node objects: label codes and taint presence, and the
signal window columns' shape. Pure functions of the nodes, in row order, and
:class:`NodeColumnCache`, which the table keeps them in until a node's constraint fields
or the row layout change."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scheduler.api.objects import NodeInfo, Taint


@dataclass(frozen=True, slots=True)
class WindowColumns:
    """One window's signal columns (views of the table's storage; do not modify): a
    typed view of ``scheduler.signals.frame.WINDOW_PARTS``, built by name, whose fields
    the table checks against that declaration."""

    runq_p99_us: NDArray[np.float64]
    """Run-queue p99 of the window's merged histogram, µs."""
    reclaim_mean: NDArray[np.float64]
    """Mean reclaim stall, ms/s."""
    reclaim_stddev: NDArray[np.float64]
    index_mean: NDArray[np.float64]
    """Mean interference index (0 = quiet)."""
    index_stddev: NDArray[np.float64]


ABSENT = -1
"""Label code of a node that does not have the label."""


@dataclass(frozen=True, slots=True)
class LabelColumn:
    """One label key over all nodes: ``codes[i]`` is a position in ``values`` or :data:`ABSENT`."""

    codes: NDArray[np.int32]
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TaintColumns:
    """Distinct taints of the cluster and which node carries which."""

    taints: tuple[Taint, ...]
    present: NDArray[np.bool_]
    """``present[i, t]``: node ``i`` carries ``taints[t]``."""


def label_column(nodes: Sequence[NodeInfo], key: str, field: bool = False) -> LabelColumn:
    """Codes of label ``key`` over ``nodes``; with ``field``, of the node field ``key``
    (only ``metadata.name`` exists for node selectors)."""
    vocabulary: dict[str, int] = {}
    codes = np.full(len(nodes), ABSENT, dtype=np.int32)
    for row, node in enumerate(nodes):
        value = node.labels.get(key) if not field else _field(node, key)
        if value is not None:
            codes[row] = vocabulary.setdefault(value, len(vocabulary))
    return LabelColumn(codes, tuple(vocabulary))


def _field(node: NodeInfo, key: str) -> str | None:
    return node.name if key == "metadata.name" else None


def taint_columns(nodes: Sequence[NodeInfo]) -> TaintColumns:
    """Distinct taints of ``nodes`` and a node × taint presence matrix."""
    vocabulary: dict[Taint, int] = {}
    for node in nodes:
        for taint in node.taints:
            vocabulary.setdefault(taint, len(vocabulary))
    present = np.zeros((len(nodes), len(vocabulary)), dtype=np.bool_)
    for row, node in enumerate(nodes):
        for taint in node.taints:
            present[row, vocabulary[taint]] = True
    return TaintColumns(tuple(vocabulary), present)


class NodeColumnCache:
    """The label and taint columns of the table's nodes, built when first asked for and
    kept until :meth:`clear`."""

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        self._nodes = nodes
        """The table's nodes in row order (its own list, changed in place)."""
        self._columns: dict[Hashable, object] = {}

    def clear(self) -> None:
        """Forget every column (a node's constraint fields or the row layout changed)."""
        self._columns.clear()

    def label_column(self, key: str, field: bool = False) -> LabelColumn:
        """:func:`label_column` of the nodes (cached)."""
        cache_key = ("field" if field else "label", key)
        cached = self._columns.get(cache_key)
        if isinstance(cached, LabelColumn):
            return cached
        # a key no node carries (a pod may name thousands) costs no pass over the nodes
        # and no cache entry, so the cache holds only the keys the nodes bring
        carried = key == "metadata.name" if field else key in self._label_keys()
        if not carried:
            return LabelColumn(np.full(len(self._nodes), ABSENT, dtype=np.int32), ())
        column = label_column(self._nodes, key, field)
        self._columns[cache_key] = column
        return column

    def _label_keys(self) -> frozenset[str]:
        """Every label key some node carries (cached until :meth:`clear`)."""
        cached = self._columns.get("label_keys")
        if isinstance(cached, frozenset):
            return cached
        keys = frozenset(key for node in self._nodes for key in node.labels)
        self._columns["label_keys"] = keys
        return keys

    def taint_columns(self) -> TaintColumns:
        """:func:`taint_columns` of the nodes (cached)."""
        cached = self._columns.get("taints")
        if isinstance(cached, TaintColumns):
            return cached
        columns = taint_columns(self._nodes)
        self._columns["taints"] = columns
        return columns
