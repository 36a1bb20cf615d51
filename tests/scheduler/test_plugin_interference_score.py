"""Quietness score (100 = quiet): the index, its windowed risk, recent load, and the stale
policies for stale, missing and degraded signals."""

from __future__ import annotations

import numpy as np
import pytest

from interference.signals import SIGNAL_FAMILIES, NodeMetrics, WindowMetrics
from scheduler.api.nodes import parse_node
from scheduler.api.pods import parse_pod
from scheduler.cycle.ports import NodeSignals
from scheduler.plugins.interference import (
    InterferenceArgs,
    SignalWindow,
    StalePolicy,
    fresh_signals,
    quietness,
    stale_rows,
)
from tests.builders import node_obj, pod_obj, table_of
from tests.indexed_signals import metrics_with_index, window_with_index

NOW = 1000.0

BURSTY = window_with_index(10.0, 40.0, 30.0)
"""A 10 s window of an antagonist on for 5 s and off for 5 s."""


@pytest.mark.parametrize(
    ("case", "metrics", "windows", "args", "expected"),
    [
        ("quiet", NodeMetrics(), {}, InterferenceArgs(), 100.0),
        ("index", metrics_with_index(30), {}, InterferenceArgs(), 70.0),
        ("saturated", metrics_with_index(100), {}, InterferenceArgs(), 0.0),
        (
            "the run-queue p99 alone does not score (the index already holds it)",
            metrics_with_index(10, runq_p99_us=4000),
            {},
            InterferenceArgs(),
            90.0,
        ),
        (
            "window missing: the latest interval stands in",
            metrics_with_index(5),
            {},
            InterferenceArgs(signal_window="60s"),
            95.0,
        ),
        (
            "a quiet second of a bursty node scores by its window: mean + k·σ",
            metrics_with_index(2),
            {"10s": BURSTY},
            InterferenceArgs(signal_window="10s", risk_k=1.0),
            100 - (40 + 30),
        ),
        (
            "k = 0: the window's mean",
            metrics_with_index(2),
            {"10s": BURSTY},
            InterferenceArgs(signal_window="10s", risk_k=0.0),
            60.0,
        ),
        (
            "risk is capped at 100",
            metrics_with_index(2),
            {"10s": BURSTY},
            InterferenceArgs(signal_window="10s", risk_k=3.0),
            0.0,
        ),
        (
            "the per-interval policy sees only the quiet second",
            metrics_with_index(2),
            {"10s": BURSTY},
            InterferenceArgs(signal_window="latest"),
            98.0,
        ),
        (
            "a window with no interval yet falls back to the latest interval",
            metrics_with_index(7),
            {"10s": WindowMetrics(10.0)},
            InterferenceArgs(signal_window="10s"),
            93.0,
        ),
    ],
)
def test_formula(
    case: str,
    metrics: NodeMetrics,
    windows: dict[str, WindowMetrics],
    args: InterferenceArgs,
    expected: float,
) -> None:
    table = table_of([node_obj("n")])
    table.set_signals(
        {"n": NodeSignals(metrics, updated_at=NOW, windows=windows, measured=SIGNAL_FAMILIES)}
    )
    assert quietness(table, args, NOW)[0] == pytest.approx(expected), case


@pytest.mark.parametrize("window", ["latest", "10s", "60s"])
def test_bursty_node_ranks_below_a_steady_quiet_one_on_windows_only(window: SignalWindow) -> None:
    table = table_of([node_obj("bursty"), node_obj("steady")])
    steady = window_with_index(10.0, 8.0, 1.0)
    table.set_signals(
        {
            "bursty": NodeSignals(
                metrics_with_index(1),
                NOW,
                windows={"10s": BURSTY, "60s": BURSTY},
                measured=SIGNAL_FAMILIES,
            ),
            "steady": NodeSignals(
                metrics_with_index(8),
                NOW,
                windows={"10s": steady, "60s": steady},
                measured=SIGNAL_FAMILIES,
            ),
        }
    )
    bursty, steady_score = quietness(table, InterferenceArgs(signal_window=window), NOW).tolist()
    assert (bursty < steady_score) == (window != "latest")


