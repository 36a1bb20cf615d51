"""The one freshness rule (interference.freshness), table-driven."""

from __future__ import annotations

import pytest

from interference import freshness, keys


@pytest.mark.parametrize(
    ("interval_s", "ttl_s"),
    [(0.1, 5), (1.0, 5), (1.7, 5), (2.0, 6), (10.0, 30), (0.5, 5)],
)
def test_stale_after_is_three_intervals_at_least_five_seconds(
    interval_s: float, ttl_s: int
) -> None:
    assert freshness.ttl_seconds(interval_s) == ttl_s
    assert freshness.stale_after_s(interval_s) == ttl_s
    assert keys.ttl_seconds(interval_s) == ttl_s  # the hashes' TTL is the same number


@pytest.mark.parametrize(
    ("case", "age_s", "interval_s", "measured", "state"),
    [
        ("just published", 0.0, 1.0, ("runq",), "ok"),
        ("at the edge of the window", 5.0, 1.0, ("runq", "psi"), "ok"),
        ("just past the window", 5.01, 1.0, ("runq",), "stale"),
        ("slow agent within three intervals", 29.0, 10.0, ("runq",), "ok"),
        ("slow agent past three intervals", 31.0, 10.0, ("runq",), "stale"),
        ("fresh without the run queue", 1.0, 1.0, ("psi", "reclaim"), "degraded"),
        ("fresh, nothing measured", 1.0, 1.0, (), "degraded"),
        ("fresh, measured unknown", 1.0, 1.0, None, "degraded"),
        ("old and degraded reads stale", 60.0, 1.0, (), "stale"),
        ("clock skew: a report from the future is fresh", -3.0, 1.0, ("runq",), "ok"),
    ],
)
def test_node_state(
    case: str, age_s: float, interval_s: float, measured: tuple[str, ...] | None, state: str
) -> None:
    now = 1000.0
    assert freshness.node_state(now - age_s, interval_s, measured, now) == state, case
    assert freshness.is_fresh(now - age_s, interval_s, now) == (
        age_s <= 3 * interval_s or age_s <= 5
    )


def test_fresh_until_and_missing_core() -> None:
    assert freshness.fresh_until(100.0, 1.0) == 105.0
    assert freshness.missing_core(("psi",)) == ("runq",)
    assert freshness.missing_core(("runq", "psi")) == ()


def test_expired_members() -> None:
    exists = {"alive": True, "dead": False}
    assert freshness.expired_members(["alive", "dead", "unknown"], exists) == ["dead", "unknown"]
