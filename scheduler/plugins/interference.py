"""Interference (ours): keep pods off nodes their neighbours make noisy, prefer quiet ones.

Both read signals (:attr:`~scheduler.plugins.base.Filter.signals` names the columns): in an
interference-blind profile neither runs. While signals are unreadable (the store cannot
be read, so no node's signals are known) the score is off and the filter fails closed:
it refuses every node for a pod with a tolerance and, under ``stale_policy: reject``, for
every pod (``node(s) had no readable interference signals (the signal store cannot be
read)``); other pods pass, as a stale node does under ``neutral``/``avoid``. The relax
rule applies to these refusals as to any other of this filter. Args:
:class:`InterferenceArgs` (``stale_policy``, ``signal_window``, ``risk_k``,
``recent_load_weight``), set in the profile's ``plugin_config``.

Filter — tolerance (only for pods that declare one, see :mod:`scheduler.api.pods` for the
annotations), on nodes with usable signals, all read from the args' ``signal_window``
``w`` (``latest``, ``10s`` or ``60s``)::

    runq_exceeded[i]    = runq_p99_us[w][i] > max_runq_p99_us   (merged histogram's p99)
    reclaim_exceeded[i] = reclaim_mean[w][i] + k · reclaim_stddev[w][i]
                              > max_reclaim_stall_ms_per_s
    index_exceeded[i]   = index[i] > max_index   (index = min(100, index_mean[w] +
                              k · index_stddev[w] + load placed since the report))

with ``k = risk_k``. Stale, degraded or missing signals (:mod:`interference.freshness`)
pass under ``neutral``/``avoid``; under ``reject`` they fail for every pod (``node(s) had
stale or missing interference signals``). The cycle drops this filter for a pod pending
longer than ``relax_after_s`` only because of it (it is relaxable). Its rejections are
``UnschedulableAndUnresolvable`` (evicting pods does not quiet a node now). A rejected
pod is retried early when a node is added; signal changes reach it at its next backoff
(at most 10 s), well within a report's freshness.

Score — quietness: 0–100 per node, higher is quieter (the inverse of the agents'
interference index, :mod:`interference.index`, where 0 is quiet).
With usable signals (fresh and measuring the core families, see
:mod:`interference.freshness`), reading the args' ``signal_window`` ``w``::

    risk       = index_mean[w] + risk_k · index_stddev[w]     (latest: the interval's index)
    load       = recent_load_weight · recent_cpu_m / allocatable_cpu_m
    index      = min(100, risk + load)
    quietness  = 100 − index

``risk`` is Trimaran's LoadVariationRiskBalancing term: a node whose index swings (an
antagonist that is on for 5 s and off for 5 s) ranks by its bad seconds, not its good
ones. ``recent_cpu_m`` is the CPU requested by pods placed on the node after its last
report, so a burst spreads out instead of piling onto the one quiet node until the next
report shows their load. Stale, missing or degraded signals score 50 under ``neutral``
and 0 under ``avoid`` and ``reject`` (``reject`` also filters such nodes out).

Evidence for the decision record: the pod's run-queue tolerance with the p99 compared on
the recorded nodes (and the nearest node, for a pod no node passed), and the index read on
them (:class:`~scheduler.plugins.base.Evidence`).

The per-node parts are kept by :meth:`scheduler.signals.table.NodeTable.derived`, so a decision
after a placement recomputes one row, not the whole column.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from interference.decision import IndexRead, RunqCheck
from scheduler.api.events import Action, EventInterest
from scheduler.api.objects import PodInfo
from scheduler.api.quantity import CPU
from scheduler.plugins.base import CycleState, Evidence, Filter, FilterResult, Score
from scheduler.signals.table import NodeTable

NAME = "Interference"
NEUTRAL_SCORE = 50.0
STALE_SIGNALS = "node(s) had stale or missing interference signals"
SIGNALS_UNREADABLE = (
    "node(s) had no readable interference signals (the signal store cannot be read)"
)
RUNQ_EXCEEDED = "node(s) had run-queue p99 above the pod's interference tolerance"
RECLAIM_EXCEEDED = "node(s) had memory reclaim stall above the pod's interference tolerance"
INDEX_EXCEEDED = "node(s) had an interference index above the pod's interference tolerance"
StalePolicy = Literal["neutral", "avoid", "reject"]
STALE_POLICIES: tuple[StalePolicy, ...] = ("neutral", "avoid", "reject")
SignalWindow = Literal["latest", "10s", "60s"]
SIGNAL_WINDOWS: tuple[SignalWindow, ...] = ("latest", "10s", "60s")


@dataclass(frozen=True, slots=True)
class InterferenceArgs:
    """The Interference plugin's args (``plugin_config``)."""

    stale_policy: StalePolicy = "neutral"
    """Stale, missing or degraded signals (:mod:`interference.freshness`: a report older
    than 3 of its intervals, at least 5 s, or one without the run-queue family):
    ``neutral`` scores the node 50 and lets it pass tolerance filters, ``avoid`` scores it
    0, ``reject`` filters it out for every pod."""
    signal_window: SignalWindow = "10s"
    """Which of the agents' signals the filter and score read: ``latest`` (the latest
    interval), or the ``10s``/``60s`` window (merged run-queue histogram, mean + ``risk_k``
    · σ of the index and of reclaim stall). A window a report lacks falls back to its
    latest interval."""
    risk_k: float = 1.0
    """``k`` of the windowed risk ``mean + k · σ`` (Trimaran's LoadVariationRiskBalancing)."""
    recent_load_weight: float = 100.0
    """Interference-index points added per node's worth of CPU requested by pods bound to
    it since its last report (so a burst does not all land on the one quiet node)."""

    def __post_init__(self) -> None:
        if self.stale_policy not in STALE_POLICIES:
            raise ValueError(
                f"stale_policy: {self.stale_policy!r} is not one of {', '.join(STALE_POLICIES)}"
            )
        if self.signal_window not in SIGNAL_WINDOWS:
            raise ValueError(
                f"signal_window: {self.signal_window!r} is not one of {', '.join(SIGNAL_WINDOWS)}"
            )
        if not 0 <= self.risk_k <= 10:
            raise ValueError(f"risk_k: {self.risk_k!r} must be a number from 0 to 10")
        if not self.recent_load_weight >= 0:
            raise ValueError(f"recent_load_weight: {self.recent_load_weight!r} must be ≥ 0")


