"""The node table's resource accounting: allocatable, requested and free per resource and
node, as three numpy matrices (a row per resource, a column per node row)::

    requested[r, node] = Σ requests[r] of the node's pods      (``pods`` counts 1 per pod)
    free[r, node]      = allocatable[r, node] − requested[r, node]

:class:`ResourceColumns` owns the storage (``capacity`` node columns, a resource row added
the first time a resource is seen); the table (:class:`scheduler.signals.table.NodeTable`)
tells it when a node row is set, moved, cleared or the storage grows, and shows the live
columns as views. Not thread-safe: callers hold the cache lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from scheduler.api.quantity import CPU, EPHEMERAL_STORAGE, MEMORY, PODS

BASE_RESOURCES = (CPU, MEMORY, EPHEMERAL_STORAGE, PODS)
"""The resources every node has a row for, in this order."""


def widened(array: NDArray[Any], capacity: int) -> NDArray[Any]:
    """``array`` with its last axis grown to ``capacity`` (the new part zero)."""
    grown = np.zeros((*array.shape[:-1], capacity), dtype=array.dtype)
    grown[..., : array.shape[-1]] = array
    return grown


class ResourceColumns:
    """Allocatable, requested and free amounts per resource row × node row."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._rows: dict[str, int] = {r: i for i, r in enumerate(BASE_RESOURCES)}
        shape = (len(BASE_RESOURCES), capacity)
        self._alloc = np.zeros(shape, dtype=np.int64)
        self._requested = np.zeros(shape, dtype=np.int64)
        self._free = np.zeros(shape, dtype=np.int64)

    def row(self, resource: str) -> int | None:
        """Row of ``resource`` in the matrices, if known."""
        return self._rows.get(resource)

    def views(self, count: int) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """Allocatable, requested and free of the first ``count`` node rows (views that
        share memory with the storage until it is reallocated)."""
        return self._alloc[:, :count], self._requested[:, :count], self._free[:, :count]

    def ensure(self, resource: str) -> bool:
        """Give ``resource`` a row; True when it is new (the storage was reallocated, so
        earlier views no longer see it)."""
        if resource in self._rows:
            return False
        self._rows[resource] = len(self._rows)
        extra = np.zeros((1, self._capacity), dtype=np.int64)
        self._alloc = np.vstack([self._alloc, extra])
        self._requested = np.vstack([self._requested, extra])
        self._free = np.vstack([self._free, extra])
        return True

    def set_allocatable(self, row: int, allocatable: Mapping[str, int]) -> bool:
        """The node at ``row`` has ``allocatable`` (nothing of other resources); True when
        a resource was new (see :meth:`ensure`)."""
        self._alloc[:, row] = 0
        new = False
        for resource, amount in allocatable.items():
            new |= self.ensure(resource)  # may reallocate the matrices
            self._alloc[self._rows[resource], row] = amount
        self._free[:, row] = self._alloc[:, row] - self._requested[:, row]
        return new

    def account(self, row: int, requests: Mapping[str, int], sign: int) -> None:
        """Count (``sign`` +1) or stop counting (-1) one pod's ``requests`` at ``row``; every
        resource requested has a row already (:meth:`ensure`)."""
        for resource, amount in requests.items():
            r = self._rows[resource]
            self._requested[r, row] += sign * amount
            self._free[r, row] -= sign * amount
        pods_row = self._rows[PODS]
        self._requested[pods_row, row] += sign
        self._free[pods_row, row] -= sign

    def shift(self, loads: Mapping[int, Mapping[str, int]], sign: int) -> None:
        """Stop counting (``sign`` -1) or count again (+1) what ``loads`` maps each node row
        to (requests of pods together, ``pods``: how many), in one numpy step."""
        resource_rows: list[int] = []
        node_rows: list[int] = []
        amounts: list[int] = []
        for row, load in loads.items():
            for resource, amount in load.items():
                resource_rows.append(self._rows[resource])
                node_rows.append(row)
                amounts.append(sign * amount)
        at = (np.array(resource_rows, dtype=np.intp), np.array(node_rows, dtype=np.intp))
        change = np.array(amounts, dtype=np.int64)
        np.add.at(self._requested, at, change)
        np.subtract.at(self._free, at, change)

    def move_row(self, row: int, source: int) -> None:
        """Copy node row ``source`` into ``row`` (a removed node's row takes the last)."""
        for matrix in (self._alloc, self._requested, self._free):
            matrix[:, row] = matrix[:, source]

    def clear_row(self, row: int) -> None:
        """Zero node row ``row`` (no longer in use)."""
        for matrix in (self._alloc, self._requested, self._free):
            matrix[:, row] = 0

    def grow(self, capacity: int) -> None:
        """Room for ``capacity`` node rows (reallocates: earlier views no longer see it)."""
        self._alloc = widened(self._alloc, capacity)
        self._requested = widened(self._requested, capacity)
        self._free = widened(self._free, capacity)
        self._capacity = capacity
