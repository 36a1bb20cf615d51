"""Every node's signals as columns: what the node table ingests in one vectorised step.

A :class:`SignalFrame` holds, per node (row), the columns the filters and scores read —
those declared once in :data:`COLUMNS` (``signals_at``, ``fresh_until``, the record's
node signals, and each window's (:data:`SIGNAL_WINDOWS`) :data:`WINDOW_PARTS`) — plus
each row's measured families. Every frame
is built from scheduling records (:mod:`interference.sched_record`) decoded in bulk by
:mod:`scheduler.signals.records`: the Redis follower's from the records it reads, and
those of in-process sources (``interference simulate``, tests) from the records of their
:class:`~scheduler.cycle.ports.NodeSignals`, encoded as the agent writes them
(:func:`scheduler.signals.records.frame_of_signals`) — one path, so the interference index
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

from interference.sched_record import NODE_SIGNALS, families_of
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
UNKNOWN = -1.0
"""A node signal's value in a row without it (no record, or its family not measured):
every real value is ≥ 0 (the record refuses negative ones)."""


@dataclass(frozen=True, slots=True)
class SignalColumn:
    """One column the node table keeps of every node's signals, and where it comes from."""

    name: str
    """The column's name: a key of :attr:`SignalFrame.columns` (``{name}@{window}`` for a
    windowed one, :func:`window_column`), of the table's views and of the columns a
    plugin declares it reads (:attr:`scheduler.plugins.base.Score.signals`)."""
    doc: str
    windowed: bool = False
    """One column per window of :data:`SIGNAL_WINDOWS` (else one per node)."""
    record_field: str | None = None
    """The scheduling record field it is copied from (``{window}.{record_field}`` for a
    windowed column; a window without intervals yet takes the latest interval's);
    ``None`` for a column the scheduler computes
    (:func:`scheduler.signals.records.signal_columns`)."""
    no_signal: float = 0.0
    """What it holds in a row without signals."""
    family: str | None = None
    """The signal family the value needs measured: a record that did not measure it
    leaves ``no_signal`` in its row (a probe that did not run reads 0, not "quiet")."""


COLUMNS: tuple[SignalColumn, ...] = (
    SignalColumn(
        "signals_at", "Unix time of the node's record; -inf without one", no_signal=-np.inf
    ),
    SignalColumn(
        "fresh_until",
        "Unix time until which the record is usable; -inf without one or when it lacks a"
        " core family (interference.freshness)",
        no_signal=-np.inf,
    ),
    *(
        SignalColumn(s.name, s.doc, record_field=s.name, no_signal=UNKNOWN, family=s.family)
        for s in NODE_SIGNALS
    ),
    SignalColumn(
        "runq_p99_us", "run-queue p99 of the window's merged histogram, µs", True, "runq_p99_us"
    ),
    SignalColumn("reclaim_mean", "mean reclaim stall, ms/s", True, "reclaim_stall_ms_per_s_mean"),
    SignalColumn(
        "reclaim_stddev", "σ of the reclaim stall, ms/s", True, "reclaim_stall_ms_per_s_stddev"
    ),
    SignalColumn("index_mean", "interference index of the window's means (0 = quiet)", True),
    SignalColumn("index_stddev", "the index at mean + σ minus index_mean", True),
)
"""Every signal column, declared once: the frame's columns, the record fields they are read
from and the table's views derive from it. A node signal of the record
(:data:`interference.sched_record.NODE_SIGNALS`) is a column of the same name."""
COLUMNS_BY_NAME = {column.name: column for column in COLUMNS}
NODE_PARTS = tuple(column.name for column in COLUMNS if not column.windowed)
"""The columns kept once per node."""
WINDOW_PARTS = tuple(column.name for column in COLUMNS if column.windowed)
"""The columns kept once per window."""


def window_column(window: str, part: str) -> str:
    """Name of one window's column in frames and in the table's storage."""
    return f"{part}@{window}"


SIGNAL_COLUMNS = (
    *NODE_PARTS,
    *(window_column(window, part) for window in SIGNAL_WINDOWS for part in WINDOW_PARTS),
)
"""Every column of a frame; the table keeps one vector of each."""
NO_SIGNAL_DEFAULTS = {
    **{part: COLUMNS_BY_NAME[part].no_signal for part in NODE_PARTS},
    **{
        window_column(window, part): COLUMNS_BY_NAME[part].no_signal
        for window in SIGNAL_WINDOWS
        for part in WINDOW_PARTS
    },
}
"""Value of each column in a row without signals."""


def no_signal_value(column: str) -> float:
    """What ``column`` holds for a node without signals."""
    return NO_SIGNAL_DEFAULTS.get(column, 0.0)


@dataclass(frozen=True, slots=True)
class NodeSignals:
    """The latest interference report of one node, as an in-process source holds it. It
    reaches a decision only through its scheduling record
    (:func:`scheduler.signals.records.frame_of_signals`): the signals the record carries
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
    rows: Mapping[str, int]
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
        rows: Mapping[str, int] | None = None,
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
        if rows is None:
            rows = MappingProxyType({name: i for i, name in enumerate(names)})
        return cls(names, rows, MappingProxyType(full), measured)

    def row(self, name: str) -> int | None:
        """Row of ``name``, None when the frame does not hold it."""
        return self.rows.get(name)

    def has_record(self, name: str) -> bool:
        """Whether the frame holds a record of ``name``."""
        row = self.rows.get(name)
        return row is not None and bool(self.columns["signals_at"][row] > -np.inf)

    def families(self, name: str) -> tuple[str, ...]:
        """The families ``name``'s record measured (empty without one)."""
        row = self.rows.get(name)
        return families_of(int(self.measured[row])) if row is not None else ()