def interference_filter(
    table: NodeTable, pod: PodInfo, args: InterferenceArgs, now: float
) -> FilterResult | None:
    """Nodes acceptable under the stale policy and the pod's interference tolerance;
    ``None`` when neither applies to the pod."""
    reject_stale = args.stale_policy == "reject"
    tolerance = pod.tolerance
    if tolerance is None and not reject_stale:
        return None
    fresh = fresh_signals(table, now)
    window = table.windows[args.signal_window]
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
                reclaim_risk(table, args),
                RECLAIM_EXCEEDED,
            ),
            (tolerance.max_index, None, INDEX_EXCEEDED),
        )
        units = {RUNQ_EXCEEDED: "µs", RECLAIM_EXCEEDED: "ms/s", INDEX_EXCEEDED: ""}
        for bound, values, reason in bounds:
            if bound is None:
                continue
            measured = effective_index(table, args) if values is None else values
            columns.append(fresh & (measured > bound))
            reasons.append(reason)
            measurements.append(_versus(measured, bound, units[reason]))
    if not columns:  # a tolerance without any bound
        return None
    failing = columns[0].copy()
    for column in columns[1:]:
        failing |= column  # column by column: numpy reduces a [nodes, k] matrix slowly
    return FilterResult(
        NAME,
        ~failing,
        tuple(reasons),
        lambda: columns,
        lambda position, row: measurements[position](row),
    )


def refused_for_runq(reasons: Iterable[str]) -> bool:
    """Whether one of ``reasons`` (a reason as counted, or with the node's measurement
    after it, as the extender's records keep them) is the run-queue tolerance's."""
    return any(reason.startswith(RUNQ_EXCEEDED) for reason in reasons)


def runq_check(
    table: NodeTable,
    pod: PodInfo,
    args: InterferenceArgs,
    now: float,
    nodes: Iterable[str],
    nearest_among: NDArray[np.bool_] | None = None,
) -> RunqCheck | None:
    """For the decision record: the pod's run-queue tolerance, the run-queue p99 the filter
    compares on ``nodes`` (the recorded candidates) and, given ``nearest_among`` (the nodes
    no other filter refuses, for a pod no node passed), the node among them with the lowest
    run-queue p99 above the tolerance; ``None`` for a pod without a run-queue tolerance."""
    tolerance = pod.tolerance
    if tolerance is None or tolerance.max_runq_p99_us is None:
        return None
    bound = tolerance.max_runq_p99_us
    measured = table.windows[args.signal_window].runq_p99_us
    fresh = fresh_signals(table, now)
    rows = [row for row in map(table.row_of, nodes) if row is not None]
    nearest = ""
    if nearest_among is not None:
        above = nearest_among & fresh & (measured > bound)
        if above.any():
            candidates = np.flatnonzero(above)
            row = int(candidates[np.argmin(measured[candidates])])
            nearest = table.names[row]
            rows.append(row)
    values = {
        table.names[row]: value
        for row in rows
        if fresh[row] and np.isfinite(value := measured.item(row))
    }
    return RunqCheck(bound, args.signal_window, values, nearest)


