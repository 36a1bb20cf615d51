"""What a decision record says about each candidate node: the chosen node and the next best
with their score breakdown, and the rejected nodes with the reasons of their first failing
filter (:class:`~interference.decision.CandidateVerdict`).

Reasons are looked up for the recorded nodes only; the verdicts of the signature-cached
filters are built once per signature.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from interference.decision import CandidateVerdict
from scheduler.cycle.filter_masks import merged, rejections
from scheduler.cycle.stages import Filtered, StaticStage
from scheduler.plugins.base import CandidateDetails, Filter, FilterResult
from scheduler.signals.table import NodeTable


def refusals_of(
    table: NodeTable,
    filtered: Filtered,
    candidates: NDArray[np.bool_] | None,
    feasible: int,
    details: CandidateDetails | None,
    top_k: int,
) -> tuple[dict[str, int], dict[str, int], list[CandidateVerdict]]:
    """What the Filter stage refused among ``candidates`` (every node when ``None``): the
    nodes per reason, each counted at its first failing filter (a fresh dict, the cached
    one stays), the nodes per first failing plugin (its keys: the rejectors), and up to
    ``top_k`` rejected nodes' verdicts, those of the later filters first."""
    static = filtered.static
    if candidates is None:
        counts = dict(static.rejections.counts)
        static_rejections = static.rejections
        undecided_count = static.passed_count
        first_failures = dict(static.first_failures)
    else:
        static_rejections = rejections(static.checked, candidates)
        counts = dict(static_rejections.counts)
        undecided_count = int(np.count_nonzero(filtered.undecided))
        first_failures = static_rejections.first_failures()
    rejected: list[CandidateVerdict] = []
    if undecided_count > feasible:
        dynamic_rejections = rejections(filtered.dynamic, filtered.undecided)
        counts = merged(counts, dynamic_rejections.counts)
        first_failures.update(dynamic_rejections.first_failures())
        rejected = rejected_verdicts(table, dynamic_rejections.failing, details, top_k)
    left = top_k - len(rejected)
    if left > 0 and static_rejections.failing:
        if candidates is None:
            rejected += static_verdicts(table, static, left, details)
        else:
            rejected += rejected_verdicts(table, static_rejections.failing, details, left)
    return counts, first_failures, rejected


def ranked_verdicts(
    table: NodeTable,
    best_rows: list[int],
    chosen: int,
    scores: dict[str, tuple[float, NDArray[np.float64]]],
    totals: NDArray[np.float64],
    details: CandidateDetails | None,
    top_k: int,
) -> list[CandidateVerdict]:
    """The chosen node, then the next best feasible nodes (``top_k`` in all), with their
    breakdowns."""
    if chosen == best_rows[0]:
        rows = best_rows[:top_k]
    else:
        rows = [chosen, *filter(chosen.__ne__, best_rows)][:top_k]
    weights = {plugin: weight for plugin, (weight, _) in scores.items()}
    columns = [(plugin, score) for plugin, (_, score) in scores.items()]
    names = table.names
    # a bound score.item(row) per part: 6 µs for five rows, where map() over
    # np.ndarray.item (fewer instructions, unbound calls) took 12 µs
    return [
        CandidateVerdict(
            names[row],
            True,
            [],
            {plugin: score.item(row) for plugin, score in columns},
            totals.item(row),
            details(row) if details is not None else {},
            weights,
        )
        for row in rows
    ]


def rejected_verdicts(
    table: NodeTable,
    failing: tuple[tuple[Filter, FilterResult, NDArray[np.bool_]], ...],
    details: CandidateDetails | None,
    count: int,
) -> list[CandidateVerdict]:
    """Up to ``count`` rejected nodes with the reasons of their first failing filter, the
    latest filter first: interference, so a noisy node shows why it lost, then
    anti-affinity, resources, … readiness."""
    verdicts: list[CandidateVerdict] = []
    left = count
    for _, stage, rejected in reversed(failing):
        if left <= 0:
            break
        recorded = np.flatnonzero(rejected)[:left]
        reasons = stage.failure_reasons(recorded)
        for row, why in zip(recorded.tolist(), reasons, strict=True):
            verdicts.append(
                CandidateVerdict(
                    table.names[row],
                    False,
                    why,
                    details=details(row) if details is not None else {},
                )
            )
        left -= len(recorded)
    return verdicts


def static_verdicts(
    table: NodeTable,
    static: StaticStage,
    count: int,
    details: CandidateDetails | None,
) -> list[CandidateVerdict]:
    """:func:`rejected_verdicts` for the signature-cached filters, built once per
    signature."""
    key = (count, details is not None)
    verdicts = static.verdicts.get(key)
    if verdicts is None:
        verdicts = rejected_verdicts(table, static.rejections.failing, details, count)
        static.verdicts[key] = verdicts
    return verdicts
