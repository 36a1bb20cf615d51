"""The interference index (interference.index): separation, curve and combination edge
cases, table-driven with named cases."""

from __future__ import annotations

import math

import pytest

from interference.index import (
    REFERENCE_NAMES,
    SIGNALS_BY_FAMILY,
    IndexReferences,
    family_saturations,
    interference_index,
    saturation,
)

REFS = IndexReferences()
SIGNALS = tuple(name for names in SIGNALS_BY_FAMILY.values() for name in names)


def at_saturation(name: str) -> float:
    return float(getattr(REFS, name))


def at_quiet(name: str) -> float:
    return float(getattr(REFS, f"{name}_quiet"))


# A quiet node as measured: every signal below its quiet point.
QUIET_NODE = {
    "runq_p99_us": 180.0,
    "runq_wait_ratio": 0.01,
    "reclaim_stall_ms_per_s": 0.0,
    "throttled_ms_per_s": 0.0,
    "psi_cpu_some": 4.0,
    "psi_mem_some": 0.2,
    "net_drops_per_s": 0.0,
}


@pytest.mark.parametrize("signal", SIGNALS)
def test_any_single_saturated_signal_scores_at_least_90(signal: str) -> None:
    """The separation the scheduler's tolerances rely on: one saturated family is enough."""
    assert interference_index({**QUIET_NODE, signal: at_saturation(signal)}) >= 90


@pytest.mark.parametrize("signal", SIGNALS)
def test_any_single_signal_at_its_quiet_point_scores_at_most_10(signal: str) -> None:
    assert interference_index({**QUIET_NODE, signal: at_quiet(signal)}) <= 10


@pytest.mark.parametrize(
    ("case", "signals", "check"),
    [
        ("nothing measured reads quiet", {}, lambda x: x == 0.0),
        ("quiet node", QUIET_NODE, lambda x: x <= 10),
        (
            "every signal exactly at its quiet point",
            {n: at_quiet(n) for n in SIGNALS},
            lambda x: x == 0.0,
        ),
        (
            "make demo's CPU-saturated node (p99 31 ms, PSI cpu 94 %)",
            {**QUIET_NODE, "runq_p99_us": 31_000.0, "psi_cpu_some": 94.0, "runq_wait_ratio": 1.7},
            lambda x: x == 100.0,
        ),
        (
            "the recorded lab's quiet node, median second (p99 3.8 ms, wait ratio 0.05)",
            {**QUIET_NODE, "runq_p99_us": 3800.0, "runq_wait_ratio": 0.052},
            lambda x: x <= 10,
        ),
        (
            "the recorded lab's quiet node, p90 second (p99 6.4 ms, wait ratio 0.09)",
            {**QUIET_NODE, "runq_p99_us": 6400.0, "runq_wait_ratio": 0.088},
            lambda x: 10 < x < 50,
        ),
        (
            "the recorded lab's saturated node, p10 second (p99 16 ms, wait ratio 1.3)",
            {**QUIET_NODE, "runq_p99_us": 16_200.0, "runq_wait_ratio": 1.3},
            lambda x: x >= 90,
        ),
        ("reclaim alone at 5 ms/s", {"reclaim_stall_ms_per_s": 5.0}, lambda x: x == 100.0),
        (
            "two families half way combine by soft OR (1 − 0.5²)",
            {
                "runq_p99_us": math.sqrt(REFS.runq_p99_us * REFS.runq_p99_us_quiet),
                "reclaim_stall_ms_per_s": math.sqrt(
                    REFS.reclaim_stall_ms_per_s * REFS.reclaim_stall_ms_per_s_quiet
                ),
            },
            lambda x: x == pytest.approx(75.0, abs=0.01),
        ),
        (
            "signals of one family combine by max, not soft OR",
            {
                "runq_p99_us": math.sqrt(REFS.runq_p99_us * REFS.runq_p99_us_quiet),
                "runq_wait_ratio": math.sqrt(REFS.runq_wait_ratio * REFS.runq_wait_ratio_quiet),
            },
            lambda x: x == pytest.approx(50.0, abs=0.01),
        ),
        ("NaN counts as quiet", {"runq_p99_us": float("nan")}, lambda x: x == 0.0),
        ("negative counts as quiet", {"runq_p99_us": -5.0}, lambda x: x == 0.0),
        ("infinity saturates", {"net_drops_per_s": float("inf")}, lambda x: x == 100.0),
        ("far past saturation stays at 100", {"psi_mem_some": 100.0}, lambda x: x == 100.0),
    ],
)
def test_index_cases(case: str, signals: dict[str, float], check: object) -> None:
    value = interference_index(signals)
    assert callable(check) and check(value), f"{case}: index {value}"
    assert 0.0 <= value <= 100.0


