"""The plugin interface: what a filter or score plugin receives and returns.

A plugin is one module under :mod:`scheduler.plugins` holding a filter, a score or both,
as pure functions of a :class:`CycleState` (the pod, the node table, the engine settings,
the clock and the results of the filters that already ran), with the formula in the
docstring. The engine runs a profile (:class:`scheduler.settings.Profile`): its filters in
order, each node counted at its first failing filter, then its scores over the nodes that
passed, ``total = Σ weightₚ · scoreₚ``. Plugins keep whatever they want to reuse across
decisions in the table's caches (:meth:`scheduler.table.NodeTable.cached`, scopes named
for what empties them), never in module state.

A plugin module exposes ``FILTER = Filter(...)`` and/or ``SCORE = Score(...)`` (the
function is the ``filter``/``score`` field itself: no extra call per decision; a pure
function of the table and the pod is wrapped by :func:`filter_by_table_and_pod` or
:func:`score_by_table_pod_and_feasible`) and is listed in
:mod:`scheduler.plugins.registry`. It must not import adapters, ``redis`` or ``kubernetes``
(import-linter checks).

Extension points (kube-scheduler's names):

- **PreFilter** (:attr:`FilterPlugin.prefilter`): a pod-wide check before any filter
  runs; a :class:`PodRejection` ends the decision with no node looked at (what it found
  for the filter may go into :attr:`CycleState.data`). Standalone mode only: in extender
  mode kube-scheduler has run its own PreFilters, so a plugin with one is not
  :attr:`~FilterPlugin.in_extender`.
- **Filter** (:class:`FilterPlugin`): a pass mask over all nodes and why nodes failed
  (:class:`FilterResult`), or ``None`` when the pod asks nothing of this plugin.
- **Score** (:class:`ScorePlugin`): 0–100 per node (higher is better), or ``None`` when
  the plugin has no preference for this pod; only the feasible nodes' values count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from scheduler.api.objects import PodInfo
from scheduler.settings import EngineSettings
from scheduler.table import NodeTable


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
    """``(reason index, node row)`` → what was measured against what bound, appended to
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
                reason if measured is None else f"{reason} ({measured(index, row)})"
                for index, (reason, flag) in enumerate(zip(self.reasons, node_flags, strict=True))
                if flag
            ]
            for row, node_flags in zip(rows.tolist(), flags, strict=True)
        ]


