"""The rebalancer: moves a running pod off a node whose interference breaks its tolerance.

It runs in the scheduler process, on the Lease holder only (docs/design.md §11): every
``interval_s`` :meth:`Rebalancer.step` looks at the bound pods that declare a run-queue or
reclaim tolerance (:func:`scheduler.rebalancing.rebalance.eligible`), reads the per-interval
rows the agents publish for them (each node's report stream, so no interval is missed between two
looks), and judges each by the rules of :mod:`scheduler.rebalancing.rebalance`. For a victim that
passes every guard rail it runs the scheduling cycle over every node but its own; when a
node passes every filter, :class:`~scheduler.rebalancing.mover.Mover` moves it (evicts it,
or in a dry run asks the Eviction API whether it could) and keeps the move for the guard
rails of later looks and leaders.

A victim kept where it is counts in ``interference_scheduler_rebalance_holds_total{reason}``
(once per streak and reason, so a long hold is not a flood); one an eviction would not move
whole (:mod:`scheduler.rebalancing.evictable`) also gets a rebalancing record (``held``).
This module is the look and the judgement: the pods' histories, the agents' clocks, the
breach streaks and the holds.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable

from interference.freshness import stale_after_s
from interference.signals import NodeReport
from scheduler.api.objects import PodInfo
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.nominated import Hold, held_room
from scheduler.cycle.outcome import CycleResult
from scheduler.cycle.ports import (
    DecisionSink,
    DecisionTracer,
    NoTracer,
    PodRef,
    SignalSource,
)
from scheduler.cycle.settings import CycleSettings
from scheduler.cycle.stage_trace import Attributes, StageRecorder
from scheduler.plugins.rebalanced_away import NAME as REBALANCED_AWAY
from scheduler.plugins.rebalanced_away import DepartureLookup, RebalancedAwayArgs
from scheduler.rebalancing.evictable import Refusal, refusal
from scheduler.rebalancing.evidence import AgentClocks, report_refusal
from scheduler.rebalancing.metrics import EVICTED, WOULD_EVICT, RebalanceMetrics
from scheduler.rebalancing.mover import HELD, Mover, RebalanceAction
from scheduler.rebalancing.ports import (
    EventRecorder,
    Evictor,
    MoveJournal,
    NodeReportSource,
)
from scheduler.rebalancing.rebalance import (
    NO_BETTER_NODE,
    NODE_LIMIT,
    OWN_LIMIT,
    RECENT_WINDOW,
    RETRY_LATER,
    Breach,
    BreachTracker,
    PodHistory,
    RebalancerSettings,
    breach,
    eligible,
    own_cause,
)
from scheduler.rebalancing.reservations import replacement_of
from scheduler.signals.records import MAX_CLOCK_SKEW_S

log = logging.getLogger(__name__)

TOLERANT_PODS = "rebalancer.tolerant_pods"
"""The table lookup of :class:`TolerantPods`."""


class TolerantPods:
    """The placed pods that declare a run-queue or reclaim tolerance, kept current by the
    table's placed-pod hooks, so a look costs O(those pods), not O(every pod)."""

    def __init__(self) -> None:
        self._pods: dict[str, PodInfo] = {}

    def add(self, pod: PodInfo, node: str) -> None:
        tolerance = pod.tolerance
        if tolerance is None or (
            tolerance.max_runq_p99_us is None and tolerance.max_reclaim_stall_ms_per_s is None
        ):
            return
        placed = pod if pod.node_name == node else dataclasses.replace(pod, node_name=node)
        self._pods[pod.key] = placed

    def remove(self, pod: PodInfo, node: str) -> None:
        self._pods.pop(pod.key, None)

    def pods(self) -> list[PodInfo]:
        return list(self._pods.values())


