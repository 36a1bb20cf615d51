"""The scheduling record: what the scheduler decides on, in a fixed binary layout.

An agent writes one per interval to ``intf:node:{node}:sched``
(:func:`interference.keys.sched_key`) beside the hashes and the report stream people and
the CLI read. The scheduler reads only these records, many in one ``MGET``, and decodes
them in bulk as a numpy structured array built from :data:`FIELDS` — no per-field Python
work per report, and none of the pod rows or histograms it never uses (docs/design.md §4).

Layout (little-endian, packed, :data:`SIZE` bytes), every field in :data:`FIELDS` order:

- header: ``version`` (:data:`VERSION`), ``measured`` (bit ``i`` = family ``i`` of
  :data:`interference.signals.SIGNAL_FAMILIES`), ``gpu_count``, ``reserved`` (0),
  ``node_id`` (:func:`node_id`: binds the record to the node whose key holds it), ``ts``,
  ``interval_s``, and a GPU summary (the smallest device's memory, memory used and mean
  utilisation — shown to people, never turned into labels a pod selector matches);
- the node signals (:data:`NODE_SIGNALS`), one float each, that the scheduler reads as a
  column of the same name as they are (no index, no window): adding a signal to the
  record is one line there (docs/design.md §8, "Adding a signal");
- per window ``latest`` (the interval), ``10s`` and ``60s``: ``covered_s``,
  ``intervals`` (≥ 0), ``runq_p99_us`` (of the window's merged histogram), and mean and σ
  of every other signal the interference index reads (:data:`MEAN_SIGNALS`). The
  ``latest`` window is the interval itself (σ 0).

The record carries no interference index: the scheduler computes it from these signals
with its own references. A record is untrusted input; the scheduler checks every field
(``scheduler.signals.frame``) before it uses any.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from interference import hist
from interference.codec import PayloadError
from interference.signals import SIGNAL_FAMILIES, NodeReport, WindowMetrics, window_name

VERSION = 2
"""Layout version; a reader refuses any other (run one release of agent and scheduler).
Bumped whenever the layout changes (2: the node signals after the header)."""

RECORD_WINDOWS = ("latest", window_name(10), window_name(60))
"""Windows a record carries, in layout order."""

MEAN_SIGNALS = (
    "runq_wait_ratio",
    "reclaim_stall_ms_per_s",
    "throttled_ms_per_s",
    "psi_cpu_some",
    "psi_mem_some",
    "net_drops_per_s",
)
"""Index signals carried as mean and σ per window (``runq_p99_us`` is a percentile)."""

HEADER: tuple[tuple[str, str], ...] = (
    ("version", "H"),
    ("measured", "H"),
    ("gpu_count", "H"),
    ("reserved", "H"),
    ("node_id", "Q"),
    ("ts", "d"),
    ("interval_s", "d"),
    ("gpu_memory_min_mib", "d"),
    ("gpu_memory_used_mib", "d"),
    ("gpu_utilization_pct", "d"),
)


@dataclass(frozen=True, slots=True)
class NodeSignal:
    """A signal the record carries once per node, read by the scheduler as it is."""

    name: str
    """The :class:`~interference.signals.NodeMetrics` field the agent fills, the record
    field, and the scheduler's column (``scheduler.signals.frame.COLUMNS``) — one name."""
    family: str
    """The family (:data:`~interference.signals.SIGNAL_FAMILIES`) whose probe reads it:
    in a record that did not measure that family the value means "unknown"."""
    doc: str
    """What it measures and its unit, for the column's and the record's readers."""


