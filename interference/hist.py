"""Log2 histograms as libbpf-tools builds them.

Slot ``i`` counts values ``v`` with ``floor(log2(v)) == i`` (slot 0 also holds 0 and 1),
so slot ``i`` covers ``[2**i, 2**(i+1) - 1]``. All functions are pure.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_SLOTS = 27
"""Slots kept per histogram; 2**26 µs ≈ 67 s is longer than any run-queue or reclaim stall."""


def slot_of(value: int) -> int:
    """The slot a value falls into: ``floor(log2(value))``, 0 for values ≤ 1, capped."""
    if value <= 1:
        return 0
    return min(int(value).bit_length() - 1, MAX_SLOTS - 1)


def slot_bounds(slot: int) -> tuple[int, int]:
    """Inclusive value range of a slot: ``[2**slot, 2**(slot+1) - 1]`` (slot 0 is ``[0, 1]``)."""
    if slot == 0:
        return (0, 1)
    return (1 << slot, (1 << (slot + 1)) - 1)


def normalize(buckets: Sequence[int]) -> list[int]:
    """Buckets padded or folded to ``MAX_SLOTS`` slots (overflow goes to the last slot)."""
    out = [0] * MAX_SLOTS
    for i, count in enumerate(buckets):
        out[min(i, MAX_SLOTS - 1)] += int(count)
    return out


def trimmed(buckets: Sequence[int]) -> list[int]:
    """Buckets without trailing empty slots (``[]`` when all are empty): the compact form
    per-pod histograms travel in."""
    out = [int(c) for c in buckets]
    while out and out[-1] == 0:
        out.pop()
    return out


def add(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """Slot-wise sum of two histograms."""
    na, nb = normalize(a), normalize(b)
    return [x + y for x, y in zip(na, nb, strict=True)]


def subtract(now: Sequence[int], before: Sequence[int]) -> list[int]:
    """Slot-wise ``now - before`` for cumulative histograms, clamped at 0 (counter resets)."""
    nn, nb = normalize(now), normalize(before)
    return [max(0, x - y) for x, y in zip(nn, nb, strict=True)]


def total(buckets: Sequence[int]) -> int:
    """Number of samples in a histogram."""
    return int(sum(buckets))


def percentile(buckets: Sequence[int], q: float) -> float:
    """The ``q``-quantile (0 < q ≤ 1) estimated by linear interpolation inside its slot.

    With ``N`` samples the target rank is ``r = q·N``; walking the slots until the
    cumulative count reaches ``r``, the value is ``lo + (hi - lo)·(r - before)/count``
    for that slot's ``[lo, hi]``. Returns 0.0 for an empty histogram.
    """
    if not 0.0 < q <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {q}")
    n = total(buckets)
    if n == 0:
        return 0.0
    rank = q * n
    seen = 0
    for slot, count in enumerate(buckets):
        if count <= 0:
            continue
        if seen + count >= rank:
            lo, hi = slot_bounds(min(slot, MAX_SLOTS - 1))
            return lo + (hi - lo) * (rank - seen) / count
        seen += count
    lo, hi = slot_bounds(len(buckets) - 1)
    return float(hi)
