"""The windowed policy against an antagonist that is on for 5 s and off for 5 s, on
synthetic signals through the agent's real history and the scheduler's real scheduling cycle (the
kernel run of the same experiment is a bench: it needs root, cgroups and stress-ng).

Each second for 2 minutes both nodes report — an interval's run-queue histogram and wait
ratio, the windows the agent's history makes of them, read by the scheduler through the
node's scheduling record as from Redis; the cycle then places one pod. The per-second
policy (``signal_window: latest``) follows the antagonist's quiet seconds and lands on it
about half the time; the 10 s and 60 s windows (the p99 of the window's merged histogram,
the wait ratio's mean + k·σ) avoid it in at least 95 % of decisions."""

from __future__ import annotations

import pytest

from interference import hist
from interference.signals import NodeMetrics
from node_agent.history import SignalHistory
from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.ports import NodeSignals
from scheduler.cycle.settings import Profile
from scheduler.plugins.interference import SignalWindow
from tests.builders import node_obj, pod_obj, table_of
from tests.scheduler.profiles import interference_settings

DURATION_S = 120
STEADY_P99_US = (4500.0, 5000.0, 5500.0, 4800.0)
"""The steady node: a little busy every second (above the 4 ms quiet point), never
saturated."""


STEADY_WAIT_RATIO = 0.3


def on_off_p99_us(second: int) -> float:
    """The antagonist: 30 ms run-queue p99 while on, a quiet 300 µs while off."""
    return 30_000.0 if second % 10 < 5 else 300.0


def on_off_wait_ratio(second: int) -> float:
    """The antagonist's wait ratio: 1.5 tasks waiting per CPU while on, 0.02 while off."""
    return 1.5 if second % 10 < 5 else 0.02


def runq_histogram(tail_us: float) -> list[int]:
    """An interval's 100 wake-ups: 90 waited about 64 µs, 10 about ``tail_us`` (its p99)."""
    buckets = [0] * hist.MAX_SLOTS
    buckets[hist.slot_of(64)] += 90
    buckets[hist.slot_of(int(tail_us))] += 10
    return hist.trimmed(buckets)


def avoidance(window: SignalWindow, risk_k: float = 1.0) -> float:
    """Share of decisions that did not place the pod on the antagonist's node."""
    table = table_of([node_obj("antagonist"), node_obj("steady")])
    cycle = SchedulingCycle(
        interference_settings(
            Profile(scores=(("NodeResourcesFit", 0.0), ("GpuPacking", 0.0))),
            signal_window=window,
            risk_k=risk_k,
            recent_load_weight=0.0,
        ),
        seed=7,
    )
    histories = {"antagonist": SignalHistory(), "steady": SignalHistory()}
    avoided = 0
    for second in range(1, DURATION_S + 1):
        now = 1_000.0 + second
        tails = {"antagonist": on_off_p99_us(second), "steady": STEADY_P99_US[second % 4]}
        waits = {"antagonist": on_off_wait_ratio(second), "steady": STEADY_WAIT_RATIO}
        snapshot = {}
        for node, tail in tails.items():
            runq = runq_histogram(tail)
            p99 = hist.percentile(runq, 0.99)
            metrics = NodeMetrics(runq_p99_us=p99, runq_wait_ratio=waits[node])
            histories[node].add(now, 1.0, metrics, runq, ("runq",))
            windows = histories[node].windows(now)
            snapshot[node] = NodeSignals(metrics, now, measured=("runq",), windows=windows)
        table.set_signals(snapshot)
        result = cycle.schedule(parse_pod(pod_obj(f"latency-{second}")), table, now)
        avoided += result.node == "steady"
    return avoided / DURATION_S


def test_windows_avoid_an_on_off_antagonist_in_its_quiet_seconds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rates = {window: avoidance(window) for window in ("latest", "10s", "60s")}
    with capsys.disabled():
        print(
            "\non/off antagonist, share of decisions avoiding it over "
            f"{DURATION_S} s: "
            + ", ".join(f"{window} {rate:.0%}" for window, rate in rates.items())
        )
    assert rates["10s"] >= 0.95
    assert rates["60s"] >= 0.95
    assert rates["latest"] <= 0.6  # the per-second policy follows the quiet seconds


def test_without_the_risk_term_the_window_mean_still_ranks_the_steady_node_first() -> None:
    assert avoidance("10s", risk_k=0.0) >= 0.95
