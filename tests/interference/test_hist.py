"""Log2 histogram math (interference.hist), table-driven."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from interference import hist


@pytest.mark.parametrize(
    ("value", "slot"),
    [(-5, 0), (0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (1023, 9), (1024, 10), (2**40, 26)],
)
def test_slot_of(value: int, slot: int) -> None:
    assert hist.slot_of(value) == slot


@pytest.mark.parametrize(
    ("slot", "bounds"), [(0, (0, 1)), (1, (2, 3)), (2, (4, 7)), (10, (1024, 2047))]
)
def test_slot_bounds(slot: int, bounds: tuple[int, int]) -> None:
    assert hist.slot_bounds(slot) == bounds


@given(st.integers(min_value=2, max_value=2**26 - 1))
def test_every_value_lies_inside_the_bounds_of_its_slot(value: int) -> None:
    lo, hi = hist.slot_bounds(hist.slot_of(value))
    assert lo <= value <= hi


@pytest.mark.parametrize(
    ("buckets", "expected"),
    [
        ([], [0] * hist.MAX_SLOTS),
        ([1, 2], [1, 2] + [0] * (hist.MAX_SLOTS - 2)),
        ([0] * hist.MAX_SLOTS + [5, 6], [0] * (hist.MAX_SLOTS - 1) + [11]),
    ],
)
def test_normalize_pads_and_folds_overflow_into_the_last_slot(
    buckets: list[int], expected: list[int]
) -> None:
    assert hist.normalize(buckets) == expected


def test_add_subtract_total() -> None:
    a, b = [1, 2, 3], [4, 0, 0, 7]
    assert hist.add(a, b)[:4] == [5, 2, 3, 7]
    assert hist.total(hist.add(a, b)) == 17
    assert hist.subtract([5, 5, 5], [1, 2, 3])[:3] == [4, 3, 2]
    # A counter reset (now < before) clamps to zero instead of going negative.
    assert hist.subtract([1, 0], [3, 2])[:2] == [0, 0]


@pytest.mark.parametrize(
    ("buckets", "q", "expected"),
    [
        ([], 0.5, 0.0),
        ([0, 0, 0], 0.99, 0.0),
        ([0, 0, 4], 0.5, 5.5),  # slot [4, 7], rank 2 of 4: 4 + 3·2/4
        ([0, 0, 4], 1.0, 7.0),
        ([10], 0.5, 0.5),  # slot 0 is [0, 1]
        ([0, 50, 0, 50], 0.5, 3.0),  # the median ends exactly at the top of slot 1
        ([0, 50, 0, 50], 0.99, 8 + 7 * 49 / 50),  # slot 3 is [8, 15]
    ],
)
def test_percentile_interpolates_inside_the_slot(
    buckets: list[int], q: float, expected: float
) -> None:
    assert hist.percentile(buckets, q) == pytest.approx(expected)


@pytest.mark.parametrize("q", [0.0, -0.1, 1.5])
def test_percentile_rejects_quantiles_outside_0_1(q: float) -> None:
    with pytest.raises(ValueError, match="quantile"):
        hist.percentile([1, 2], q)