class Rebalancer:
    """Judges the bound pods with a tolerance and moves victims; see the module docstring.

    :meth:`step` is the whole work of one look and returns what it did, so a benchmark
    (``bench/rebalance.py``) or a test can drive it with its own clock.
    """

    def __init__(
        self,
        cache: ClusterCache,
        signals: SignalSource,
        reports: NodeReportSource,
        evictor: Evictor,
        events: EventRecorder,
        rebalancing_records: DecisionSink,
        cycle_settings: CycleSettings,
        settings: RebalancerSettings,
        scheduler_name: str,
        metrics: RebalanceMetrics,
        *,
        journal: MoveJournal | None = None,
        records_only: bool = False,
        clock: Callable[[], float] = time.time,
        tracer: DecisionTracer | None = None,
        max_clock_skew_s: float = MAX_CLOCK_SKEW_S,
    ) -> None:
        """``rebalancing_records``: where each look's rebalancing record goes, a sink of
        its own (``intf:rebalance:decision:{ns}/{pod}`` in Redis), never the placement
        records' sink, so that a look leaves the pod's placement record as it is.
        ``records_only``: the scheduler is a dry run (``loop.dry_run``): no Event, no
        Eviction API call, only rebalancing records (as ``dry_run`` mode otherwise).
        ``tracer``: each search for a better node is a trace, as a scheduling attempt is
        (its id in the rebalancing record)."""
        self._cache = cache
        self._tracer: DecisionTracer = tracer or NoTracer()
        self.records_only = records_only
        self._signals = signals
        self._reports = reports
        self._events = events
        self._metrics = metrics
        self._clock = clock
        self.settings = settings
        self.scheduler_name = scheduler_name
        self._cycle_settings = cycle_settings
        self._cycle = SchedulingCycle(cycle_settings)
        """Its own cycle: a check of a running pod must leave no relax memory behind for
        the scheduling loop (a StatefulSet's replacement has the same name)."""
        self._histories: dict[str, PodHistory] = {}
        self._max_clock_skew_s = max_clock_skew_s
        """The signal reader's ``redis.max_clock_skew_s``: a report further off is refused."""
        self._clocks = AgentClocks()
        self._refused: dict[str, set[float]] = {}
        """Node → times of the refused reports in its stream at the last look (counted once)."""
        self._streaks = BreachTracker()
        self._look_holds: list[Hold] = []
        """Rooms a dry run's victims of this look would hold (never the loop's business)."""
        self._held: dict[str, str] = {}
        """Victim UID → the hold reason already counted in this streak."""
        self._mover = Mover(
            cache,
            evictor,
            events,
            rebalancing_records,
            metrics,
            settings,
            placed=self._tolerant_pods,
            avoid_for_s=self._avoid_for_s,
            journal=journal,
            records_only=records_only,
        )
        with cache.lock:
            cache.table.lookup(TOLERANT_PODS, TolerantPods)

    def update_settings(
        self,
        cycle_settings: CycleSettings,
        settings: RebalancerSettings,
        scheduler_name: str,
        records_only: bool = False,
    ) -> None:
        """Apply a reloaded configuration (between two steps)."""
        self.records_only = records_only
        if cycle_settings != self._cycle_settings:
            self._cycle = SchedulingCycle(cycle_settings)
            self._cycle_settings = cycle_settings
        self.settings = settings
        self.scheduler_name = scheduler_name
        self._mover.configure(settings, records_only)

    @property
    def departures(self) -> DepartureLookup:
        """The RebalancedAway filter's record of who left which node."""
        with self._cache.lock:
            return self._cache.table.lookup(REBALANCED_AWAY, DepartureLookup)

    # ---- running -------------------------------------------------------------------------

    def run(self, stop: threading.Event, leading: threading.Event) -> None:
        """Step every ``interval_s`` while this replica leads and the cache is synced."""
        while not stop.wait(self.settings.interval_s):
            if not leading.is_set():
                self._mover.lost_leadership()
                continue
            if self.settings.mode == "off" or not self._cache.synced():
                continue
            try:
                self.step()
            except Exception:  # one bad step must not end rebalancing
                log.exception("rebalancing step failed")

    def step(self, now: float | None = None) -> list[RebalanceAction]:
        """One look at every pod with a tolerance; returns the victims' outcomes."""
        now = self._clock() if now is None else now
        settings = self.settings
        self._mover.settle(now)
        self._look_holds = []
        if settings.mode == "off":
            return []
        if not self._mover.ready(now):
            return []  # judging without the old leader's moves could break its guard rails
        self._metrics.looks.inc()
        name = self.scheduler_name
        with self._cache.lock:
            tolerant = self._tolerant_pods()
        pods = [p for p in tolerant if eligible(p, settings, name) is None]
        uids = {p.uid for p in pods}
        for uid in list(self._histories):
            if uid not in uids:
                del self._histories[uid]
                self._held.pop(uid, None)
                self._mover.forget(uid)
        self._streaks.keep_only(uids)
        self._mover.outcomes.forget_before(now - settings.move_budget_window_s)
        if not pods:
            self._metrics.over_tolerance.set(0)
            return []
        self._read_rows(pods)
        breaching: list[tuple[PodInfo, Breach, float, str | None]] = []
        unhelped: list[tuple[PodInfo, Breach, float]] = []
        helped: list[PodInfo] = []
        with self._cache.lock:
            readable = self._signals.healthy()
            table = self._cache.table
            if readable:
                table.set_signals(self._signals.snapshot())
            reclaim_mean = table.windows[settings.window].reclaim_mean
            recent_reclaim = table.windows[RECENT_WINDOW[settings.window]].reclaim_mean
            fresh_for = stale_after_s(1.0) + settings.interval_s
            for pod in pods:
                history = self._histories.get(pod.uid)
                row = table.row_of(pod.node_name)
                # the node's own record must be fresh: rows of an expired agent are no evidence
                fresh = readable and row is not None and bool(table.fresh_until[row] >= now)
                own = (
                    None
                    if history is None or not fresh
                    else history.window(now, settings.window_s, fresh_for)
                )
                reclaim = float(reclaim_mean[row]) if fresh and row is not None else None
                recent = float(recent_reclaim[row]) if fresh and row is not None else None
                found = breach(pod, own, reclaim, recent)
                lasted = self._streaks.note(pod.uid, found is not None, now)
                verdict = self._mover.outcomes.judge(
                    pod,
                    own is not None,
                    None if found is None else lasted,
                    settings.sustained_for_s,
                )
                if verdict == "did_not_help":
                    assert found is not None
                    unhelped.append((pod, found, lasted))
                elif verdict == "helped":
                    helped.append(pod)
                if found is None:
                    self._held.pop(pod.uid, None)
                    continue
                breaching.append((pod, found, lasted, own_cause(found, own)))
        self._metrics.over_tolerance.set(len(breaching))
        for pod, found, lasted in unhelped:
            self._mover.mark_unhelped(pod, found, lasted, now)
            self._held.pop(pod.uid, None)  # counted under its new reason at this look
        for pod in helped:
            self._mover.note_helped(pod, now)
        actions: list[RebalanceAction] = []
        moved_from: set[str] = set()
        # the worst breach first: on each node, and for the namespace and cluster limits
        for pod, found, lasted, cause in sorted(breaching, key=lambda b: -b[1].severity):
            if lasted < settings.sustained_for_s:
                continue
            if pod.node_name in moved_from:  # one eviction per hot node per look
                why = f"{found.text}; a worse victim left {pod.node_name} at this look"
                actions.append(self._hold(pod, NODE_LIMIT, why, now))
                continue
            refused = self._refusal(pod)
            if refused is not None:
                actions.append(self._refuse(pod, found, refused, now))
                continue
            if cause is not None:
                whose = "its own CPU limit" if cause == OWN_LIMIT else "its own tasks"
                why = f"{found.text}, but {whose} caused most of the wait (moving would not help)"
                actions.append(self._hold(pod, cause, why, now))
            else:
                action = self._judge(pod, found, lasted, now)
                actions.append(action)
                if action.outcome in (EVICTED, WOULD_EVICT):
                    moved_from.add(pod.node_name)
        return actions

    # ---- one victim -----------------------------------------------------------------------

    def _judge(self, pod: PodInfo, found: Breach, lasted: float, now: float) -> RebalanceAction:
        settings = self.settings
        if self._mover.retry_later(pod, now):
            return self._hold(pod, RETRY_LATER, "the Eviction API asked to wait", now)
        guard = self._mover.hold_reason(pod, now)
        if guard is not None:
            return self._hold(pod, guard, found.text, now)
        why = f"{found.text} for {lasted:.0f} s over the {settings.window} window"
        recorder = self._tracer.start()
        started_ns = time.time_ns() if recorder is not None else 0
        result = self._better_node(pod, now, recorder)
        if recorder is not None:
            attributes: Attributes = {
                "pod": pod.key,
                "node": pod.node_name,
                "breach": why,
                "better_node": "" if result is None else result.node or "",
            }
            self._tracer.finish(recorder, "rebalance", started_ns, attributes)
        if result is None or result.node is None:
            return self._hold(pod, NO_BETTER_NODE, why, now)
        trace_id = "" if recorder is None else recorder.trace_hex
        action = self._mover.move(pod, why, result, now, trace_id)
        if action.outcome in (EVICTED, WOULD_EVICT):
            self._held.pop(pod.uid, None)
        if action.outcome == EVICTED:  # a dry run keeps the streak: enforce then acts at once
            self._streaks.forget(pod.uid)
        elif action.outcome == WOULD_EVICT:
            controller = pod.controller
            assert controller is not None  # eligible() requires one
            self._look_holds.append(Hold(replacement_of(pod), action.target, controller.uid))
        return action

    def _better_node(
        self, pod: PodInfo, now: float, recorder: StageRecorder | None
    ) -> CycleResult | None:
        """The cycle over every node but the pod's own, as if it were pending now."""
        with self._cache.lock:
            table = self._cache.table
            row = table.row_of(pod.node_name)
            if row is None or len(table) < 2:
                return None
            readable = self._signals.healthy()
            if not readable:  # an interference-blind answer cannot say a node is better
                return None
            candidates = table.everyone().copy()
            candidates[row] = False
            pending = dataclasses.replace(pod, node_name="")
            # the rooms held already, this look's victims' among them: no two count on one
            held = [*self._cache.holds.against(pending), *self._look_holds]
            with held_room(table, held):
                result = self._cycle.schedule(
                    pending,
                    table,
                    now,
                    signals_readable=True,
                    candidates=candidates,
                    recorder=recorder,
                )
            self._cycle.relax.forget(pod.key)
            return result

    def _hold(self, pod: PodInfo, reason: str, why: str, now: float) -> RebalanceAction:
        if self._held.get(pod.uid) != reason:
            self._held[pod.uid] = reason
            self._metrics.holds.labels(reason).inc()
            # once per reason, so an operator reading the leader's log learns why a pod
            # over its tolerance stays where it is
            log.info("%s stays on %s: %s: %s", pod.key, pod.node_name, reason, why)
        return RebalanceAction(
            pod.key, pod.node_name, HELD, f"{reason}: {why}", "", str(pod.controller), now
        )

    # ---- helpers ----------------------------------------------------------------------------

    def _tolerant_pods(self) -> list[PodInfo]:
        """The placed pods with a tolerance (caller holds the cache lock)."""
        return self._cache.table.lookup(TOLERANT_PODS, TolerantPods).pods()

    def _avoid_for_s(self) -> float:
        args = self._cycle.profile.args.get(REBALANCED_AWAY)
        return (args if isinstance(args, RebalancedAwayArgs) else RebalancedAwayArgs()).avoid_for_s

    def _read_rows(self, pods: list[PodInfo]) -> None:
        """Add each pod's rows from its node's recent reports to its history."""
        nodes = sorted({p.node_name for p in pods})
        try:
            reports = self._reports.recent(nodes)
        except Exception as exc:  # unknown signals end no streak here: the window ages out
            log.warning("reading the agents' reports for rebalancing failed: %s", exc)
            return
        by_key = {p.key: p for p in pods}
        now = self._clock()
        refused_now: dict[str, set[float]] = {}
        for node, node_reports in reports.items():
            self._note_clock(node, node_reports, by_key.values(), now)
            for report in sorted(node_reports, key=lambda r: r.ts):
                if report.node != node:
                    continue  # a report under another node's key is not this node's word
                refused = report_refusal(report, now, self._max_clock_skew_s)
                if refused is not None:
                    if report.ts not in self._refused.get(node, ()):
                        self._metrics.refused_reports.labels(refused).inc()
                    refused_now.setdefault(node, set()).add(report.ts)
                    continue
                for row in report.pods:
                    pod = by_key.get(row.key)
                    if pod is None or pod.node_name != node or (row.uid and row.uid != pod.uid):
                        continue
                    history = self._histories.get(pod.uid)
                    if history is None:
                        history = self._histories[pod.uid] = PodHistory(pod.uid)
                    history.add(row, report.ts)
        self._refused = refused_now
        self._clocks.keep_only(set(nodes))
        self._metrics.skewed_agents.set(self._clocks.skewed())

    def _note_clock(
        self, node: str, reports: list[NodeReport], pods: Iterable[PodInfo], now: float
    ) -> None:
        """A Warning (log, Event on the node's pods with a tolerance) when the node's agent
        has just turned out to publish with a skewed clock (:class:`AgentClocks`)."""
        mine = [r for r in reports if r.node == node]
        if not mine:
            return
        skew = self._clocks.note(node, max(mine, key=lambda r: r.ts), now, self._max_clock_skew_s)
        if skew is None:
            return
        log.warning("%s", skew.text)
        if self.records_only:
            return
        for pod in pods:
            if pod.node_name == node:
                ref = PodRef(pod.namespace, pod.name, pod.uid)
                self._events.record_event(ref, "Warning", "InterferenceAgentClockSkewed", skew.text)

    def _refuse(self, pod: PodInfo, found: Breach, refused: Refusal, now: float) -> RebalanceAction:
        """Hold a victim an eviction would not move whole; its rebalancing record (``held``)
        says why, once per streak as the metric."""
        why = f"{found.text}, but {refused.text} (an eviction would not move it whole)"
        if self._held.get(pod.uid) != refused.reason:
            message = f"{refused.reason}: {why}"
            log.info("%s held: %s", pod.key, message)
            self._mover.record_held(pod, message, now)
        return self._hold(pod, refused.reason, why, now)

    def _refusal(self, pod: PodInfo) -> Refusal | None:
        """Why evicting ``pod`` would not move it whole (scheduler/rebalancing/evictable.py)."""
        with self._cache.lock:
            catalog = self._cache.table.volumes

            def local_volume(namespace: str, claim_name: str) -> bool:
                claim = catalog.claim(namespace, claim_name)
                volume = catalog.volume(claim.volume_name) if claim is not None else None
                return volume is not None and volume.local

            return refusal(pod, self.settings.controller_kinds, local_volume)
