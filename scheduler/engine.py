"""One scheduling decision: run the profile's filters, score what passes, pick the best.

The profile (:class:`scheduler.settings.Profile`, resolved by
:mod:`scheduler.plugins.registry`) lists the filter plugins in order — by default
kube-scheduler's: NodeReady, NodeUnschedulable, TaintToleration, NodeAffinity, NodePorts,
NodeResourcesFit, PodTopologySpread, InterPodAffinity, then Interference — and the score
plugins with their weights. First every filter's PreFilter (a pod-wide check that may
refuse the pod outright), then the filters: the leading static ones (depending only on the
pod's signature) together, cached in the table per signature with their rejection counts,
then the others. A node counts only its first failing filter in the ``FailedScheduling``
message, as in kube-scheduler.

Scores (0–100 each) are combined as ``total = Σ weightₚ · scoreₚ`` over the profile's
score plugins; the highest total wins and ties are broken uniformly at random. The result
carries, for the decision record, the best ``record_top_k`` candidates with their score
breakdown by plugin name (the chosen node first), then up to as many rejected nodes with
the reasons of their first failing filter — those the last filters (Interference)
rejected first, so ``interference explain`` shows why a noisy node lost — and the count
of nodes per reason. Reasons are looked up only for the recorded nodes; counts need the
per-reason split only for filters with several reasons, and the signature-cached filters'
counts are cached with their masks.

With ``EngineSettings.interference_aware`` False the Interference plugin neither filters
nor scores (interference-blind scheduling); ``relax_interference`` drops the relaxable
filters (Interference) for one decision.

A pod asking for a field the engine does not implement (:attr:`PodInfo.unsupported`) is
refused before any filter runs: no node, and a message naming the field. No pod is ever
placed with a constraint ignored.

Preemption is not done, but when no node fits, the message says on how many nodes evicting
lower-priority pods would have made room (see :func:`preemption_would_help`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from interference.decision import CandidateVerdict
from scheduler.api.objects import GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, PREEMPT_NEVER, PodInfo
from scheduler.messages import (
    NO_NODES,
    failed_scheduling_message,
    pod_rejected_message,
    preemption_message,
    refused_message,
    scheduled_message,
)
from scheduler.plugins.base import CycleState, FilterPlugin, FilterResult, PodRejection
from scheduler.plugins.node_resources_fit import NAME as NODE_RESOURCES_FIT
from scheduler.plugins.registry import ResolvedProfile, resolve
from scheduler.quantity import PODS
from scheduler.settings import EngineSettings
from scheduler.table import NodeTable

GPU_MODEL = "gpu_model"
"""Candidate detail: the node's GPU model (``nvidia.com/gpu.product``), for GPU pods."""
GPU_MEMORY_MIB = "gpu_memory_mib"
"""Candidate detail: memory per GPU in MiB (``nvidia.com/gpu.memory``), for GPU pods."""


@dataclass(frozen=True, slots=True)
class EngineResult:
    """The outcome of :meth:`Engine.schedule` for one pod."""

    node: str | None
    """Chosen node, ``None`` when no node passed every filter."""
    candidates: list[CandidateVerdict]
    """The chosen node and the next best with score breakdowns (none when no node passed),
    then up to ``record_top_k`` rejected nodes with the reasons of their first failing
    filter, those rejected by the last filters (Interference) first. For GPU pods each
    carries the node's GPU model and memory in ``details``."""
    message: str
    """``Successfully assigned ns/pod to node`` or kube-scheduler's FailedScheduling text."""
    blocked_only_by_interference: bool
    """No node passed, but some would have without the relaxable (interference) filters."""
    unsupported: tuple[str, ...]
    """The pod's fields standalone mode does not implement; when any, the pod was refused."""
    feasible: int
    """How many nodes passed every filter."""
    reason_counts: dict[str, int] = field(default_factory=dict)
    """Filter reason → nodes it rejected, each node counted at its first failing filter
    (the FailedScheduling histogram; also for scheduled pods)."""


@dataclass(frozen=True, slots=True)
class _StaticStage:
    """The profile's leading filters that depend only on the pod's signature and the
    nodes' constraint fields."""

    passed: NDArray[np.bool_]
    results: dict[str, FilterResult | None]
    """By plugin name (``None``: nothing to check for this pod)."""
    passed_count: int
    rejections: _Rejections
    """Which nodes these filters reject first, and why (cached with the masks)."""
    verdicts: dict[tuple[int, bool], list[CandidateVerdict]] = field(default_factory=dict)
    """Record entries of the first rejected nodes by (how many, with GPU details); they
    depend only on what the masks depend on, so they are built once per signature."""


