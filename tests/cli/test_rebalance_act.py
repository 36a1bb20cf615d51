"""When the second act and bench/rebalance.py call a moved workload recovered."""

from __future__ import annotations

from interference.signals import PodMetrics
from interference_demo.rebalance_act import PodRows, first_window_under


def rows(p99_slot_by_second: dict[int, int]) -> PodRows:
    """One row a second, each with 100 wake-ups in one log2 µs slot."""
    found = PodRows()
    for second, slot in p99_slot_by_second.items():
        runq_us = tuple([0] * slot + [100])
        found.rows[1000.0 + second] = PodMetrics("demo", "w-1", uid="u", runq_us=runq_us)
    return found


def test_the_first_full_window_under_the_tolerance() -> None:
    # 5 noisy seconds after the start (slot 15: 32-65 ms), then quiet (slot 10: ~1-2 ms).
    seconds = {s: (15 if s < 5 else 10) for s in range(30)}
    end = first_window_under(rows(seconds), limit_us=6000)
    assert end == 1000.0 + 14  # the window (4, 14]: seconds 5-14, all quiet


def test_no_window_until_ten_seconds_of_rows() -> None:
    assert first_window_under(rows({s: 10 for s in range(9)}), limit_us=6000) is None
    assert first_window_under(rows({s: 10 for s in range(11)}), limit_us=6000) == 1010.0


def test_missing_intervals_do_not_make_a_window() -> None:
    sparse = {s: 10 for s in range(0, 30, 3)}  # a row every 3 s
    assert first_window_under(rows(sparse), limit_us=6000) is None
