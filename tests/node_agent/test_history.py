"""Windowed signals (node_agent.history): merged histograms, weighted moments, bounds."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry

from interference import hist
from interference.signals import SIGNAL_FAMILIES, NodeMetrics
from node_agent.agent import Agent
from node_agent.health import AgentMetrics
from node_agent.history import IntervalMetrics, SignalHistory, summarize
from node_agent.pods import StaticPodDirectory
from node_agent.settings import AgentSettings

RUNQ = SIGNAL_FAMILIES
"""Every family measured (the run queue, the core, among them)."""


def metrics(index: float = 0.0, wait: float = 0.0, reclaim: float = 0.0) -> NodeMetrics:
    return NodeMetrics(
        interference_index=index, runq_wait_ratio=wait, reclaim_stall_ms_per_s=reclaim
    )


def slots(**counts: int) -> list[int]:
    buckets = [0] * hist.MAX_SLOTS
    for name, count in counts.items():
        buckets[int(name[1:])] = count
    return buckets


def interval(
    index: float, interval_s: float = 1.0, runq: list[int] | None = None
) -> IntervalMetrics:
    return IntervalMetrics(
        0.0, interval_s, tuple(runq or []), index / 100, index / 10, index,
        measured=frozenset(SIGNAL_FAMILIES),
    )  # fmt: skip


ON_OFF = [interval(95.0)] * 5 + [interval(3.0)] * 5
"""An antagonist on for 5 s and off for 5 s."""


@pytest.mark.parametrize(
    ("case", "intervals", "mean", "peak", "stddev"),
    [
        ("no interval", [], 0.0, 0.0, 0.0),
        ("steady", [interval(10.0)] * 10, 10.0, 10.0, 0.0),
        ("on/off antagonist", ON_OFF, 49.0, 95.0, 46.0),
        ("a longer interval weighs more", [interval(0.0, 3.0), interval(100.0, 1.0)], 25.0, 100.0,
         math.sqrt(0.75 * 25**2 + 0.25 * 75**2)),
    ],
)  # fmt: skip
def test_index_moments(
    case: str, intervals: list[IntervalMetrics], mean: float, peak: float, stddev: float
) -> None:
    window = summarize(10.0, intervals)
    assert window.intervals == len(intervals), case
    assert window.index_mean == pytest.approx(mean), case
    assert window.index_max == pytest.approx(peak), case
    assert window.index_stddev == pytest.approx(stddev), case
    # wait ratio and reclaim follow the same moments (they are index / 100 and / 10 here)
    assert window.runq_wait_ratio_mean == pytest.approx(mean / 100), case
    assert window.reclaim_stall_ms_per_s_stddev == pytest.approx(stddev / 10), case


MEAN_AND_STDDEV_SIGNALS = (
    "throttled_ms_per_s",
    "psi_cpu_some",
    "psi_mem_some",
    "net_drops_per_s",
)
"""The other signals of the index, carried as mean and σ per window."""


@pytest.mark.parametrize("signal", MEAN_AND_STDDEV_SIGNALS)
@pytest.mark.parametrize(
    ("case", "values", "interval_s", "mean", "stddev"),
    [
        ("steady", [4.0] * 10, [1.0] * 10, 4.0, 0.0),
        ("on/off", [90.0] * 5 + [10.0] * 5, [1.0] * 10, 50.0, 40.0),
        ("a longer interval weighs more", [0.0, 100.0], [3.0, 1.0], 25.0,
         math.sqrt(0.75 * 25**2 + 0.25 * 75**2)),
        ("one interval", [7.5], [2.0], 7.5, 0.0),
    ],
)  # fmt: skip
def test_the_other_index_signals_get_weighted_mean_and_stddev(
    signal: str,
    case: str,
    values: list[float],
    interval_s: list[float],
    mean: float,
    stddev: float,
) -> None:
    """Through :meth:`SignalHistory.add` (what the agent calls): each interval's value of
    ``signal`` enters its windows, weighted by the interval's length."""
    history = SignalHistory((10, 60))
    ended_at = 0.0
    for value, length in zip(values, interval_s, strict=True):
        ended_at += length
        history.add(ended_at, length, NodeMetrics(**{signal: value}), slots(s3=1), RUNQ)
    window = history.windows(ended_at)["60s"]
    assert window.intervals == len(values), case
    assert getattr(window, f"{signal}_mean") == pytest.approx(mean), case
    assert getattr(window, f"{signal}_stddev") == pytest.approx(stddev), case
    # Only that signal moved: every other mean and σ stays 0.
    for other in MEAN_AND_STDDEV_SIGNALS:
        if other != signal:
            assert getattr(window, f"{other}_mean") == 0.0, (case, other)
            assert getattr(window, f"{other}_stddev") == 0.0, (case, other)


