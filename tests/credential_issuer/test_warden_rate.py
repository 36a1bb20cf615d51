"""How the warden dates a node's writes for its rate bound (credential_issuer.write_rates):
by its own ticks in the event stream, not by when it read them (the events are handed in
as the warden's events thread would)."""

from __future__ import annotations

import pytest

from credential_issuer.write_rates import WriteRates


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def feed(rates: WriteRates, clock: Clock, ticks_ms: list[int], per_tick: int) -> None:
    """For each tick set at ``ticks_ms``, its event, then ``per_tick`` xadd events of node
    ``n1``, all read 1 ms apart on the reader's clock."""
    for ms in ticks_ms:
        assert rates.ticked(f"{rates.tick_prefix}{ms}")
        for _ in range(per_tick):
            rates.noted("n1", b"xadd")
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
    rates = WriteRates(50, 5.0, clock)
    feed(rates, clock, ticks_ms, per_tick)
    found = rates.too_fast()
    assert ("n1" in found) is too_fast, (name, found)
    if too_fast:
        assert found["n1"].startswith("writing_too_fast: 51 xadd events in ")
        assert rates.too_fast() == {}  # counted again from zero


def test_no_rate_is_judged_while_the_ticks_do_not_come_back() -> None:
    """Key events without ``$`` (no tick returns), or an events thread stalled: a burst
    read then cannot be dated, so it is not counted."""
    clock = Clock()
    rates = WriteRates(50, 5.0, clock)
    feed(rates, clock, [1_000_000], 0)
    clock.now += 3.0  # the last tick was read 3 s ago (> TICK_STALE_S)
    for _ in range(100):
        rates.noted("n1", b"xadd")
    assert rates.too_fast() == {}


def test_only_its_own_ticks_and_the_report_events_count() -> None:
    clock = Clock()
    rates, other = WriteRates(50, 5.0, clock), WriteRates(50, 5.0, clock)
    assert not rates.ticked(other.tick_key())  # another replica's tick
    assert not rates.ticked("intf:node:n1")
    assert rates.ticked(rates.tick_key())
    for _ in range(100):
        rates.noted("n1", b"hset")
        rates.noted("n1", b"new")
    assert rates.too_fast() == {}