def _versus(measured: NDArray[np.float64], bound: float, unit: str) -> Callable[[int], str]:
    """``row`` → ``measured 2900 µs > tolerance 500 µs``."""
    suffix = f" {unit}" if unit else ""
    return lambda row: f"measured {measured[row]:g}{suffix} > tolerance {bound:g}{suffix}"


def _age(table: NodeTable, row: int, now: float) -> str:
    updated = float(table.signals_at[row])
    return "no report" if not np.isfinite(updated) else f"latest report {now - updated:.0f} s old"


def _staleness(
    table: NodeTable, now: float
) -> tuple[float, float, NDArray[np.intp], NDArray[np.bool_]]:
    """(computed at, valid until, stale rows, stale mask) of :func:`stale_rows`.

    Cached until signals or rows change or the next usable report expires (staleness only
    grows with time, so the answer holds from when it was computed until then).
    """

    key = (NAME, "stale_rows")
    return table.cached("signals", key, _find_stale, table, now, still_valid=_still_stale)


_Staleness = tuple[float, float, NDArray[np.intp], NDArray[np.bool_]]


def _find_stale(table: NodeTable, now: float) -> _Staleness:
    stale = table.fresh_until < now
    stale.setflags(write=False)
    until = table.fresh_until[~stale]
    return (now, float(until.min()) if len(until) else np.inf, np.flatnonzero(stale), stale)


def _still_stale(entry: _Staleness, table: NodeTable, now: float) -> bool:
    return entry[0] <= now < entry[1]


def stale_rows(table: NodeTable, now: float) -> NDArray[np.intp]:
    """Rows whose report is stale, degraded or missing (``now > fresh_until``), cached."""
    return _staleness(table, now)[2]


def fresh_signals(table: NodeTable, now: float) -> NDArray[np.bool_]:
    """Nodes whose report is usable now (fresh and not degraded)."""
    # from the cached mask: indexing every stale row costs far more when most are stale
    return ~_staleness(table, now)[3]


def risk_index(table: NodeTable, args: InterferenceArgs) -> NDArray[np.float64]:
    """``risk`` of the module formula, capped at 100. Callers must not modify the result."""
    window = table.windows[args.signal_window]
    k = args.risk_k
    key = ("risk_index", args.signal_window, k)
    return table.derived(key, _risk, _risk_at, window.index_mean, window.index_stddev, k)


def _risk(mean: NDArray[np.float64], stddev: NDArray[np.float64], k: float) -> NDArray[np.float64]:
    risk = stddev * k
    risk += mean
    np.minimum(risk, 100.0, out=risk)
    return risk


def _risk_at(row: int, mean: NDArray[np.float64], stddev: NDArray[np.float64], k: float) -> float:
    return min(mean.item(row) + k * stddev.item(row), 100.0)


def reclaim_risk(table: NodeTable, args: InterferenceArgs) -> NDArray[np.float64]:
    """``reclaim_mean[w] + risk_k · reclaim_stddev[w]`` (ms/s) over the args' ``signal_window``."""
    window = table.windows[args.signal_window]
    risk: NDArray[np.float64] = window.reclaim_mean + args.risk_k * window.reclaim_stddev
    return risk


def effective_index(table: NodeTable, args: InterferenceArgs) -> NDArray[np.float64]:
    """``index`` of the module formula: the risk plus load placed since the report.

    Callers must not modify the result.
    """
    weight = args.recent_load_weight
    inverse_cpu = table.inverse_allocatable(CPU)
    risk = risk_index(table, args)
    key = ("effective_index", weight, args.signal_window, args.risk_k)
    return table.derived(key, _index, _index_at, table.recent_cpu_m, inverse_cpu, weight, risk)


def _index(
    recent: NDArray[np.float64],
    inverse_cpu: NDArray[np.float64],
    weight: float,
    risk: NDArray[np.float64],
) -> NDArray[np.float64]:
    index = recent * inverse_cpu
    index *= weight
    index += risk
    np.minimum(index, 100.0, out=index)
    return index


