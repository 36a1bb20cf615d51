"""The scheduling cycle: PreFilter → Filter → Score → relax → interference-blind fallback.

Every mode runs a pod through this one cycle, over the rows it is given: every node in
standalone mode (:class:`scheduler.standalone.loop.SchedulingLoop`), the offered nodes in extender
mode (:class:`scheduler.extender.extender.Extender`: :meth:`SchedulingCycle.filter` and
:meth:`SchedulingCycle.score`), the candidates of a rebalancing decision. Nothing else
implements these rules.

1. **Signals.** :class:`SignalGate` reads the signal source's health once per decision.
   In an interference-blind profile (``cycle.interference_aware: false``) the plugins
   that read signals (:attr:`~scheduler.plugins.base.Filter.uses_signals`) are off: the
   pod is judged as kube-scheduler would. While signals are unreadable the scores that
   read them are off and the filters that read them fail closed: a pod with an
   interference tolerance (or any pod under ``stale_policy: reject``) is refused on every
   node until the relax rule drops them; any other pod is judged interference-blind.
2. **PreFilter.** Each filter's pod-wide check, in order; a :class:`PodRejection` ends the
   decision. A pod asking for a field standalone mode does not implement
   (:attr:`PodInfo.unsupported`) is refused before any filter runs.
3. **Filter.** The profile's filters in order: the leading static ones (depending only on
   the pod's signature) cached together in the table per signature with their rejection
   counts, then the others. A node counts only at its first failing filter in the
   ``FailedScheduling`` message, as in kube-scheduler; the plugins that rejected any node
   are the pod's rejectors (the queue retries it early only on their events).
4. **Relax.** A pod whose candidates are all refused only by relaxable filters
   (Interference) for ``relax_after_s`` (:class:`RelaxTracker`) is judged once more
   without them.
5. **Score.** ``total = Σ weightₚ · scoreₚ`` over the profile's score plugins on the
   nodes that passed; the highest total wins, ties broken uniformly at random.

6. **Nominated pods** (standalone, :mod:`scheduler.cycle.nominated`): room held for pods of at
   least the pod's priority counts as taken; the filters run with and without it and a
   node must pass both. A pod whose own nominated node passes goes there.
7. **PostFilter** (standalone, :mod:`scheduler.cycle.preemption`): when no node passes,
   kube-scheduler's DefaultPreemption looks for a node where evicting pods of lower
   priority lets the pod pass every filter, running this cycle's filters on the table
   with those pods removed; the result names the node and the victims, and the message
   goes on with kube-scheduler's ``preemption: …`` when it finds none. What the dry run
   may assume of the profile's filters: :mod:`scheduler.cycle.dry_run`.

What the result carries: :mod:`scheduler.cycle.outcome`; what a record says about each
candidate: :mod:`scheduler.cycle.verdicts`; what the plugins add to it: their
:class:`~scheduler.plugins.base.Evidence`; the stages as functions of the profile and the
state (the PreFilters, the signature cache, the scores, the funnel):
:mod:`scheduler.cycle.stages`.

Size: about 600 lines, one class, because its methods share one decision's state (the
profile run, the cycle state, the relax clock, the random tie-break) and re-enter one
another: the standalone, extender and rebalancing entry points, the relax rule's second
decision, and the nominated pods' and the PostFilter's dry runs all run the same Filter
stage (:meth:`SchedulingCycle._filters`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from interference.decision import IndexRead, RunqCheck, runq_advice
from scheduler.api.objects import PodInfo
from scheduler.cycle.dry_run import antagonist_rows, node_local, resources_only
from scheduler.cycle.filter_masks import all_of, best_first, rejections, weighted_sum
from scheduler.cycle.messages import (
    NO_NODES,
    failed_scheduling_message,
    pod_rejected_message,
    refused_message,
    scheduled_message,
)
from scheduler.cycle.nominated import TableRoom
from scheduler.cycle.outcome import CycleResult, FilterOutcome
from scheduler.cycle.preemption import (
    Fits,
    PreemptionInputs,
    PreemptionOutcome,
    eligible,
    lowest_victim_priority,
    not_eligible,
    potential_rows,
    preempt,
)
from scheduler.cycle.relax import RelaxTracker
from scheduler.cycle.settings import CycleSettings
from scheduler.cycle.stage_trace import PREFILTER, StageRecorder
from scheduler.cycle.stages import (
    Filtered,
    filter_funnel,
    first_reasons,
    note_filters,
    prefilter,
    run_filter,
    run_scores,
    static_stage,
)
from scheduler.cycle.verdicts import ranked_verdicts, refusals_of
from scheduler.plugins.base import CycleState, Filter, FilterResult
from scheduler.plugins.registry import REGISTRY, Registry, ResolvedProfile
from scheduler.signals.table import NodeTable

log = logging.getLogger(__name__)


class SchedulingCycle:
    """Runs pods through the profile; holds no cluster state, only the relax notes."""

    def __init__(
        self,
        settings: CycleSettings,
        *,
        extender: bool = False,
        seed: int | None = None,
        registry: Registry = REGISTRY,
    ) -> None:
        self.settings = settings
        self.profile = registry.resolve(settings.profile, extender=extender)
        self._blind = self.profile.without_signals()
        self._unreadable = self.profile.without_signal_scores()
        self.relax = RelaxTracker()
        self._random = random.Random(seed)

    def register_lookups(self, table: NodeTable) -> None:
        """Register the profile's placed-pod lookups with ``table`` (before its pods arrive,
        so each is kept current pod by pod; one registered late is filled at once)."""
        for plugin in self.profile.filters:
            if plugin.lookup is not None:
                table.lookup(plugin.name, plugin.lookup)

    def profile_for(self, signals_readable: bool) -> ResolvedProfile:
        """The profile to run: without the signal plugins when the settings are
        interference-blind, without the signal scores while signals are unreadable."""
        if not self.settings.interference_aware:
            return self._blind
        return self.profile if signals_readable else self._unreadable

    def _state(
        self, pod: PodInfo, table: NodeTable, now: float, profile: ResolvedProfile
    ) -> CycleState:
        return CycleState(
            pod, table, now, profile.args, signals_readable=profile is not self._unreadable
        )

    # ---- standalone and rebalancing ----------------------------------------------------

    def schedule(
        self,
        pod: PodInfo,
        table: NodeTable,
        now: float,
        *,
        signals_readable: bool = True,
        candidates: NDArray[np.bool_] | None = None,
        relax_interference: bool = False,
        recorder: StageRecorder | None = None,
        preemption: PreemptionInputs | None = None,
    ) -> CycleResult:
        """Pick a node for ``pod`` among ``candidates`` (every node when ``None``), applying
        the relax rule (``relax_interference`` drops the relaxable filters at once); a
        ``recorder`` notes each stage for the attempt's trace. With ``preemption`` (the
        standalone loop) nominated pods hold their room and the PostFilter runs."""
        profile = self.profile_for(signals_readable)
        blind = profile is not self.profile
        with contextlib.ExitStack() as stack:
            room = None
            if preemption is not None:
                room = preemption.room
                if room is None:  # a room for this decision only
                    room = TableRoom(table)
                    room.sync(preemption.holds)
                    stack.callback(room.clear)
                if not stack.enter_context(room.counting_for(pod, preemption.holds)):
                    room = None  # no held pod counts against this one
            result = self._decide(
                pod, table, now, profile, candidates, relax_interference, recorder, preemption, room
            )
            waited: float | None = None
            relax_at: float | None = None
            if relax_interference:
                pass
            elif result.node is not None or not result.blocked_only_by_interference:
                self.relax.forget(pod.key)
            else:
                blocked_s, relax_at = self._relax_clock(pod.key, now)
                if blocked_s >= self.settings.relax_after_s:
                    relaxed = self._decide(
                        pod, table, now, profile, candidates, True, recorder, preemption, room
                    )
                    if relaxed.node is not None:
                        self.relax.forget(pod.key)
                        result, waited = relaxed, blocked_s
        if (
            result.node is None
            and result.runq is not None
            and self.refused_for_runq(result.reason_counts)
        ):
            runq = dataclasses.replace(result.runq, relax_at=relax_at)
            advised = f"{result.message} {runq_advice(runq, now)}"
            result = dataclasses.replace(result, runq=runq, message=advised)
        if not blind and waited is None:
            return result
        return dataclasses.replace(result, blind=blind, relaxed_after_s=waited)

    # ---- extender ----------------------------------------------------------------------

    def filter(
        self,
        pod: PodInfo,
        table: NodeTable,
        now: float,
        candidates: NDArray[np.bool_],
        *,
        signals_readable: bool = True,
        recorder: StageRecorder | None = None,
    ) -> FilterOutcome:
        """The Filter stage over ``candidates`` (kube-scheduler's offered nodes) with the
        relax rule, every rejected candidate at its first failing filter."""
        profile = self.profile_for(signals_readable)
        blind = profile is not self.profile
        state = self._state(pod, table, now, profile)
        stamps: list[int] | None = [] if recorder is not None else None
        filtered = self._filters(profile, state, candidates, False, stamps)
        relaxed_after: float | None = None
        relax_at: float | None = None
        blocked = not filtered.passed.any() and bool(filtered.without_relaxable.any())
        if blocked:
            blocked_s, relax_at = self._relax_clock(pod.key, now)
            if blocked_s >= self.settings.relax_after_s:
                relaxed_after = blocked_s
                self.relax.forget(pod.key)
                state = self._state(pod, table, now, profile)
                filtered = self._filters(profile, state, candidates, True, stamps)
        else:
            self.relax.forget(pod.key)
        runq = None
        if not filtered.passed.any():
            runq = self._runq(profile, state, (), filtered.without_relaxable)
            if runq is not None:
                runq = dataclasses.replace(runq, relax_at=relax_at)
        stages = filtered.static.checked + filtered.dynamic
        found = rejections(stages, candidates)
        considered = int(np.count_nonzero(candidates))
        relaxed = relaxed_after is not None
        first_failures = found.first_failures()
        funnel = filter_funnel(profile, relaxed, considered, first_failures)
        if recorder is not None and stamps is not None:
            note_filters(
                recorder, profile, relaxed, considered, first_failures, stamps, found.counts, state
            )
        return FilterOutcome(filtered.passed, found, relaxed_after, blind, funnel, runq)

    def runq_of(
        self,
        pod: PodInfo,
        table: NodeTable,
        now: float,
        nodes: Iterable[str],
        *,
        signals_readable: bool = True,
    ) -> RunqCheck | None:
        """The pod's run-queue tolerance and the p99 compared on ``nodes`` (those a record
        keeps), under the profile the cycle runs (:attr:`Evidence.runq`)."""
        profile = self.profile_for(signals_readable)
        return self._runq(profile, self._state(pod, table, now, profile), nodes)

    def index_read_of(
        self,
        pod: PodInfo,
        table: NodeTable,
        now: float,
        nodes: Iterable[str],
        *,
        signals_readable: bool = True,
    ) -> IndexRead | None:
        """The index read on ``nodes`` (those a record keeps), under the profile the cycle
        runs (:attr:`Evidence.index_read`)."""
        profile = self.profile_for(signals_readable)
        return self._index_read(profile, self._state(pod, table, now, profile), nodes)

    def score(
        self,
        pod: PodInfo,
        table: NodeTable,
        now: float,
        *,
        signals_readable: bool = True,
        recorder: StageRecorder | None = None,
    ) -> dict[str, tuple[float, NDArray[np.float64]]]:
        """Plugin → (weight, 0–100 score per node) of the profile's score plugins, every
        node counted feasible (kube-scheduler asks about the nodes that passed)."""
        profile = self.profile_for(signals_readable)
        state = self._state(pod, table, now, profile)
        return run_scores(profile, state, table.everyone(), recorder)

    def fits_for(
        self, pod: PodInfo, table: NodeTable, now: float, *, signals_readable: bool = True
    ) -> tuple[Fits, bool, bool]:
        """The preemption dry run's check (:data:`scheduler.cycle.preemption.Fits`) for ``pod``
        as the table is now, whether it may check many nodes at once (every filter with
        anything to check judges a node by its own pods alone), and whether it may put
        pods back by NodeResourcesFit's arithmetic (no other such filter reads the placed
        pods)."""
        profile = self.profile_for(signals_readable)
        state = self._state(pod, table, now, profile)
        self._filters(profile, state, None, False)
        batch = node_local(profile, state)
        light = batch and resources_only(profile, state)
        return self._fits(profile, state, False, None, {}, batch), batch, light

    # ---- internals ---------------------------------------------------------------------

    def _relax_clock(self, key: str, now: float) -> tuple[float, float]:
        """The relax rule for ``key``, refused only by relaxable filters: how long it has
        been (its first refusal noted now), and when it is judged without them."""
        blocked_s = self.relax.waited(key, now)
        return blocked_s, now + self.settings.relax_after_s - blocked_s

    def _decide(
        self,
        pod: PodInfo,
        table: NodeTable,
        now: float,
        profile: ResolvedProfile,
        candidates: NDArray[np.bool_] | None,
        relax: bool,
        recorder: StageRecorder | None = None,
        preemption: PreemptionInputs | None = None,
        room: TableRoom | None = None,
    ) -> CycleResult:
        if len(table) == 0:
            return CycleResult(None, [], NO_NODES, False, pod.unsupported, 0)
        if pod.unsupported:
            message = refused_message(len(table), pod.unsupported)
            return CycleResult(None, [], message, False, pod.unsupported, 0)
        state = self._state(pod, table, now, profile)
        if profile.prefilters:
            started = time.time_ns() if recorder is not None else 0
            refused = prefilter(profile, state)
            if recorder is not None:
                recorder.note(
                    "PreFilter", PREFILTER, started, {"rejected_by": refused[0]} if refused else {}
                )
            if refused is not None:
                plugin, rejection = refused
                if rejection.unsupported:
                    message = refused_message(len(table), rejection.unsupported)
                    return CycleResult(None, [], message, False, rejection.unsupported, 0)
                message = pod_rejected_message(len(table), rejection.reason)
                return CycleResult(None, [], message, False, (), 0, {}, frozenset({plugin}))
        stamps: list[int] | None = [] if recorder is not None else None
        holds = None if preemption is None else preemption.holds
        filtered, state = self._filters_held(profile, state, candidates, relax, stamps, room)
        passed = filtered.passed
        feasible = int(np.count_nonzero(passed))
        nominated = None if holds is None else holds.node_of(pod.key)
        if nominated is not None and feasible > 1:  # kube's evaluateNominatedNode
            row = table.row_of(nominated)
            if row is not None and passed[row]:
                passed = np.zeros(len(table), dtype=np.bool_)
                passed[row] = True
                feasible = 1
        details_of = profile.evidence.candidate_details
        details = None if details_of is None else details_of(state)
        top_k = self.settings.record_top_k
        counts, first_failures, rejected = refusals_of(
            table, filtered, candidates, feasible, details, top_k
        )
        considered = len(table) if candidates is None else int(np.count_nonzero(candidates))
        funnel = filter_funnel(profile, relax, considered, first_failures)
        if recorder is not None and stamps is not None:
            note_filters(
                recorder, profile, relax, considered, first_failures, stamps, counts, state
            )
        if feasible == 0:
            message = failed_scheduling_message(considered, counts)
            outcome = None
            if preemption is not None and self.settings.preemption.enabled:
                outcome = self._post_filter(
                    profile, state, candidates, relax, filtered, considered, preemption, room
                )
                if outcome is not None and outcome.message:
                    message += " " + outcome.message
            return CycleResult(
                node=None,
                candidates=rejected,
                message=message,
                blocked_only_by_interference=bool(filtered.without_relaxable.any()),
                unsupported=pod.unsupported,
                feasible=0,
                reason_counts=counts,
                rejected_by=frozenset(first_failures),
                funnel=funnel,
                omitted={"feasible": 0, "rejected": considered - len(rejected)},
                preemption=outcome,
                runq=self._runq(
                    profile, state, (c.node for c in rejected), filtered.without_relaxable
                ),
                interference_index=self._index_read(profile, state, (c.node for c in rejected)),
            )
        scores = run_scores(profile, state, passed, recorder)
        selecting = time.time_ns() if recorder is not None else 0
        totals = weighted_sum(scores.values(), len(table))
        np.putmask(totals, ~passed, -np.inf)  # infeasible nodes rank last, never chosen
        best = best_first(totals, min(max(2, top_k), feasible))
        chosen = best[0]
        if len(best) > 1 and totals[best[1]] == totals[chosen]:
            ties = np.flatnonzero(totals == totals[chosen])
            chosen = int(ties[self._random.randrange(len(ties))])
        ranked = ranked_verdicts(table, best, chosen, scores, totals, details, top_k)
        if recorder is not None:
            top = [(c.node, c.total) for c in ranked]
            recorder.note_selection(selecting, table.names[chosen], feasible, top)
        return CycleResult(
            node=table.names[chosen],
            candidates=ranked + rejected,
            message=scheduled_message(pod.key, table.names[chosen]),
            blocked_only_by_interference=False,
            unsupported=pod.unsupported,
            feasible=feasible,
            reason_counts=counts,
            rejected_by=frozenset(first_failures),
            funnel=funnel,
            omitted={
                "feasible": feasible - len(ranked),
                "rejected": considered - feasible - len(rejected),
            },
            runq=self._runq(profile, state, (c.node for c in ranked + rejected)),
            interference_index=self._index_read(
                profile, state, (c.node for c in ranked + rejected)
            ),
        )

    def refused_for_runq(self, reasons: Iterable[str]) -> bool:
        """Whether ``reasons`` include the run-queue tolerance's
        (:attr:`Evidence.refused_for_runq`; false where no plugin supplies it)."""
        refused = self.profile.evidence.refused_for_runq
        return refused is not None and refused(reasons)

    def _runq(
        self,
        profile: ResolvedProfile,
        state: CycleState,
        nodes: Iterable[str],
        nearest_among: NDArray[np.bool_] | None = None,
    ) -> RunqCheck | None:
        """The profile's :attr:`Evidence.runq` (``None`` where none supplies it)."""
        runq = profile.evidence.runq
        return None if runq is None else runq(state, nodes, nearest_among)

    def _index_read(
        self, profile: ResolvedProfile, state: CycleState, nodes: Iterable[str]
    ) -> IndexRead | None:
        """The profile's :attr:`Evidence.index_read` (``None`` where none supplies it)."""
        index_read = profile.evidence.index_read
        return None if index_read is None else index_read(state, nodes)

    def _filters_held(
        self,
        profile: ResolvedProfile,
        state: CycleState,
        candidates: NDArray[np.bool_] | None,
        relax: bool,
        stamps: list[int] | None,
        room: TableRoom | None,
        second_pass: bool = True,
    ) -> tuple[Filtered, CycleState]:
        """:meth:`_filters` with the held room that counts against the pod on the table
        (``room``), and, unless every filter with anything to check judges a node by its
        own pods (then taking pods away cannot fail a node), again without it: a node
        passes only if it passes both (kube's ``RunFilterPluginsWithNominatedPods``). The
        reasons are those with the room held."""
        first = self._filters(profile, state, candidates, relax, stamps)
        if room is None or not second_pass or node_local(profile, state):
            return first, state
        for _, result in first.dynamic:
            result.reason_columns()  # the reasons while the room is held
        with room.without():
            bare = self._state(state.pod, state.table, state.now, profile)
            second = self._filters(profile, bare, candidates, relax)
        both = dataclasses.replace(
            first,
            passed=first.passed & second.passed,
            without_relaxable=first.without_relaxable & second.without_relaxable,
        )
        return both, state

    def _post_filter(
        self,
        profile: ResolvedProfile,
        state: CycleState,
        candidates: NDArray[np.bool_] | None,
        relax: bool,
        filtered: Filtered,
        considered: int,
        inputs: PreemptionInputs,
        room: TableRoom | None,
    ) -> PreemptionOutcome | None:
        """DefaultPreemption (:mod:`scheduler.cycle.preemption`) after no node passed; ``None``
        when no placed pod has a lower priority than the pod (no one to preempt: the
        message stays as it is, unlike kube-scheduler's ``No preemption victims found``)."""
        pod, table = state.pod, state.table
        args = self.settings.preemption
        if pod.priority <= lowest_victim_priority(table):
            return PreemptionOutcome(None, clear_nomination=True)
        base = table.everyone() if candidates is None else candidates
        failing = rejections(filtered.static.checked + filtered.dynamic, base).failing
        potential = potential_rows(failing, len(table))
        forced: dict[int, frozenset[str]] = {}
        if args.preempt_antagonists:
            forced = antagonist_rows(pod, table, failing, potential, inputs)
        why_not = eligible(pod, table, inputs, lambda row: not potential[row])
        if why_not is not None:
            return not_eligible(why_not)
        batch = node_local(profile, state)
        light = batch and resources_only(profile, state)
        fits = self._fits(profile, state, relax, room, forced, batch)
        return preempt(
            pod,
            table,
            potential,
            fits,
            inputs,
            args,
            self._random,
            considered,
            forced,
            batch,
            light,
        )

    def _fits(
        self,
        profile: ResolvedProfile,
        state: CycleState,
        relax: bool,
        room: TableRoom | None,
        loose: Mapping[int, Collection[str]],
        batch: bool,
    ) -> Fits:
        """The preemption dry run's check: the nodes of ``rows`` where the pod does not pass
        every filter as the table is now, with the reasons of the first failing one (the
        held room that counts against the pod is on the table); the ``loose`` nodes (the
        opt-in antagonist rule) are judged without the relaxable filters. One row at a
        time unless ``batch``."""
        pod, table, now = state.pod, state.table, state.now

        def fits(rows: Sequence[int]) -> dict[int, tuple[str, ...]]:
            failing: dict[int, tuple[str, ...]] = {}
            for relaxed in (False, True):
                group = [row for row in rows if (relax or row in loose) is relaxed]
                if not group:
                    continue
                only = np.zeros(len(table), dtype=np.bool_)
                only[group] = True
                fresh = self._state(pod, table, now, profile)
                found, _ = self._filters_held(
                    profile, fresh, only, relaxed, None, room, second_pass=not batch
                )
                for row in group:
                    if not found.passed[row]:
                        failing[row] = first_reasons(found, row)
            return failing

        return fits

    def _filters(
        self,
        profile: ResolvedProfile,
        state: CycleState,
        candidates: NDArray[np.bool_] | None,
        relax: bool,
        stamps: list[int] | None = None,
    ) -> Filtered:
        """Run the profile's filters: the static ones from the signature cache, then the
        others (the relaxable ones skipped with ``relax``); ``stamps`` is set to the
        wall-clock ns of the start, the static ones' end and each later filter's end."""
        if stamps is not None:
            stamps[:] = (time.time_ns(),)
        static = static_stage(profile, state)
        state.filtered.update(static.results)
        if stamps is not None:
            stamps.append(time.time_ns())
        dynamic: list[tuple[Filter, FilterResult]] = []  # those with a reason, in order
        binding: list[FilterResult] = []  # … of them, those never relaxed
        for plugin in profile.dynamic:
            if relax and plugin.relaxable:
                state.filtered[plugin.name] = None
                continue
            if plugin.static:
                result = run_filter(plugin, state)
            else:  # run_filter inlined: this loop runs for every decision
                result = state.filtered[plugin.name] = plugin.filter(state)
            if stamps is not None:
                stamps.append(time.time_ns())
            if result is not None and result.reasons:  # no reason: every node passed
                dynamic.append((plugin, result))
                if not plugin.relaxable:
                    binding.append(result)
        undecided = static.passed if candidates is None else static.passed & candidates
        without_relaxable = all_of(undecided, binding)
        if len(binding) == len(dynamic):
            passed = without_relaxable
        else:
            passed = all_of(undecided, (result for _, result in dynamic))
        return Filtered(passed, without_relaxable, static, tuple(dynamic), undecided)