@dataclass(frozen=True, slots=True)
class _Rejections:
    """Nodes rejected by a sequence of filters, each at its first failing filter."""

    counts: dict[str, int]
    """Reason → nodes, reasons with none left out (a node failing a filter for two
    reasons counts under both)."""
    failing: tuple[tuple[FilterResult, NDArray[np.bool_]], ...]
    """Per filter that rejected any node first, in filter order: the nodes it rejected."""


def run_filter(plugin: FilterPlugin, state: CycleState) -> FilterResult | None:
    """``plugin.filter(state)``, from the table's per-signature cache for a static plugin,
    recorded in ``state.filtered`` for the filters after it."""
    if plugin.static:
        result = state.table.cached(
            "constraints", (plugin.name, state.pod.signature), lambda: plugin.filter(state)
        )
    else:
        result = plugin.filter(state)
    state.filtered[plugin.name] = result
    return result


def prefilter(profile: ResolvedProfile, state: CycleState) -> PodRejection | None:
    """The first pod-wide rejection of the profile's filters' PreFilters, if any."""
    for check in profile.prefilters:
        rejection = check(state)
        if rejection is not None:
            return rejection
    return None


class Engine:
    """Filters and scores nodes for one pod at a time; holds no cluster state itself."""

    def __init__(self, settings: EngineSettings, seed: int | None = None) -> None:
        self.settings = settings
        self.profile = resolve(settings.profile)
        self._random = random.Random(seed)

    def schedule(
        self, pod: PodInfo, table: NodeTable, now: float, relax_interference: bool = False
    ) -> EngineResult:
        """Pick a node for ``pod`` (``relax_interference`` drops the relaxable filters)."""
        if len(table) == 0:
            return EngineResult(None, [], NO_NODES, False, pod.unsupported, 0)
        if pod.unsupported:
            message = refused_message(len(table), pod.unsupported)
            return EngineResult(None, [], message, False, pod.unsupported, 0)
        profile = self.profile
        state = CycleState(pod, table, self.settings, now)
        rejection = prefilter(profile, state) if profile.prefilters else None
        if rejection is not None:
            if rejection.unsupported:
                message = refused_message(len(table), rejection.unsupported)
                return EngineResult(None, [], message, False, rejection.unsupported, 0)
            message = pod_rejected_message(len(table), rejection.reason)
            return EngineResult(None, [], message, False, (), 0)
        static = self._static_stage(state)
        state.filtered.update(static.results)
        dynamic: list[FilterResult] = []  # those with a reason, in profile order
        binding: list[FilterResult] = []  # … of them, those never relaxed
        for plugin in profile.dynamic:
            if relax_interference and plugin.relaxable:
                state.filtered[plugin.name] = None
                continue
            if plugin.static:
                result = run_filter(plugin, state)
            else:  # run_filter inlined: this loop runs for every decision
                result = state.filtered[plugin.name] = plugin.filter(state)
            if result is not None and result.reasons:  # no reason: every node passed
                dynamic.append(result)
                if not plugin.relaxable:
                    binding.append(result)
        without_relaxable = _all_of(static.passed, binding)
        if len(binding) == len(dynamic):
            passed = without_relaxable
        else:
            passed = _all_of(static.passed, dynamic)
        feasible = int(np.count_nonzero(passed))
        details = self._details_for(pod, table)
        counts = dict(static.rejections.counts)  # the result's own, the cached one stays
        rejected: list[CandidateVerdict] = []
        if static.passed_count > feasible:
            dynamic_rejections = _rejections(dynamic, static.passed)
            counts = _merged(counts, dynamic_rejections.counts)
            rejected = self._rejected(table, dynamic_rejections.failing, details)
        left = self.settings.record_top_k - len(rejected)
        if left > 0 and static.rejections.failing:
            rejected += self._static_verdicts(table, static, left, details)
        if feasible == 0:
            message = failed_scheduling_message(len(table), counts)
            fit = state.filtered.get(NODE_RESOURCES_FIT)
            if fit is not None and fit.reasons:
                only_resources = _all_of(static.passed, (s for s in dynamic if s is not fit))
                helpful = preemption_would_help(table, pod, only_resources & ~fit.passed)
                if helpful:
                    message += preemption_message(helpful, len(table))
            return EngineResult(
                node=None,
                candidates=rejected,
                message=message,
                blocked_only_by_interference=bool(without_relaxable.any()),
                unsupported=pod.unsupported,
                feasible=0,
                reason_counts=counts,
            )
        scores: dict[str, tuple[float, NDArray[np.float64]]] = {}
        for scorer, weight in profile.scores:
            score = scorer.score(state, passed)
            if score is not None:
                scores[scorer.name] = (weight, score)
        totals = _weighted_sum(scores.values(), len(table))
        np.putmask(totals, ~passed, -np.inf)  # infeasible nodes rank last, never chosen
        best = _best_first(totals, min(max(2, self.settings.record_top_k), feasible))
        chosen = best[0]
        if len(best) > 1 and totals[best[1]] == totals[chosen]:
            ties = np.flatnonzero(totals == totals[chosen])
            chosen = int(ties[self._random.randrange(len(ties))])
        ranked = self._ranked(table, best, chosen, scores, totals, details)
        return EngineResult(
            node=table.names[chosen],
            candidates=ranked + rejected,
            message=scheduled_message(pod.key, table.names[chosen]),
            blocked_only_by_interference=False,
            unsupported=pod.unsupported,
            feasible=feasible,
            reason_counts=counts,
        )

    def _static_stage(self, state: CycleState) -> _StaticStage:
        key = ("static", self.profile.static_names, state.pod.signature)
        return state.table.cached("constraints", key, lambda: self._build_static(state))

    def _build_static(self, state: CycleState) -> _StaticStage:
        table = state.table
        results: dict[str, FilterResult | None] = {}
        for plugin in self.profile.filters[: self.profile.static_prefix]:
            results[plugin.name] = result = plugin.filter(state)
            state.filtered[plugin.name] = result  # a later static filter may read it
        checked = [r for r in results.values() if r is not None and r.reasons]
        passed = _all_of(table.everyone(), checked)
        return _StaticStage(
            passed, results, int(np.count_nonzero(passed)), _rejections(checked, table.everyone())
        )

    def _static_verdicts(
        self,
        table: NodeTable,
        static: _StaticStage,
        count: int,
        details: Callable[[int], dict[str, str]],
    ) -> list[CandidateVerdict]:
        """:meth:`_rejected` for the signature-cached filters, built once per signature."""
        key = (count, details is not _no_details)
        verdicts = static.verdicts.get(key)
        if verdicts is None:
            verdicts = self._rejected(table, static.rejections.failing, details, count)
            static.verdicts[key] = verdicts
        return verdicts

    def _details_for(self, pod: PodInfo, table: NodeTable) -> Callable[[int], dict[str, str]]:
        """What a candidate record says about a node besides verdict and scores: for GPU
        pods, the node's GPU model and memory (labels, else the agent's devices)."""
        if pod.requests.get(self.settings.gpu_resource, 0) == 0:
            return _no_details

        # labels change only with the table's generation, which empties this scope
        found: dict[int, dict[str, str]] = table.cached("constraints", "gpu_details", dict)

        def gpu_details(row: int) -> dict[str, str]:
            cached = found.get(row)
            if cached is None:
                labels = ((GPU_MODEL, GPU_PRODUCT_LABEL), (GPU_MEMORY_MIB, GPU_MEMORY_LABEL))
                values = {name: table.node_label(row, label) for name, label in labels}
                cached = {name: value for name, value in values.items() if value is not None}
                found[row] = cached
            return cached

        return gpu_details

    def _ranked(
        self,
        table: NodeTable,
        best_rows: list[int],
        chosen: int,
        scores: dict[str, tuple[float, NDArray[np.float64]]],
        totals: NDArray[np.float64],
        details: Callable[[int], dict[str, str]],
    ) -> list[CandidateVerdict]:
        """The chosen node, then the next best feasible nodes, with their breakdowns."""
        k = self.settings.record_top_k
        rows = [chosen, *(r for r in best_rows if r != chosen)][:k]
        weights = {plugin: weight for plugin, (weight, _) in scores.items()}
        names = table.names
        return [
            CandidateVerdict(
                names[row],
                True,
                [],
                {plugin: score.item(row) for plugin, (_, score) in scores.items()},
                totals.item(row),
                details(row),
                weights,
            )
            for row in rows
        ]

    def _rejected(
        self,
        table: NodeTable,
        rejections: tuple[tuple[FilterResult, NDArray[np.bool_]], ...],
        details: Callable[[int], dict[str, str]],
        count: int | None = None,
    ) -> list[CandidateVerdict]:
        """Up to ``count`` (``record_top_k``) rejected nodes with the reasons of their first
        failing filter, the latest filter first: interference, so a noisy node shows why it
        lost, then anti-affinity, resources, … readiness. Reasons are looked up for these
        nodes only."""
        verdicts: list[CandidateVerdict] = []
        left = self.settings.record_top_k if count is None else count
        for stage, failing in reversed(rejections):
            if left <= 0:
                break
            recorded = np.flatnonzero(failing)[:left]
            reasons = stage.failure_reasons(recorded)
            for row, why in zip(recorded.tolist(), reasons, strict=True):
                verdicts.append(
                    CandidateVerdict(table.names[row], False, why, details=details(row))
                )
            left -= len(recorded)
        return verdicts