def test_monotone_in_every_signal() -> None:
    for signal in SIGNALS:
        q, r = at_quiet(signal), at_saturation(signal)
        points = [q * (r / q) ** (i / 20) for i in range(-2, 23)]
        values = [interference_index({**QUIET_NODE, signal: x}) for x in points]
        assert values == sorted(values), signal
        assert values[0] <= 10 and values[-1] == 100.0


@pytest.mark.parametrize(
    ("case", "value", "expected"),
    [
        ("below quiet", 1.0, 0.0),
        ("at quiet", 10.0, 0.0),
        ("geometric middle", 100.0, 0.5),
        ("at saturation", 1000.0, 1.0),
        ("past saturation", 1e9, 1.0),
        ("NaN", float("nan"), 0.0),
    ],
)
def test_saturation_curve_is_log_scale(case: str, value: float, expected: float) -> None:
    assert saturation(value, 10.0, 1000.0) == pytest.approx(expected), case


def test_only_measured_families_count() -> None:
    saturated_net = {**QUIET_NODE, "net_drops_per_s": 1e6}
    assert interference_index(saturated_net) == 100.0
    assert interference_index(saturated_net, measured=("runq", "psi")) <= 10
    assert set(family_saturations(saturated_net, measured=("net",))) == {"net"}


@pytest.mark.parametrize(
    ("case", "refs", "signals", "expected"),
    [
        (
            "weight 0 leaves a signal out",
            IndexReferences(weight_net_drops=0.0),
            {"net_drops_per_s": 1e6},
            0.0,
        ),
        (
            "weight scales a saturated family",
            IndexReferences(weight_reclaim=0.5),
            {"reclaim_stall_ms_per_s": 50.0},
            50.0,
        ),
        (
            "stricter saturation point counts sooner",
            IndexReferences(runq_p99_us=5000.0),
            {"runq_p99_us": 5000.0},
            100.0,
        ),
    ],
)
def test_references_and_weights(
    case: str, refs: IndexReferences, signals: dict[str, float], expected: float
) -> None:
    assert interference_index(signals, refs) == pytest.approx(expected), case


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"runq_p99_us_quiet": 20_000.0}, "runq_p99_us_quiet < runq_p99_us"),
        ({"runq_p99_us": 2_000.0}, "runq_p99_us_quiet < runq_p99_us"),
        ({"psi_cpu_some_quiet": 0.0}, "psi_cpu_some_quiet"),
        ({"weight_psi_mem": 1.5}, "weight_psi_mem"),
        ({"weight_runq_p99": -0.1}, "weight_runq_p99"),
    ],
)
def test_bad_references_say_what_is_wrong(change: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        IndexReferences(**change)  # type: ignore[arg-type]


def test_every_signal_has_a_quiet_point_a_saturation_point_and_a_weight() -> None:
    for signal in SIGNALS:
        assert signal in REFERENCE_NAMES and f"{signal}_quiet" in REFERENCE_NAMES
    assert sum(name.startswith("weight_") for name in REFERENCE_NAMES) == len(SIGNALS)