NODE_SIGNALS: tuple[NodeSignal, ...] = (
    NodeSignal(
        "psi_mem_some_avg10",
        "psi",
        "memory pressure: the kernel's own 10 s average of the share of time some task of"
        " the agent's cgroup root stalled on memory (memory.pressure `some avg10`), percent",
    ),
)
"""The node signals, in layout order: the one declaration a new signal needs in the
record (the agent fills the :class:`~interference.signals.NodeMetrics` field of the same
name; a value must be finite and ≥ 0, as every record float)."""
WINDOW_FIELDS: tuple[tuple[str, str], ...] = (
    ("covered_s", "d"),
    ("intervals", "q"),
    ("runq_p99_us", "d"),
    *((f"{signal}_{moment}", "d") for signal in MEAN_SIGNALS for moment in ("mean", "stddev")),
)
FIELDS: tuple[tuple[str, str], ...] = (
    *HEADER,
    *((signal.name, "d") for signal in NODE_SIGNALS),
    *((f"{window}.{name}", code) for window in RECORD_WINDOWS for name, code in WINDOW_FIELDS),
)
"""Every field as (name, :mod:`struct` code), in layout order; window fields are named
``{window}.{field}`` (``60s.runq_p99_us``)."""

_STRUCT = struct.Struct("<" + "".join(code for _, code in FIELDS))
SIZE = _STRUCT.size
"""Bytes per record."""


def node_id(node: str) -> int:
    """64-bit id of a node name (BLAKE2b), stored in its records so a record copied under
    another node's key is recognised."""
    return int.from_bytes(hashlib.blake2b(node.encode(), digest_size=8).digest(), "little")


def measured_mask(families: tuple[str, ...] | list[str]) -> int:
    """Bit mask of ``families`` (bit ``i`` = ``SIGNAL_FAMILIES[i]``)."""
    return sum(1 << i for i, family in enumerate(SIGNAL_FAMILIES) if family in families)


def families_of(mask: int) -> tuple[str, ...]:
    """Inverse of :func:`measured_mask` (unknown bits are ignored)."""
    return tuple(family for i, family in enumerate(SIGNAL_FAMILIES) if mask >> i & 1)


def encode(report: NodeReport) -> bytes:
    """The record of ``report`` (:data:`SIZE` bytes)."""
    gpus = report.gpus
    values: list[float | int] = [
        VERSION,
        measured_mask(report.measured),
        min(len(gpus), 0xFFFF),
        0,
        node_id(report.node),
        report.ts,
        report.interval_s,
        min((g.memory_total_mib for g in gpus), default=0.0),
        sum(g.memory_used_mib for g in gpus),
        sum(g.utilization_pct for g in gpus) / len(gpus) if gpus else 0.0,
    ]
    metrics = report.metrics
    values += [getattr(metrics, signal.name) for signal in NODE_SIGNALS]
    latest_intervals = 1 if hist.total(report.histograms.get("runq_us", [])) > 0 else 0
    values += [report.interval_s, latest_intervals, metrics.runq_p99_us]
    for signal in MEAN_SIGNALS:
        values += [getattr(metrics, signal), 0.0]
    for window in RECORD_WINDOWS[1:]:
        values += _window_values(report.windows.get(window))
    return _STRUCT.pack(*values)


def _window_values(window: WindowMetrics | None) -> list[float | int]:
    if window is None:
        return [0.0, 0, 0.0] + [0.0] * (2 * len(MEAN_SIGNALS))
    out: list[float | int] = [window.covered_s, window.intervals, window.runq_p99_us]
    for signal in MEAN_SIGNALS:
        out += [getattr(window, f"{signal}_mean"), getattr(window, f"{signal}_stddev")]
    return out


def decode(payload: bytes) -> dict[str, float | int]:
    """Field name → value of one record (for people and tests; the scheduler decodes in
    bulk); :class:`~interference.codec.PayloadError` for a payload of another size or version."""
    if len(payload) != SIZE:
        raise PayloadError(f"a scheduling record is {SIZE} bytes, got {len(payload)}")
    values = dict(zip((name for name, _ in FIELDS), _STRUCT.unpack(payload), strict=True))
    if values["version"] != VERSION:
        raise PayloadError(
            f"scheduling record version {values['version']} is not {VERSION}; run the same"
            " release of agent and scheduler"
        )
    return values
