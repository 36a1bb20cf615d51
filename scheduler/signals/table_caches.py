"""The node table's caches, so a decision costs O(nodes) numpy passes and few of them.

:meth:`TableCaches.cached` values live in three scopes named for what empties them
(:data:`CacheScope`); :meth:`TableCaches.derived` columns are refreshed only at the rows
whose requests, signals or allocatable changed since they were built
(:attr:`TableCaches.load_generation`), and rebuilt whole after rows move or many changed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Literal, TypeVar, TypeVarTuple, Unpack, get_args

import numpy as np
from numpy.typing import NDArray

T = TypeVar("T")
Args = TypeVarTuple("Args")
CHANGED_ROWS_LIMIT = 32
"""Changed rows :meth:`TableCaches.derived` refreshes one by one; beyond that it rebuilds."""
CACHE_LIMIT = 512
"""Entries per cache scope (a signature's masks take ~30 KB at 5,000 nodes) before that
scope starts over."""
_MISSING = object()
CacheScope = Literal["constraints", "allocatable", "signals"]
"""What empties a :meth:`TableCaches.cached` scope:

- ``constraints``: the table's ``generation`` changes (rows move; a node's labels,
  taints, readiness or cordon change). For results that depend only on a pod's
  signature and those node fields, e.g. the NodeAffinity mask per signature.
- ``allocatable``: any node's allocatable changes, or ``constraints`` empties.
- ``signals``: any node's signals change, or ``constraints`` empties.
"""


class TableCaches:
    """Scoped values and row-refreshed derived columns of one node table."""

    def __init__(self) -> None:
        # values typed Any: cached() hands each back as its caller's T without a cast() call
        self._scopes: dict[CacheScope, dict[Hashable, Any]] = {
            scope: {} for scope in get_args(CacheScope)
        }
        self._derived: dict[Hashable, tuple[int, NDArray[np.float64]]] = {}
        self.load_generation = 0
        """Changes whenever a node's requests, signals or allocatable change."""
        self._changed_rows: list[int] = []
        """Row changed by each load generation since ``_changed_rows_start``."""
        self._changed_rows_start = 0

    def cached(
        self,
        scope: CacheScope,
        key: Hashable,
        build: Callable[[Unpack[Args]], T],
        *args: *Args,
        still_valid: Callable[[T, Unpack[Args]], bool] | None = None,
    ) -> T:
        """The value cached under ``key`` in ``scope``, built by ``build(*args)`` when
        missing (or when ``still_valid(value, *args)`` says it expired). A key names its
        owner first (``("NodeResourcesFit", …)``) so plugins never collide. Callers must
        not modify the value.

        ``build`` takes its inputs as ``args`` rather than from a closure: plugins call
        this dozens of times a decision, mostly finding the value, and making a closure
        for each call was 1.4 % of a decision's instructions (callgrind, 1,000 nodes)."""
        entries = self._scopes[scope]
        found: T = entries.get(key, _MISSING)
        if found is not _MISSING and (still_valid is None or still_valid(found, *args)):
            return found
        value = build(*args)
        if len(entries) >= CACHE_LIMIT:
            entries.clear()
        entries[key] = value
        return value

    def size(self, scope: CacheScope) -> int:
        """How many values :meth:`cached` holds in ``scope``."""
        return len(self._scopes[scope])

    def clear(self, scope: CacheScope) -> None:
        self._scopes[scope].clear()

    def clear_all(self) -> None:
        """Rows moved or a constraint field changed: every value and column starts over."""
        for entries in self._scopes.values():
            entries.clear()
        self._derived.clear()
        self.note_load_change(None)

    def note_load_change(self, row: int | None) -> None:
        """A new load generation that changed ``row`` (``None``: rows moved, or too many)."""
        self.load_generation += 1
        if row is None or len(self._changed_rows) >= CHANGED_ROWS_LIMIT:
            self._changed_rows = []
            self._changed_rows_start = self.load_generation
        else:
            self._changed_rows.append(row)

    def derived(
        self,
        key: Hashable,
        compute: Callable[[Unpack[Args]], NDArray[np.float64]],
        compute_row: Callable[[int, Unpack[Args]], float],
        *args: *Args,
    ) -> NDArray[np.float64]:
        """A per-node column derived from the table's per-node columns, kept current
        cheaply: ``compute(*args)`` builds it whole (a new array) after rows move or many
        rows changed; otherwise ``compute_row(row, *args)`` — the same formula on one
        row's scalars, in the same order of operations — refreshes only the rows whose
        requests, signals or allocatable changed (usually one per decision). Callers must
        not modify it. The inputs come as ``args``, as for :meth:`cached`.
        """
        entry = self._derived.get(key)
        if entry is not None:
            built_at, values = entry
            if built_at == self.load_generation:
                return values
            if built_at >= self._changed_rows_start:
                for row in set(self._changed_rows[built_at - self._changed_rows_start :]):
                    values[row] = compute_row(row, *args)
                self._derived[key] = (self.load_generation, values)
                return values
        values = compute(*args)
        self._derived[key] = (self.load_generation, values)
        return values
