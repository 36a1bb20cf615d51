"""The Pending-rate guard of a reload (scheduler.entry.reload_guard): the rate's definition (pods
Pending under the last good configuration too are left out, pods the reload stopped
attempting count as Pending) and the verdicts (too few pods is no verdict), table-driven
on a fake clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from interference_infra.strict import SettingsError
from scheduler.entry.reload_guard import (
    Outcome,
    PendingWindow,
    ReloadGuard,
    ReloadGuardSettings,
    Verdict,
)

# ---- the Pending rate ---------------------------------------------------------------------

Attempt = tuple[float, str, Outcome]
"""(time, pod, its outcome)"""
PLACED, PENDING, ANYWAY = Outcome.PLACED, Outcome.PENDING, Outcome.PENDING_ANYWAY


@pytest.mark.parametrize(
    ("attempts", "now", "expected"),
    [
        pytest.param([], 10.0, (0, 0, 0), id="nothing attempted"),
        pytest.param([(1, "a", PLACED), (2, "b", PENDING)], 10.0, (1, 2, 0), id="one of two"),
        pytest.param(
            [(1, "a", PENDING), (11, "a", PENDING), (21, "a", PENDING)],
            30.0,
            (1, 1, 0),
            id="retries of one pod count once",
        ),
        pytest.param(
            [(1, "a", PENDING), (5, "a", PLACED)], 10.0, (0, 1, 0), id="a pod placed at its retry"
        ),
        pytest.param(
            [(1, "a", PLACED), (5, "a", PENDING)], 10.0, (1, 1, 0), id="the latest attempt counts"
        ),
        pytest.param(
            [(1, "a", PENDING), (50, "b", PLACED)], 61.0, (0, 1, 0), id="an attempt leaves"
        ),
        pytest.param(
            [(1, "a", PENDING), (30, "a", PENDING), (50, "b", PLACED)],
            61.0,
            (1, 2, 0),
            id="a retried pod stays in the window",
        ),
        pytest.param([(1, "a", PENDING)], 61.0, (0, 0, 0), id="exactly window_s old is out"),
        pytest.param(
            [(1, "a", ANYWAY), (2, "b", ANYWAY), (3, "c", PLACED)],
            10.0,
            (0, 1, 2),
            id="Pending under both configurations: not in U nor N",
        ),
        pytest.param(
            [(1, "a", ANYWAY), (5, "a", PENDING)],
            10.0,
            (1, 1, 0),
            id="a pod the old configuration would now place counts",
        ),
        pytest.param([(1, "a", ANYWAY)], 61.0, (0, 0, 0), id="anyway pods leave the window"),
    ],
)
def test_pending_window(
    attempts: list[Attempt], now: float, expected: tuple[int, int, int]
) -> None:
    window = PendingWindow(60.0)
    for at, pod, outcome in attempts:
        window.observe(pod, outcome, at)
    assert window.sample(now) == expected


# ---- verdicts ------------------------------------------------------------------------------

SETTINGS = ReloadGuardSettings(
    window_s=60,
    warn_above=0.15,
    roll_back_above=0.08,
    roll_back_after_s=180,
    watch_for_s=600,
    min_pods=10,
)


@dataclass(frozen=True)
class Step:
    """From ``at`` on, every second: ``pods`` pods attempted, the first ``pending`` of
    them left Pending; checks every second until the next step."""

    at: float
    pods: int
    pending: int
    anyway: int = 0
    """More pods, Pending under the last good configuration too."""
    stranded: int = 0
    """More pods, the reload stopped attempting (a changed scheduler name)."""


def run(
    steps: list[Step], until: float, settings: ReloadGuardSettings = SETTINGS
) -> list[tuple[float, Verdict]]:
    """The verdicts other than ``watching``, with their times (a reload at t=0)."""
    guard = ReloadGuard()
    guard.watch(settings, 0.0)
    seen: list[tuple[float, Verdict]] = []
    now = 0.0
    while now <= until:
        step = [s for s in steps if s.at <= now][-1]
        for i in range(step.pods):
            guard.observe(f"p{i}", i >= step.pending, now)
        for i in range(step.anyway):
            guard.observe(f"claim{i}", False, now, pending_anyway=True)
        guard.observe_stranded((f"other{i}" for i in range(step.stranded)), now)
        verdict = guard.check(now).verdict
        if verdict not in (Verdict.WATCHING, Verdict.IDLE):
            seen.append((now, verdict))
        now += 1.0
    return seen


@pytest.mark.parametrize(
    ("steps", "until", "expected"),
    [
        pytest.param([Step(0, 20, 0)], 700, [(600, Verdict.CONFIRMED)], id="quiet: kept"),
        pytest.param([Step(0, 20, 1)], 700, [(600, Verdict.CONFIRMED)], id="5 % pending: kept"),
        pytest.param(
            [Step(0, 20, 2)],
            700,
            [(180, Verdict.ROLL_BACK)],
            id="10 %: above 8 % for 180 s rolls back, no warning",
        ),
        pytest.param(
            [Step(0, 20, 4)],
            700,
            [(0, Verdict.WARN), (180, Verdict.ROLL_BACK)],
            id="20 %: a warning at once, the roll back after 180 s",
        ),
        pytest.param(
            [Step(0, 20, 4), Step(100, 20, 0), Step(101, 20, 4)],
            700,
            [(0, Verdict.WARN), (281, Verdict.ROLL_BACK)],
            id="a dip below 8 % starts the count again; one warning per reload",
        ),
        pytest.param(
            [Step(0, 5, 5)],
            700,
            [(600, Verdict.UNDECIDED)],
            id="fewer than min_pods, all Pending: neither rolled back nor kept",
        ),
        pytest.param(
            [Step(0, 5, 0), Step(650, 12, 0)],
            700,
            [(600, Verdict.UNDECIDED), (650, Verdict.CONFIRMED)],
            id="fewer than min_pods, all placed: kept once enough pods came",
        ),
        pytest.param(
            [Step(0, 20, 0), Step(500, 0, 0), Step(590, 3, 3)],
            700,
            [(600, Verdict.UNDECIDED)],
            id="enough pods seen but the few in the window Pending: not kept",
        ),
        pytest.param(
            [Step(0, 4, 0, anyway=6)],
            700,
            [(600, Verdict.UNDECIDED)],
            id="pods Pending anyway are no evidence either way",
        ),
        pytest.param(
            [Step(0, 20, 0, anyway=6)],
            700,
            [(600, Verdict.CONFIRMED)],
            id="6 pods waiting on unbound claims under both configurations: kept",
        ),
        pytest.param(
            [Step(0, 20, 0, anyway=100)],
            700,
            [(600, Verdict.CONFIRMED)],
            id="however many pods are Pending anyway",
        ),
        pytest.param(
            [Step(0, 0, 0, stranded=15)],
            700,
            [(0, Verdict.WARN), (180, Verdict.ROLL_BACK)],
            id="15 pods no longer attempted (a scheduler name typo): rolled back",
        ),
        pytest.param(
            [Step(0, 20, 0, stranded=2)],
            700,
            [(180, Verdict.ROLL_BACK)],
            id="2 of 22 pods no longer attempted: above 8 %",
        ),
        pytest.param(
            [Step(0, 20, 0), Step(500, 20, 20)],
            800,
            [(500, Verdict.WARN), (680, Verdict.ROLL_BACK)],
            id="trouble starting late: the watch lasts until it is settled",
        ),
        pytest.param(
            [Step(0, 20, 0), Step(550, 20, 2), Step(650, 20, 0)],
            800,
            [(650, Verdict.CONFIRMED)],
            id="the watch ends once the rate falls",
        ),
    ],
)
def test_verdicts(steps: list[Step], until: float, expected: list[tuple[float, Verdict]]) -> None:
    assert run(steps, until) == expected


def test_a_disabled_guard_never_watches() -> None:
    guard = ReloadGuard()
    guard.watch(ReloadGuardSettings(enabled=False), 0.0)
    guard.observe("p", False, 0.0)
    assert not guard.watching
    assert guard.check(1000.0).verdict is Verdict.IDLE


def test_a_reload_during_a_watch_starts_anew() -> None:
    guard = ReloadGuard()
    guard.watch(SETTINGS, 0.0)
    for i in range(20):
        guard.observe(f"p{i}", False, 1.0)
    guard.watch(SETTINGS, 2.0)
    reading = guard.check(2.0)
    assert (reading.verdict, reading.attempted) == (Verdict.WATCHING, 0)
    for i in range(10):
        guard.observe(f"q{i}", True, 590.0)
    assert guard.check(602.0).verdict is Verdict.CONFIRMED
    assert guard.check(603.0).verdict is Verdict.IDLE


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"warn_above": 1.5}, "warn_above: 1.5 must be a share from 0 to below 1"),
        ({"roll_back_above": -0.1}, "roll_back_above: -0.1 must be a share"),
        ({"window_s": 0}, "window_s: 0 must be a number of seconds > 0"),
        ({"watch_for_s": 100}, "watch_for_s: 100 must be above roll_back_after_s (180.0)"),
        ({"min_pods": 0}, "min_pods: 0 must be an integer ≥ 1"),
    ],
)
def test_settings_name_the_field_and_the_fix(changes: dict[str, float], problem: str) -> None:
    with pytest.raises(SettingsError) as caught:
        ReloadGuardSettings(**changes)  # type: ignore[arg-type]
    assert any(p.startswith(problem) for p in caught.value.problems), caught.value.problems
