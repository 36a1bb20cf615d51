"""The scheduling loop: queue → scheduling cycle → assume → bind, with Events and records.

One scheduling thread pops a pending pod, runs it through the
:class:`~scheduler.cycle.cycle.SchedulingCycle` over every node and, when it finds one, assumes
the pod in the cache and hands the bind to the :class:`~scheduler.standalone.binder.Binder`
(another thread). Every attempt produces a decision record; Events and the
``PodScheduled`` condition follow kube-scheduler:

* bound → ``Normal Scheduled "Successfully assigned ns/pod to node"``;
* no node → ``Warning FailedScheduling`` with the cycle's message
  ("0/12 nodes are available: …"), ``PodScheduled=False/Unschedulable``, backoff;
* no node, but the PostFilter found one where evicting pods of lower priority makes room
  → as above, plus the room held there at once and, on a preemption thread (never a
  bind's), the preemptor's ``status.nominatedNodeName`` and the victims' eviction
  (:class:`~scheduler.cycle.ports.Preemptor`; the pod is not attempted again until those calls
  are done);
* the bind failed → ``Warning FailedScheduling "Binding rejected: …"``, backoff;
* a pod asking for a field the cycle does not implement is refused like a pod that fits
  nowhere: ``Warning FailedScheduling`` naming the field, ``PodScheduled=False``, backoff;
* a pod of ours that does not parse → ``Warning FailedScheduling`` with the parse error
  and ``PodScheduled=False`` (once per version of the pod; a change parses it again).

The cycle applies the relax rule (a pod blocked only by interference filters for
``relax_after_s`` is judged without them; when that finds a node a ``Warning
InterferenceRelaxed`` Event says so) and the interference-blind fallback while signals are
unreadable (attempts counted in
``interference_scheduler_interference_blind_attempts_total``). An unschedulable pod goes
back to the queue with the events that may make it fit (those the plugins that rejected
it registered for). A pod with an ``interference.io/`` key no program reads gets a
``Warning UnknownAnnotation`` Event naming the closest known key, once per pod.

Leadership: the loop schedules and binds only while ``leading`` is set; when it is
cleared, binds not yet sent are dropped and their pods requeued (see the binder).

Size: over 500 lines: each outcome of an attempt (bound, unschedulable, preempting, bind
failed, dry run, unparseable) has its Events, condition, API calls and record here, next
to each other.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from interference.decision import CandidateVerdict, Decision, PreemptionRecord
from scheduler.api.objects import PodInfo, PodWarning
from scheduler.cycle.cache import ClusterCache, UnparseablePod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.messages import relaxed_message, scheduled_message, unparseable_message
from scheduler.cycle.nominated import TableRoom
from scheduler.cycle.outcome import CycleResult
from scheduler.cycle.ports import (
    Cluster,
    ClusterError,
    DecisionSink,
    DecisionTracer,
    NoTracer,
    PodRef,
    Preemption,
    Preemptor,
    SignalSource,
)
from scheduler.cycle.preemption import PreemptionInputs, PreemptionOutcome
from scheduler.cycle.queue import QueueState, SchedulingQueue
from scheduler.cycle.settings import CycleSettings
from scheduler.cycle.signal_gate import SignalGate
from scheduler.cycle.stage_trace import BIND, Attributes, StageRecorder
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.signals.table import NodeTable
from scheduler.standalone.binder import Binder, BindOutcome, BindRequest, BindStatus
from scheduler.standalone.reload_baseline import ReloadBaseline

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER_NAME = "interference-scheduler"
_PRUNE_EVERY = 4096
"""Attempts between sweeps of per-pod notes (also swept whenever the queue runs dry)."""
_WARNED_PODS = 16384
"""Pods remembered as told about their deprecated annotations (the oldest forgotten)."""


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
        self._decisions = decisions
        self._leading = leading
        self._metrics = metrics
        self._clock = clock
        self._monotonic = monotonic
        self._seed = seed
        self._tracer: DecisionTracer = tracer or NoTracer()
        self._bind_traces: dict[str, _TracedBind] = {}
        """Traced attempts whose bind is in flight: their trace is handed to the tracer,
        bind included, when the bind's outcome comes."""
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
        self._binder = Binder(
            cluster, leading, self._on_bind_outcome, metrics, loop_settings.bind_workers
        )
        self._preemptions = Binder(
            cluster, leading, self._on_bind_outcome, metrics, loop_settings.preemption_workers
        )
        """Preemptions' API calls: their own threads, so binds never queue behind them."""
        self._retired_binders: list[Binder] = []
        """Pools replaced by a reload; they finish their queued work in the background."""
        self._state_lock = threading.Lock()
        self._preempting_now: set[str] = set()
        """Pods whose preemption calls have not finished: not attempted meanwhile (kube's
        PreEnqueue while preempting), so a slow writer never gets the same victims twice."""
        self._bind_decisions: dict[str, Decision] = {}
        """Decision of each bind in flight, written once the bind's outcome is known."""
        self._warned: OrderedDict[str, tuple[PodWarning, ...]] = OrderedDict()
        """Pods told about their :attr:`PodInfo.warnings`, with what they were told."""
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
            if old.bind_workers != loop_settings.bind_workers:
                self._binder = self._replace_pool(self._binder, loop_settings.bind_workers)
            if old.preemption_workers != loop_settings.preemption_workers:
                self._preemptions = self._replace_pool(
                    self._preemptions, loop_settings.preemption_workers
                )
        log.info("scheduler settings updated")

    def _replace_pool(self, retired: Binder, workers: int) -> Binder:
        """A pool of ``workers`` threads in place of ``retired``, which finishes its queued
        work in the background (the reload does not wait for it)."""
        self._retired_binders.append(retired)
        threading.Thread(target=retired.close, name="binder-retire", daemon=True).start()
        return Binder(self._cluster, self._leading, self._on_bind_outcome, self._metrics, workers)

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
                    self._binder.wait_for_room(
                        self._loop_settings.max_writes_in_flight, self._loop_settings.idle_wait_s
                    )
                if not self._leading.is_set() or not self.cache.synced():
                    stop.wait(0.1)
        finally:
            self._binder.close()
            self._preemptions.close()
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
            self._report_unparseable(broken)
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
        deadline = time.monotonic() + timeout_s
        binders = [*self._retired_binders, self._binder, self._preemptions]
        return all(b.flush(max(0.0, deadline - time.monotonic())) for b in binders)

    def close(self) -> None:
        """Finish queued writes and stop the binder threads (after :meth:`run` returned
        or when driving the loop by hand)."""
        self._binder.close()
        self._preemptions.close()
        with self._state_lock:
            unfinished, self._bind_traces = self._bind_traces, {}
        for t in unfinished.values():  # a bind that never reported: no bind span
            self._tracer.finish(t.recorder, "schedule", t.started_ns, t.attributes, t.decided_ns)

    # ---- one attempt -----------------------------------------------------------------

    def schedule(self, key: str) -> None:
        """One scheduling attempt for a popped pod."""
        started = time.perf_counter()
        pod = self.cache.pending_pod(key)
        if pod is None:  # bound, deleted or no longer ours since it was queued
            self.queue.remove(key)
            self._forget_pod_state(key)
            return
        if not self._leading.is_set():
            self.queue.requeue(key)
            return
        with self._state_lock:
            busy = key in self._preempting_now
        if busy:  # its victims' deletion (or a failure) brings it back
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
                preempting = None if node is not None else self._preempting(pod, result)
        except Exception:
            log.exception("scheduling %s failed; retrying with backoff", key)
            self._metrics.attempts.labels("error").inc()
            self.queue.backoff(key)
            return
        if pod.warnings and not settings.dry_run:
            self._warn(pod)
        if result.node is None:
            outcome = "unschedulable"
            # the preemption's status patch carries the PodScheduled condition (kube's one
            # patch): one API call and one watch event fewer per preemptor
            self._unschedulable(pod, result, now, trace_id, condition=preempting is None)
            if preempting is not None:
                self._preemptions.submit(preempting, "preemption")
        elif settings.dry_run:
            outcome = "dry_run"
            decision = self._decision(pod, result, "dry_run", result.node, now, trace_id=trace_id)
            self._write_decision(decision)
            self.queue.backoff(key)  # stays pending: look again later, not in a hot loop
        else:
            outcome = "scheduled"
            if result.relaxed_after_s is not None:
                self._metrics.relaxed.inc()
                self._event(
                    pod, "Warning", "InterferenceRelaxed", relaxed_message(result.relaxed_after_s)
                )
            message = scheduled_message(key, result.node)
            traced = None
            if recorder is not None:
                attributes = self._trace_attributes(pod, outcome, result)
                traced = _TracedBind(recorder, started_ns, time.time_ns(), attributes)
            with self._state_lock:
                self._bind_decisions[key] = self._decision(
                    pod, result, "scheduled", result.node, now, message, trace_id
                )
                if traced is not None:
                    self._bind_traces[key] = traced
            self._binder.bind(BindRequest(_ref(pod), key, result.node))
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

    def _preempting(self, pod: PodInfo, result: CycleResult) -> Callable[[], None] | None:
        """Act on the PostFilter's outcome (caller holds the cache lock): hold the room on
        the nominated node at once and return the API calls for a writer thread (the loop
        does not wait for the victims to go: kube-scheduler's asynchronous preemption), or
        clear a nomination that no longer helps. A dry run changes nothing."""
        outcome = result.preemption
        preemptor = self._preemptor
        if outcome is None or preemptor is None or self._loop_settings.dry_run:
            return None
        holds = self.cache.holds
        ref = _ref(pod)
        node = outcome.node
        if node is None:
            if outcome.clear_nomination and holds.release(pod.key) is not None:
                return lambda: _quietly(preemptor.nominate, ref, "", result.message)
            return None
        lower = [  # nominated pods (not other reservations) of lower priority there
            p
            for p in holds.on_node(node)
            if p.priority < pod.priority and self.cache.pending_pod(p.key) is not None
        ]
        for other in lower:  # they may no longer fit there; they look again
            holds.release(other.key)
            self.queue.requeue(other.key)
        holds.hold(pod, node)
        preemption = Preemption(
            ref,
            pod.scheduler_name,
            node,
            tuple(_ref(v) for v in outcome.victims if not v.terminating),
            tuple(_ref(p) for p in lower),
        )
        self._metrics.preemptions.labels(_preemption_kind(outcome)).inc()
        key = pod.key

        with self._state_lock:
            self._preempting_now.add(key)

        def act() -> None:
            try:
                preemptor.nominate(ref, node, result.message)
                preemptor.preempt(preemption)
            except ClusterError as exc:
                log.warning("preempting for %s on %s failed; retrying: %s", key, node, exc)
                self.queue.requeue(key)
            finally:
                with self._state_lock:
                    self._preempting_now.discard(key)

        return act

    def _warn(self, pod: PodInfo) -> None:
        """A Warning Event per warning (``UnknownAnnotation``, ``InvalidAnnotation``), once
        per pod."""
        with self._state_lock:
            if self._warned.get(pod.key) == pod.warnings:
                return
            self._warned[pod.key] = pod.warnings
            while len(self._warned) > _WARNED_PODS:
                self._warned.popitem(last=False)
        for warning in pod.warnings:
            self._event(pod, "Warning", warning.reason, warning.message)

    def _report_unparseable(self, broken: UnparseablePod) -> None:
        """A pod that does not parse stays Pending with the parse error for its owner to
        read; the decision record says the same (a dry run writes only that)."""
        message = unparseable_message(broken.error)
        ref = broken.ref
        self._metrics.attempts.labels("unparseable").inc()
        decision = Decision(
            ref.namespace,
            ref.name,
            "unschedulable",
            "",
            message,
            self._clock(),
            dry_run=self._loop_settings.dry_run,
        )
        if self._loop_settings.dry_run:
            self._write_decision(decision)
            return

        def report() -> None:
            binder = self._binder
            binder.write_now(
                lambda: self._cluster.record_event(ref, "Warning", "FailedScheduling", message),
                "event",
            )
            binder.write_now(lambda: self._cluster.set_unschedulable(ref, message), "condition")
            binder.write_now(lambda: self._decisions.write(decision), "decision")

        self._binder.submit(report, "report")

    def _unschedulable(
        self, pod: PodInfo, result: CycleResult, now: float, trace_id: str, condition: bool = True
    ) -> None:
        """Backoff, and the FailedScheduling Event, the decision record and (``condition``)
        ``PodScheduled=False`` off the scheduling thread."""
        self.queue.backoff(pod.key, self._cycle.profile.retry_on(pod, result.rejected_by))
        decision = self._decision(pod, result, "unschedulable", "", now, trace_id=trace_id)
        if self._loop_settings.dry_run:  # a dry run writes decision records only
            self._write_decision(decision)
            return
        ref = _ref(pod)

        def report() -> None:  # one task: the writes share a binder thread
            binder = self._binder
            binder.write_now(
                lambda: self._cluster.record_event(
                    ref, "Warning", "FailedScheduling", result.message
                ),
                "event",
            )
            if condition:
                binder.write_now(
                    lambda: self._cluster.set_unschedulable(ref, result.message), "condition"
                )
            binder.write_now(lambda: self._decisions.write(decision), "decision")

        self._binder.submit(report, "report")

    # ---- bind outcomes (binder threads) ------------------------------------------------

    def _on_bind_outcome(self, outcome: BindOutcome) -> None:
        """Runs on the binder thread that did the bind; its writes stay on that thread."""
        request = outcome.request
        key = request.key
        binder = self._binder
        with self._state_lock:
            decision = self._bind_decisions.pop(key, None)
            traced = self._bind_traces.pop(key, None)
        if traced is not None:
            attributes: Attributes = {"node": request.node, "status": outcome.status.value}
            if outcome.error:
                attributes["error"] = str(outcome.error)
            recorder = traced.recorder
            recorder.note("Bind", BIND, traced.decided_ns, attributes)
            self._tracer.finish(
                recorder, "schedule", traced.started_ns, traced.attributes, traced.decided_ns
            )
        if outcome.status is BindStatus.BOUND:
            self.queue.remove(key)
            self._forget_pod_state(key)
            binder.write_now(
                lambda: self._cluster.record_event(
                    request.pod, "Normal", "Scheduled", scheduled_message(key, request.node)
                ),
                "event",
            )
            if decision is not None:
                binder.write_now(lambda: self._decisions.write(decision), "decision")
            return
        pending = self.cache.forget(key)
        if outcome.status is BindStatus.DROPPED:
            log.info("dropped bind of %s to %s: %s", key, request.node, outcome.error)
            if pending is None:
                self.queue.remove(key)
            else:
                self.queue.requeue(key)
            return
        log.warning("binding %s to %s failed: %s", key, request.node, outcome.error)
        if outcome.status is BindStatus.CONFLICT or pending is None:
            self.queue.remove(key)
            self._forget_pod_state(key)
        else:
            self.queue.backoff(key)
            binder.write_now(
                lambda: self._cluster.record_event(
                    request.pod, "Warning", "FailedScheduling", f"Binding rejected: {outcome.error}"
                ),
                "event",
            )
        if decision is not None:
            failed = dataclasses.replace(
                decision,
                result="bind_failed",
                message=f"binding to {request.node} failed: {outcome.error}",
                ts=self._clock(),
            )
            binder.write_now(lambda: self._decisions.write(failed), "decision")

    # ---- helpers ---------------------------------------------------------------------

    def _decision(
        self,
        pod: PodInfo,
        result: CycleResult,
        outcome: str,
        node: str,
        now: float,
        message: str | None = None,
        trace_id: str = "",
    ) -> Decision:
        candidates: list[CandidateVerdict] = list(result.candidates)
        return Decision(
            namespace=pod.namespace,
            pod=pod.name,
            result=outcome,
            node=node,
            message=result.message if message is None else message,
            ts=now,
            dry_run=self._loop_settings.dry_run,
            candidates=candidates,
            rejected_by_reason=dict(result.reason_counts),
            funnel=list(result.funnel),
            omitted=dict(result.omitted),
            trace_id=trace_id,
            preemption=_preemption_record(result.preemption),
            runq=result.runq,
            interference_index=result.interference_index,
        )

    def _write_decision(self, decision: Decision) -> None:
        self._binder.submit(lambda: self._decisions.write(decision), "decision")

    def _event(self, pod: PodInfo, event_type: str, reason: str, message: str) -> None:
        ref = _ref(pod)
        self._binder.submit(
            lambda: self._cluster.record_event(ref, event_type, reason, message), "event"
        )

    def _forget_pod_state(self, key: str) -> None:
        self._cycle.relax.forget(key)
        with self._state_lock:
            self._warned.pop(key, None)

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


