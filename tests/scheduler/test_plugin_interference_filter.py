"""Interference tolerance and stale-signal filters."""

from __future__ import annotations

import pytest

from interference.signals import SIGNAL_FAMILIES, NodeMetrics, WindowMetrics
from scheduler.api.objects import (
    ANNOTATION_MAX_INDEX,
    ANNOTATION_MAX_RECLAIM_STALL_MS_PER_S,
    ANNOTATION_MAX_RUNQ_P99_US,
)
from scheduler.api.pods import parse_pod
from scheduler.cycle.ports import NodeSignals
from scheduler.plugins.interference import (
    INDEX_EXCEEDED,
    RECLAIM_EXCEEDED,
    RUNQ_EXCEEDED,
    STALE_SIGNALS,
    InterferenceArgs,
    SignalWindow,
    StalePolicy,
    interference_filter,
)
from scheduler.signals.table import NodeTable
from tests.builders import node_obj, pod_obj, table_of
from tests.indexed_signals import metrics_with_index
from tests.scheduler.filters import or_all_pass

NOW = 1000.0


def _table(metrics: NodeMetrics, age_s: float = 1.0) -> NodeTable:
    table = table_of([node_obj("n", cpu="10")])
    table.set_signals({"n": NodeSignals(metrics, updated_at=NOW - age_s, measured=SIGNAL_FAMILIES)})
    return table


@pytest.mark.parametrize(
    ("annotations", "metrics", "reasons"),
    [
        ({ANNOTATION_MAX_RUNQ_P99_US: "500"}, NodeMetrics(runq_p99_us=499), []),
        ({ANNOTATION_MAX_RUNQ_P99_US: "500"}, NodeMetrics(runq_p99_us=500), []),
        ({ANNOTATION_MAX_RUNQ_P99_US: "500"}, NodeMetrics(runq_p99_us=501), [RUNQ_EXCEEDED]),
        (
            {ANNOTATION_MAX_RECLAIM_STALL_MS_PER_S: "2"},
            NodeMetrics(reclaim_stall_ms_per_s=3),
            [RECLAIM_EXCEEDED],
        ),
        ({ANNOTATION_MAX_INDEX: "40"}, metrics_with_index(41), [INDEX_EXCEEDED]),
        ({ANNOTATION_MAX_INDEX: "40"}, metrics_with_index(40), []),
        (
            {ANNOTATION_MAX_RUNQ_P99_US: "100", ANNOTATION_MAX_INDEX: "10"},
            metrics_with_index(80, runq_p99_us=900),
            [RUNQ_EXCEEDED, INDEX_EXCEEDED],
        ),
        ({}, metrics_with_index(100, runq_p99_us=10_000), []),
    ],
    ids=[
        "runq-below",
        "runq-at-bound",
        "runq-above",
        "reclaim-above",
        "score-above",
        "score-at-bound",
        "two-bounds-exceeded",
        "no-tolerance-no-filter",
    ],
)
def test_tolerance(annotations: dict[str, str], metrics: NodeMetrics, reasons: list[str]) -> None:
    table = _table(metrics)
    pod = parse_pod(pod_obj(annotations=annotations))
    result = or_all_pass(interference_filter(table, pod, InterferenceArgs(), NOW), table)
    assert bool(result.passed[0]) is (not reasons)
    assert _bare(result.reasons_for(0)) == reasons


def _bare(reasons: list[str]) -> list[str]:
    """Reasons without the measurement a decision record appends (`` (measured …)``)."""
    return [reason.split(" (", 1)[0] for reason in reasons]


def test_reasons_carry_the_measurement_against_the_tolerance() -> None:
    table = _table(NodeMetrics(runq_p99_us=2900))
    pod = parse_pod(pod_obj(annotations={ANNOTATION_MAX_RUNQ_P99_US: "500"}))
    result = or_all_pass(
        interference_filter(table, pod, InterferenceArgs(signal_window="latest"), NOW), table
    )
    assert result.reasons_for(0) == [f"{RUNQ_EXCEEDED} (measured 2900 µs > tolerance 500 µs)"]


def test_load_placed_since_report_counts_toward_max_index() -> None:
    table = _table(metrics_with_index(30))
    pod = parse_pod(pod_obj(annotations={ANNOTATION_MAX_INDEX: "40"}))
    args = InterferenceArgs(recent_load_weight=100.0)
    assert or_all_pass(interference_filter(table, pod, args, NOW), table).passed[0]
    # 2 of 10 CPUs placed after the report: index 30 + 100·0.2 = 50 > 40
    table.add_pod(parse_pod(pod_obj("burst", requests={"cpu": "2"})), "n", NOW)
    assert _bare(or_all_pass(interference_filter(table, pod, args, NOW), table).reasons_for(0)) == [
        INDEX_EXCEEDED
    ]
    # a newer report includes that load and replaces the estimate
    table.set_signals(
        {"n": NodeSignals(metrics_with_index(35), updated_at=NOW + 1, measured=SIGNAL_FAMILIES)}
    )
    assert or_all_pass(interference_filter(table, pod, args, NOW + 1), table).passed[0]


