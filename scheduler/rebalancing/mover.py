"""The rebalancer's move: what happens to a victim once the look has found it a better node.

:class:`scheduler.rebalancing.rebalancer.Rebalancer` judges; :class:`Mover` acts, and keeps
what acting leaves behind for the next looks and the next leader (docs/design.md §11). For
a victim with a node that passes every filter it:

* ``enforce``: evicts the pod through the Eviction API (PodDisruptionBudgets are the API
  server's to honour; a 429 means try again after ``retry_after_s``), records the
  departure so the RebalancedAway filter keeps the workload's replacement off the node
  it left (:mod:`scheduler.plugins.rebalanced_away`), holds the replacement's room on the
  node found (:mod:`scheduler.rebalancing.reservations`), and says so in a ``Warning
  InterferenceEvicted`` Event on the pod;
* ``dry_run`` (the default): asks the Eviction API with ``dryRun=All`` (the budgets are
  checked, nothing is evicted) and writes a ``Normal InterferenceWouldEvict`` Event;
* while the whole scheduler is a dry run (``loop.dry_run``, the dry-run overlay, whose
  RBAC has neither Events nor evictions) it writes the rebalancing record only.

A blocking budget is a ``Normal InterferenceEvictionBlocked`` Event, any other failure of
the Eviction API a ``Warning InterferenceEvictionFailed`` one; both are tried again after
``retry_after_s``. A rebalancing record (``intf:rebalance:decision:{ns}/{pod}``, result
``evicted``, ``would_evict``, ``eviction_blocked`` or ``held``; the fields of a decision
record) holds the node it found with the candidates' verdicts, beside the pod's placement
record (``intf:decision:{ns}/{pod}``), which it leaves as it is, and
``interference_scheduler_rebalance_evictions_total{result}`` counts it.

Every move (and the verdict on whether it helped) goes into the eviction ledger, the
guard rails' memory (:class:`~scheduler.rebalancing.rebalance.EvictionLedger`), and into
the move journal, which a new leader reads back before it judges anyone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from interference.decision import Decision
from scheduler.api.objects import PodInfo
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.outcome import CycleResult
from scheduler.cycle.ports import ClusterError, DecisionSink, PodRef
from scheduler.plugins.rebalanced_away import NAME as REBALANCED_AWAY
from scheduler.plugins.rebalanced_away import Departure, DepartureLookup
from scheduler.rebalancing.metrics import (
    BLOCKED,
    EVICTED,
    FAILED,
    WOULD_EVICT,
    RebalanceMetrics,
)
from scheduler.rebalancing.ports import (
    EventRecorder,
    EvictionAnswer,
    EvictionStatus,
    Evictor,
    MoveJournal,
)
from scheduler.rebalancing.rebalance import (
    Breach,
    EvictionLedger,
    Moved,
    MoveOutcomes,
    RebalancerSettings,
)
from scheduler.rebalancing.reservations import Reservations

log = logging.getLogger(__name__)

HELD = "held"
"""The outcome of a victim kept where it is (and the result of its rebalancing record)."""


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


class Mover:
    """Evicts (or would evict) the rebalancer's victims and keeps its moves; see the module
    docstring."""

    def __init__(
        self,
        cache: ClusterCache,
        evictor: Evictor,
        events: EventRecorder,
        rebalancing_records: DecisionSink,
        metrics: RebalanceMetrics,
        settings: RebalancerSettings,
        *,
        placed: Callable[[], list[PodInfo]],
        avoid_for_s: Callable[[], float],
        journal: MoveJournal | None = None,
        records_only: bool = False,
    ) -> None:
        """``placed``: the placed pods with a tolerance, among them the evicted victims'
        replacements (called with the cache lock held). ``avoid_for_s``: how long the
        RebalancedAway filter keeps a workload off the node it left (the profile's)."""
        self._cache = cache
        self._evictor = evictor
        self._events = events
        self._records = rebalancing_records
        self._metrics = metrics
        self._placed = placed
        self._avoid_for_s = avoid_for_s
        self._journal = journal
        self._restored = journal is None
        """Whether this leadership has read the journal back (a new leader must, before
        it judges anyone: the cool-downs and limits are the old leader's too)."""
        self.settings = settings
        self.records_only = records_only
        self._ledger = EvictionLedger()
        self.outcomes = MoveOutcomes()
        """Whether each moved workload's latest move helped (judged by the look)."""
        self._reservations = Reservations()
        """Rooms held for evicted victims' replacements (in the cache's holds)."""
        self._retry_at: dict[str, float] = {}

    def configure(self, settings: RebalancerSettings, records_only: bool) -> None:
        """Apply a reloaded configuration (between two steps)."""
        self.settings = settings
        self.records_only = records_only

    @property
    def dry_run(self) -> bool:
        """Whether a move only asks (``dry_run`` mode, or the whole scheduler a dry run)."""
        return self.settings.mode != "enforce" or self.records_only

    # ---- leadership ------------------------------------------------------------------------

    def lost_leadership(self) -> None:
        """Read the journal again when leading again: another leader may have moved pods."""
        self._restored = self._journal is None

    def ready(self, now: float) -> bool:
        """Whether the earlier leaders' moves are known (the journal read back, or nothing
        to read); False: do not judge at this look, since judging without them could break
        their guard rails."""
        return self._restored or self.records_only or self._restore(now)

    # ---- guard rails -----------------------------------------------------------------------

    def retry_later(self, pod: PodInfo, now: float) -> bool:
        """Whether the Eviction API asked to wait before ``pod`` is tried again."""
        return bool(now < self._retry_at.get(pod.uid, -np.inf))

    def hold_reason(self, pod: PodInfo, now: float) -> str | None:
        """The guard rail the earlier moves set against moving ``pod`` now, if any."""
        return self._ledger.hold_reason(pod, now, self.settings, dry_run=self.dry_run)

    def forget(self, uid: str) -> None:
        """Drop the notes of a pod that no longer has a tolerance here."""
        self._retry_at.pop(uid, None)

    # ---- the move --------------------------------------------------------------------------

    def move(
        self, pod: PodInfo, why: str, result: CycleResult, now: float, trace_id: str = ""
    ) -> RebalanceAction:
        """Evict ``pod`` towards the node ``result`` found (or ask, in a dry run)."""
        dry_run = self.dry_run
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
        if not dry_run:
            self.outcomes.moved(controller.uid, now)
        outcome = WOULD_EVICT if dry_run else EVICTED
        departure: Departure | None = None
        if dry_run:
            message = (
                f"would evict (dry run): {why}; {target} passes every filter for it "
                f"(rebalancer mode enforce would move it)"
            )
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

    def record_held(self, pod: PodInfo, message: str, now: float) -> None:
        """The rebalancing record (``held``) of a victim an eviction would not move whole."""
        decision = Decision(pod.namespace, pod.name, HELD, "", message, now, self.dry_run)
        self._records.write(decision)

    def mark_unhelped(self, pod: PodInfo, found: Breach, lasted: float, now: float) -> None:
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

    def note_helped(self, pod: PodInfo, now: float) -> None:
        """The workload's latest move brought it back under its tolerance: journaled, so a
        later leader does not judge that move again (and mark it when a new neighbour
        comes)."""
        controller = pod.controller
        assert controller is not None  # only moved workloads are judged
        log.info("%s is back under its tolerance on %s: its move helped", pod.key, pod.node_name)
        self._journal_move(
            Moved(now, pod.node_name, pod.namespace, controller.uid, helped=True), None
        )

    # ---- the replacements' rooms -----------------------------------------------------------

    def settle(self, now: float) -> None:
        """Let go of the rooms whose replacement is placed or whose time is up."""
        if not len(self._reservations):
            return
        with self._cache.lock:
            placed = self._placed()
            done = self._reservations.settle(self._cache.holds, placed, now)
        for made, why in done:
            log.info("room on %s for a replacement of %s: %s", made.node, made.workload_uid, why)

    def _unreserve(self, pod: PodInfo) -> None:
        if pod.controller is not None:
            with self._cache.lock:
                self._reservations.release(self._cache.holds, pod.controller.uid)

    # ---- the journal and the records -------------------------------------------------------

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
                    self.outcomes.judged(moved.workload_uid, moved.at)
                elif not moved.dry_run:
                    self.outcomes.moved(moved.workload_uid, moved.at)
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
