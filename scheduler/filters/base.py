"""What every filter returns: a pass mask and, computed only when asked, why nodes failed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from scheduler.table import NodeTable


@dataclass(slots=True)
class FilterResult:
    """One filter over all nodes of a table.

    ``passed[i]`` says whether node row ``i`` passes. ``reasons`` are the kube-scheduler
    style messages this filter can give; :meth:`reason_matrix` says which apply to each
    node (computed lazily, once, since only failure messages and decision records need it).
    """

    name: str
    passed: NDArray[np.bool_]
    reasons: tuple[str, ...]
    explain: Callable[[], NDArray[np.bool_]] | None = None
    """Builds the ``[nodes, reasons]`` matrix; ``None`` means one reason for every failure."""
    explain_rows: Callable[[NDArray[np.intp]], NDArray[np.bool_]] | None = None
    """The same matrix for some rows only (cheaper when few nodes failed); optional."""
    _matrix: NDArray[np.bool_] | None = field(default=None, repr=False)

    def reason_matrix(self) -> NDArray[np.bool_]:
        """``matrix[i, j]``: reason ``j`` applies to node ``i`` (all False where it passed)."""
        if self._matrix is None:
            if self.explain is None:
                self._matrix = ~self.passed[:, np.newaxis]
            else:
                self._matrix = self.explain()
        return self._matrix

    def reason_rows(self, rows: NDArray[np.intp]) -> NDArray[np.bool_]:
        """``reason_matrix()[rows]``, without building the whole matrix when it can."""
        if self._matrix is None and self.explain_rows is not None:
            return self.explain_rows(rows)
        return self.reason_matrix()[rows]

    def reasons_for(self, row: int) -> list[str]:
        """The reasons node ``row`` failed this filter (empty when it passed)."""
        if self.passed[row]:
            return []
        return self.failure_reasons(np.array([row]))[0]

    def failure_reasons(self, rows: NDArray[np.intp]) -> list[list[str]]:
        """:meth:`reasons_for` each of ``rows``, nodes known to have failed this filter."""
        if len(self.reasons) == 1:  # a failing node fails for some reason: the only one
            return [list(self.reasons) for _ in range(len(rows))]
        return [
            [reason for reason, flag in zip(self.reasons, flags, strict=True) if flag]
            for flags in self.reason_rows(rows).tolist()
        ]


def any_per_node(matrix: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """``result[i] = ∃j matrix[i, j]`` for a ``[nodes, k]`` matrix."""
    return np.asarray(matrix.any(axis=1), dtype=np.bool_)


def all_pass(name: str, table: NodeTable) -> FilterResult:
    """A filter with nothing to check for this pod (every node passes)."""
    return FilterResult(name, table.everyone(), ())