def _index_at(
    row: int,
    recent: NDArray[np.float64],
    inverse_cpu: NDArray[np.float64],
    weight: float,
    risk: NDArray[np.float64],
) -> float:
    # Python floats: the same IEEE operations as numpy's, without numpy scalar overhead
    return min(recent.item(row) * inverse_cpu.item(row) * weight + risk.item(row), 100.0)


def fresh_quietness(table: NodeTable, args: InterferenceArgs) -> NDArray[np.float64]:
    """``quietness`` of the module formula for every node, as if its signals were usable.

    Callers must not modify the result.
    """
    index = effective_index(table, args)
    key = ("quietness", args.recent_load_weight, args.signal_window, args.risk_k)
    return table.derived(key, _quiet, _quiet_at, index)


def _quiet(index: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.subtract(100.0, index)


def _quiet_at(row: int, index: NDArray[np.float64]) -> float:
    return 100.0 - index.item(row)


def quietness(table: NodeTable, args: InterferenceArgs, now: float) -> NDArray[np.float64]:
    """0–100 per node, higher is quieter (see the module formula).

    Callers must not modify the result (it may be the cached column itself).
    """
    score = fresh_quietness(table, args)
    stale = stale_rows(table, now)
    if len(stale) == 0:
        return score
    value = NEUTRAL_SCORE if args.stale_policy == "neutral" else 0.0
    if len(stale) == len(score):  # every report stale (an outage): one constant column
        key = (NAME, "stale_score", value)
        return table.cached("signals", key, _constant, score, value)
    score = score.copy()
    score[stale] = value
    return score


def _constant(like: NDArray[np.float64], value: float) -> NDArray[np.float64]:
    column = np.full_like(like, value)
    column.setflags(write=False)
    return column


def _filter(state: CycleState) -> FilterResult | None:
    args = state.args_of(NAME, InterferenceArgs)
    if not state.signals_readable:
        return unreadable_signals_filter(state.table, state.pod, args)
    return interference_filter(state.table, state.pod, args, state.now)


def unreadable_signals_filter(
    table: NodeTable, pod: PodInfo, args: InterferenceArgs
) -> FilterResult | None:
    """Failing closed while no signal can be read: every node refused for a pod this
    filter would judge by signals (a tolerance, or ``stale_policy: reject``); ``None`` for
    the others."""
    if pod.tolerance is None and args.stale_policy != "reject":
        return None
    return FilterResult(NAME, np.zeros(len(table), dtype=np.bool_), (SIGNALS_UNREADABLE,))


def _score(state: CycleState, feasible: NDArray[np.bool_]) -> NDArray[np.float64] | None:
    return quietness(state.table, state.args_of(NAME, InterferenceArgs), state.now)


def _runq_evidence(
    state: CycleState, nodes: Iterable[str], nearest_among: NDArray[np.bool_] | None
) -> RunqCheck | None:
    """:func:`runq_check` for the record while signals are readable."""
    if state.pod.tolerance is None or not state.signals_readable:
        return None  # most pods: no lookups
    args = state.args_of(NAME, InterferenceArgs)
    return runq_check(state.table, state.pod, args, state.now, nodes, nearest_among)


def _index_evidence(state: CycleState, nodes: Iterable[str]) -> IndexRead | None:
    """For the record: the index this plugin reads (:func:`effective_index`) on those of
    ``nodes`` with usable signals; ``None`` while signals are unreadable."""
    if not state.signals_readable:
        return None
    args = state.args_of(NAME, InterferenceArgs)
    table = state.table
    index = effective_index(table, args)
    fresh = fresh_signals(table, state.now)
    read: dict[str, float] = {}
    for node in nodes:
        row = table.row_of(node)
        if row is not None and fresh[row]:
            read[node] = index.item(row)
    return IndexRead(args.signal_window, read)


FILTER = Filter(
    name=NAME,
    explain="the node's interference signals are within the pod's tolerance "
    "(and, under stale_policy reject, fresh)",
    filter=_filter,
    events=(EventInterest("Node", Action.ADD),),
    relaxable=True,
    signals=(
        "signals_at",
        "fresh_until",
        "runq_p99_us",
        "reclaim_mean",
        "reclaim_stddev",
        "index_mean",
        "index_stddev",
    ),
    args=InterferenceArgs,
    evidence=Evidence(
        runq=_runq_evidence, refused_for_runq=refused_for_runq, index_read=_index_evidence
    ),
)
SCORE = Score(
    name=NAME,
    explain="quietness: 100 − the node's interference index (risk-adjusted, plus load "
    "placed since its last report)",
    score=_score,
    default_weight=2.0,
    signals=("fresh_until", "index_mean", "index_stddev"),
    args=InterferenceArgs,
)
