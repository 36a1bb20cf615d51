"""MemoryPressure (ours): prefer nodes whose tasks do not stall on memory, by the kernel's PSI.

Reads one signal column, ``psi_mem_some_avg10``: the kernel's own 10 s average of the
share of time some task of the node (the agent's cgroup root) stalled on memory, percent
(``memory.pressure``'s ``some avg10``, carried by the scheduling record as it is). With
``p`` that value, ``q = quiet_pct`` and ``r = saturated_pct`` (:class:`MemoryPressureArgs`)::

    s(p)   = clamp(ln(p / q) / ln(r / q), 0, 1)     (the index's saturation curve)
    score  = 100 · (1 − s(p))       on a node with usable PSI (fresh, the psi family measured)
           = 50                     on any other node (stale, missing, PSI not measured)
    None   (no preference)          when no feasible node with usable PSI is above q

So a node at or below ``q`` scores 100, one at ``r`` or above 0, and between them the
score falls with the logarithm of the pressure (from 1 % to 4.5 % costs as much as from
4.5 % to 20 %). Without any pressure among the feasible nodes the plugin has no
preference: it adds nothing to the totals nor to decision records, so on a quiet cluster
every decision is the one the other scores make. Memory stalls also weigh in the
interference index (``psi_mem_some``, the interval's own share); this score reads the
kernel's smoothed figure on its own, so a node with sustained memory pressure ranks
lower even when the index's other families are quiet.

This module is docs/design.md §8's example of adding a signal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scheduler.plugins.base import CycleState, Score
from scheduler.signals.index_columns import saturation_column
from scheduler.signals.table import NodeTable

NAME = "MemoryPressure"
NEUTRAL_SCORE = 50.0
"""The score of a node whose memory pressure is not known."""


@dataclass(frozen=True, slots=True)
class MemoryPressureArgs:
    """The MemoryPressure plugin's args (``plugin_config``); the defaults are the index's
    references for memory PSI (``psi_mem_some_quiet``, ``psi_mem_some``)."""

    quiet_pct: float = 1.0
    """Pressure (percent) at or below which a node scores 100."""
    saturated_pct: float = 20.0
    """Pressure (percent) at or above which a node scores 0."""

    def __post_init__(self) -> None:
        if not 0 < self.quiet_pct < self.saturated_pct:
            raise ValueError(
                f"quiet_pct {self.quiet_pct!r} and saturated_pct {self.saturated_pct!r}: "
                "need 0 < quiet_pct < saturated_pct"
            )


def memory_pressure_score(
    table: NodeTable, feasible: NDArray[np.bool_], now: float, args: MemoryPressureArgs
) -> NDArray[np.float64] | None:
    """0–100 per node, ``None`` without pressure among the feasible nodes (see the module
    formula)."""
    pressure = table.node_signals["psi_mem_some_avg10"]
    usable = (table.fresh_until >= now) & (pressure >= 0)
    if not (usable & feasible & (pressure > args.quiet_pct)).any():
        return None
    level = saturation_column(pressure, args.quiet_pct, args.saturated_pct)
    scores: NDArray[np.float64] = np.where(usable, 100.0 * (1.0 - level), NEUTRAL_SCORE)
    return scores


def _score(state: CycleState, feasible: NDArray[np.bool_]) -> NDArray[np.float64] | None:
    args = state.args_of(NAME, MemoryPressureArgs)
    return memory_pressure_score(state.table, feasible, state.now, args)


SCORE = Score(
    name=NAME,
    explain="memory pressure: the node's PSI memory 'some' avg10, 100 when quiet, 0 when "
    "saturated (no preference while no feasible node is under pressure)",
    score=_score,
    default_weight=1.0,
    signals=("fresh_until", "psi_mem_some_avg10"),
    args=MemoryPressureArgs,
)
