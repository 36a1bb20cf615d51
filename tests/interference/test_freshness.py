"""The one freshness rule (interference.freshness), table-driven."""

from __future__ import annotations

import pytest

from interference import freshness


@pytest.mark.parametrize(
    ("interval_s", "ttl_s"),
    [(0.1, 5), (0.5, 5), (1.0, 5), (1.5, 5), (1.7, 5), (2.0, 6), (2.5, 8), (10.0, 30), (60.0, 180)],
)
def test_stale_after_is_three_intervals_at_least_five_seconds(
    interval_s: float, ttl_s: int
) -> None:
    assert freshness.ttl_seconds(interval_s) == ttl_s
    assert freshness.stale_after_s(interval_s) == ttl_s


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


@pytest.mark.parametrize(
    ("case", "measured", "lost_entries", "complete", "state"),
    [
        ("nothing lost", ("psi", "runq"), (), ("psi", "runq"), "ok"),
        ("run queue lost entries: degraded", ("psi", "runq"), ("runq",), ("psi",), "degraded"),
        ("reclaim lost entries: still ok", ("reclaim", "runq"), ("reclaim",), ("runq",), "ok"),
        (
            "taskstats measured runq too, runqlat lost: degraded",
            ("reclaim", "runq"),
            ("runq",),
            ("reclaim",),
            "degraded",
        ),
        ("both BPF probes lost entries", ("reclaim", "runq"), ("reclaim", "runq"), (), "degraded"),
        ("a lossy family not measured anyway", ("runq",), ("reclaim",), ("runq",), "ok"),
        ("unsorted, repeated", ("runq", "psi", "runq"), (), ("psi", "runq"), "ok"),
    ],
)
def test_a_family_whose_probe_lost_map_entries_is_not_measured(
    case: str,
    measured: tuple[str, ...],
    lost_entries: tuple[str, ...],
    complete: tuple[str, ...],
    state: str,
) -> None:
    """The one rule: a family with lost BPF map entries is left out of ``measured``, so
    lost run-queue entries make a fresh report degraded (the cycle's stale policy)."""
    assert freshness.complete_families(measured, lost_entries) == complete, case
    assert freshness.node_state(1000.0, 1.0, complete, 1000.0) == state, case
