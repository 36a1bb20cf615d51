"""The relax rule's memory: since when each pod has been refused only by relaxable filters.

A pod whose candidates are all refused only by relaxable filters (Interference) for
``relax_after_s`` is judged once more without them (:mod:`scheduler.cycle.cycle`); this
remembers since when, across attempts and configuration reloads, bounded.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

REMEMBERED_BLOCKED_PODS = 65536
"""Pods the relax rule remembers at once (the oldest are forgotten first)."""


class RelaxTracker:
    """When each pod was first found refused only by relaxable filters (bounded: the
    oldest entries are forgotten first). Thread-safe: the scheduling thread notes, binder
    threads forget."""

    def __init__(self, limit: int = REMEMBERED_BLOCKED_PODS) -> None:
        self._since: OrderedDict[str, float] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def waited(self, key: str, now: float) -> float:
        """Seconds ``key`` has been blocked, noting ``now`` as the start the first time."""
        with self._lock:
            since = self._since.setdefault(key, now)
            self._since.move_to_end(key)
            while len(self._since) > self._limit:
                self._since.popitem(last=False)
        return now - since

    def forget(self, key: str) -> None:
        if key not in self._since:  # most decisions: no lock taken (only this thread adds)
            return
        with self._lock:
            self._since.pop(key, None)

    def prune(self, keep: Callable[[str], bool]) -> None:
        """Drop the pods ``keep`` says no longer wait."""
        with self._lock:
            for key in [k for k in self._since if not keep(k)]:
                del self._since[key]

    def __len__(self) -> int:
        return len(self._since)
