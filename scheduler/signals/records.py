"""Scheduling records (:mod:`interference.sched_record`) decoded in bulk and checked as the
untrusted input they are.

``MGET`` hands the follower one payload per known node; :func:`decode_records` joins
the well-sized ones into one buffer, views it as a numpy structured array
(:data:`RECORD_DTYPE`, built from the layout's own field list) and checks every field
with vectorised comparisons — no Python work per field. A record is rejected, with the
first reason that applies (:data:`REJECT_REASONS`), when:

- ``size``: it is not exactly one record long (a longer payload — lists appended — or
  a truncated one);
- ``version``: another layout version;
- ``node``: its ``node_id`` is not the id of the node whose key holds it (copied from
  another node's key);
- ``clock``: its ``ts`` is more than ``max_skew_s`` (30 s) from the scheduler's clock,
  either way (a report dated ahead would otherwise outrank the node's real ones);
- ``interval``: ``interval_s`` outside 0.1 s – ``max_interval_s`` (the longest interval
  the cluster's agents are configured with: a record claiming a longer one would stay
  fresh for three of them after its agent stopped);
- ``value``: a negative, NaN or infinite signal, a negative count, or a measured family
  bit this release does not know.

:func:`signal_columns` turns accepted records into frame columns
(:mod:`scheduler.signals.frame`), computing the interference index from the signals with
the scheduler's own references (:mod:`scheduler.signals.index_columns`): per window, ``index_mean``
is the index of the signals' means and ``index_stddev`` the index of mean + σ minus it
(how far one σ of burstiness moves the index), so the risk term ``index_mean + k ·
index_stddev`` reads as the index at mean + k·σ to first order. A window with no interval
yet (agent warming up) falls back to the latest interval, as the agent's own windows do.
A record's freshness counts from the earlier of its ``ts`` and the time the scheduler
read it, so a record dated ahead (within the clock skew allowed) does not outlive its
agent by that much: a node whose agent stops is stale at most ``stale_after_s`` of the
longest allowed interval after its last record was read (docs/design.md §7).

:func:`frame_of_records` is that decode and those columns as one frame, and
:func:`frame_of_signals` the way in-process :class:`~scheduler.signals.frame.NodeSignals`
(``interference simulate``, tests) reach a decision: each node's record encoded as its
agent writes it, then read back the same way — one path from signals to a decision, so
the agent's own index never reaches one (docs/design.md §8).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
from numpy.typing import NDArray

from interference import freshness, sched_record
from interference.index import IndexReferences
from interference.sched_record import (
    FIELDS,
    MEAN_SIGNALS,
    RECORD_WINDOWS,
    SIZE,
    VERSION,
)
from interference.signals import CORE_FAMILIES, SIGNAL_FAMILIES, NodeReport
from scheduler.signals.frame import (
    COLUMNS,
    LATEST_WINDOW,
    SIGNAL_COLUMNS,
    NodeSignals,
    SignalFrame,
    no_signal_value,
    window_column,
)
from scheduler.signals.index_columns import index_column

_NUMPY_CODES = {"H": "<u2", "Q": "<u8", "d": "<f8", "q": "<i8"}
RECORD_DTYPE = np.dtype([(name, _NUMPY_CODES[code]) for name, code in FIELDS])
"""One record as numpy sees it (packed, little-endian, the layout's field order)."""
if RECORD_DTYPE.itemsize != SIZE:  # pragma: no cover - the layout and its dtype disagree
    raise ImportError(f"record dtype is {RECORD_DTYPE.itemsize} bytes, the layout {SIZE}")

REJECT_REASONS = ("size", "version", "node", "clock", "interval", "value")
"""Why a record is ignored, in the order the checks run (``unknown_node`` is counted by
the follower for records of names that are no Node)."""
MAX_CLOCK_SKEW_S = 30.0
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 60.0
_OFFSETS = {name: spec[1] for name, spec in (RECORD_DTYPE.fields or {}).items()}
_FLOAT_WORDS = np.array([_OFFSETS[n] // 8 for n, c in FIELDS if c == "d"])
_COUNT_WORDS = np.array([_OFFSETS[n] // 8 for n, c in FIELDS if c == "q"])
"""The 8-byte words of a record holding its floats and counts: every such field starts on
a multiple of 8, so a batch of records can be checked as one float64 (int64) matrix."""
if SIZE % 8 or any(_OFFSETS[n] % 8 for n, c in FIELDS if c in "dq"):  # pragma: no cover
    raise ImportError("scheduling record floats and counts must be 8-byte aligned")
_KNOWN_FAMILY_BITS = (1 << len(SIGNAL_FAMILIES)) - 1
_CORE_BITS = sum(1 << SIGNAL_FAMILIES.index(f) for f in CORE_FAMILIES)


@overload
def in_clock_window(ts: float, now: float, max_skew_s: float = ...) -> bool: ...
@overload
def in_clock_window(
    ts: NDArray[np.float64], now: float, max_skew_s: float = ...
) -> NDArray[np.bool_]: ...
def in_clock_window(
    ts: float | NDArray[np.float64], now: float, max_skew_s: float = MAX_CLOCK_SKEW_S
) -> bool | NDArray[np.bool_]:
    """``|ts − now| ≤ max_skew_s``: a report's time the scheduler believes (the ``clock``
    check; the rebalancer applies it to each report it reads rows from). NaN is outside."""
    if isinstance(ts, np.ndarray):
        within: NDArray[np.bool_] = np.abs(ts - now) <= max_skew_s
        return within
    return abs(ts - now) <= max_skew_s


@dataclass(frozen=True, slots=True)
class DecodedRecords:
    """The outcome of one bulk decode."""

    positions: NDArray[np.intp]
    """Position (in the payload list) of each accepted record."""
    records: NDArray[np.void]
    """The accepted records (:data:`RECORD_DTYPE`), in ``positions`` order."""
    rejected: dict[str, NDArray[np.intp]]
    """Reason → positions of the records rejected for it (reasons with none left out)."""


def decode_records(
    payloads: Sequence[bytes | None],
    expected_ids: NDArray[np.uint64],
    now: float,
    max_skew_s: float = MAX_CLOCK_SKEW_S,
    max_interval_s: float = MAX_INTERVAL_S,
) -> DecodedRecords:
    """Check and decode ``payloads[i]``, the record under the key of the node whose id is
    ``expected_ids[i]``; ``None`` (no record) is neither accepted nor rejected."""
    present = np.fromiter((p is not None for p in payloads), np.bool_, len(payloads))
    sizes = np.fromiter((len(p) if p is not None else 0 for p in payloads), np.intp, len(payloads))
    rejected: dict[str, NDArray[np.intp]] = {}
    wrong_size = present & (sizes != SIZE)
    if wrong_size.any():
        rejected["size"] = np.flatnonzero(wrong_size)
    positions = np.flatnonzero(present & ~wrong_size)
    if len(positions) == len(payloads):  # the usual case: every node has a record
        buffer = b"".join(payloads)  # type: ignore[arg-type]
    else:
        buffer = b"".join([payloads[i] or b"" for i in positions.tolist()])
    records = np.frombuffer(buffer, dtype=RECORD_DTYPE)
    keep = np.ones(len(records), np.bool_)

    def reject(reason: str, bad: NDArray[np.bool_]) -> None:
        bad = bad & keep
        if bad.any():
            rejected[reason] = positions[bad]
            keep[bad] = False

    reject("version", records["version"] != VERSION)
    reject("node", records["node_id"] != expected_ids[positions])
    reject("clock", ~in_clock_window(records["ts"], now, max_skew_s))
    interval = records["interval_s"]
    reject("interval", ~((interval >= MIN_INTERVAL_S) & (interval <= max_interval_s)))
    bad_value = (records["measured"] & ~np.uint16(_KNOWN_FAMILY_BITS)) != 0
    floats = np.frombuffer(buffer, "<f8").reshape(len(records), SIZE // 8)[:, _FLOAT_WORDS]
    bad_value |= ~((floats >= 0) & (floats < np.inf)).all(axis=1)  # NaN fails both
    counts = np.frombuffer(buffer, "<i8").reshape(len(records), SIZE // 8)[:, _COUNT_WORDS]
    bad_value |= (counts < 0).any(axis=1)
    reject("value", bad_value)
    return DecodedRecords(positions[keep], records[keep], rejected)


def signal_columns(
    records: NDArray[np.void], refs: IndexReferences, received_at: float = np.inf
) -> dict[str, NDArray[np.float64]]:
    """Frame columns (:data:`scheduler.signals.frame.SIGNAL_COLUMNS`) of checked records
    read at ``received_at``: every declared column with a record field
    (:data:`scheduler.signals.frame.COLUMNS`) copied from it, the index columns computed,
    ``signals_at = min(ts, received_at)`` and ``fresh_until = signals_at + max(5,
    round(3 · interval_s))`` for a record with the core families (``-inf`` otherwise)."""
    ts = np.minimum(records["ts"].astype(np.float64), received_at)
    interval = records["interval_s"].astype(np.float64)
    measured = records["measured"].astype(np.uint16)
    stale_after = np.maximum(
        freshness.MIN_STALE_AFTER_S, np.round(freshness.MISSED_INTERVALS * interval)
    )
    core = (measured & np.uint16(_CORE_BITS)) == _CORE_BITS
    columns: dict[str, NDArray[np.float64]] = {
        "signals_at": ts,
        "fresh_until": np.where(core, ts + stale_after, -np.inf),
    }
    for column in COLUMNS:
        if column.record_field is not None and not column.windowed:
            values = records[column.record_field].astype(np.float64)
            if column.family is not None:
                bit = np.uint16(1 << SIGNAL_FAMILIES.index(column.family))
                values = np.where((measured & bit) != 0, values, column.no_signal)
            columns[column.name] = values
    index = _window_indices(records, measured, refs)
    latest_index = index[LATEST_WINDOW]
    for window in RECORD_WINDOWS:
        # a window with no interval yet (agent warming up) reads as the latest interval
        empty = None if window == LATEST_WINDOW else records[f"{window}.intervals"] == 0
        for column in COLUMNS:
            if not column.windowed:
                continue
            if column.record_field is not None:
                values = records[f"{window}.{column.record_field}"].astype(np.float64)
                fallback = records[f"{LATEST_WINDOW}.{column.record_field}"]
            else:
                values, fallback = index[window][column.name], latest_index[column.name]
            if empty is not None:
                values = np.where(empty, fallback, values)
            columns[window_column(window, column.name)] = values
    return columns


def _window_indices(
    records: NDArray[np.void], measured: NDArray[np.uint16], refs: IndexReferences
) -> dict[str, dict[str, NDArray[np.float64]]]:
    """Window → its computed columns (``index_mean``, ``index_stddev``). The index of
    every window's means and of its means + σ is one :func:`index_column` over the six
    variants stacked (numpy's per-call cost, not the rows, dominates a poll of a few
    hundred records)."""

    def field(window: str, name: str) -> NDArray[np.float64]:
        values: NDArray[np.float64] = records[f"{window}.{name}"].astype(np.float64)
        return values

    n, windows = len(records), RECORD_WINDOWS
    stacked: dict[str, NDArray[np.float64]] = {}
    for signal in MEAN_SIGNALS:
        means = [field(w, f"{signal}_mean") for w in windows]
        spreads = [m + field(w, f"{signal}_stddev") for w, m in zip(windows, means, strict=True)]
        stacked[signal] = np.concatenate(means + spreads)
    stacked["runq_p99_us"] = np.tile(np.concatenate([field(w, "runq_p99_us") for w in windows]), 2)
    index = index_column(stacked, np.tile(measured, 2 * len(windows)), refs)
    index = index.reshape(2, len(windows), n)
    return {
        window: {"index_mean": index[0, i], "index_stddev": index[1, i] - index[0, i]}
        for i, window in enumerate(windows)
    }


_COMPUTED = frozenset({"signals_at", "fresh_until", "index_mean", "index_stddev"})
"""The declared columns :func:`signal_columns` computes; every other is a record field."""


def _undecodable_columns() -> list[str]:
    """Declared columns :func:`signal_columns` cannot fill: with no record field and no
    computation, or naming a field the record does not have."""
    fields = {name for name, _ in FIELDS}
    bad = []
    for column in COLUMNS:
        field = column.record_field
        where = f"{LATEST_WINDOW}.{field}" if column.windowed else field
        if (field is None) != (column.name in _COMPUTED) or (
            field is not None and where not in fields
        ):
            bad.append(column.name)
    return bad


if _undecodable_columns():  # pragma: no cover - the declaration and the layout disagree
    raise ImportError(f"signal columns without a source: {_undecodable_columns()}")


DEFAULT_REFERENCES = IndexReferences()
"""The index references a frame is computed with unless the caller passes its own (the
scheduler's default ``redis.index_references``)."""


def frame_of_records(
    names: Sequence[str],
    payloads: Sequence[bytes | None],
    refs: IndexReferences = DEFAULT_REFERENCES,
    now: float | None = None,
    max_interval_s: float = MAX_INTERVAL_S,
) -> SignalFrame:
    """The frame of ``names[i]``'s scheduling record ``payloads[i]`` (``None``: no record),
    checked and turned into columns as the Redis follower does it — :func:`decode_records`,
    then :func:`signal_columns` with ``refs`` — so every index a decision reads is the one
    the scheduler computes from a record (docs/design.md §8). A rejected or missing record
    leaves its row without signals.

    ``now`` is when the records are read: the ``clock`` check runs against it and a record
    counts as read no later than it. ``None`` takes each record as read when it was
    written — what the follower keeps of a node it polled in time (the replay of a trace,
    in-process sources): no clock check, ``signals_at`` is the record's ``ts``."""
    names = tuple(names)
    ids = np.fromiter(map(sched_record.node_id, names), np.uint64, len(names))
    if now is None:
        decoded = decode_records(payloads, ids, 0.0, np.inf, max_interval_s)
        received_at = np.inf
    else:
        decoded = decode_records(payloads, ids, now, MAX_CLOCK_SKEW_S, max_interval_s)
        received_at = now
    columns = {name: np.full(len(names), no_signal_value(name)) for name in SIGNAL_COLUMNS}
    measured = np.zeros(len(names), np.uint16)
    positions, records = decoded.positions, decoded.records
    if len(positions):
        for column, values in signal_columns(records, refs, received_at).items():
            columns[column][positions] = values
        measured[positions] = records["measured"]
    return SignalFrame.build(names, columns, measured)


def record_of_signals(node: str, signals: NodeSignals) -> bytes:
    """The scheduling record an agent writes for ``signals`` of ``node``
    (:func:`interference.sched_record.encode`)."""
    report = NodeReport(
        node=node,
        ts=signals.updated_at,
        interval_s=signals.interval_s,
        metrics=signals.metrics,
        measured=tuple(signals.measured),
        windows=dict(signals.windows),
    )
    return sched_record.encode(report)


def frame_of_signals(
    signals: Mapping[str, NodeSignals],
    refs: IndexReferences = DEFAULT_REFERENCES,
    max_interval_s: float = MAX_INTERVAL_S,
) -> SignalFrame:
    """The frame of in-process :class:`NodeSignals` (tests, small in-memory sources): each
    node's scheduling record encoded as its agent writes it and read back by
    :func:`frame_of_records` — the one path from signals to a decision. The index the
    agent computed (``interference_index``, a window's ``index_mean``) is not in a record
    and reaches no decision; NaN, negative or infinite signals make a record the follower
    ignores, so such a node has no signals."""
    names = tuple(signals)
    payloads = [record_of_signals(name, signals[name]) for name in names]
    return frame_of_records(names, payloads, refs, max_interval_s=max_interval_s)
