"""Every node's signals as columns: what the node table ingests in one vectorised step.

A :class:`SignalFrame` holds, per node (row), the columns the filters and scores read —
``signals_at``, ``fresh_until`` and each window's (:data:`SIGNAL_WINDOWS`)
:data:`WINDOW_PARTS` — plus each row's measured families. The Redis
follower builds frames straight from scheduling records in bulk
(:mod:`scheduler.signal_records`); tests, simulation and the in-memory adapter build them
from :class:`~scheduler.ports.NodeSignals` mappings with :meth:`SignalFrame.from_signals`.

Frames are immutable once handed over; a frame that changed is a new frame. Rows of
nodes without a record hold ``signals_at = fresh_until = −inf`` (no signals).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

from interference.freshness import fresh_until, missing_core
from interference.sched_record import families_of, measured_mask
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
    """The latest interference report of one node, as the scheduler sees it."""

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

    @classmethod
    def from_signals(cls, signals: Mapping[str, NodeSignals]) -> SignalFrame:
        """A frame of :class:`NodeSignals` (one Python pass per node: for tests, simulation
        and small in-memory clusters; the Redis follower decodes records in bulk). The
        report's own index is used here; NaN and negative values count as 0."""
        names = tuple(signals)
        n = len(names)
        columns = {name: np.full(n, no_signal_value(name)) for name in SIGNAL_COLUMNS}
        measured = np.zeros(n, np.uint16)
        for row, name in enumerate(names):
            node = signals[name]
            columns["signals_at"][row] = node.updated_at
            columns["fresh_until"][row] = (
                -np.inf
                if missing_core(node.measured)
                else fresh_until(node.updated_at, node.interval_s)
            )
            measured[row] = measured_mask(tuple(node.measured))
            for window in SIGNAL_WINDOWS:
                values = window_values(node.metrics, node.windows.get(window))
                for part, value in zip(WINDOW_PARTS, values, strict=True):
                    columns[window_column(window, part)][row] = value if value > 0 else 0.0
        return cls.build(names, columns, measured)

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


def window_values(
    metrics: NodeMetrics, window: WindowMetrics | None
) -> tuple[float, float, float, float, float]:
    """The :data:`WINDOW_PARTS` of one window; the latest interval's values (σ 0) when the
    report has no such window (the ``latest`` column, or an agent that publishes none)."""
    if window is None or window.intervals == 0:
        return (
            metrics.runq_p99_us,
            metrics.reclaim_stall_ms_per_s,
            0.0,
            metrics.interference_index,
            0.0,
        )
    return (
        window.runq_p99_us,
        window.reclaim_stall_ms_per_s_mean,
        window.reclaim_stall_ms_per_s_stddev,
        window.index_mean,
        window.index_stddev,
    )
