"""Interference score: quiet nodes score high.

With fresh signals (reported within ``stale_after_s``)::

    index     = min(100, score + recent_load_weight · recent_cpu_m / allocatable_cpu_m)
    pressure  = max(index, 100 · min(1, max(runq_p99_us / runq_p99_reference_us,
                                            reclaim_stall_ms_per_s / reclaim_stall_reference)))
    score     = 100 − pressure

``recent_cpu_m`` is the CPU requested by pods placed on the node after its last report, so
a burst spreads out instead of piling onto the one quiet node until the next report shows
their load. Stale or missing signals score 50 under ``neutral`` and 0 under ``avoid`` and
``reject`` (``reject`` also filters such nodes out, see :mod:`scheduler.filters.interference`).

The per-node parts are kept by :meth:`scheduler.table.NodeTable.derived`, so a decision
after a placement recomputes one row, not the whole column.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scheduler.quantity import CPU
from scheduler.settings import EngineSettings
from scheduler.table import NodeTable

NEUTRAL_SCORE = 50.0


def stale_rows(table: NodeTable, settings: EngineSettings, now: float) -> NDArray[np.intp]:
    """Rows whose latest report is older than ``stale_after_s`` (or that have none).

    Cached until signals or rows change or the next fresh report expires (staleness only
    grows with time, so the answer holds from when it was computed until then).
    """
    key = ("stale_rows", settings.stale_after_s)
    cached = table.signal_cache.get(key)
    if isinstance(cached, tuple) and cached[0] <= now < cached[1]:
        rows: NDArray[np.intp] = cached[2]
        return rows
    cutoff = now - settings.stale_after_s
    stale = table.signals_at < cutoff
    rows = np.flatnonzero(stale)
    fresh_at = table.signals_at[~stale]
    valid_until = fresh_at.min() + settings.stale_after_s if len(fresh_at) else np.inf
    table.signal_cache[key] = (now, float(valid_until), rows)
    return rows


def fresh_signals(table: NodeTable, settings: EngineSettings, now: float) -> NDArray[np.bool_]:
    """Nodes whose latest report is at most ``stale_after_s`` old."""
    fresh = np.ones(len(table), dtype=np.bool_)
    fresh[stale_rows(table, settings, now)] = False
    return fresh


def effective_index(table: NodeTable, settings: EngineSettings) -> NDArray[np.float64]:
    """``index`` of the module formula: the agent's index plus load placed since its report.

    Callers must not modify the result.
    """
    weight = settings.recent_load_weight
    inverse_cpu = table.inverse_allocatable(CPU)
    recent, reported = table.recent_cpu_m, table.interference_score

    def compute() -> NDArray[np.float64]:
        index = recent * inverse_cpu
        index *= weight
        index += reported
        np.minimum(index, 100.0, out=index)
        return index

    def compute_row(row: int) -> float:
        # Python floats: the same IEEE operations as numpy's, without numpy scalar overhead
        return min(recent.item(row) * inverse_cpu.item(row) * weight + reported.item(row), 100.0)

    return table.derived(("effective_index", weight), compute, compute_row)


def fresh_score(table: NodeTable, settings: EngineSettings) -> NDArray[np.float64]:
    """``score`` of the module formula for every node, as if its signals were fresh.

    Callers must not modify the result.
    """
    runq_reference = settings.runq_p99_reference_us
    reclaim_reference = settings.reclaim_stall_reference_ms_per_s
    index = effective_index(table, settings)
    runq, reclaim = table.runq_p99_us, table.reclaim_stall_ms_per_s

    def compute() -> NDArray[np.float64]:
        signal = np.maximum(runq / runq_reference, reclaim / reclaim_reference)
        np.minimum(signal, 1.0, out=signal)
        signal *= 100.0
        np.maximum(signal, index, out=signal)
        np.subtract(100.0, signal, out=signal)
        return signal

    def compute_row(row: int) -> float:
        signal = min(
            max(runq.item(row) / runq_reference, reclaim.item(row) / reclaim_reference), 1.0
        )
        return 100.0 - max(signal * 100.0, index.item(row))

    key = ("fresh_score", settings.recent_load_weight, runq_reference, reclaim_reference)
    return table.derived(key, compute, compute_row)


def interference_score(
    table: NodeTable, settings: EngineSettings, now: float
) -> NDArray[np.float64]:
    """0–100 per node, higher is quieter (see the module formula).

    Callers must not modify the result (it may be the cached column itself).
    """
    score = fresh_score(table, settings)
    stale = stale_rows(table, settings, now)
    if len(stale) == 0:
        return score
    score = score.copy()
    score[stale] = NEUTRAL_SCORE if settings.stale_policy == "neutral" else 0.0
    return score
