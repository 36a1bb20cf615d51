"""SignalFrame built from NodeSignals: through each node's scheduling record, as the Redis
follower reads it — what it counts as usable (fail closed) and which index it holds."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from interference import sched_record
from interference.index import IndexReferences
from interference.signals import SIGNAL_FAMILIES, NodeMetrics, NodeReport, WindowMetrics
from scheduler.signal_frame import SIGNAL_COLUMNS, NodeSignals
from scheduler.signal_records import (
    decode_records,
    frame_of_records,
    frame_of_signals,
    record_of_signals,
    signal_columns,
)
from tests.scheduler.frames import stale_nodes

NOW = 1_000_000.0
WINDOW = WindowMetrics(
    10.0,
    covered_s=10.0,
    intervals=10,
    runq_p99_us=9000.0,
    runq_wait_ratio_mean=0.3,
    runq_wait_ratio_stddev=0.2,
    reclaim_stall_ms_per_s_mean=1.0,
    reclaim_stall_ms_per_s_stddev=0.5,
    index_mean=3.0,
    index_stddev=1.0,
)
NOISY = NodeSignals(
    NodeMetrics(runq_p99_us=12_000.0, runq_wait_ratio=0.5, interference_index=1.0),
    updated_at=NOW,
    measured=SIGNAL_FAMILIES,
    windows={"10s": WINDOW},
)


def test_signals_that_do_not_say_what_they_measured_count_as_nothing_measured() -> None:
    frame = frame_of_signals({"unsaid": NodeSignals(NodeMetrics(), updated_at=NOW)})
    assert frame.families("unsaid") == ()
    assert stale_nodes(frame, NOW) == ["unsaid"]  # degraded: treated like a stale report


def test_signals_that_measured_every_family_are_usable_while_fresh() -> None:
    signals = NodeSignals(NodeMetrics(), updated_at=NOW, measured=SIGNAL_FAMILIES)
    frame = frame_of_signals({"full": signals})
    assert set(frame.families("full")) == set(SIGNAL_FAMILIES)
    assert stale_nodes(frame, NOW) == []
    assert stale_nodes(frame, NOW + 60) == ["full"]


def test_the_index_is_the_schedulers_from_the_record_never_the_agents() -> None:
    frame = frame_of_signals({"noisy": NOISY})
    # the agent said 1 (latest) and 3 ± 1 (10 s); the signals say otherwise
    assert frame.columns["index_mean@latest"][0] > 50
    assert frame.columns["index_mean@10s"][0] > 30
    assert frame.columns["index_stddev@10s"][0] > 5
    lied = NodeSignals(
        NodeMetrics(runq_p99_us=12_000.0, runq_wait_ratio=0.5, interference_index=99.0),
        updated_at=NOW,
        measured=SIGNAL_FAMILIES,
        windows={"10s": dataclasses.replace(WINDOW, index_mean=99.0, index_stddev=0.0)},
    )
    other = frame_of_signals({"noisy": lied})
    for column in SIGNAL_COLUMNS:
        assert other.columns[column][0] == frame.columns[column][0], column


def test_the_frame_is_the_followers_decode_of_the_agents_record() -> None:
    """The columns equal those the Redis follower makes of the record the agent writes
    (``sched_record.encode`` of its report) when it reads it at the report's time."""
    report = NodeReport(
        node="noisy",
        ts=NOW,
        interval_s=1.0,
        metrics=NOISY.metrics,
        measured=SIGNAL_FAMILIES,
        windows={"10s": WINDOW},
    )
    payload = sched_record.encode(report)
    assert record_of_signals("noisy", NOISY) == payload
    refs = IndexReferences(runq_p99_us_quiet=2000.0)
    ids = np.array([sched_record.node_id("noisy")], np.uint64)
    decoded = decode_records([payload], ids, NOW)
    expected = signal_columns(decoded.records, refs, NOW)
    frame = frame_of_signals({"noisy": NOISY}, refs)
    for column, values in expected.items():
        assert frame.columns[column][0] == values[0], column
    read_late = frame_of_records(["noisy"], [payload], refs, now=NOW + 1)
    assert read_late.columns["signals_at"][0] == NOW


@pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf])
def test_a_record_the_follower_would_ignore_leaves_the_node_without_signals(bad: float) -> None:
    broken = NodeSignals(NodeMetrics(runq_p99_us=bad), updated_at=NOW, measured=SIGNAL_FAMILIES)
    frame = frame_of_signals({"broken": broken, "fine": NOISY})
    assert not frame.has_record("broken")
    assert frame.has_record("fine")


def test_the_clock_check_applies_when_the_records_are_read_at_a_time() -> None:
    payload = record_of_signals("old", NOISY)
    assert frame_of_records(["old"], [payload]).has_record("old")  # read when written
    assert not frame_of_records(["old"], [payload], now=NOW + 31).has_record("old")
    assert not frame_of_records(["old"], [None]).has_record("old")
