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
from scheduler.plugins.base import Score
from scheduler.signals.frame import (
    COLUMNS,
    COLUMNS_BY_NAME,
    SIGNAL_COLUMNS,
    SIGNAL_WINDOWS,
    UNKNOWN,
    NodeSignals,
    window_column,
)
from scheduler.signals.node_columns import WindowColumns
from scheduler.signals.records import (
    decode_records,
    frame_of_records,
    frame_of_signals,
    record_of_signals,
    signal_columns,
)
from tests.builders import node_obj, table_of
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


def test_every_declared_column_is_a_frame_column_and_a_table_view() -> None:
    table = table_of([node_obj("n")])
    frame = frame_of_signals({"n": NOISY})
    for column in COLUMNS:
        if column.windowed:
            names = [window_column(window, column.name) for window in SIGNAL_WINDOWS]
            assert column.name in {f.name for f in dataclasses.fields(WindowColumns)}
            assert all(hasattr(table.windows[w], column.name) for w in SIGNAL_WINDOWS)
        else:
            names = [column.name]
            assert column.name in table.node_signals
        assert all(name in frame.columns for name in names), column.name
    assert set(SIGNAL_COLUMNS) == set(frame.columns)


def test_the_records_node_signals_are_columns_of_the_same_name() -> None:
    for signal in sched_record.NODE_SIGNALS:
        column = COLUMNS_BY_NAME[signal.name]
        assert (column.record_field, column.family) == (signal.name, signal.family)
        assert column.no_signal == UNKNOWN
        assert signal.family in SIGNAL_FAMILIES


def test_a_plugin_may_read_only_declared_columns_and_reading_any_uses_signals() -> None:
    def no_preference(state: object, feasible: object) -> None:
        return None

    reader = Score("Reader", "memory pressure", no_preference, 1.0, signals=("psi_mem_some_avg10",))
    assert reader.uses_signals
    with pytest.raises(ValueError, match="no signal column psi_typo"):
        Score("Typo", "a column nobody declared", no_preference, 1.0, signals=("psi_typo",))