def _ref(pod: PodInfo) -> PodRef:
    return PodRef(pod.namespace, pod.name, pod.uid)


def _quietly(
    call: Callable[[PodRef, str, str], None], ref: PodRef, node: str, unschedulable: str
) -> None:
    try:
        call(ref, node, unschedulable)
    except ClusterError as exc:
        log.warning("clearing the nomination of %s/%s failed: %s", ref.namespace, ref.name, exc)


def _preemption_record(outcome: PreemptionOutcome | None) -> PreemptionRecord | None:
    """The decision record's account of a preemption (none when nothing was preempted)."""
    if outcome is None or outcome.node is None:
        return None
    return PreemptionRecord(
        outcome.node,
        [v.key for v in outcome.victims],
        outcome.why,
        len(outcome.found),
        outcome.pdb_violations,
        list(outcome.antagonists),
    )


def _preemption_kind(outcome: PreemptionOutcome) -> str:
    """The metric's label: ``antagonists`` when the opt-in rule named any victim."""
    return "antagonists" if outcome.antagonists else "priority"


@dataclass(frozen=True, slots=True)
class _TracedBind:
    """A traced attempt whose bind is in flight."""

    recorder: StageRecorder
    started_ns: int
    decided_ns: int
    """When the attempt ended and the bind was handed over (the root span's end, the bind
    span's start)."""
    attributes: Attributes
