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
    _matrix: NDArray[np.bool_] | None = field(default=None, repr=False)

    def reason_matrix(self) -> NDArray[np.bool_]:
        """``matrix[i, j]``: reason ``j`` applies to node ``i`` (all False where it passed)."""
        if self._matrix is None:
            if self.explain is None:
                self._matrix = ~self.passed[:, np.newaxis]
            else:
                self._matrix = self.explain()
        return self._matrix

    def reasons_for(self, row: int) -> list[str]:
        """The reasons node ``row`` failed this filter (empty when it passed)."""
        if self.passed[row]:
            return []
        flags = self.reason_matrix()[row]
        return [reason for reason, flag in zip(self.reasons, flags, strict=True) if flag]


def any_per_node(matrix: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """``result[i] = ∃j matrix[i, j]`` for a ``[nodes, k]`` matrix."""
    return np.asarray(matrix.any(axis=1), dtype=np.bool_)


def all_pass(name: str, table: NodeTable) -> FilterResult:
    """A filter with nothing to check for this pod (every node passes)."""
    return FilterResult(name, table.everyone(), ())
