"""How the warden dates a node's writes for its rate bound (credential_issuer.warden): by
its own ticks in the event stream, not by when it read them; no Redis is reached here
(the events are handed in as the events thread would)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from credential_issuer.settings import redis_target
from credential_issuer.warden import Warden, WardenLimits, WardenMetrics
from interference import keys


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def warden(clock: Clock) -> Warden:
    return Warden(
        redis_target("redis://127.0.0.1:1/0"),
        WardenLimits(max_writes_per_s=10, rate_window_s=5),
        WardenMetrics(CollectorRegistry()),
        clock=clock,
    )


def feed(w: Warden, clock: Clock, ticks_ms: list[int], per_tick: int, node: str = "n1") -> None:
    """For each tick set at ``ticks_ms``, its event, then ``per_tick`` xadd events of
    ``node``, all read 1 ms apart on the warden's clock."""
    for ms in ticks_ms:
        w._ticked(f"{w._tick_prefix}{ms}")
        for _ in range(per_tick):
            w._noted(keys.reports_key(node), node, b"xadd")
            clock.now += 0.001


@pytest.mark.parametrize(
    ("name", "ticks_ms", "per_tick", "too_fast"),
    [
        # 60 reports a second apart, read as a backlog within 0.06 s: an agent behind
        ("backlog", [1_000_000 + 1000 * i for i in range(60)], 1, False),
        # 60 reports between two ticks 0.2 s apart: a burst
        ("burst", [1_000_000], 60, True),
        # 50 in 5 s is the bound, not over it
        ("at the bound", [1_000_000 + 100 * i for i in range(50)], 1, False),
        # 51 within 5 s of stream time
        ("over the bound", [1_000_000 + 90 * i for i in range(51)], 1, True),
    ],
)
def test_writes_are_dated_by_the_ticks_before_them(
    name: str, ticks_ms: list[int], per_tick: int, too_fast: bool
) -> None:
    clock = Clock()
    w = warden(clock)
    try:
        feed(w, clock, ticks_ms, per_tick)
        with w._lock:
            found = w._too_fast()
        assert ("n1" in found) is too_fast, (name, found)
        if too_fast:
            assert found["n1"].startswith("writing_too_fast: 51 xadd events in ")
    finally:
        w.close()


def test_no_rate_is_judged_while_the_ticks_do_not_come_back() -> None:
    """Key events without ``$`` (no tick returns), or an events thread stalled: a burst
    read then cannot be dated, so it is not counted."""
    clock = Clock()
    w = warden(clock)
    try:
        feed(w, clock, [1_000_000], 0)
        clock.now += 3.0  # the last tick was read 3 s ago (> TICK_STALE_S)
        for _ in range(100):
            w._noted(keys.reports_key("n1"), "n1", b"xadd")
        with w._lock:
            assert w._too_fast() == {}
    finally:
        w.close()
