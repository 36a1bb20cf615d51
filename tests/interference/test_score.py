"""The node interference index (interference.score): formula edge cases, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from interference.score import ScoreReferences, interference_score

QUIET = {
    "runq_p99_us": 0.0,
    "runq_wait_ratio": 0.0,
    "reclaim_stall_ms_per_s": 0.0,
    "throttled_ms_per_s": 0.0,
    "psi_cpu_some": 0.0,
    "psi_mem_some": 0.0,
    "net_drops_per_s": 0.0,
}
REFS = ScoreReferences()
AT_REFERENCE = {
    "runq_p99_us": REFS.runq_p99_us,
    "runq_wait_ratio": REFS.runq_wait_ratio,
    "reclaim_stall_ms_per_s": REFS.reclaim_stall_ms_per_s,
    "throttled_ms_per_s": REFS.throttled_ms_per_s,
    "psi_cpu_some": REFS.psi_cpu_some,
    "psi_mem_some": REFS.psi_mem_some,
    "net_drops_per_s": REFS.net_drops_per_s,
}


def test_default_weights_sum_to_one_so_each_term_reads_as_points() -> None:
    weights = [getattr(REFS, n) for n in REFS.__dataclass_fields__ if n.startswith("weight_")]
    assert sum(weights) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("signals", "refs", "expected"),
    [
        ({}, REFS, 0.0),
        (AT_REFERENCE, REFS, 100.0),
        ({k: v * 10 for k, v in AT_REFERENCE.items()}, REFS, 100.0),  # saturates
        ({"runq_p99_us": 1000.0}, REFS, 30.0),  # p99 at its 1 ms reference: weight 0.30
        ({"runq_p99_us": 500.0}, REFS, 15.0),
        ({"reclaim_stall_ms_per_s": 2.5}, REFS, 12.5),  # half of 5 ms/s at weight 0.25
        ({"runq_p99_us": 4000.0, "reclaim_stall_ms_per_s": 5.0}, REFS, 55.0),
        ({"runq_p99_us": float("nan")}, REFS, 0.0),
        ({"runq_p99_us": -100.0}, REFS, 0.0),
        ({"runq_p99_us": float("inf")}, REFS, 30.0),
        # A reference ≤ 0 disables its term and the rest are renormalised.
        ({"runq_p99_us": 10_000.0}, ScoreReferences(runq_p99_us=0.0), 0.0),
        (AT_REFERENCE, ScoreReferences(runq_p99_us=-1.0), 100.0),
        (
            {"reclaim_stall_ms_per_s": 5.0},
            ScoreReferences(runq_p99_us=0.0, runq_wait_ratio=0.0),
            round(100 * 0.25 / 0.55, 2),
        ),
        # Stricter references make the same signal count more.
        ({"runq_p99_us": 500.0}, ScoreReferences(runq_p99_us=500.0), 30.0),
        # All weights zero: nothing to score.
        (
            AT_REFERENCE,
            ScoreReferences(
                weight_runq_p99=0,
                weight_runq_wait=0,
                weight_reclaim=0,
                weight_throttled=0,
                weight_psi_cpu=0,
                weight_psi_mem=0,
                weight_net_drops=0,
            ),
            0.0,
        ),
        ({"psi_cpu_some": 1.0 / 3}, REFS, round(100 * 0.05 / 150, 2)),  # rounded to 2 places
    ],
)
def test_interference_score(
    signals: dict[str, float], refs: ScoreReferences, expected: float
) -> None:
    args: dict[str, Any] = {**QUIET, **signals}
    assert interference_score(**args, refs=refs) == pytest.approx(expected)
