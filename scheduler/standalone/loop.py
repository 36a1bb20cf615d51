"""The scheduling loop: queue → scheduling cycle → assume → bind.

One scheduling thread pops a pending pod, runs it through the
:class:`~scheduler.cycle.cycle.SchedulingCycle` over every node and, when it finds one, assumes
the pod in the cache and hands the bind to the :class:`~scheduler.standalone.binder.Binder`
(another thread). What each outcome of an attempt brings (Events, the ``PodScheduled``
condition, the preemption's API calls, the decision record) is
:class:`~scheduler.standalone.outcomes.AttemptOutcomes`' to carry out.

The cycle applies the relax rule (a pod blocked only by interference filters for
``relax_after_s`` is judged without them) and the interference-blind fallback while signals are
unreadable (attempts counted in
``interference_scheduler_interference_blind_attempts_total``). An unschedulable pod goes
back to the queue with the events that may make it fit (those the plugins that rejected
it registered for); with a preemptor, the cycle's PostFilter may find it a node where
evicting pods of lower priority makes room.

Leadership: the loop schedules and binds only while ``leading`` is set; when it is
cleared, binds not yet sent are dropped and their pods requeued (see the binder).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from scheduler.api.objects import PodInfo
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.nominated import TableRoom
from scheduler.cycle.outcome import CycleResult
from scheduler.cycle.ports import (
    Cluster,
    DecisionSink,
    DecisionTracer,
    NoTracer,
    Preemptor,
    SignalSource,
)
from scheduler.cycle.preemption import PreemptionInputs
from scheduler.cycle.queue import QueueState, SchedulingQueue
from scheduler.cycle.settings import CycleSettings
from scheduler.cycle.signal_gate import SignalGate
from scheduler.cycle.stage_trace import Attributes, StageRecorder
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.signals.table import NodeTable
from scheduler.standalone.outcomes import AttemptOutcomes, TracedBind
from scheduler.standalone.reload_baseline import ReloadBaseline

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER_NAME = "interference-scheduler"
_PRUNE_EVERY = 4096
"""Attempts between sweeps of per-pod notes (also swept whenever the queue runs dry)."""


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """How the scheduling loop runs (the cycle's own settings are separate)."""

    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    """Pods with this ``spec.schedulerName`` are ours; every other pod is left alone."""
    dry_run: bool = False
    """Record decisions (result ``dry_run``) but assume and bind nothing."""
    ignore_namespaces: tuple[str, ...] = ()
    """Pending pods in these namespaces are never scheduled (their running pods still
    count on their nodes)."""
    bind_workers: int = 16
    """Threads that POST Bindings, Events and conditions in parallel."""
    preemption_workers: int = 4
    """Threads that nominate preemptors and evict their victims, apart from the binds':
    a preemption waits for its victims to go (seconds), and a bind never waits behind it."""
    max_writes_in_flight: int = 64
    """Binds and other writes queued or running before the scheduling thread waits for
    them: bounds the backlog (and what a lost lease drops) when the API server is slower
    than decisions, and leaves the interpreter lock to the writers meanwhile."""
    idle_wait_s: float = 1.0
    """Longest sleep when no pod is ready (new pods and backoff expiry wake it sooner)."""
    stale_gauge_interval_s: float = 1.0
    """How often the stale-node gauge is recomputed (it walks every node)."""
    wedged_after_s: float = 60.0
    """``/healthz`` fails when the scheduling thread has not come round for this long
    (it comes round at least every ``idle_wait_s``; a relist of a large cluster can hold
    it for seconds, so keep a wide margin)."""

    def __post_init__(self) -> None:
        if not self.scheduler_name:
            raise ValueError("scheduler_name: must not be empty, e.g. interference-scheduler")
        for name in ("bind_workers", "preemption_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be an integer ≥ 1")
        if self.max_writes_in_flight < 1:
            raise ValueError(
                f"max_writes_in_flight: {self.max_writes_in_flight!r} must be an integer ≥ 1,"
                " e.g. 64"
            )
        for name in ("idle_wait_s", "stale_gauge_interval_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name}: {value!r} must be a number > 0")
        if not self.wedged_after_s > self.idle_wait_s:
            raise ValueError(
                f"wedged_after_s: {self.wedged_after_s!r} must be a number of seconds above"
                f" idle_wait_s ({self.idle_wait_s!r}), e.g. 60"
            )


class SchedulingLoop:
    """Schedules the pods of one scheduler name over one cluster."""

    def __init__(
        self,
        cluster: Cluster,
        signals: SignalSource,
        decisions: DecisionSink,
        cycle_settings: CycleSettings,
        loop_settings: LoopSettings,
        leading: threading.Event,
        metrics: SchedulerMetrics,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        seed: int | None = None,
        tracer: DecisionTracer | None = None,
        preemptor: Preemptor | None = None,
        antagonists: Callable[[Sequence[str]], Mapping[str, Collection[str]]] | None = None,
        on_attempt: Callable[[str, bool, bool], None] | None = None,
    ) -> None:
        """``on_attempt(pod key, found a node, Pending anyway)`` is told each attempt's
        outcome (the Pending-rate guard of a reload, scheduler.entry.reload_guard; Pending anyway:
        no node, and none under the last good configuration either, :attr:`baseline`)."""
        self._cluster = cluster
        self._preemptor = preemptor
        """Acts on the PostFilter's preemptions; ``None``: standalone does not preempt."""
        self._antagonists = antagonists
        """Nodes → the antagonists the agents name there (``cycle.preemption.
        preempt_antagonists``; scheduler.cycle.preemption.antagonists_in)."""
        self._on_attempt = on_attempt
        self._leading = leading
        self._metrics = metrics
        self._clock = clock
        self._monotonic = monotonic
        self._seed = seed
        self._tracer: DecisionTracer = tracer or NoTracer()
        self._cycle_settings = cycle_settings
        self._loop_settings = loop_settings
        self._cycle = SchedulingCycle(cycle_settings, seed=seed)
        self._signal_gate = SignalGate(signals, metrics, "scheduling")
        self.baseline = ReloadBaseline(seed)
        """The last good configuration, while a reload is judged."""
        self.queue = SchedulingQueue(clock=monotonic)
        self.cache = ClusterCache(
            NodeTable(),
            self.queue,
            metrics,
            loop_settings.scheduler_name,
            loop_settings.ignore_namespaces,
            clock=clock,
        )
        self._cycle.register_lookups(self.cache.table)
        self._room = TableRoom(self.cache.table)
        """The held room, kept placed on the table between decisions (scheduler.cycle.nominated)."""
        self._outcomes = AttemptOutcomes(
            cluster,
            decisions,
            self.queue,
            self.cache,
            leading,
            metrics,
            self._cycle.relax,
            self._tracer,
            clock,
            dry_run=loop_settings.dry_run,
            bind_workers=loop_settings.bind_workers,
            preemption_workers=loop_settings.preemption_workers,
            preemptor=preemptor,
        )
        self._attempts_since_prune = 0
        self.last_cycle_at = monotonic()
        """Monotonic time the scheduling thread last went round (for ``/healthz``: a loop
        that is alive comes back at least every ``idle_wait_s``)."""
        self._stale_gauge_at = -float("inf")

    # ---- settings --------------------------------------------------------------------

    @property
    def cycle_settings(self) -> CycleSettings:
        return self._cycle_settings

    @property
    def loop_settings(self) -> LoopSettings:
        return self._loop_settings

    def update_settings(self, cycle_settings: CycleSettings, loop_settings: LoopSettings) -> None:
        """Apply a reloaded configuration without restarting.

        The swap happens under the cache lock, i.e. between two scheduling attempts.
        """
        with self.cache.lock:
            if cycle_settings != self._cycle_settings:
                relax = self._cycle.relax  # pods keep their waiting time across a reload
                self._cycle = SchedulingCycle(cycle_settings, seed=self._seed)
                self._cycle.relax = relax
                self._cycle.register_lookups(self.cache.table)
                self._cycle_settings = cycle_settings
            old = self._loop_settings
            self._loop_settings = loop_settings
            if (old.scheduler_name, old.ignore_namespaces) != (
                loop_settings.scheduler_name,
                loop_settings.ignore_namespaces,
            ):
                self.cache.configure(loop_settings.scheduler_name, loop_settings.ignore_namespaces)
            self._outcomes.configure(
                loop_settings.dry_run, loop_settings.bind_workers, loop_settings.preemption_workers
            )
        log.info("scheduler settings updated")

    # ---- running ---------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run the informers and the scheduling loop until ``stop`` is set."""
        informer = threading.Thread(
            target=self._cluster.run_informers,
            args=(self.cache, stop),
            name="informers",
            daemon=True,
        )
        informer.start()
        try:
            while not stop.is_set():
                if self.run_once(wait=True):
                    # Hand the interpreter lock to binder threads waiting on it now; else
                    # each waits out a forced switch (5 ms) and binds fall behind
                    # decisions (end to end 690 → 756 pods/s median, bench/).
                    time.sleep(0)
                    self._outcomes.wait_for_room(
                        self._loop_settings.max_writes_in_flight, self._loop_settings.idle_wait_s
                    )
                if not self._leading.is_set() or not self.cache.synced():
                    stop.wait(0.1)
        finally:
            self._outcomes.close_writers()
            informer.join(timeout=5.0)

    def run_once(self, wait: bool = False) -> bool:
        """Schedule the next ready pod; with ``wait``, sleep briefly when there is none.

        Returns True when a pod was attempted.
        """
        self.last_cycle_at = self._monotonic()
        leading = self._leading.is_set()
        self._metrics.leader.set(1 if leading else 0)
        if not leading or not self.cache.synced():
            return False
        for broken in self.cache.take_unparseable():
            self._outcomes.unparseable(broken)
        key = self.queue.pop()
        if key is None:
            self._update_queue_gauges()
            self._prune_pod_state()
            if wait:
                self.queue.wait(self._loop_settings.idle_wait_s)
            return False
        self.schedule(key)
        self._attempts_since_prune += 1
        if self._attempts_since_prune >= _PRUNE_EVERY:
            self._prune_pod_state()
        return True

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every bind, Event, condition and decision write has finished."""
        return self._outcomes.flush(timeout_s)

    def close(self) -> None:
        """Finish queued writes and stop the binder threads (after :meth:`run` returned
        or when driving the loop by hand)."""
        self._outcomes.close()

    # ---- one attempt -----------------------------------------------------------------

    def schedule(self, key: str) -> None:
        """One scheduling attempt for a popped pod."""
        started = time.perf_counter()
        pod = self.cache.pending_pod(key)
        if pod is None:  # bound, deleted or no longer ours since it was queued
            self.queue.remove(key)
            self._outcomes.forget(key)
            return
        if not self._leading.is_set():
            self.queue.requeue(key)
            return
        if self._outcomes.busy(key):  # its victims' deletion (or a failure) brings it back
            self.queue.backoff(key)
            return
        settings = self._loop_settings
        recorder = self._tracer.start()
        started_ns = time.time_ns() if recorder is not None else 0
        trace_id = "" if recorder is None else recorder.trace_hex
        try:
            with self.cache.lock:
                now = self._clock()
                result, anyway = self._decide(pod, now, recorder)
                node = result.node
                if node is not None and not settings.dry_run:
                    self.cache.assume(pod, node)
                preempting = None if node is not None else self._outcomes.preempting(pod, result)
        except Exception:
            log.exception("scheduling %s failed; retrying with backoff", key)
            self._metrics.attempts.labels("error").inc()
            self.queue.backoff(key)
            return
        if pod.warnings and not settings.dry_run:
            self._outcomes.warn(pod)
        if result.node is None:
            outcome = "unschedulable"
            retry_on = self._cycle.profile.retry_on(pod, result.rejected_by)
            self._outcomes.unschedulable(pod, result, now, trace_id, retry_on, preempting)
        elif settings.dry_run:
            outcome = "dry_run"
            self._outcomes.dry_run_found(pod, result, now, trace_id)
        else:
            outcome = "scheduled"
            traced = None
            if recorder is not None:
                attributes = self._trace_attributes(pod, outcome, result)
                traced = TracedBind(recorder, started_ns, time.time_ns(), attributes)
            self._outcomes.scheduled(pod, result, result.node, now, trace_id, traced)
        if recorder is not None and outcome != "scheduled":
            attributes = self._trace_attributes(pod, outcome, result)
            self._tracer.finish(recorder, "schedule", started_ns, attributes)
        if self._on_attempt is not None:
            self._on_attempt(key, result.node is not None, anyway)
        self._metrics.attempts.labels(outcome).inc()
        self._metrics.attempt_duration.labels(outcome).observe(time.perf_counter() - started)
        self._update_queue_gauges()

    def _trace_attributes(self, pod: PodInfo, outcome: str, result: CycleResult) -> Attributes:
        """The attempt's root span attributes."""
        return {
            "k8s.namespace.name": pod.namespace,
            "k8s.pod.name": pod.name,
            "mode": "standalone",
            "result": outcome,
            "node": result.node or "",
            "nodes": len(self.cache.table),
            "feasible": result.feasible,
            "interference_blind": result.blind,
        }

    def _decide(
        self, pod: PodInfo, now: float, recorder: StageRecorder | None
    ) -> tuple[CycleResult, bool]:
        """Run the cycle over every node (caller holds the cache lock); with it, for a pod
        it finds no node for, whether the last good configuration finds none either."""
        table = self.cache.table
        readable = self._signal_gate.readable(table)
        if readable:
            self._update_stale_gauge(now)
        result = self._cycle.schedule(
            pod,
            table,
            now,
            signals_readable=readable,
            recorder=recorder,
            preemption=self._preemption_inputs(),
        )
        return result, result.node is None and self.baseline.pending_anyway(
            pod, table, now, readable
        )

    def _preemption_inputs(self) -> PreemptionInputs | None:
        """What the cycle's PostFilter reads (caller holds the cache lock); ``None`` when
        this loop does not preempt."""
        if self._preemptor is None:
            return None
        cache = self.cache
        self._room.sync(cache.holds)
        return PreemptionInputs(
            holds=cache.holds,
            room=self._room,
            budgets=cache.disruption_budgets(),
            start_time=cache.start_time,
            preempted=cache.preempted,
            antagonists=self._antagonists,
        )

    # ---- helpers ---------------------------------------------------------------------

    def _prune_pod_state(self) -> None:
        """Drop the notes of pods that left the queue without an outcome (deleted while
        waiting), so they do not accumulate."""
        self._attempts_since_prune = 0
        self._cycle.relax.prune(lambda key: self.queue.state(key) is not None)

    def _update_stale_gauge(self, now: float) -> None:
        moment = self._monotonic()
        if moment - self._stale_gauge_at < self._loop_settings.stale_gauge_interval_s:
            return
        self._stale_gauge_at = moment
        table = self.cache.table
        stale = int((table.fresh_until < now).sum())  # stale, degraded or missing
        self._metrics.stale_nodes.set(stale)

    def _update_queue_gauges(self) -> None:
        counts = self.queue.counts()
        for state in (QueueState.ACTIVE, QueueState.BACKOFF):
            self._metrics.pending_pods.labels(state.value).set(counts[state])