def preemption_would_help(table: NodeTable, pod: PodInfo, candidates: NDArray[np.bool_]) -> int:
    """On how many ``candidates`` (nodes that failed only for resources) evicting every pod
    of lower priority than ``pod`` would make room::

        helps[i] = ∀ r ∈ requests: free[r, i] + Σ_{q on i, prio(q) < prio(pod)} req[q, r] ≥ req[r]
                   ∧ free[pods, i] + |{q on i, prio(q) < prio(pod)}| ≥ 1

    0 when the pod's ``preemptionPolicy`` is ``Never`` or no placed pod has a lower
    priority. Other filters a victim's eviction could also satisfy (anti-affinity, host
    ports) are not considered, so this is a lower bound on what kube-scheduler would find.
    """
    lowest = table.lowest_priority()
    if pod.preemption_policy == PREEMPT_NEVER or lowest is None or lowest >= pod.priority:
        return 0
    wanted: list[tuple[str, int, int]] = []  # resource, its table row, amount
    for resource, amount in pod.requests.items():
        row = table.resource_row(resource)
        if row is None:
            return 0  # a resource no node offers: no eviction makes room for it
        wanted.append((resource, row, amount))
    pods_row = table.resource_row(PODS)
    if pods_row is None:
        return 0
    free = table.free
    helpful = 0
    for node_row in np.flatnonzero(candidates).tolist():
        victims = [
            q
            for q in table.pods_on_node(table.names[node_row]).values()
            if q.priority < pod.priority
        ]
        if not victims or free[pods_row, node_row] + len(victims) < 1:
            continue
        if all(
            free[row, node_row] + sum(q.requests.get(resource, 0) for q in victims) >= amount
            for resource, row, amount in wanted
        ):
            helpful += 1
    return helpful