def test_recent_load_lowers_score_until_next_report() -> None:
    table = table_of([node_obj("n", cpu="8")])
    table.set_signals(
        {"n": NodeSignals(metrics_with_index(20), updated_at=NOW - 1, measured=SIGNAL_FAMILIES)}
    )
    args = InterferenceArgs(recent_load_weight=100.0)
    table.add_pod(parse_pod(pod_obj("a", requests={"cpu": "2"})), "n", NOW)
    assert quietness(table, args, NOW)[0] == pytest.approx(100 - 20 - 25)
    table.add_pod(parse_pod(pod_obj("b", requests={"cpu": "2"})), "n", NOW)
    assert quietness(table, args, NOW)[0] == pytest.approx(100 - 20 - 50)
    table.remove_pod(parse_pod(pod_obj("b")))  # a failed bind is forgotten
    assert quietness(table, args, NOW)[0] == pytest.approx(100 - 20 - 25)
    table.set_signals(
        {"n": NodeSignals(metrics_with_index(30), updated_at=NOW + 1, measured=SIGNAL_FAMILIES)}
    )
    assert quietness(table, args, NOW + 1)[0] == pytest.approx(70)


def test_pods_placed_before_the_report_do_not_count() -> None:
    table = table_of([node_obj("n", cpu="8")])
    table.add_pod(parse_pod(pod_obj("old", requests={"cpu": "4"})), "n", NOW - 10)
    table.set_signals(
        {"n": NodeSignals(metrics_with_index(20), updated_at=NOW - 5, measured=SIGNAL_FAMILIES)}
    )
    assert quietness(table, InterferenceArgs(), NOW)[0] == pytest.approx(80)


def test_confirming_an_assumed_pod_keeps_its_stamp() -> None:
    table = table_of([node_obj("n", cpu="8")])
    table.set_signals(
        {"n": NodeSignals(NodeMetrics(), updated_at=NOW - 1, measured=SIGNAL_FAMILIES)}
    )
    pod = parse_pod(pod_obj("a", requests={"cpu": "4"}))
    table.add_pod(pod, "n", NOW)
    table.set_signals(
        {"n": NodeSignals(metrics_with_index(10), updated_at=NOW + 1, measured=SIGNAL_FAMILIES)}
    )
    table.add_pod(pod, "n", NOW + 2)  # the watch confirms the binding later
    assert quietness(table, InterferenceArgs(), NOW + 2)[0] == pytest.approx(90)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("neutral", 50.0), ("avoid", 0.0), ("reject", 0.0)],
    ids=["neutral", "avoid", "reject"],
)
def test_stale_missing_and_degraded_signals(policy: StalePolicy, expected: float) -> None:
    """Stale (older than 3 intervals, at least 5 s), missing, and degraded (no run-queue
    family measured, e.g. every probe failed: its zeros must not read as the quietest
    node) all follow the stale policy."""
    table = table_of([node_obj(n) for n in ("stale", "missing", "degraded", "fresh", "slow-agent")])
    table.set_signals(
        {
            "stale": NodeSignals(NodeMetrics(), updated_at=NOW - 5.5, measured=SIGNAL_FAMILIES),
            "degraded": NodeSignals(NodeMetrics(), updated_at=NOW, measured=("psi",)),
            "fresh": NodeSignals(
                metrics_with_index(25), updated_at=NOW - 4.5, measured=SIGNAL_FAMILIES
            ),
            "slow-agent": NodeSignals(
                NodeMetrics(), updated_at=NOW - 25, interval_s=10.0, measured=SIGNAL_FAMILIES
            ),
        }
    )
    scores = quietness(table, InterferenceArgs(stale_policy=policy), NOW)
    assert scores.tolist() == [expected, expected, expected, 75.0, 100.0]


