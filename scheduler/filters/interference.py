"""Interference filters.

Tolerance (only for pods that declare one, see :mod:`scheduler.model` for the
annotations), on nodes with usable signals, all read from the engine's ``signal_window``
``w`` (``latest``, ``10s`` or ``60s``)::

    runq_exceeded[i]    = runq_p99_us[w][i] > max_runq_p99_us   (merged histogram's p99)
    reclaim_exceeded[i] = reclaim_mean[w][i] + k · reclaim_stddev[w][i]
                              > max_reclaim_stall_ms_per_s
    score_exceeded[i]   = index[i] > max_score   (index = min(100, index_mean[w] +
                              k · index_stddev[w] + load placed since the report))

with ``k = risk_k``. Stale, degraded or missing signals (:mod:`interference.freshness`)
pass under ``neutral``/``avoid``; under ``reject`` they fail for every pod (``node(s) had
stale or missing interference signals``). The loop drops these filters for a pod pending
longer than ``relax_after_s`` only because of them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from scheduler.filters.base import FilterResult, all_pass
from scheduler.model import PodInfo
from scheduler.scores.interference import effective_index, fresh_signals, reclaim_risk
from scheduler.settings import EngineSettings
from scheduler.table import NodeTable

STALE_SIGNALS = "node(s) had stale or missing interference signals"
RUNQ_EXCEEDED = "node(s) had run-queue p99 above the pod's interference tolerance"
RECLAIM_EXCEEDED = "node(s) had memory reclaim stall above the pod's interference tolerance"
SCORE_EXCEEDED = "node(s) had an interference score above the pod's interference tolerance"


def interference_filter(
    table: NodeTable, pod: PodInfo, settings: EngineSettings, now: float
) -> FilterResult:
    """Nodes acceptable under the stale policy and the pod's interference tolerance."""
    reject_stale = settings.stale_policy == "reject"
    tolerance = pod.tolerance
    if tolerance is None and not reject_stale:
        return all_pass("Interference", table)
    fresh = fresh_signals(table, now)
    window = table.windows[settings.signal_window]
    columns: list[NDArray[np.bool_]] = []
    reasons: list[str] = []
    measurements: list[Callable[[int], str]] = []
    if reject_stale:
        columns.append(~fresh)
        reasons.append(STALE_SIGNALS)
        measurements.append(lambda row: _age(table, row, now))
    if tolerance is not None:
        bounds = (
            (tolerance.max_runq_p99_us, window.runq_p99_us, RUNQ_EXCEEDED),
            (
                tolerance.max_reclaim_stall_ms_per_s,
                reclaim_risk(table, settings),
                RECLAIM_EXCEEDED,
            ),
            (tolerance.max_score, None, SCORE_EXCEEDED),
        )
        units = {RUNQ_EXCEEDED: "µs", RECLAIM_EXCEEDED: "ms/s", SCORE_EXCEEDED: ""}
        for bound, values, reason in bounds:
            if bound is None:
                continue
            measured = effective_index(table, settings) if values is None else values
            columns.append(fresh & (measured > bound))
            reasons.append(reason)
            measurements.append(_versus(measured, bound, units[reason]))
    if not columns:  # a tolerance without any bound
        return all_pass("Interference", table)
    failing = columns[0].copy()
    for column in columns[1:]:
        failing |= column  # column by column: numpy reduces a [nodes, k] matrix slowly
    return FilterResult(
        "Interference",
        ~failing,
        tuple(reasons),
        lambda: columns,
        lambda index, row: measurements[index](row),
    )


def _versus(measured: NDArray[np.float64], bound: float, unit: str) -> Callable[[int], str]:
    """``row`` → ``measured 2900 µs > tolerance 500 µs``."""
    suffix = f" {unit}" if unit else ""
    return lambda row: f"measured {measured[row]:g}{suffix} > tolerance {bound:g}{suffix}"


def _age(table: NodeTable, row: int, now: float) -> str:
    updated = float(table.signals_at[row])
    return "no report" if not np.isfinite(updated) else f"latest report {now - updated:.0f} s old"