@pytest.mark.parametrize(
    ("policy", "age_s", "tolerant_passes", "plain_passes"),
    [
        ("neutral", 60.0, True, True),
        ("avoid", 60.0, True, True),
        ("reject", 60.0, False, False),
        ("reject", 1.0, False, True),
    ],
    ids=[
        "neutral-stale-passes",
        "avoid-stale-passes",
        "reject-stale-fails-everyone",
        "reject-fresh-checks-tolerance",
    ],
)
def test_stale_policies(
    policy: StalePolicy, age_s: float, tolerant_passes: bool, plain_passes: bool
) -> None:
    table = _table(NodeMetrics(runq_p99_us=5000), age_s=age_s)
    args = InterferenceArgs(stale_policy=policy)
    tolerant = parse_pod(pod_obj("t", annotations={ANNOTATION_MAX_RUNQ_P99_US: "100"}))
    plain = parse_pod(pod_obj("p"))
    assert (
        bool(or_all_pass(interference_filter(table, tolerant, args, NOW), table).passed[0])
        is tolerant_passes
    )
    assert (
        bool(or_all_pass(interference_filter(table, plain, args, NOW), table).passed[0])
        is plain_passes
    )
    if policy == "reject" and age_s > 5:
        reasons = or_all_pass(interference_filter(table, plain, args, NOW), table).reasons_for(0)
        assert _bare(reasons) == [STALE_SIGNALS]


@pytest.mark.parametrize("policy", ["neutral", "avoid", "reject"])
def test_degraded_signals_are_stale(policy: StalePolicy) -> None:
    """A fresh report whose run-queue probes all failed (it reads 0 everywhere) is not a
    quiet node: it is treated exactly like a stale one."""
    table = table_of([node_obj("broken"), node_obj("stale")])
    table.set_signals(
        {
            "broken": NodeSignals(NodeMetrics(), updated_at=NOW, measured=("psi", "reclaim")),
            "stale": NodeSignals(NodeMetrics(), updated_at=NOW - 60, measured=SIGNAL_FAMILIES),
        }
    )
    args = InterferenceArgs(stale_policy=policy)
    tolerant = parse_pod(pod_obj("t", annotations={ANNOTATION_MAX_RUNQ_P99_US: "100"}))
    broken, stale = or_all_pass(
        interference_filter(table, tolerant, args, NOW), table
    ).passed.tolist()
    assert broken == stale == (policy != "reject")


@pytest.mark.parametrize(
    ("window", "passes"),
    [("latest", True), ("10s", False), ("60s", False)],
)
def test_tolerances_read_the_cycle_s_window(window: SignalWindow, passes: bool) -> None:
    """A bursty node in a quiet second: its latest p99 is within the tolerance, its
    windows' merged p99 and its reclaim mean + k·σ are not."""
    bursty = WindowMetrics(
        10.0,
        10.0,
        10,
        runq_p99_us=12_000,
        reclaim_stall_ms_per_s_mean=1.0,
        reclaim_stall_ms_per_s_stddev=2.0,
    )
    table = table_of([node_obj("n")])
    metrics = NodeMetrics(runq_p99_us=200, reclaim_stall_ms_per_s=0.1)
    windows = {"10s": bursty, "60s": bursty}
    table.set_signals(
        {"n": NodeSignals(metrics, updated_at=NOW, windows=windows, measured=SIGNAL_FAMILIES)}
    )
    args = InterferenceArgs(signal_window=window, risk_k=1.0)
    for annotation, bound in ((ANNOTATION_MAX_RUNQ_P99_US, "500"),
                              (ANNOTATION_MAX_RECLAIM_STALL_MS_PER_S, "2.5")):  # fmt: skip
        pod = parse_pod(pod_obj("t", annotations={annotation: bound}))
        assert (
            bool(or_all_pass(interference_filter(table, pod, args, NOW), table).passed[0]) is passes
        )


def test_missing_signals_are_stale() -> None:
    table = table_of([node_obj("n")])
    args = InterferenceArgs(stale_policy="reject")
    result = or_all_pass(interference_filter(table, parse_pod(pod_obj()), args, NOW), table)
    assert _bare(result.reasons_for(0)) == [STALE_SIGNALS]
