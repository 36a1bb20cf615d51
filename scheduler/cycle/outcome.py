"""What one scheduling cycle answers: :class:`CycleResult` for a decision,
:class:`FilterOutcome` for the extender's Filter verb.

The result carries, for the decision record, the best ``record_top_k`` candidates with
their score breakdown by plugin (the chosen node first), then up to as many rejected nodes
with the reasons of their first failing filter — those the last filters (Interference)
rejected first, so ``interference explain`` shows why a noisy node lost — and the count of
nodes per reason. Reasons are looked up only for the recorded nodes. For a pod with a
run-queue tolerance it also carries the p99 the Interference filter compared on the
recorded nodes and, when no node passed, on the nearest one, with when the relax rule will
judge the pod interference-blind; the FailedScheduling message then says so and how far
to raise the tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from interference.decision import CandidateVerdict, FunnelStage, IndexRead, RunqCheck
from scheduler.cycle.filter_masks import Rejections
from scheduler.cycle.preemption import PreemptionOutcome


@dataclass(slots=True)
class CycleResult:
    """The outcome of :meth:`~scheduler.cycle.cycle.SchedulingCycle.schedule` for one pod
    (not frozen: one per decision, as :class:`~interference.decision.CandidateVerdict`
    says why)."""

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
    rejected_by: frozenset[str] = frozenset()
    """The plugins that rejected any candidate (or the pod, at PreFilter)."""
    relaxed_after_s: float | None = None
    """Seconds the pod had waited when the relaxable filters were dropped, else ``None``."""
    blind: bool = False
    """Judged interference-blind (signals unreadable, or a blind profile)."""
    funnel: tuple[FunnelStage, ...] = ()
    """Each filter that ran, in order, with the candidates in and out."""
    omitted: dict[str, int] = field(default_factory=dict)
    """How many ``feasible`` and ``rejected`` nodes ``candidates`` leaves out."""
    preemption: PreemptionOutcome | None = None
    """What the PostFilter decided when no node passed (``None``: it did not run)."""
    runq: RunqCheck | None = None
    """The pod's run-queue tolerance as the Interference filter compared it (``None``: no
    such tolerance, or the filter is not in the profile)."""
    interference_index: IndexRead | None = None
    """The index the Interference plugin read on the recorded candidates (``None``: the
    plugin is not in the profile, or signals were unreadable)."""


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    """The Filter stage of one cycle over its candidates
    (:meth:`~scheduler.cycle.cycle.SchedulingCycle.filter`)."""

    passed: NDArray[np.bool_]
    """Per table row: a candidate that passed every filter that ran."""
    rejections: Rejections
    relaxed_after_s: float | None
    blind: bool
    funnel: tuple[FunnelStage, ...] = ()
    """Each filter that ran, in order, with the candidates in and out."""
    runq: RunqCheck | None = None
    """For a pod no candidate passed, with a run-queue tolerance: the nearest node (its p99
    the only one measured here) and when the relax rule judges the pod interference-blind."""