def any_per_node(matrix: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """``result[i] = ∃j matrix[i, j]`` for a ``[nodes, k]`` matrix."""
    return np.asarray(matrix.any(axis=1), dtype=np.bool_)


def all_pass(name: str, table: NodeTable) -> FilterResult:
    """A filter with nothing to check for this pod (every node passes)."""
    return FilterResult(name, table.everyone(), ())


def or_all_pass(result: FilterResult | None, table: NodeTable) -> FilterResult:
    """``result``, or for ``None`` (the filter had nothing to check) every node passing."""
    return FilterResult("", table.everyone(), ()) if result is None else result


@dataclass(frozen=True, slots=True)
class PodRejection:
    """A PreFilter's pod-wide verdict: no node can run the pod as it is."""

    reason: str = ""
    """kube-scheduler's PreFilter message (``persistentvolumeclaim "data" not found``),
    the whole ``FailedScheduling`` reason."""
    unsupported: tuple[str, ...] = ()
    """Instead of ``reason``: fields standalone mode does not implement for this pod (the
    pod is refused naming them, as for :attr:`PodInfo.unsupported`)."""


@dataclass(slots=True)
class CycleState:
    """Everything a plugin reads for one scheduling decision of one pod."""

    pod: PodInfo
    table: NodeTable
    settings: EngineSettings
    now: float
    """The decision's clock (seconds since the epoch), for signal freshness."""
    filtered: dict[str, FilterResult | None] = field(default_factory=dict)
    """Results of the profile's filters that already ran for this pod, by plugin name
    (``None``: the plugin had nothing to check). Read them with :meth:`passed`."""
    data: dict[str, object] = field(default_factory=dict)
    """What a plugin's PreFilter found for its Filter or Score, under the plugin's name."""

    def passed(self, plugin: str) -> NDArray[np.bool_]:
        """The pass mask of filter ``plugin``, which must have run earlier in the profile
        (declared in its :attr:`FilterPlugin.reads`); all nodes when it had nothing to check.
        Callers must not modify it."""
        result = self.filtered[plugin]
        return self.table.everyone() if result is None else result.passed


class FilterPlugin(Protocol):
    """A filter: which nodes may run the pod, and why the others may not."""

    @property
    def name(self) -> str:
        """The plugin's name (kube-scheduler's where it mirrors one): the key in profiles,
        :attr:`FilterResult.name` and decision records."""

    @property
    def explain(self) -> str:
        """One line on what the filter checks, for ``interference explain`` and the docs."""

    @property
    def static(self) -> bool:
        """True when the result depends only on the pod's :attr:`PodInfo.signature` and the
        nodes' constraint fields (labels, taints, readiness, cordon): the engine caches it
        per signature in the table's ``constraints`` scope."""

    @property
    def reads(self) -> tuple[str, ...]:
        """Filters whose results this one reads from :attr:`CycleState.filtered`; a profile
        must run them earlier."""

    @property
    def preemption_may_help(self) -> bool:
        """Whether evicting pods could undo a rejection (kube-scheduler's ``Unschedulable``
        vs ``UnschedulableAndUnresolvable``; extender mode's ``FailedNodes`` vs
        ``FailedAndUnresolvableNodes``)."""

    @property
    def relaxable(self) -> bool:
        """Dropped for a pod refused only by relaxable filters for ``relax_after_s`` (the
        interference filters); never true of a kube-scheduler constraint."""

    @property
    def in_extender(self) -> bool:
        """Also run in extender mode, where kube-scheduler has already run its own plugins
        (False for what the extender cannot judge as well, e.g. volume binding)."""

    @property
    def prefilter(self) -> Callable[[CycleState], PodRejection | None] | None:
        """A pod-wide check run before every filter of the profile (``None``: none); a
        :class:`PodRejection` refuses the pod without looking at nodes."""

    def filter(self, state: CycleState) -> FilterResult | None:
        """The pass mask over every node of ``state.table``, ``None`` when the pod asks
        nothing of this plugin (every node passes; nothing to report)."""


class ScorePlugin(Protocol):
    """A score: how much the plugin likes each feasible node, 0–100."""

    @property
    def name(self) -> str:
        """The plugin's name: the key of its weight in profiles and of its score in
        decision records (:attr:`interference.decision.CandidateVerdict.scores`)."""

    @property
    def explain(self) -> str:
        """One line on what the score prefers, for ``interference explain`` and the docs."""

    @property
    def default_weight(self) -> float:
        """Its weight in the default profile (0–100; 0 leaves it out)."""

    @property
    def in_extender(self) -> bool:
        """Also scored in extender mode (False where kube-scheduler's own plugin scores it)."""

    def score(self, state: CycleState, feasible: NDArray[np.bool_]) -> NDArray[np.float64] | None:
        """0–100 per node of ``state.table`` (only ``feasible`` nodes' values count; the
        engine never writes into the array, so it may be a cached column), or ``None`` when
        the plugin has no preference for this pod."""


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


@dataclass(frozen=True, slots=True)
class Filter:
    """A :class:`FilterPlugin` built from a function (how the plugin modules declare one)."""

    name: str
    explain: str
    filter: Callable[[CycleState], FilterResult | None]
    static: bool = False
    reads: tuple[str, ...] = ()
    preemption_may_help: bool = False
    relaxable: bool = False
    in_extender: bool = True
    prefilter: Callable[[CycleState], PodRejection | None] | None = None


@dataclass(frozen=True, slots=True)
class Score:
    """A :class:`ScorePlugin` built from a function (how the plugin modules declare one)."""

    name: str
    explain: str
    score: Callable[[CycleState, NDArray[np.bool_]], NDArray[np.float64] | None]
    default_weight: float
    in_extender: bool = True
