"""What every filter returns: a pass mask and, computed only when asked, why nodes failed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from scheduler.table import NodeTable


@dataclass(slots=True)
class FilterResult:
    """One filter over all nodes of a table.

    ``passed[i]`` says whether node row ``i`` passes. ``reasons`` are the kube-scheduler
    style messages this filter can give; :meth:`reason_columns` says which apply to each
    node (computed lazily, once, since only failure messages and decision records need it).
    """

    name: str
    passed: NDArray[np.bool_]
    reasons: tuple[str, ...]
    explain: Callable[[], Sequence[NDArray[np.bool_]]] | None = None
    """Builds :meth:`reason_columns`; ``None`` means one reason for every failure."""
    measured: Callable[[int, int], str] | None = None
    """``(reason index, node row)`` → what was measured against what bound, appended to
    that reason in decision records (e.g. ``2900 µs measured > 500 µs tolerated``)."""
    _columns: Sequence[NDArray[np.bool_]] | None = field(default=None, repr=False)

    def reason_columns(self) -> Sequence[NDArray[np.bool_]]:
        """Per reason, a node mask: ``column[i]`` says whether the reason applies to node
        ``i``; read only where the node failed (a passing node's entries mean nothing)."""
        if self._columns is None:
            self._columns = (~self.passed,) if self.explain is None else self.explain()
        return self._columns

    def reason_counts(self, failing: NDArray[np.bool_]) -> list[int]:
        """Per reason, how many of the ``failing`` nodes (a mask of nodes this filter
        rejected) it applies to: ``count(failing ∧ column)``."""
        if len(self.reasons) == 1:  # a failing node fails for some reason: the only one
            return [int(np.count_nonzero(failing))]
        return [int(np.count_nonzero(failing & column)) for column in self.reason_columns()]

    def reasons_for(self, row: int) -> list[str]:
        """The reasons node ``row`` failed this filter (empty when it passed)."""
        if self.passed[row]:
            return []
        return self.failure_reasons(np.array([row]))[0]

    def failure_reasons(self, rows: NDArray[np.intp]) -> list[list[str]]:
        """:meth:`reasons_for` each of ``rows``, nodes known to have failed this filter,
        each followed by its measurement when the filter has one (``reason (what)``)."""
        if len(self.reasons) == 1:
            flags = [[True] for _ in range(len(rows))]
        else:
            stacked = np.stack([column[rows] for column in self.reason_columns()], axis=1)
            flags = stacked.tolist()
        measured = self.measured
        return [
            [
                reason if measured is None else f"{reason} ({measured(index, row)})"
                for index, (reason, flag) in enumerate(zip(self.reasons, node_flags, strict=True))
                if flag
            ]
            for row, node_flags in zip(rows.tolist(), flags, strict=True)
        ]


def any_per_node(matrix: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """``result[i] = ∃j matrix[i, j]`` for a ``[nodes, k]`` matrix."""
    return np.asarray(matrix.any(axis=1), dtype=np.bool_)


def all_pass(name: str, table: NodeTable) -> FilterResult:
    """A filter with nothing to check for this pod (every node passes)."""
    return FilterResult(name, table.everyone(), ())