def test_each_window_keeps_only_its_own_span_of_the_other_signals() -> None:
    """60 s of quiet, then 10 s of throttling and pressure: the 10 s window sees only the
    burst, the 60 s window its share."""
    history = SignalHistory((10, 60))
    for second in range(1, 61):
        loud = second > 50
        history.add(
            float(second),
            1.0,
            NodeMetrics(
                throttled_ms_per_s=200.0 if loud else 0.0,
                psi_cpu_some=30.0 if loud else 0.0,
                psi_mem_some=6.0 if loud else 0.0,
                net_drops_per_s=12.0 if loud else 0.0,
            ),
            slots(s3=1),
            RUNQ,
        )
    windows = history.windows(60.0)
    assert windows["10s"].throttled_ms_per_s_mean == pytest.approx(200.0)
    assert windows["10s"].psi_cpu_some_stddev == pytest.approx(0.0)
    assert windows["60s"].throttled_ms_per_s_mean == pytest.approx(200.0 / 6)
    assert windows["60s"].psi_cpu_some_mean == pytest.approx(5.0)
    assert windows["60s"].psi_mem_some_mean == pytest.approx(1.0)
    assert windows["60s"].net_drops_per_s_mean == pytest.approx(2.0)
    # σ of a 1-in-6 on/off signal: value · √(p(1 − p)), p = 1/6
    assert windows["60s"].net_drops_per_s_stddev == pytest.approx(12.0 * math.sqrt(5) / 6)


def test_no_interval_gives_zero_moments_of_every_signal() -> None:
    window = summarize(10.0, [])
    for signal in MEAN_AND_STDDEV_SIGNALS:
        assert getattr(window, f"{signal}_mean") == 0.0
        assert getattr(window, f"{signal}_stddev") == 0.0


def test_p99_comes_from_the_merged_histogram_not_from_per_second_p99s() -> None:
    """Nine quiet seconds of 100 wake-ups at ~4 µs and one second with 20 waits at ~2 ms:
    2 % of the window's wake-ups are slow, so its p99 is slow — while 9 of 10 per-second
    p99s are quiet."""
    quiet, burst = slots(s2=100), slots(s2=80, s11=20)
    intervals = [interval(0.0, runq=quiet)] * 9 + [interval(0.0, runq=burst)]
    window = summarize(10.0, intervals)
    per_second = sorted(hist.percentile(list(r.runq_us), 0.99) for r in intervals)
    assert per_second[len(per_second) // 2] < 8  # the median second is quiet
    assert 2048 <= window.runq_p99_us <= 4095  # the window's p99 is in the 2–4 ms slot


def test_windows_cover_their_span_and_memory_is_bounded() -> None:
    history = SignalHistory((10, 60))
    for second in range(1, 201):
        index = 95.0 if second % 10 < 5 else 3.0
        history.add(float(second), 1.0, metrics(index), slots(s3=10), RUNQ)
    assert len(history) == 60  # older intervals are dropped
    windows = history.windows(200.0)
    assert windows["10s"].intervals == 10 and windows["10s"].covered_s == 10.0
    assert windows["60s"].intervals == 60
    assert windows["10s"].index_mean == pytest.approx(49.0)
    assert windows["60s"].index_stddev == pytest.approx(46.0)
    assert history.windows(1000.0)["60s"].intervals == 0  # nothing that recent


def test_intervals_without_the_run_queue_stay_out_of_the_windows() -> None:
    """A probe failure for a few seconds: its zeros are unknown, not quiet."""
    history = SignalHistory((10,))
    for second in range(1, 11):
        measured = ("psi",) if second > 5 else RUNQ
        history.add(float(second), 1.0, metrics(80.0 if second <= 5 else 0.0), [], measured)
    window = history.windows(10.0)["10s"]
    assert window.intervals == 5
    assert window.index_mean == 80.0


def test_spans_must_be_positive() -> None:
    with pytest.raises(ValueError, match="spans must be > 0"):
        SignalHistory((10, 0))


def test_the_agent_publishes_both_windows_with_each_report() -> None:
    settings = AgentSettings(node_name="windows", probes=("taskstats",), ncpu=1)
    agent = Agent(settings, StaticPodDirectory(), metrics=AgentMetrics(CollectorRegistry()))
    try:
        agent.start()
        reports = [agent.measure() for _ in range(3)]
    finally:
        agent.close()
    last = reports[-1]
    assert set(last.windows) == {"10s", "60s"}
    assert last.windows["10s"].intervals == 3 and last.windows["60s"].intervals == 3
    assert last.windows["10s"].index_max == max(r.metrics.interference_index for r in reports)


def test_a_signal_averages_only_the_intervals_that_measured_its_family() -> None:
    history = SignalHistory((10.0,))
    history.add(1.0, 1.0, NodeMetrics(psi_cpu_some=40.0, net_drops_per_s=8.0), [1], RUNQ)
    # PSI and the network not read this interval: their zeros mean "unknown"
    history.add(2.0, 1.0, NodeMetrics(), [1], ("runq", "reclaim", "throttle"))
    window = history.windows(2.0)["10s"]
    assert window.intervals == 2
    assert window.psi_cpu_some_mean == 40.0 and window.psi_cpu_some_stddev == 0.0
    assert window.net_drops_per_s_mean == 8.0
    assert window.throttled_ms_per_s_mean == 0.0  # measured both times, quiet both times
