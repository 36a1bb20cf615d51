"""What the rebalancer takes as evidence (scheduler/rebalancing/evidence.py) and how it reads it
(scheduler/rebalancing/rebalance.py: each look's own rows, the worst breach), table-driven."""

from __future__ import annotations

import math

import numpy as np
import pytest

from interference.signals import NodeMetrics, NodeReport, PodMetrics
from scheduler.api.objects import PodInfo
from scheduler.api.pods import parse_pod
from scheduler.rebalancing.evidence import (
    CLOCK_AHEAD,
    UNMEASURED,
    AgentClocks,
    report_refusal,
)
from scheduler.rebalancing.rebalance import OwnWindow, PodHistory, breach
from scheduler.signals.records import in_clock_window
from tests.builders import pod_obj

NOW = 1_800_000_000.0
NOISY = (0,) * 12 + (50,)  # p99 ≈ 8 ms
QUIET = (200,)


def report(ts: float, measured: tuple[str, ...] = ("runq",), interval_s: float = 1.0) -> NodeReport:
    return NodeReport("node-a", ts, interval_s, NodeMetrics(), measured=measured)


@pytest.mark.parametrize(
    ("ts", "measured", "refused"),
    [
        (NOW, ("runq",), None),
        (NOW - 29, ("psi", "runq"), None),
        (NOW + 29, ("runq",), None),
        (NOW + 31, ("runq",), CLOCK_AHEAD),
        (NOW + 600, ("runq",), CLOCK_AHEAD),
        (NOW - 31, ("runq",), None),  # old, not skewed: the 60 s window needs it
        (NOW - 600, ("runq",), None),  # the window and the node's freshness judge its age
        (math.nan, ("runq",), CLOCK_AHEAD),  # no time at all
        (math.inf, ("runq",), CLOCK_AHEAD),
        (NOW, ("psi",), UNMEASURED),
        (NOW, (), UNMEASURED),
        (NOW + 600, (), CLOCK_AHEAD),  # the clock first, as the signal reader checks
    ],
)
def test_which_reports_are_evidence(
    ts: float, measured: tuple[str, ...], refused: str | None
) -> None:
    assert report_refusal(report(ts, measured), NOW) == refused


def test_the_clock_window_is_the_signal_readers_one_rule() -> None:
    ts = np.array([NOW, NOW + 30, NOW - 30.5, np.nan])
    assert in_clock_window(ts, NOW).tolist() == [True, True, False, False]
    assert [in_clock_window(float(t), NOW) for t in ts] == [True, True, False, False]


@pytest.mark.parametrize(
    ("stamps", "warned"),
    [
        ([NOW - 8, NOW - 7, NOW - 6], [False, True, False]),  # behind, publishing: once
        ([NOW - 1, NOW, NOW + 1], [False, False, False]),  # on time
        ([NOW - 8, NOW - 8, NOW - 8], [False, False, False]),  # silent: stale, not skewed
        ([NOW + 600, NOW + 601, NOW + 602], [False, True, False]),  # ahead, refused
        ([NOW - 8, NOW - 7, NOW, NOW - 8, NOW - 7], [False, True, False, True, False]),
    ],
)
def test_an_agent_publishing_with_a_skewed_clock_is_said_once_per_change(
    stamps: list[float], warned: list[bool]
) -> None:
    clocks = AgentClocks()
    seen = [clocks.note("node-a", report(ts), NOW + i) is not None for i, ts in enumerate(stamps)]
    # the look's own clock advances a second per look, as the stamps do
    assert seen == warned


def test_a_skew_warning_says_which_way_and_what_it_costs() -> None:
    clocks = AgentClocks()
    clocks.note("node-a", report(NOW - 9), NOW)
    skew = clocks.note("node-a", report(NOW - 8), NOW)
    assert skew is not None and skew.offset_s == -8
    assert "8 s behind" in skew.text and "stale on arrival" in skew.text
    assert clocks.skewed() == 1
    clocks.keep_only(set())
    assert clocks.skewed() == 0


def tolerant(max_runq_p99_us: str) -> PodInfo:
    annotations = {"interference.io/max-runq-p99-us": max_runq_p99_us}
    return parse_pod(pod_obj("web-1", "shop", nodeName="node-a", annotations=annotations))


def history(rows: list[tuple[float, tuple[int, ...]]]) -> PodHistory:
    h = PodHistory("uid")
    for at, hist in rows:
        h.add(PodMetrics("shop", "web-1", uid="uid", runq_us=hist), at)
    return h


def test_each_look_judges_its_own_rows_not_only_the_window() -> None:
    # a 3 s burst, then quiet: the 10 s window's merged p99 stays high, the looks' do not
    h = history([(NOW + t, NOISY if t < 3 else QUIET) for t in range(0, 4)])
    first = h.window(NOW + 3, 10.0, 6.0)
    assert first is not None and first.runq_p99_us > 500
    assert first.recent_runq_p99_us is not None and first.recent_runq_p99_us > 500
    for t in range(4, 8):
        h.add(PodMetrics("shop", "web-1", uid="uid", runq_us=QUIET), NOW + t)
    later = h.window(NOW + 7, 10.0, 6.0)
    assert later is not None and later.runq_p99_us > 500  # the burst is still in the window
    assert later.recent_runq_p99_us is not None and later.recent_runq_p99_us < 500
    pod = tolerant("500")
    assert breach(pod, first, None) is not None
    assert breach(pod, later, None) is None
    # no new row since the last look: its slice stands (while the window is fresh)
    again = h.window(NOW + 7.5, 10.0, 6.0)
    assert again is not None and again.recent_runq_p99_us == later.recent_runq_p99_us


@pytest.mark.parametrize(
    ("tolerance", "p99", "severity"),
    [("500", 8000.0, 16.0), ("100", 8000.0, 80.0), ("0", 8000.0, math.inf)],
)
def test_the_severity_of_a_breach_is_measured_over_tolerance(
    tolerance: str, p99: float, severity: float
) -> None:
    pod = tolerant(tolerance)
    found = breach(pod, OwnWindow(10, p99, 400.0, 0.0, recent_runq_p99_us=p99), None)
    assert found is not None and found.severity == severity


@pytest.mark.parametrize(
    ("window", "recent", "breaks"),
    [
        (9.0, 9.0, True),
        (9.0, None, True),  # the look's interval not known apart from the window
        (9.0, 1.0, False),  # a burst the window still holds: the look's own interval is quiet
        (1.0, 9.0, False),  # a spike the window does not confirm
    ],
)
def test_a_reclaim_breach_holds_over_the_window_and_the_looks_interval(
    window: float, recent: float | None, breaks: bool
) -> None:
    annotations = {"interference.io/max-reclaim-stall-ms-per-s": "2"}
    pod = parse_pod(pod_obj("web-1", "shop", nodeName="node-a", annotations=annotations))
    found = breach(pod, None, window, recent)
    assert (found is not None) == breaks
    if found is not None:
        assert found.reclaim and found.severity == 4.5
