"""Every node's signals as columns: what the node table ingests in one vectorised step.

A :class:`SignalFrame` holds, per node (row), the columns the filters and scores read —
``signals_at``, ``fresh_until`` and each window's (:data:`SIGNAL_WINDOWS`)
:data:`WINDOW_PARTS` — plus each row's measured families. Every frame
is built from scheduling records (:mod:`interference.sched_record`) decoded in bulk by
:mod:`scheduler.signal_records`: the Redis follower's from the records it reads, and
those of in-process sources (``interference simulate``, tests) from the records of their
:class:`~scheduler.ports.NodeSignals`, encoded as the agent writes them
(:func:`scheduler.signal_records.frame_of_signals`) — one path, so the interference index
a decision reads is always the one the scheduler computes (docs/design.md §8).

Frames are immutable once handed over; a frame that changed is a new frame. Rows of
nodes without a record hold ``signals_at = fresh_until = −inf`` (no signals).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

from interference.sched_record import families_of
from interference.signals import (
    WINDOWS_S,
    NodeMetrics,
    WindowMetrics,
    window_name,
)

LATEST_WINDOW = "latest"
"""The window name of the latest interval's values."""
SIGNAL_WINDOWS = (LATEST_WINDOW, *(window_name(span) for span in WINDOWS_S))
"""Windows the table keeps columns for: ``latest`` (the latest interval), ``10s``, ``60s``."""
WINDOW_PARTS = ("runq_p99_us", "reclaim_mean", "reclaim_stddev", "index_mean", "index_stddev")


def window_column(window: str, part: str) -> str:
    """Name of one window's column in frames and in the table's storage."""
    return f"{part}@{window}"


SIGNAL_COLUMNS = (
    "signals_at",
    "fresh_until",
    *(window_column(window, part) for window in SIGNAL_WINDOWS for part in WINDOW_PARTS),
)
"""Every column of a frame; the table keeps one vector of each."""
NO_SIGNAL_DEFAULTS = {"signals_at": -np.inf, "fresh_until": -np.inf}
"""Value of a column in a row without signals (0 for the columns not listed)."""


def no_signal_value(column: str) -> float:
    """What ``column`` holds for a node without signals."""
    return NO_SIGNAL_DEFAULTS.get(column, 0.0)


@dataclass(frozen=True, slots=True)
class NodeSignals:
    """The latest interference report of one node, as an in-process source holds it. It
    reaches a decision only through its scheduling record
    (:func:`scheduler.signal_records.frame_of_signals`): the signals the record carries
    count, the agent's own index (``metrics.interference_index``, a window's ``index_*``)
    does not."""

    metrics: NodeMetrics
    updated_at: float
    """Unix time of the agent's report."""
    interval_s: float = 1.0
    """The report's interval; with ``updated_at`` it decides freshness
    (:mod:`interference.freshness`)."""
    measured: tuple[str, ...] = ()
    """Signal families the report measured; adapters pass the report's own list (one
    without a core family makes the node count as stale). The default is nothing
    measured: signals that do not say what they measured never count as usable."""
    windows: Mapping[str, WindowMetrics] = field(default_factory=dict)
    """The report's windowed signals by window name (``10s``, ``60s``)."""


@dataclass(frozen=True, eq=False, slots=True)
class SignalFrame:
    """Signals of ``names[i]`` in row ``i`` of every column (do not modify the arrays)."""

    names: tuple[str, ...]
    index: Mapping[str, int]
    """Row of each name; shared between frames over the same names (the table caches
    its row mapping by this object)."""
    columns: Mapping[str, NDArray[np.float64]]
    """Every :data:`SIGNAL_COLUMNS` entry, ``len(names)`` long."""
    measured: NDArray[np.uint16]
    """Family bit mask per row (:func:`interference.sched_record.measured_mask`)."""

    def __len__(self) -> int:
        return len(self.names)

    @classmethod
    def empty(cls) -> SignalFrame:
        return cls.build((), {}, np.zeros(0, np.uint16))

    @classmethod
    def build(
        cls,
        names: tuple[str, ...],
        columns: Mapping[str, NDArray[np.float64]],
        measured: NDArray[np.uint16],
        index: Mapping[str, int] | None = None,
    ) -> SignalFrame:
        """A frame over ``names``; columns left out hold "no signals"."""
        n = len(names)
        full = {
            name: columns[name] if name in columns else np.full(n, no_signal_value(name))
            for name in SIGNAL_COLUMNS
        }
        for name, column in full.items():
            if column.shape != (n,):
                raise ValueError(f"column {name} has shape {column.shape}, expected ({n},)")
        if index is None:
            index = MappingProxyType({name: i for i, name in enumerate(names)})
        return cls(names, index, MappingProxyType(full), measured)

    def row(self, name: str) -> int | None:
        """Row of ``name``, None when the frame does not hold it."""
        return self.index.get(name)

    def has_record(self, name: str) -> bool:
        """Whether the frame holds a record of ``name``."""
        row = self.index.get(name)
        return row is not None and bool(self.columns["signals_at"][row] > -np.inf)

    def families(self, name: str) -> tuple[str, ...]:
        """The families ``name``'s record measured (empty without one)."""
        row = self.index.get(name)
        return families_of(int(self.measured[row])) if row is not None else ()
