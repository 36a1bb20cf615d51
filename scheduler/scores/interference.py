"""Interference score: quiet nodes score high.

With fresh signals (reported within ``stale_after_s``)::

    index     = min(100, score + recent_load_weight · recent_cpu_m / allocatable_cpu_m)
    pressure  = max(index, 100 · min(1, runq_p99_us / runq_p99_reference_us),
                           100 · min(1, reclaim_stall_ms_per_s / reclaim_stall_reference))
    score     = 100 − pressure

``recent_cpu_m`` is the CPU requested by pods placed on the node after its last report, so
a burst spreads out instead of piling onto the one quiet node until the next report shows
their load. Stale or missing signals score 50 under ``neutral`` and 0 under ``avoid`` and
``reject`` (``reject`` also filters such nodes out, see :mod:`scheduler.filters.interference`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from scheduler.quantity import CPU
from scheduler.settings import EngineSettings
from scheduler.table import NodeTable

NEUTRAL_SCORE = 50.0


def fresh_signals(table: NodeTable, settings: EngineSettings, now: float) -> NDArray[np.bool_]:
    """Nodes whose latest report is at most ``stale_after_s`` old."""
    fresh: NDArray[np.bool_] = table.signals_at >= now - settings.stale_after_s
    return fresh


def effective_index(table: NodeTable, settings: EngineSettings) -> NDArray[np.float64]:
    """``index`` of the module formula: the agent's index plus load placed since its report.

    Cached until the table's load or signals change; callers must not modify the result.
    """
    key = ("effective_index", settings.recent_load_weight)
    cached = table.signal_cache.get(key)
    if isinstance(cached, tuple) and cached[0] == table.load_generation:
        index: NDArray[np.float64] = cached[1]
        return index
    index = table.recent_cpu_m * table.inverse_allocatable(CPU)
    index *= settings.recent_load_weight
    index += table.interference_score
    np.minimum(index, 100.0, out=index)
    index.setflags(write=False)
    table.signal_cache[key] = (table.load_generation, index)
    return index


def signal_pressure(table: NodeTable, settings: EngineSettings) -> NDArray[np.float64]:
    """The run-queue and reclaim terms of ``pressure`` (cached until signals change)."""
    key = (
        "signal_pressure",
        settings.runq_p99_reference_us,
        settings.reclaim_stall_reference_ms_per_s,
    )
    cached = table.signal_cache.get(key)
    if isinstance(cached, np.ndarray):
        return cached
    runq = table.runq_p99_us / settings.runq_p99_reference_us
    reclaim = table.reclaim_stall_ms_per_s / settings.reclaim_stall_reference_ms_per_s
    pressure: NDArray[np.float64] = 100.0 * np.minimum(1.0, np.maximum(runq, reclaim))
    pressure.setflags(write=False)
    table.signal_cache[key] = pressure
    return pressure


def interference_score(
    table: NodeTable, settings: EngineSettings, now: float
) -> NDArray[np.float64]:
    """0–100 per node, higher is quieter (see the module formula)."""
    score = np.maximum(effective_index(table, settings), signal_pressure(table, settings))
    np.subtract(100.0, score, out=score)
    stale_score = NEUTRAL_SCORE if settings.stale_policy == "neutral" else 0.0
    score[table.signals_at < now - settings.stale_after_s] = stale_score
    return score
