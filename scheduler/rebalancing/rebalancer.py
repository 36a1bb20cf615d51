"""The rebalancer: moves a running pod off a node whose interference breaks its tolerance.

It runs in the scheduler process, on the Lease holder only (docs/design.md §11): every
``interval_s`` :meth:`Rebalancer.step` looks at the bound pods that declare a run-queue or
reclaim tolerance (:func:`scheduler.rebalancing.rebalance.eligible`), reads the per-interval
rows the agents publish for them (each node's report stream, so no interval is missed between two
looks), and judges each by the rules of :mod:`scheduler.rebalancing.rebalance`. For a victim that
passes every guard rail it runs the scheduling cycle over every node but its own; when a
node passes every filter it:

* ``enforce``: evicts the pod through the Eviction API (PodDisruptionBudgets are the API
  server's to honour; a 429 means try again after ``retry_after_s``), records the
  departure so the RebalancedAway filter keeps the workload's replacement off the node
  it left (:mod:`scheduler.plugins.rebalanced_away`), and says so in a ``Warning
  InterferenceEvicted`` Event on the pod;
* ``dry_run`` (the default): asks the Eviction API with ``dryRun=All`` (the budgets are
  checked, nothing is evicted) and writes a ``Normal InterferenceWouldEvict`` Event;
* while the whole scheduler is a dry run (``loop.dry_run``, the dry-run overlay, whose
  RBAC has neither Events nor evictions) it writes the rebalancing record only.

A blocking budget is a ``Normal InterferenceEvictionBlocked`` Event, any other failure of
the Eviction API a ``Warning InterferenceEvictionFailed`` one; both are tried again after
``retry_after_s``. A rebalancing record (``intf:rebalance:decision:{ns}/{pod}``, result
``evicted``, ``would_evict`` or ``eviction_blocked``; the fields of a decision record)
holds the node it found with the candidates' verdicts, beside the pod's placement record
(``intf:decision:{ns}/{pod}``), which it leaves as it is, and
``interference_scheduler_rebalance_evictions_total{result}`` counts it. A
victim kept where it is counts in ``interference_scheduler_rebalance_holds_total{reason}``
(once per streak and reason, so a long hold is not a flood).

Size: over 520 lines because the look, the judgement and the move share one leadership's
state (the pods' histories, the streaks, the eviction ledger, the retries, the journal);
the rules (:mod:`scheduler.rebalancing.rebalance`, :mod:`scheduler.rebalancing.evictable`,
:mod:`scheduler.rebalancing.evidence`), the ports (:mod:`scheduler.rebalancing.ports`) and
the adapters are modules of their own.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from interference.decision import Decision
from interference.freshness import stale_after_s
from interference.signals import NodeReport
from scheduler.api.objects import PodInfo
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.nominated import Hold, held_room
from scheduler.cycle.outcome import CycleResult
from scheduler.cycle.ports import (
    ClusterError,
    DecisionSink,
    DecisionTracer,
    NoTracer,
    PodRef,
    SignalSource,
)
from scheduler.cycle.settings import CycleSettings
from scheduler.cycle.stage_trace import Attributes, StageRecorder
from scheduler.plugins.rebalanced_away import NAME as REBALANCED_AWAY
from scheduler.plugins.rebalanced_away import Departure, DepartureLookup, RebalancedAwayArgs
from scheduler.rebalancing.evictable import REFUSALS, Refusal, refusal
from scheduler.rebalancing.evidence import REPORT_REFUSALS, AgentClocks, report_refusal
from scheduler.rebalancing.ports import (
    EventRecorder,
    EvictionAnswer,
    EvictionStatus,
    Evictor,
    MoveJournal,
    NodeReportSource,
)
from scheduler.rebalancing.rebalance import (
    HOLD_REASONS,
    NO_BETTER_NODE,
    NODE_LIMIT,
    OWN_LIMIT,
    RECENT_WINDOW,
    RETRY_LATER,
    Breach,
    BreachTracker,
    EvictionLedger,
    Moved,
    MoveOutcomes,
    PodHistory,
    RebalancerSettings,
    breach,
    eligible,
    own_cause,
)
from scheduler.rebalancing.reservations import Reservations, replacement_of
from scheduler.signals.records import MAX_CLOCK_SKEW_S

log = logging.getLogger(__name__)

EVICTED = "evicted"
WOULD_EVICT = "would_evict"
BLOCKED = "eviction_blocked"
FAILED = "eviction_failed"
HELD = "held"
EVICTION_RESULTS = (EVICTED, WOULD_EVICT, BLOCKED, FAILED)
"""Values of the ``result`` label of ``interference_scheduler_rebalance_evictions_total``
(and, but ``eviction_failed``, of the rebalancing record's ``result``)."""


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


class RebalanceMetrics:
    """The rebalancer's metrics (on the scheduler's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.evictions = Counter(
            "interference_scheduler_rebalance_evictions",
            "Victims the rebalancer acted on, by result (evicted, would_evict in a dry run,"
            " eviction_blocked by a PodDisruptionBudget, eviction_failed).",
            ["result"],
            registry=registry,
        )
        self.holds = Counter(
            "interference_scheduler_rebalance_holds",
            "Victims kept where they are, by guard rail (own_limit, own_tasks, cooldown,"
            " move_budget, move_did_not_help, node_limit, namespace_limit, cluster_limit,"
            " no_better_node, retry_later); once per streak and reason.",
            ["reason"],
            registry=registry,
        )
        self.refused_reports = Counter(
            "interference_scheduler_rebalance_refused_reports",
            "Agents' reports whose rows the rebalancer left out, by reason (clock_ahead:"
            " dated beyond the clock skew; unmeasured: no run-queue family); each once.",
            ["reason"],
            registry=registry,
        )
        self.skewed_agents = Gauge(
            "interference_scheduler_rebalance_skewed_agents",
            "Nodes with a tolerant pod whose agent publishes with a clock off by more than"
            " its reports' freshness window (a Warning each time one becomes skewed).",
            registry=registry,
        )
        self.over_tolerance = Gauge(
            "interference_scheduler_rebalance_over_tolerance_pods",
            "Bound pods whose window breaks their interference tolerance at the latest look.",
            registry=registry,
        )
        self.looks = Counter(
            "interference_scheduler_rebalance_looks",
            "Looks the leader took at the pods with a tolerance (one per interval_s while"
            " the rebalancer is not off).",
            registry=registry,
        )
        for result in EVICTION_RESULTS:
            self.evictions.labels(result)
        for reason in (*HOLD_REASONS, *REFUSALS):
            self.holds.labels(reason)
        for reason in REPORT_REFUSALS:
            self.refused_reports.labels(reason)


@dataclass(frozen=True, slots=True)
class RebalanceAction:
    """What one step did (or would do) about one victim."""

    pod: str
    """``namespace/name``."""
    node: str
    """The node it is on."""
    outcome: str
    """``evicted``, ``would_evict``, ``eviction_blocked``, ``eviction_failed`` or ``held``."""
    reason: str
    """Why: the breach, then for a hold which guard rail (``no_better_node``, …)."""
    target: str = ""
    """The node the cycle found for it (empty when none)."""
    workload: str = ""
    at: float = 0.0


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
        self._journal = journal
        self._restored = journal is None
        """Whether this leadership has read the journal back (a new leader must, before
        it judges anyone: the cool-downs and limits are the old leader's too)."""
        self.records_only = records_only
        self._signals = signals
        self._reports = reports
        self._evictor = evictor
        self._events = events
        self._records = rebalancing_records
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
        self._ledger = EvictionLedger()
        self._outcomes = MoveOutcomes()
        self._reservations = Reservations()
        """Rooms held for evicted victims' replacements (in the cache's holds)."""
        self._look_holds: list[Hold] = []
        """Rooms a dry run's victims of this look would hold (never the loop's business)."""
        self._retry_at: dict[str, float] = {}
        self._held: dict[str, str] = {}
        """Victim UID → the hold reason already counted in this streak."""
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
                self._restored = self._journal is None  # read it again when leading again
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
        self._settle_reservations(now)
        self._look_holds = []
        if settings.mode == "off":
            return []
        if not self._restored and not self.records_only and not self._restore(now):
            return []  # judging without the old leader's moves could break its guard rails
        self._metrics.looks.inc()
        name = self.scheduler_name
        with self._cache.lock:
            tolerant = self._cache.table.lookup(TOLERANT_PODS, TolerantPods).pods()
        pods = [p for p in tolerant if eligible(p, settings, name) is None]
        uids = {p.uid for p in pods}
        for uid in list(self._histories):
            if uid not in uids:
                del self._histories[uid]
                self._held.pop(uid, None)
                self._retry_at.pop(uid, None)
        self._streaks.keep_only(uids)
        self._outcomes.forget_before(now - settings.move_budget_window_s)
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
                verdict = self._outcomes.judge(
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
            self._mark_unhelped(pod, found, lasted, now)
        for pod in helped:
            self._note_helped(pod, now)
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
        if now < self._retry_at.get(pod.uid, -np.inf):
            return self._hold(pod, RETRY_LATER, "the Eviction API asked to wait", now)
        guard = self._ledger.hold_reason(pod, now, settings, dry_run=self._dry_run())
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
        return self._move(pod, why, result, now, trace_id)

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

    def _move(
        self, pod: PodInfo, why: str, result: CycleResult, now: float, trace_id: str = ""
    ) -> RebalanceAction:
        dry_run = self._dry_run()
        target = result.node or ""
        ref = PodRef(pod.namespace, pod.name, pod.uid)
        workload = str(pod.controller)
        if not dry_run:  # hold the room before the eviction: the replacement's, no one else's
            with self._cache.lock:
                self._reservations.reserve(
                    self._cache.holds, pod, target, now, self.settings.reserve_for_s
                )
        try:
            if self.records_only:
                answer = EvictionAnswer(EvictionStatus.EVICTED)  # not asked: records only
            else:
                answer = self._evictor.evict(ref, dry_run)
        except ClusterError as exc:
            self._unreserve(pod)
            log.warning("evicting %s failed: %s", pod.key, exc)
            self._metrics.evictions.labels(FAILED).inc()
            self._retry_at[pod.uid] = now + self.settings.retry_after_s
            message = (
                f"{'asking the Eviction API (dry run) about' if dry_run else 'evicting'} it "
                f"to leave {pod.node_name} ({why}; {target} passes every filter) failed: "
                f"{exc}; trying again in {self.settings.retry_after_s:g} s"
            )
            self._events.record_event(ref, "Warning", "InterferenceEvictionFailed", message)
            return RebalanceAction(pod.key, pod.node_name, FAILED, message, target, workload, now)
        if answer.status is not EvictionStatus.EVICTED:
            self._unreserve(pod)
        if answer.status is EvictionStatus.GONE:
            return RebalanceAction(pod.key, pod.node_name, HELD, "already gone", "", workload, now)
        if answer.status is EvictionStatus.BLOCKED:
            self._retry_at[pod.uid] = now + self.settings.retry_after_s
            message = (
                f"{'would evict' if dry_run else 'evicting'} it to leave {pod.node_name} "
                f"({why}; {target} passes every filter) is blocked: {answer.message}; "
                f"trying again in {self.settings.retry_after_s:g} s"
            )
            self._metrics.evictions.labels(BLOCKED).inc()
            self._events.record_event(ref, "Normal", "InterferenceEvictionBlocked", message)
            self._record(pod, BLOCKED, message, result, now, dry_run, trace_id)
            return RebalanceAction(pod.key, pod.node_name, BLOCKED, message, target, workload, now)
        controller = pod.controller
        assert controller is not None  # eligible() requires one
        moved = Moved(now, pod.node_name, pod.namespace, controller.uid, dry_run=dry_run)
        self._ledger.note(moved)
        if not dry_run:  # a dry run keeps the streak: switching to enforce acts at once
            self._streaks.forget(pod.uid)
            self._outcomes.moved(controller.uid, now)
        self._held.pop(pod.uid, None)
        outcome = WOULD_EVICT if dry_run else EVICTED
        departure: Departure | None = None
        if dry_run:
            message = (
                f"would evict (dry run): {why}; {target} passes every filter for it "
                f"(rebalancer mode enforce would move it)"
            )
            self._look_holds.append(Hold(replacement_of(pod), target, controller.uid))
            if not self.records_only:
                self._events.record_event(ref, "Normal", "InterferenceWouldEvict", message)
        else:
            message = (
                f"evicted to leave {pod.node_name}: {why}; {target} passes every filter for it "
                f"and holds its replacement's room for up to {self.settings.reserve_for_s:g} s; "
                f"{workload} avoids {pod.node_name} for {self._avoid_for_s():g} s"
            )
            departure = Departure(controller.uid, workload, pod.node_name, now, why)
            with self._cache.lock:
                departures = self._cache.table.lookup(REBALANCED_AWAY, DepartureLookup)
                departures.record(departure, now - self._avoid_for_s())
            self._events.record_event(ref, "Warning", "InterferenceEvicted", message)
        log.info("%s %s", pod.key, message)
        self._journal_move(moved, departure)
        self._metrics.evictions.labels(outcome).inc()
        self._record(pod, outcome, message, result, now, dry_run, trace_id)
        return RebalanceAction(pod.key, pod.node_name, outcome, message, target, workload, now)

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

    def _mark_unhelped(self, pod: PodInfo, found: Breach, lasted: float, now: float) -> None:
        """The workload's latest move left its replacement over the tolerance: mark it (a
        Warning Event, journaled) so it stays where it is for ``move_budget_window_s``."""
        controller = pod.controller
        assert controller is not None  # eligible() requires one
        mark = Moved(now, pod.node_name, pod.namespace, controller.uid, unhelpful=True)
        self._ledger.note(mark)
        message = (
            f"{controller} was moved here by the rebalancer and still {found.text} for "
            f"{lasted:.0f} s: moving did not help, so it is left where it is for "
            f"{self.settings.move_budget_window_s:g} s (rebalancer.move_budget_window_s)"
        )
        log.warning("%s %s", pod.key, message)
        if not self.records_only:
            ref = PodRef(pod.namespace, pod.name, pod.uid)
            self._events.record_event(ref, "Warning", "InterferenceMoveDidNotHelp", message)
        self._journal_move(mark, None)
        self._held.pop(pod.uid, None)  # counted under its new reason at this look

    def _note_helped(self, pod: PodInfo, now: float) -> None:
        """The workload's latest move brought it back under its tolerance: journaled, so a
        later leader does not judge that move again (and mark it when a new neighbour
        comes)."""
        controller = pod.controller
        assert controller is not None  # only moved workloads are judged
        log.info("%s is back under its tolerance on %s: its move helped", pod.key, pod.node_name)
        self._journal_move(
            Moved(now, pod.node_name, pod.namespace, controller.uid, helped=True), None
        )

    # ---- helpers ----------------------------------------------------------------------------

    def _unreserve(self, pod: PodInfo) -> None:
        if pod.controller is not None:
            with self._cache.lock:
                self._reservations.release(self._cache.holds, pod.controller.uid)

    def _settle_reservations(self, now: float) -> None:
        """Let go of the rooms whose replacement is placed or whose time is up."""
        if not len(self._reservations):
            return
        with self._cache.lock:
            placed = self._cache.table.lookup(TOLERANT_PODS, TolerantPods).pods()
            done = self._reservations.settle(self._cache.holds, placed, now)
        for made, why in done:
            log.info("room on %s for a replacement of %s: %s", made.node, made.workload_uid, why)

    def _dry_run(self) -> bool:
        return self.settings.mode != "enforce" or self.records_only

    def _keep_s(self) -> float:
        """How long a move still matters: the longest of its windows."""
        settings = self.settings
        return max(
            settings.rate_window_s,
            settings.cooldown_s,
            settings.move_budget_window_s,
            self._avoid_for_s(),
        )

    def _journal_move(self, moved: Moved, departure: Departure | None) -> None:
        if self._journal is None or self.records_only:  # records only: nothing to keep
            return
        try:
            self._journal.add(moved, departure, self._keep_s())
        except Exception as exc:  # the move happened; only a later leader would miss it
            log.warning("could not journal the move of a %s pod: %s", moved.namespace, exc)

    def _restore(self, now: float) -> bool:
        """Read the journal back into the ledger and the departures; False when it cannot
        be read (try again at the next look)."""
        assert self._journal is not None
        try:
            moves = self._journal.since(now - self._keep_s())
        except Exception as exc:
            log.warning("cannot read the rebalancer's journal; not judging until it can: %s", exc)
            return False
        avoid_for = self._avoid_for_s()
        with self._cache.lock:
            departures = self._cache.table.lookup(REBALANCED_AWAY, DepartureLookup)
            for moved, departure in sorted(moves, key=lambda m: m[0].at):
                self._ledger.note(moved)
                if moved.helped or moved.unhelpful:
                    self._outcomes.judged(moved.workload_uid, moved.at)
                elif not moved.dry_run:
                    self._outcomes.moved(moved.workload_uid, moved.at)
                if departure is not None:
                    departures.record(departure, now - avoid_for)
        self._restored = True
        helped = sum(moved.helped for moved, _ in moves)
        log.info(
            "rebalancer: %d earlier moves read back (%d found to have helped)",
            len(moves) - helped,
            helped,
        )
        return True

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

    def _record(
        self,
        pod: PodInfo,
        outcome: str,
        message: str,
        result: CycleResult,
        now: float,
        dry_run: bool,
        trace_id: str = "",
    ) -> None:
        self._records.write(
            Decision(
                namespace=pod.namespace,
                pod=pod.name,
                result=outcome,
                node=result.node or "",
                message=message,
                ts=now,
                dry_run=dry_run,
                candidates=list(result.candidates),
                rejected_by_reason=dict(result.reason_counts),
                funnel=list(result.funnel),
                omitted=dict(result.omitted),
                trace_id=trace_id,
            )
        )

    def _refuse(self, pod: PodInfo, found: Breach, refused: Refusal, now: float) -> RebalanceAction:
        """Hold a victim an eviction would not move whole; its rebalancing record (``held``)
        says why, once per streak as the metric."""
        why = f"{found.text}, but {refused.text} (an eviction would not move it whole)"
        if self._held.get(pod.uid) != refused.reason:
            message = f"{refused.reason}: {why}"
            log.info("%s held: %s", pod.key, message)
            dry_run = self.settings.mode != "enforce" or self.records_only
            decision = Decision(pod.namespace, pod.name, HELD, "", message, now, dry_run)
            self._records.write(decision)
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
