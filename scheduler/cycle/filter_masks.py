"""Pass masks over a table's rows: combining filters, counting the first failing filter
per node, and ranking totals — the array work of one scheduling cycle, with no Python
pass per node."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scheduler.plugins.base import Filter, FilterResult


@dataclass(frozen=True, slots=True)
class Rejections:
    """Candidates rejected by a sequence of filters, each at its first failing filter."""

    counts: dict[str, int]
    """Reason → nodes, reasons with none left out (a node failing a filter for two
    reasons counts under both)."""
    failing: tuple[tuple[Filter, FilterResult, NDArray[np.bool_]], ...]
    """Per filter that rejected any candidate first, in filter order: the candidates it
    rejected."""
    rejected: tuple[int, ...] = ()
    """How many candidates each of ``failing`` rejected first."""

    def first_failures(self) -> dict[str, int]:
        """Filter name → candidates it rejected first."""
        return {
            plugin.name: n for (plugin, _, _), n in zip(self.failing, self.rejected, strict=True)
        }


def all_of(first: NDArray[np.bool_], stages: Iterable[FilterResult]) -> NDArray[np.bool_]:
    """``first ∧ passed`` of every stage, never writing into ``first`` or a stage's mask."""
    passed = first
    for stage in stages:
        if passed is first:
            passed = first & stage.passed
        else:
            passed &= stage.passed
    return passed


def weighted_sum(
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


def best_first(values: NDArray[np.float64], k: int) -> list[int]:
    """Rows of the ``k`` largest values, largest first, ties in row order.

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


def merged(counts: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    """``counts`` with ``more`` added reason by reason (``counts`` is updated and returned)."""
    for reason, nodes in more.items():
        counts[reason] = counts.get(reason, 0) + nodes
    return counts


def rejections(
    stages: Iterable[tuple[Filter, FilterResult]], undecided: NDArray[np.bool_]
) -> Rejections:
    """Candidates among ``undecided`` that ``stages`` reject, each at its first failing
    filter. A filter with one reason needs no per-reason columns."""
    counts: dict[str, int] = {}
    failing_per_stage: list[tuple[Filter, FilterResult, NDArray[np.bool_]]] = []
    rejected_per_stage: list[int] = []
    for plugin, stage in stages:
        if not stage.reasons:
            continue
        failing = np.greater(undecided, stage.passed)  # undecided ∧ ¬passed
        rejected = int(np.count_nonzero(failing))
        if rejected == 0:
            continue
        failing_per_stage.append((plugin, stage, failing))
        rejected_per_stage.append(rejected)
        per_reason = [rejected] if len(stage.reasons) == 1 else stage.reason_counts(failing)
        for reason, nodes in zip(stage.reasons, per_reason, strict=True):
            if nodes:
                counts[reason] = counts.get(reason, 0) + nodes
        undecided = undecided & stage.passed
    return Rejections(counts, tuple(failing_per_stage), tuple(rejected_per_stage))
