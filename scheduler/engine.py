"""One scheduling decision: filter the node table, score what passes, pick the best.

Filters run in kube-scheduler's order — readiness, cordon, taints, node affinity/selector
(these four depend only on the pod's signature and are cached in the table per signature),
then host ports, resources, pod anti-affinity, interference. A node counts only its first
failing filter in the ``FailedScheduling`` message, as in kube-scheduler.

Scores (0–100 each) are combined as ``total = Σ weightₚ · scoreₚ`` over
:class:`scheduler.settings.ScoreWeights`; the highest total wins and ties are broken
uniformly at random. The result carries, for the decision record, the best ``record_top_k``
candidates with their score breakdown (the chosen node first) — or, when no node passes,
up to as many rejected nodes with the reasons of their first failing filter.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from interference.decision import CandidateVerdict
from scheduler.filters.base import FilterResult
from scheduler.filters.host_ports import host_ports
from scheduler.filters.interference import interference_filter
from scheduler.filters.node_affinity import node_affinity
from scheduler.filters.node_state import node_ready, node_schedulable
from scheduler.filters.pod_anti_affinity import pod_anti_affinity
from scheduler.filters.resources import resources_fit
from scheduler.filters.taints import taint_toleration
from scheduler.messages import NO_NODES, failed_scheduling_message, scheduled_message
from scheduler.model import PodInfo
from scheduler.scores.balance import balance_score
from scheduler.scores.gpu_packing import gpu_packing_score
from scheduler.scores.interference import interference_score
from scheduler.settings import EngineSettings
from scheduler.table import NodeTable


@dataclass(frozen=True, slots=True)
class EngineResult:
    """The outcome of :meth:`Engine.schedule` for one pod."""

    node: str | None
    """Chosen node, ``None`` when no node passed every filter."""
    candidates: list[CandidateVerdict]
    """The chosen node and the next best, with score breakdowns; or, when no node passed,
    sample rejected nodes with their reasons."""
    message: str
    """``Successfully assigned ns/pod to node`` or kube-scheduler's FailedScheduling text."""
    blocked_only_by_interference: bool
    """No node passed, but some would have without the interference filters."""
    unsupported: tuple[str, ...]
    """The pod's fields this scheduler does not enforce (for a Warning Event)."""
    feasible: int
    """How many nodes passed every filter."""


@dataclass(frozen=True, slots=True)
class _StaticStage:
    """Filters that depend only on the pod's signature and the nodes' constraint fields."""

    passed: NDArray[np.bool_]
    results: tuple[FilterResult, ...]


