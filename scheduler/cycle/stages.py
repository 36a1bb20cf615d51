"""One decision's stages as functions of the profile and the cycle state, for
:class:`~scheduler.cycle.cycle.SchedulingCycle`: the PreFilters, a filter from the
per-signature cache, the leading static filters cached together per signature
(:class:`StaticStage`), what the Filter stage found (:class:`Filtered`) and a node's first
failing reasons in it, the Score plugins, the funnel and the stage trace's Filter note.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from interference.decision import CandidateVerdict, FunnelStage, funnel_of
from scheduler.cycle.filter_masks import Rejections, all_of, rejections
from scheduler.cycle.stage_trace import StageRecorder
from scheduler.plugins.base import CycleState, Filter, FilterResult, PodRejection
from scheduler.plugins.registry import ResolvedProfile

FUNNELS_CACHED = 256
"""Funnels :func:`filter_funnel` remembers (all forgotten at once beyond that)."""
_FUNNELS: dict[
    tuple[tuple[str, ...], int, tuple[tuple[str, int], ...]], tuple[FunnelStage, ...]
] = {}
"""(filter names, candidates considered, first failures by filter) → funnel."""


@dataclass(frozen=True, slots=True)
class StaticStage:
    """The profile's leading filters that depend only on the pod's signature and the
    nodes' constraint fields."""

    passed: NDArray[np.bool_]
    results: dict[str, FilterResult | None]
    """By plugin name (``None``: nothing to check for this pod)."""
    checked: tuple[tuple[Filter, FilterResult], ...]
    """Those with a reason."""
    passed_count: int
    rejections: Rejections
    """Which nodes these filters reject first, and why (cached with the masks)."""
    first_failures: dict[str, int]
    """``rejections.first_failures()``, built once per signature (callers copy it)."""
    verdicts: dict[tuple[int, bool], list[CandidateVerdict]] = field(default_factory=dict)
    """Record entries of the first rejected nodes by (how many, with GPU details); they
    depend only on what the masks depend on, so they are built once per signature."""


@dataclass(slots=True)
class Filtered:
    """What the Filter stage found, before records are built (one per decision: not
    frozen, as :class:`~scheduler.cycle.outcome.CycleResult`)."""

    passed: NDArray[np.bool_]
    without_relaxable: NDArray[np.bool_]
    static: StaticStage
    dynamic: tuple[tuple[Filter, FilterResult], ...]
    """The non-static filters that ran with a reason, in profile order."""
    undecided: NDArray[np.bool_]
    """The candidates the static filters passed."""


def first_reasons(found: Filtered, row: int) -> tuple[str, ...]:
    """The reasons of the first filter that rejected node ``row``."""
    for plugin, result in found.static.checked + found.dynamic:
        if not result.passed[row]:
            return _reasons_at(result, row) or (plugin.name,)
    return ("node(s) had no room left by the nominated pods",)


def _reasons_at(result: FilterResult, row: int) -> tuple[str, ...]:
    """The reasons ``result`` rejected node ``row`` for, without measurements (the
    PostFilter's message counts them across nodes, as kube-scheduler's)."""
    if len(result.reasons) == 1:
        return result.reasons
    columns = result.reason_columns()
    return tuple(r for r, column in zip(result.reasons, columns, strict=True) if column[row])


def run_filter(plugin: Filter, state: CycleState) -> FilterResult | None:
    """``plugin.filter(state)``, from the table's per-signature cache for a static plugin,
    recorded in ``state.filtered`` for the filters after it."""
    if plugin.static:
        key = (plugin.name, state.pod.signature)
        result = state.table.cached("constraints", key, plugin.filter, state)
    else:
        result = plugin.filter(state)
    state.filtered[plugin.name] = result
    return result


def filter_funnel(
    profile: ResolvedProfile, relax: bool, considered: int, first_failures: dict[str, int]
) -> tuple[FunnelStage, ...]:
    """:func:`~interference.decision.funnel_of` the filters that ran.

    Memoised (the stages are immutable): most decisions repeat an earlier one's counts.
    """
    names = profile.relaxed_names if relax else profile.names
    key = (names, considered, tuple(first_failures.items()))
    found = _FUNNELS.get(key)
    if found is None:
        if len(_FUNNELS) >= FUNNELS_CACHED:
            _FUNNELS.clear()
        found = _FUNNELS[key] = funnel_of(names, considered, first_failures)
    return found


def prefilter(profile: ResolvedProfile, state: CycleState) -> tuple[str, PodRejection] | None:
    """The first pod-wide rejection of the profile's PreFilters, with its plugin's name."""
    for name, check in profile.prefilters:
        rejection = check(state)
        if rejection is not None:
            return name, rejection
    return None


def static_stage(profile: ResolvedProfile, state: CycleState) -> StaticStage:
    """The profile's static filters for the pod's signature, from the table's cache."""
    key = ("static", profile.static_names, state.pod.signature)
    return state.table.cached("constraints", key, _build_static, profile, state)


def _build_static(profile: ResolvedProfile, state: CycleState) -> StaticStage:
    table = state.table
    results: dict[str, FilterResult | None] = {}
    for plugin in profile.filters[: profile.static_prefix]:
        results[plugin.name] = result = plugin.filter(state)
        state.filtered[plugin.name] = result  # a later static filter may read it
    checked = tuple(
        (plugin, result)
        for plugin in profile.filters[: profile.static_prefix]
        if (result := results[plugin.name]) is not None and result.reasons
    )
    passed = all_of(table.everyone(), (result for _, result in checked))
    found = rejections(checked, table.everyone())
    return StaticStage(
        passed, results, checked, int(np.count_nonzero(passed)), found, found.first_failures()
    )


def run_scores(
    profile: ResolvedProfile,
    state: CycleState,
    feasible: NDArray[np.bool_],
    recorder: StageRecorder | None = None,
) -> dict[str, tuple[float, NDArray[np.float64]]]:
    """Plugin → (weight, score per node) of the profile's score plugins over ``feasible``."""
    scores: dict[str, tuple[float, NDArray[np.float64]]] = {}
    ended = time.time_ns() if recorder is not None else 0
    for scorer, weight in profile.scores:
        score = scorer.score(state, feasible)
        if score is not None:
            scores[scorer.name] = (weight, score)
        if recorder is not None:
            started, ended = ended, time.time_ns()
            if score is not None:
                recorder.note_score(scorer.name, weight, started, ended)
    return scores


def note_filters(
    recorder: StageRecorder,
    profile: ResolvedProfile,
    relax: bool,
    considered: int,
    first_failures: dict[str, int],
    stamps: list[int],
    counts: dict[str, int],
    state: CycleState,
) -> None:
    """The Filter stage, raw (:meth:`StageRecorder.note_filters`): what the decision
    computed anyway, copied where the caller may still change it."""
    filtered = state.filtered
    reasons = {name: result.reasons for name in first_failures if (result := filtered[name])}
    names = profile.relaxed_names if relax else profile.names
    static_count = len(profile.static_names)
    recorder.note_filters(
        names, static_count, considered, dict(first_failures), stamps, dict(counts), reasons
    )