def test_signals_arriving_before_the_node_apply_when_it_joins() -> None:
    table = table_of([node_obj("a")])
    table.set_signals(
        {
            "a": NodeSignals(metrics_with_index(10), updated_at=NOW, measured=SIGNAL_FAMILIES),
            "b": NodeSignals(metrics_with_index(60), updated_at=NOW, measured=SIGNAL_FAMILIES),
        }
    )
    table.upsert_node(parse_node(node_obj("b")))
    assert quietness(table, InterferenceArgs(), NOW).tolist() == [90.0, 40.0]


def test_node_absent_from_a_new_snapshot_loses_its_signals() -> None:
    table = table_of([node_obj("a"), node_obj("b")])
    both = {
        "a": NodeSignals(metrics_with_index(10), updated_at=NOW, measured=SIGNAL_FAMILIES),
        "b": NodeSignals(metrics_with_index(20), updated_at=NOW, measured=SIGNAL_FAMILIES),
    }
    table.set_signals(both)
    generation = table.signals_generation
    table.set_signals(dict(both))  # same content, new mapping: nothing changes
    assert table.signals_generation == generation
    table.set_signals({"a": both["a"]})
    assert table.signals_at[table.row_of("b")] == -np.inf
    assert quietness(table, InterferenceArgs(), NOW).tolist() == [90.0, 50.0]


def test_signals_turn_stale_as_time_passes() -> None:
    table = table_of([node_obj("a"), node_obj("b")])
    table.set_signals(
        {
            "a": NodeSignals(metrics_with_index(20), updated_at=NOW, measured=SIGNAL_FAMILIES),
            "b": NodeSignals(metrics_with_index(40), updated_at=NOW + 5, measured=SIGNAL_FAMILIES),
        }
    )
    args = InterferenceArgs()  # fresh for 5 s after each report (1 s interval)
    assert quietness(table, args, NOW + 1).tolist() == [80.0, 60.0]
    assert quietness(table, args, NOW + 5).tolist() == [80.0, 60.0]
    assert quietness(table, args, NOW + 5.5).tolist() == [50.0, 60.0]
    assert quietness(table, args, NOW + 10.5).tolist() == [50.0, 50.0]
    assert quietness(table, args, NOW + 2).tolist() == [80.0, 60.0]  # clock skew


@pytest.mark.parametrize(
    ("case", "ages", "policy", "fresh", "expected"),
    [
        ("none stale", (0.0, 1.0), "neutral", [True, True], [80.0, 60.0]),
        ("one stale", (0.0, 6.0), "neutral", [True, False], [80.0, 50.0]),
        ("every one stale: neutral", (6.0, 7.0), "neutral", [False, False], [50.0, 50.0]),
        ("every one stale: avoid", (6.0, 7.0), "avoid", [False, False], [0.0, 0.0]),
    ],
)
def test_fresh_signals_and_quietness_by_how_many_reports_are_stale(
    case: str,
    ages: tuple[float, float],
    policy: StalePolicy,
    fresh: list[bool],
    expected: list[float],
) -> None:
    """The stale rows, the fresh mask and the score agree however many reports are stale;
    neither answer is a cached array a caller could spoil for the next decision."""
    table = table_of([node_obj("a"), node_obj("b")])
    table.set_signals(
        {
            name: NodeSignals(
                metrics_with_index(index),
                updated_at=NOW - age,
                measured=SIGNAL_FAMILIES,
            )
            for name, index, age in zip(("a", "b"), (20, 40), ages, strict=True)
        }
    )
    args = InterferenceArgs(stale_policy=policy)
    assert stale_rows(table, NOW).tolist() == [i for i, f in enumerate(fresh) if not f], case
    mask = fresh_signals(table, NOW)
    assert mask.tolist() == fresh, case
    mask[:] = ~mask  # the caller's own array
    assert fresh_signals(table, NOW).tolist() == fresh, case
    scores = quietness(table, args, NOW)
    assert scores.tolist() == expected, case
    if not scores.flags.writeable:  # a cached column: read-only, so it cannot be spoiled
        with pytest.raises(ValueError):
            scores[0] = 1.0
    assert quietness(table, args, NOW).tolist() == expected, case