class Engine:
    """Filters and scores nodes for one pod at a time; holds no cluster state itself."""

    def __init__(self, settings: EngineSettings, seed: int | None = None) -> None:
        self.settings = settings
        self._random = random.Random(seed)

    def schedule(
        self, pod: PodInfo, table: NodeTable, now: float, relax_interference: bool = False
    ) -> EngineResult:
        """Pick a node for ``pod`` (``relax_interference`` drops the interference filters)."""
        if len(table) == 0:
            return EngineResult(None, [], NO_NODES, False, pod.unsupported, 0)
        static = self._static_stage(pod, table)
        dynamic = [host_ports(table, pod), resources_fit(table, pod), pod_anti_affinity(table, pod)]
        passed = static.passed
        for result in dynamic:
            if result.reasons:  # a filter with no possible reason passes every node
                passed = passed & result.passed
        without_interference = passed
        if not relax_interference:
            interference = interference_filter(table, pod, self.settings, now)
            dynamic.append(interference)
            if interference.reasons:
                passed = passed & interference.passed
        stages = (*static.results, *dynamic)
        feasible = np.flatnonzero(passed)
        if len(feasible) == 0:
            return EngineResult(
                node=None,
                candidates=self._rejected(table, stages, passed),
                message=failed_scheduling_message(len(table), _reason_counts(stages, len(table))),
                blocked_only_by_interference=bool(without_interference.any()),
                unsupported=pod.unsupported,
                feasible=0,
            )
        scores = self._scores(pod, table, now)
        totals = _weighted_sum(scores.values(), len(table))
        feasible_totals = totals[feasible]
        best = _best_first(feasible_totals, max(2, self.settings.record_top_k))
        if len(best) > 1 and feasible_totals[best[1]] == feasible_totals[best[0]]:
            ties = np.flatnonzero(feasible_totals == feasible_totals[best[0]])
            chosen = int(feasible[ties[self._random.randrange(len(ties))]])
        else:
            chosen = int(feasible[best[0]])
        candidates = self._ranked(table, feasible[best].tolist(), chosen, scores, totals)
        return EngineResult(
            node=table.names[chosen],
            candidates=candidates,
            message=scheduled_message(pod.key, table.names[chosen]),
            blocked_only_by_interference=False,
            unsupported=pod.unsupported,
            feasible=len(feasible),
        )

    def _static_stage(self, pod: PodInfo, table: NodeTable) -> _StaticStage:
        key = ("static", pod.signature)
        cached = table.mask_cache.get(key)
        if isinstance(cached, _StaticStage):
            return cached
        results = (
            node_ready(table, pod),
            node_schedulable(table, pod),
            taint_toleration(table, pod),
            node_affinity(table, pod),
        )
        passed = results[0].passed.copy()
        for result in results[1:]:
            passed &= result.passed
        stage = _StaticStage(passed, results)
        table.remember(key, stage)
        return stage

    def _scores(
        self, pod: PodInfo, table: NodeTable, now: float
    ) -> dict[str, tuple[float, NDArray[np.float64]]]:
        """Plugin → (weight, score per node) for the plugins with a non-zero weight."""
        weights = self.settings.weights
        scores: dict[str, tuple[float, NDArray[np.float64]]] = {}
        if weights.interference > 0:
            scores["interference"] = (
                weights.interference,
                interference_score(table, self.settings, now),
            )
        if weights.balance > 0:
            scores["balance"] = (weights.balance, balance_score(table, pod))
        if weights.gpu_packing > 0:
            scores["gpu_packing"] = (
                weights.gpu_packing,
                gpu_packing_score(table, pod, self.settings),
            )
        return scores

    def _ranked(
        self,
        table: NodeTable,
        best_rows: list[int],
        chosen: int,
        scores: dict[str, tuple[float, NDArray[np.float64]]],
        totals: NDArray[np.float64],
    ) -> list[CandidateVerdict]:
        """The chosen node, then the next best feasible nodes, with their breakdowns."""
        k = self.settings.record_top_k
        if k == 0:
            return []
        rows = [chosen, *(r for r in best_rows if r != chosen)][:k]
        plugins = list(scores)
        per_plugin = [score[rows].tolist() for _, score in scores.values()]
        names = table.names
        return [
            CandidateVerdict(names[row], True, [], dict(zip(plugins, values, strict=True)), total)
            for row, total, *values in zip(rows, totals[rows].tolist(), *per_plugin, strict=True)
        ]

    def _rejected(
        self, table: NodeTable, stages: tuple[FilterResult, ...], passed: NDArray[np.bool_]
    ) -> list[CandidateVerdict]:
        """Up to ``record_top_k`` rejected nodes with the reasons of their first failing filter."""
        verdicts = []
        for row in np.flatnonzero(~passed)[: self.settings.record_top_k]:
            first_failure = next(r for r in stages if not r.passed[row])
            verdicts.append(
                CandidateVerdict(
                    node=table.names[row], passed=False, reasons=first_failure.reasons_for(row)
                )
            )
        return verdicts


def _weighted_sum(
    scores: Iterable[tuple[float, NDArray[np.float64]]], count: int
) -> NDArray[np.float64]:
    """``Σ weight · score`` per node, never writing into a score (it may be a cached column)."""
    totals = np.zeros(count)
    for weight, score in scores:
        totals += score if weight == 1 else score * weight
    return totals


def _best_first(values: NDArray[np.float64], k: int) -> NDArray[np.intp]:
    """Indices of the ``k`` largest values, largest first (ties in index order)."""
    if len(values) > k:
        top = np.argpartition(values, -k)[-k:]
        return top[np.argsort(-values[top], kind="stable")]
    return np.argsort(-values, kind="stable")


def _reason_counts(stages: tuple[FilterResult, ...], count: int) -> Counter[str]:
    """Reason → nodes it applies to, each node counted at its first failing filter only."""
    counts: Counter[str] = Counter()
    undecided = np.ones(count, dtype=np.bool_)
    for stage in stages:
        failing = undecided & ~stage.passed
        if failing.any():
            per_reason = stage.reason_matrix()[failing].sum(axis=0)
            for reason, nodes in zip(stage.reasons, per_reason, strict=True):
                counts[reason] += int(nodes)
        undecided &= stage.passed
    return counts
