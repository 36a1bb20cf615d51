"""The interference index over numpy columns: :func:`interference.index.interference_index`
for every node at once, so the scheduler computes each node's index from its signals
(never taking an agent's word for it) without Python work per node.

Same formula and references as the scalar function (the tests compare both)::

    s(x)    = w · clamp(ln(x / q) / ln(r / q), 0, 1)
    family  = max of its signals' s        (0 where the family was not measured)
    index   = 100 · (1 − Π_f (1 − family_f)), rounded to 2 places
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from interference.index import SIGNALS_BY_FAMILY, IndexReferences, weight_of
from interference.signals import SIGNAL_FAMILIES


def saturation_column(
    values: NDArray[np.float64], quiet: float, saturated: float
) -> NDArray[np.float64]:
    """``clamp(ln(x / q) / ln(r / q), 0, 1)`` per element; values ≤ q (and NaN) give 0."""
    ratio = np.maximum(np.nan_to_num(values, nan=0.0), quiet) / quiet
    out: NDArray[np.float64] = np.log(ratio) / math.log(saturated / quiet)
    np.clip(out, 0.0, 1.0, out=out)
    return out


def index_column(
    signals: Mapping[str, NDArray[np.float64]],
    measured: NDArray[np.uint16],
    refs: IndexReferences,
) -> NDArray[np.float64]:
    """The interference index of every row; ``signals`` maps each NodeMetrics field the
    index reads to a column, ``measured`` is each row's family bit mask
    (:func:`interference.sched_record.measured_mask`)."""
    quiet_chance = np.ones(len(measured))
    for family, names in SIGNALS_BY_FAMILY.items():
        level = np.zeros(len(measured))
        for name in names:
            weight = weight_of(name, refs)
            if weight > 0:
                s = saturation_column(
                    signals[name], getattr(refs, f"{name}_quiet"), getattr(refs, name)
                )
                np.maximum(level, weight * s, out=level)
        bit = 1 << SIGNAL_FAMILIES.index(family)
        level[(measured & bit) == 0] = 0.0
        quiet_chance *= 1.0 - level
    index: NDArray[np.float64] = np.round(100.0 * (1.0 - quiet_chance), 2)
    return index
