r"""The plugin interface: what a plugin declares, receives and returns.

A plugin is one module under :mod:`scheduler.plugins` holding a filter, a score or both,
as pure functions of a :class:`CycleState` (the pod, the node table, the plugin's own
args, the clock and the results of the filters that already ran), with the formula in
the docstring, and one line in :mod:`scheduler.plugins.registry`. The scheduling cycle
(:mod:`scheduler.cycle.cycle`) runs a profile: PreFilter, the filters in order (each node
counted at its first failing filter), the scores over the nodes that passed
(``total = Σ weightₚ · scoreₚ``), the relax rule and the interference-blind fallback.

What a plugin declares (kube-scheduler's framework, in its words):

- **Extension points.** ``FILTER = Filter(...)`` and/or ``SCORE = Score(...)``: the
  function is the ``filter``/``score`` field itself (no extra call per decision; a pure
  function of the table and the pod is wrapped by :func:`filter_by_table_and_pod` or
  :func:`score_by_table_pod_and_feasible`). **PreFilter** (:attr:`Filter.prefilter`): a
  pod-wide check before any filter; a :class:`PodRejection` ends the decision with no node
  looked at. **Filter**: a pass mask over all nodes and why the others failed
  (:class:`FilterResult`), or ``None`` when the pod asks nothing of the plugin.
  **Score**: 0–100 per node (higher is better), or ``None`` for no preference.
- **Args** (:attr:`Filter.args`, :attr:`Score.args`): a frozen dataclass of the plugin's
  options with defaults, set in the profile's ``pluginConfig`` (kube's shape: a list of
  ``{name, args}``) and read with :meth:`CycleState.args_of`.
- **Status per reason** (:attr:`Filter.status`, :attr:`Filter.statuses`): whether
  evicting pods could undo a rejection (:class:`Code`: kube's ``Unschedulable`` vs
  ``UnschedulableAndUnresolvable``; extender mode's ``FailedNodes`` vs
  ``FailedAndUnresolvableNodes``).
- **Events** (:attr:`Filter.events`, kube's ``EventsToRegister`` with ``QueueingHint``\s):
  the cluster events that can make a pod this filter rejected schedulable; the queue
  retries such a pod early only on those.
- **Evidence** (:attr:`Filter.evidence`, :attr:`Score.evidence`; ours, kube-scheduler's
  records are Events): what the plugin read, for the decision record's own fields (the
  run-queue check, the index read, a candidate's details), so the cycle fills them
  without knowing which plugin reads what.
- **State** of its own across decisions: a lookup of placed pods registered with the
  table (:meth:`scheduler.signals.table.NodeTable.lookup`, add/remove hooks) and values in the
  table's caches (:meth:`~scheduler.signals.table.NodeTable.cached`, scopes named for what
  empties them) — never module state.

A plugin must not import adapters, ``redis`` or ``kubernetes`` (import-linter checks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from interference.decision import IndexRead, RunqCheck
from scheduler.api.events import EventInterest
from scheduler.api.objects import PodInfo
from scheduler.signals.frame import COLUMNS_BY_NAME
from scheduler.signals.placed_pods import PlacedPodLookup
from scheduler.signals.table import NodeTable


@dataclass(slots=True)
class FilterResult:
    """One filter over all nodes of a table.

    ``passed[i]`` says whether node row ``i`` passes. ``reasons`` are the kube-scheduler
    style messages this filter can give; :meth:`reason_columns` says which apply to each
    node (computed lazily, once, since only failure messages and decision records need it).
    """

    name: str
    passed: NDArray[np.bool_]
    reasons: tuple[str, ...]
    explain: Callable[[], Sequence[NDArray[np.bool_]]] | None = None
    """Builds :meth:`reason_columns`; ``None`` means one reason for every failure."""
    measured: Callable[[int, int], str] | None = None
    """``(reason's position, node row)`` → what was measured against what bound, appended to
    that reason in decision records (e.g. ``2900 µs measured > 500 µs tolerated``)."""
    _columns: Sequence[NDArray[np.bool_]] | None = field(default=None, repr=False)

    def reason_columns(self) -> Sequence[NDArray[np.bool_]]:
        """Per reason, a node mask: ``column[i]`` says whether the reason applies to node
        ``i``; read only where the node failed (a passing node's entries mean nothing)."""
        if self._columns is None:
            self._columns = (~self.passed,) if self.explain is None else self.explain()
        return self._columns

    def reason_counts(self, failing: NDArray[np.bool_]) -> list[int]:
        """Per reason, how many of the ``failing`` nodes (a mask of nodes this filter
        rejected) it applies to: ``count(failing ∧ column)``."""
        if len(self.reasons) == 1:  # a failing node fails for some reason: the only one
            return [int(np.count_nonzero(failing))]
        return [int(np.count_nonzero(failing & column)) for column in self.reason_columns()]

    def reasons_for(self, row: int) -> list[str]:
        """The reasons node ``row`` failed this filter (empty when it passed)."""
        if self.passed[row]:
            return []
        return self.failure_reasons(np.array([row]))[0]

    def failure_reasons(self, rows: NDArray[np.intp]) -> list[list[str]]:
        """:meth:`reasons_for` each of ``rows``, nodes known to have failed this filter,
        each followed by its measurement when the filter has one (``reason (what)``)."""
        if len(self.reasons) == 1:
            flags = [[True] for _ in range(len(rows))]
        else:
            stacked = np.stack([column[rows] for column in self.reason_columns()], axis=1)
            flags = stacked.tolist()
        measured = self.measured
        return [
            [
                reason if measured is None else f"{reason} ({measured(position, row)})"
                for position, (reason, flag) in enumerate(
                    zip(self.reasons, node_flags, strict=True)
                )
                if flag
            ]
            for row, node_flags in zip(rows.tolist(), flags, strict=True)
        ]


def any_per_node(matrix: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """``result[i] = ∃j matrix[i, j]`` for a ``[nodes, k]`` matrix."""
    return np.asarray(matrix.any(axis=1), dtype=np.bool_)


class Code(Enum):
    """What a rejection says about preemption (kube-scheduler's status codes)."""

    UNSCHEDULABLE = "Unschedulable"
    """Evicting pods may undo it (resources, host ports, anti-affinity)."""
    UNSCHEDULABLE_AND_UNRESOLVABLE = "UnschedulableAndUnresolvable"
    """Nothing evicting pods does changes it (labels, taints, readiness, interference)."""


@dataclass(frozen=True, slots=True)
class PodRejection:
    """A PreFilter's pod-wide verdict: no node can run the pod as it is."""

    reason: str = ""
    """kube-scheduler's PreFilter message (``persistentvolumeclaim "data" not found``),
    the whole ``FailedScheduling`` reason."""
    unsupported: tuple[str, ...] = ()
    """Instead of ``reason``: fields standalone mode does not implement for this pod (the
    pod is refused naming them, as for :attr:`PodInfo.unsupported`)."""


A = TypeVar("A")


@dataclass(slots=True)
class CycleState:
    """Everything a plugin reads for one scheduling decision of one pod."""

    pod: PodInfo
    table: NodeTable
    now: float
    """The decision's clock (seconds since the epoch), for signal freshness."""
    args: Mapping[str, object] = field(default_factory=dict)
    """The profile's plugin args by plugin name (read with :meth:`args_of`)."""
    filtered: dict[str, FilterResult | None] = field(default_factory=dict)
    """Results of the profile's filters that already ran for this pod, by plugin name
    (``None``: the plugin had nothing to check). Read them with :meth:`passed`."""
    data: dict[str, object] = field(default_factory=dict)
    """What a plugin's PreFilter found for its Filter or Score, under the plugin's name."""
    signals_readable: bool = True
    """False while the signal source cannot be read: the filters that read signals then
    fail closed (:attr:`Filter.uses_signals`)."""

    def passed(self, plugin: str) -> NDArray[np.bool_]:
        """The pass mask of filter ``plugin``, which must have run earlier in the profile
        (declared in its :attr:`Filter.reads`); all nodes when it had nothing to check.
        Callers must not modify it."""
        result = self.filtered[plugin]
        return self.table.everyone() if result is None else result.passed

    def args_of(self, plugin: str, kind: type[A]) -> A:
        """Plugin ``plugin``'s args (its defaults when the profile sets none)."""
        found = self.args.get(plugin)
        return found if isinstance(found, kind) else kind()


CandidateDetails = Callable[[int], dict[str, str]]
"""What a decision record says about a candidate node (its row) besides its verdict and
scores (:attr:`interference.decision.CandidateVerdict.details`)."""


RunqEvidence = Callable[[CycleState, Iterable[str], NDArray[np.bool_] | None], RunqCheck | None]
"""The signature of :attr:`Evidence.runq`."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a plugin adds to the decision record besides its verdicts and scores: what it
    read, so ``interference explain`` and the decision page show what decided rather than
    what an agent published. Each field fills one record field; at most one plugin of a
    registry supplies each (:class:`scheduler.plugins.registry.Registry` checks), and the
    record leaves out a field no plugin of the profile run supplies."""

    runq: RunqEvidence | None = None
    """``(state, nodes, nearest_among)`` → the pod's run-queue tolerance and the p99 compared
    on ``nodes`` (the recorded candidates) and, given ``nearest_among`` (for a pod no node
    passed), the nearest node among them (:attr:`interference.decision.Decision.runq`);
    ``None`` for a pod without such a tolerance or while signals are unreadable."""
    refused_for_runq: Callable[[Iterable[str]], bool] | None = None
    """Whether reasons (as counted, or with a node's measurement after them) include the
    run-queue tolerance's: the FailedScheduling message then says how far to raise it.
    Given exactly when :attr:`runq` is."""
    index_read: Callable[[CycleState, Iterable[str]], IndexRead | None] | None = None
    """``(state, nodes)`` → the index read on those of ``nodes`` with usable signals
    (:attr:`interference.decision.Decision.interference_index`)."""
    candidate_details: Callable[[CycleState], CandidateDetails | None] | None = None
    """``state`` → what a record says about each candidate of this pod (``None``: nothing,
    without a call per candidate)."""

    def __post_init__(self) -> None:
        if (self.runq is None) != (self.refused_for_runq is None):
            raise ValueError("evidence: runq and refused_for_runq come together")

    def fields(self) -> tuple[str, ...]:
        """The record fields this evidence supplies."""
        return tuple(
            name
            for name in ("runq", "index_read", "candidate_details")
            if getattr(self, name) is not None
        )

    @staticmethod
    def combined(parts: Iterable[Evidence]) -> Evidence:
        """One evidence of ``parts``, each field from the first part that supplies it."""
        parts = tuple(parts)
        runq = next((part for part in parts if part.runq is not None), None)
        index_read = next((part.index_read for part in parts if part.index_read), None)
        details = next((part.candidate_details for part in parts if part.candidate_details), None)
        return Evidence(
            runq=None if runq is None else runq.runq,
            refused_for_runq=None if runq is None else runq.refused_for_runq,
            index_read=index_read,
            candidate_details=details,
        )


@dataclass(frozen=True, slots=True)
class Filter:
    """A filter plugin: which nodes may run the pod, and why the others may not."""

    name: str
    """The plugin's name (kube-scheduler's where it mirrors one): the key in profiles,
    :attr:`FilterResult.name` and decision records."""
    explain: str
    """One line on what the filter checks, for ``interference explain`` and the docs."""
    filter: Callable[[CycleState], FilterResult | None]
    """The pass mask over every node of ``state.table``, ``None`` when the pod asks
    nothing of this plugin (every node passes; nothing to report)."""
    events: tuple[EventInterest, ...]
    """The cluster events that can make a pod this filter rejected schedulable (kube's
    ``EventsToRegister``, each with an optional ``QueueingHint``)."""
    status: Code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    """The code of this filter's rejections."""
    statuses: Mapping[str, Code] = field(default_factory=dict)
    """Reason → code, where a reason's differs from :attr:`status`."""
    static: bool = False
    """True when the result depends only on the pod's :attr:`PodInfo.signature` and the
    nodes' constraint fields (labels, taints, readiness, cordon): the cycle caches it per
    signature in the table's ``constraints`` scope."""
    reads: tuple[str, ...] = ()
    """Filters whose results this one reads from :attr:`CycleState.filtered`; the profile
    runs them earlier."""
    relaxable: bool = False
    """Dropped for a pod refused only by relaxable filters for ``relax_after_s`` (the
    interference filters); never true of a kube-scheduler constraint."""
    signals: tuple[str, ...] = ()
    """The signal columns it reads, by their declared names
    (:data:`scheduler.signals.frame.COLUMNS`; a windowed one in every window): any makes
    it :attr:`uses_signals`."""
    uses_signals: bool = False
    """Reads the agents' signals. While they are unreadable it still runs, with
    :attr:`CycleState.signals_readable` false, and fails closed: it refuses every node
    for a pod it would judge by signals (relaxable, so the relax rule still applies) and
    has nothing to check for the others. Off in an interference-blind profile."""
    in_extender: bool = True
    """Also run in extender mode, where kube-scheduler has already run its own plugins
    (False for what the extender cannot judge as well, e.g. volume binding)."""
    prefilter: Callable[[CycleState], PodRejection | None] | None = None
    """A pod-wide check run before every filter of the profile (``None``: none); a
    :class:`PodRejection` refuses the pod without looking at nodes. Standalone mode only:
    in extender mode kube-scheduler has run its own PreFilters."""
    args: type | None = None
    """The dataclass of this plugin's args (``pluginConfig``), ``None`` when it has none."""
    lookup: Callable[[], PlacedPodLookup] | None = None
    """Builds the plugin's lookup of placed pods, registered with the table under the
    plugin's name before pods arrive (:meth:`scheduler.signals.table.NodeTable.lookup`), so it is
    kept current as pods are placed rather than built at the first decision."""
    evidence: Evidence | None = None
    """What it adds to the decision record besides its verdicts (``None``: nothing)."""

    def __post_init__(self) -> None:
        _check_signals(self, self.signals)

    def code(self, reason: str) -> Code:
        """The status code of ``reason``."""
        return self.statuses.get(reason, self.status)


@dataclass(frozen=True, slots=True)
class Score:
    """A score plugin: how much it likes each feasible node, 0–100."""

    name: str
    """The key of its weight in profiles and of its score in decision records
    (:attr:`interference.decision.CandidateVerdict.scores`)."""
    explain: str
    """One line on what the score prefers, for ``interference explain`` and the docs."""
    score: Callable[[CycleState, NDArray[np.bool_]], NDArray[np.float64] | None]
    """0–100 per node of ``state.table`` (only ``feasible`` nodes' values count; the cycle
    never writes into the array, so it may be a cached column), or ``None`` when the
    plugin has no preference for this pod."""
    default_weight: float
    """Its weight in the default profile (0–100; 0 leaves it out)."""
    in_extender: bool = True
    """Also scored in extender mode (False where kube-scheduler's own plugin scores it)."""
    signals: tuple[str, ...] = ()
    """The signal columns it reads, by their declared names
    (:data:`scheduler.signals.frame.COLUMNS`): any makes it :attr:`uses_signals`."""
    uses_signals: bool = False
    """Reads the agents' signals: off while they are unreadable (interference-blind)."""
    args: type | None = None
    """The dataclass of this plugin's args, ``None`` when it has none."""
    evidence: Evidence | None = None
    """What it adds to the decision record besides its scores (``None``: nothing)."""

    def __post_init__(self) -> None:
        _check_signals(self, self.signals)


def _check_signals(plugin: Filter | Score, signals: tuple[str, ...]) -> None:
    """Refuse a signal column nobody declared; a plugin that reads one uses signals."""
    unknown = [name for name in signals if name not in COLUMNS_BY_NAME]
    if unknown:
        raise ValueError(
            f"plugin {plugin.name}: no signal column {', '.join(unknown)}; declared: "
            + ", ".join(COLUMNS_BY_NAME)
        )
    if signals:
        object.__setattr__(plugin, "uses_signals", True)


def filter_by_table_and_pod(
    check: Callable[[NodeTable, PodInfo], FilterResult | None],
) -> Callable[[CycleState], FilterResult | None]:
    """A :attr:`Filter.filter` running ``check`` on the cycle's table and pod, for the
    filters that read nothing else."""

    def run(state: CycleState) -> FilterResult | None:
        return check(state.table, state.pod)

    return run


def score_by_table_pod_and_feasible(
    score: Callable[[NodeTable, PodInfo, NDArray[np.bool_]], NDArray[np.float64] | None],
) -> Callable[[CycleState, NDArray[np.bool_]], NDArray[np.float64] | None]:
    """A :attr:`Score.score` running ``score`` on the cycle's table and pod and the
    feasible nodes, for the scores that read nothing else."""

    def run(state: CycleState, feasible: NDArray[np.bool_]) -> NDArray[np.float64] | None:
        return score(state.table, state.pod, feasible)

    return run
