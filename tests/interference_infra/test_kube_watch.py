"""The shared list-then-watch loop, driven by a scripted source: what it does after a
410, an expected failure, a bug in the handler, and a watch that ends at once."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

import pytest

from interference_infra.kube_watch import Backoff, Gone, list_and_watch

Step = Callable[[], tuple[str, int]]


class ApiDown(Exception):
    retry_after_s = 0.0


class Script:
    """A ListWatch whose relists and follows happen as scripted; records the calls."""

    def __init__(self, follows: list[Step]) -> None:
        self.follows = follows
        self.calls: list[str] = []
        self.stop = RecordingStop()

    def relist(self) -> str:
        self.calls.append("relist")
        return "10"

    def follow(self, resource_version: str, stop: threading.Event) -> tuple[str, int]:
        self.calls.append(f"follow@{resource_version}")
        step = self.follows.pop(0)
        if not self.follows:
            self.stop.set()
        return step()


class RecordingStop(threading.Event):
    """A stop event whose waits return at once and are recorded (no real sleeping)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(round(timeout or 0.0, 3))
        return self.is_set()


def events(count: int, resource_version: str = "20") -> Step:
    return lambda: (resource_version, count)


def raises(error: Exception) -> Step:
    def step() -> tuple[str, int]:
        raise error

    return step


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every scripted watch takes no time: "ended at once" never depends on the machine."""
    monkeypatch.setattr("interference_infra.kube_watch.monotonic", lambda: 100.0)


def run(script: Script) -> None:
    backoff = Backoff(1.0, 8.0, random.Random(1))
    list_and_watch(script, script.stop, backoff, name="pods informer", expected=(ApiDown,))


def test_events_resume_from_the_last_resource_version() -> None:
    script = Script([events(3, "20"), events(1, "25")])
    run(script)
    assert script.calls == ["relist", "follow@10", "follow@20"]
    assert script.stop.waits == []


def test_gone_relists_at_once_then_backs_off_when_it_repeats() -> None:
    script = Script([raises(Gone("too old")), raises(Gone("too old")), events(1)])
    run(script)
    assert script.calls == ["relist", "follow@10", "relist", "follow@10", "relist", "follow@10"]
    assert len(script.stop.waits) == 1  # only the second 410 in a row waits


def test_a_failure_streak_warns_once_and_logs_the_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="interference_infra.kube_watch")
    script = Script([raises(ApiDown("503")), raises(ApiDown("503")), events(2), events(1)])
    run(script)
    assert script.calls == ["relist", "follow@10", "follow@10", "follow@10", "follow@20"]
    levels = [r.levelname for r in caplog.records if "503" in r.getMessage()]
    assert levels == ["WARNING", "DEBUG"]
    assert "working again after 2 failed attempt(s)" in caplog.text
    assert len(script.stop.waits) == 2


def test_a_bug_applying_events_relists_instead_of_ending_the_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = Script([raises(KeyError("metadata")), events(1)])
    run(script)
    assert script.calls == ["relist", "follow@10", "relist", "follow@10"]
    assert "pods informer failed; relisting" in caplog.text


def test_a_watch_that_ends_at_once_without_events_backs_off() -> None:
    script = Script([events(0, "10"), events(1)])
    run(script)
    assert script.calls == ["relist", "follow@10", "follow@10"]
    assert len(script.stop.waits) == 1


def test_backoff_doubles_up_to_its_cap_and_honours_retry_after() -> None:
    backoff = Backoff(1.0, 4.0, random.Random(3))
    delays = [backoff.next_delay() for _ in range(5)]
    ceilings = [1.0, 2.0, 4.0, 4.0, 4.0]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert backoff.next_delay(at_least_s=30.0) == 30.0
