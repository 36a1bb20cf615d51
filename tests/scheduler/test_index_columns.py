"""The vectorised interference index equals the scalar one, row by row."""

from __future__ import annotations

import random

import numpy as np
import pytest

from interference.index import SIGNALS_BY_FAMILY, IndexReferences, interference_index
from interference.sched_record import measured_mask
from interference.signals import SIGNAL_FAMILIES
from scheduler.signals.index_columns import index_column, saturation_column

SIGNALS = tuple(name for names in SIGNALS_BY_FAMILY.values() for name in names)
ALL = SIGNAL_FAMILIES


@pytest.mark.parametrize(
    ("signals", "measured", "expected"),
    [
        ({}, ALL, 0.0),
        ({"runq_p99_us": 4_000.0}, ALL, 0.0),  # at the quiet point
        ({"runq_p99_us": 16_000.0}, ALL, 100.0),  # at the saturation point
        ({"runq_p99_us": 16_000.0}, ("psi",), 0.0),  # run queue not measured: left out
        ({"runq_p99_us": 8_000.0}, ALL, 50.0),  # half way on the log scale
        ({"reclaim_stall_ms_per_s": 5.0, "psi_cpu_some": 60.0}, ALL, 100.0),
        ({"runq_wait_ratio": 0.316, "net_drops_per_s": 100.0}, ALL, 75.0),
    ],
)
def test_known_points(
    signals: dict[str, float], measured: tuple[str, ...], expected: float
) -> None:
    columns = {name: np.array([signals.get(name, 0.0)]) for name in SIGNALS}
    mask = np.array([measured_mask(measured)], np.uint16)
    assert index_column(columns, mask, IndexReferences())[0] == pytest.approx(expected, abs=0.05)


def test_equals_the_scalar_index_on_random_nodes_and_references() -> None:
    rng = random.Random(7)
    refs = IndexReferences(weight_psi_mem=0.5, weight_net_drops=0.0, runq_p99_us_quiet=2_000.0)
    rows = []
    for _ in range(2_000):
        signals = {
            name: rng.choice((0.0, rng.uniform(0, 2 * getattr(refs, name)))) for name in SIGNALS
        }
        measured = tuple(f for f in SIGNAL_FAMILIES if rng.random() < 0.8)
        rows.append((signals, measured))
    columns = {name: np.array([s[name] for s, _ in rows]) for name in SIGNALS}
    masks = np.array([measured_mask(m) for _, m in rows], np.uint16)
    vectorised = index_column(columns, masks, refs)
    scalar = [interference_index(s, refs, m) for s, m in rows]
    np.testing.assert_allclose(vectorised, scalar, atol=0.011)


def test_saturation_of_nan_and_values_below_the_quiet_point_is_zero() -> None:
    values = np.array([np.nan, -1.0, 0.0, 1.0, 2.0, 4.0, 1e308])
    assert saturation_column(values, 1.0, 4.0).tolist() == [0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 1.0]