def _no_details(row: int) -> dict[str, str]:
    return {}


def _all_of(first: NDArray[np.bool_], stages: Iterable[FilterResult]) -> NDArray[np.bool_]:
    """``first ∧ passed`` of every stage, never writing into ``first`` or a stage's mask."""
    passed = first
    for stage in stages:
        if passed is first:
            passed = first & stage.passed
        else:
            passed &= stage.passed
    return passed


def _weighted_sum(
    scores: Iterable[tuple[float, NDArray[np.float64]]], count: int
) -> NDArray[np.float64]:
    """``Σ weight · score`` per node as a new array, never writing into a score (it may be a
    cached column)."""
    totals: NDArray[np.float64] | None = None
    for weight, score in scores:
        if totals is None:
            totals = score.copy() if weight == 1 else score * weight
        else:
            totals += score if weight == 1 else score * weight
    return np.zeros(count) if totals is None else totals


def _best_first(values: NDArray[np.float64], k: int) -> list[int]:
    """Indices of the ``k`` largest values, largest first, ties in index order.

    ``k`` is small (the record's length), so ``k`` arg-max passes beat a partition of every
    node; each found value is masked for the next pass and put back at the end.
    """
    rows: list[int] = []
    found: list[float] = []
    for _ in range(k):
        row = int(values.argmax())
        rows.append(row)
        found.append(values.item(row))
        values[row] = -np.inf
    values[rows] = found
    return rows


def _merged(counts: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    """``counts`` with ``more`` added reason by reason (``counts`` is updated and returned)."""
    for reason, nodes in more.items():
        counts[reason] = counts.get(reason, 0) + nodes
    return counts


def _rejections(stages: Iterable[FilterResult], undecided: NDArray[np.bool_]) -> _Rejections:
    """Nodes among ``undecided`` that ``stages`` reject, each at its first failing filter.
    A filter with one reason needs no per-reason columns."""
    counts: dict[str, int] = {}
    failing_per_stage: list[tuple[FilterResult, NDArray[np.bool_]]] = []
    for stage in stages:
        if not stage.reasons:
            continue
        failing = np.greater(undecided, stage.passed)  # undecided ∧ ¬passed
        rejected = int(np.count_nonzero(failing))
        if rejected == 0:
            continue
        failing_per_stage.append((stage, failing))
        per_reason = [rejected] if len(stage.reasons) == 1 else stage.reason_counts(failing)
        for reason, nodes in zip(stage.reasons, per_reason, strict=True):
            if nodes:
                counts[reason] = counts.get(reason, 0) + nodes
        undecided = undecided & stage.passed
    return _Rejections(counts, tuple(failing_per_stage))
