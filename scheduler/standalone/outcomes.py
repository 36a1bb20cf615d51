"""What standalone mode does with each attempt's outcome: Events, conditions, API calls, records.

The scheduling loop (:mod:`scheduler.standalone.loop`) decides; :class:`AttemptOutcomes`
carries each outcome out, off the scheduling thread where it talks to the API server or
Redis (its two :class:`~scheduler.standalone.binder.Binder` pools: the binds and the
other writes, and the preemptions' calls apart from them). Every attempt produces a
decision record; Events and the ``PodScheduled`` condition follow kube-scheduler:

* bound → ``Normal Scheduled "Successfully assigned ns/pod to node"``;
* no node → ``Warning FailedScheduling`` with the cycle's message
  ("0/12 nodes are available: …"), ``PodScheduled=False/Unschedulable``, backoff;
* no node, but the PostFilter found one where evicting pods of lower priority makes room
  → as above, plus the room held there at once and, on a preemption thread (never a
  bind's), the preemptor's ``status.nominatedNodeName`` and the victims' eviction
  (:class:`~scheduler.cycle.ports.Preemptor`; the pod is not attempted again until those calls
  are done);
* the bind failed → ``Warning FailedScheduling "Binding rejected: …"``, backoff;
* a dry run → the decision record (result ``dry_run``) only, backoff;
* a pod asking for a field the cycle does not implement is refused like a pod that fits
  nowhere: ``Warning FailedScheduling`` naming the field, ``PodScheduled=False``, backoff;
* a pod of ours that does not parse → ``Warning FailedScheduling`` with the parse error
  and ``PodScheduled=False`` (once per version of the pod; a change parses it again).

A pod found a node only once the relax rule dropped the interference filters gets a
``Warning InterferenceRelaxed`` Event, and a pod with a warning a Warning Event per
warning, once per pod (an ``interference.io/`` key no program reads: ``UnknownAnnotation``,
naming the closest known key).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from interference.decision import CandidateVerdict, Decision, PreemptionRecord
from scheduler.api.events import ClusterEvent
from scheduler.api.objects import PodInfo, PodWarning
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.informed_objects import UnparseablePod
from scheduler.cycle.messages import relaxed_message, scheduled_message, unparseable_message
from scheduler.cycle.outcome import CycleResult
from scheduler.cycle.ports import (
    Cluster,
    ClusterError,
    DecisionSink,
    DecisionTracer,
    PodRef,
    Preemption,
    Preemptor,
)
from scheduler.cycle.preemption import PreemptionOutcome
from scheduler.cycle.queue import SchedulingQueue
from scheduler.cycle.relax import RelaxTracker
from scheduler.cycle.stage_trace import BIND, Attributes, StageRecorder
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.standalone.binder import Binder, BindOutcome, BindRequest, BindStatus

log = logging.getLogger(__name__)

_WARNED_PODS = 16384
"""Pods remembered as told about their deprecated annotations (the oldest forgotten)."""


@dataclass(frozen=True, slots=True)
class TracedBind:
    """A traced attempt whose bind is in flight."""

    recorder: StageRecorder
    started_ns: int
    decided_ns: int
    """When the attempt ended and the bind was handed over (the root span's end, the bind
    span's start)."""
    attributes: Attributes


class AttemptOutcomes:
    """Carries out the scheduling loop's outcomes; see the module docstring."""

    def __init__(
        self,
        cluster: Cluster,
        decisions: DecisionSink,
        queue: SchedulingQueue,
        cache: ClusterCache,
        leading: threading.Event,
        metrics: SchedulerMetrics,
        relax: RelaxTracker,
        tracer: DecisionTracer,
        clock: Callable[[], float],
        *,
        dry_run: bool,
        bind_workers: int,
        preemption_workers: int,
        preemptor: Preemptor | None = None,
    ) -> None:
        """``relax``: the cycle's relax memory (kept across reloads), which forgets a pod
        once it is bound or gone. ``preemptor``: acts on the PostFilter's preemptions;
        ``None``: standalone does not preempt."""
        self._cluster = cluster
        self._decisions = decisions
        self._queue = queue
        self._cache = cache
        self._leading = leading
        self._metrics = metrics
        self._relax = relax
        self._tracer = tracer
        self._clock = clock
        self._preemptor = preemptor
        self._dry_run = dry_run
        self._bind_workers = bind_workers
        self._preemption_workers = preemption_workers
        self._binder = Binder(cluster, leading, self._on_bind_outcome, metrics, bind_workers)
        self._preemptions = Binder(
            cluster, leading, self._on_bind_outcome, metrics, preemption_workers
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
        self._bind_traces: dict[str, TracedBind] = {}
        """Traced attempts whose bind is in flight: their trace is handed to the tracer,
        bind included, when the bind's outcome comes."""
        self._warned: OrderedDict[str, tuple[PodWarning, ...]] = OrderedDict()
        """Pods told about their :attr:`PodInfo.warnings`, with what they were told."""

    # ---- the writers -----------------------------------------------------------------

    def configure(self, dry_run: bool, bind_workers: int, preemption_workers: int) -> None:
        """Apply a reloaded configuration (the caller holds the cache lock: between two
        attempts)."""
        self._dry_run = dry_run
        if bind_workers != self._bind_workers:
            self._binder = self._replace_pool(self._binder, bind_workers)
            self._bind_workers = bind_workers
        if preemption_workers != self._preemption_workers:
            self._preemptions = self._replace_pool(self._preemptions, preemption_workers)
            self._preemption_workers = preemption_workers

    def _replace_pool(self, retired: Binder, workers: int) -> Binder:
        """A pool of ``workers`` threads in place of ``retired``, which finishes its queued
        work in the background (the reload does not wait for it)."""
        self._retired_binders.append(retired)
        threading.Thread(target=retired.close, name="binder-retire", daemon=True).start()
        return Binder(self._cluster, self._leading, self._on_bind_outcome, self._metrics, workers)

    def wait_for_room(self, max_in_flight: int, timeout_s: float) -> None:
        """Wait while ``max_in_flight`` binds and writes are queued or running."""
        self._binder.wait_for_room(max_in_flight, timeout_s)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every bind, Event, condition and decision write has finished."""
        deadline = time.monotonic() + timeout_s
        binders = [*self._retired_binders, self._binder, self._preemptions]
        return all(b.flush(max(0.0, deadline - time.monotonic())) for b in binders)

    def close_writers(self) -> None:
        """Finish queued writes and stop the writer threads."""
        self._binder.close()
        self._preemptions.close()

    def close(self) -> None:
        """:meth:`close_writers`, then hand the tracer the traces of binds that never
        reported (without a bind span)."""
        self.close_writers()
        with self._state_lock:
            unfinished, self._bind_traces = self._bind_traces, {}
        for t in unfinished.values():
            self._tracer.finish(t.recorder, "schedule", t.started_ns, t.attributes, t.decided_ns)

    # ---- each outcome ----------------------------------------------------------------

    def busy(self, key: str) -> bool:
        """Whether the pod's preemption calls have not finished yet."""
        with self._state_lock:
            return key in self._preempting_now

    def scheduled(
        self,
        pod: PodInfo,
        result: CycleResult,
        node: str,
        now: float,
        trace_id: str,
        traced: TracedBind | None,
    ) -> None:
        """Hand the bind of a pod assumed on ``node`` to a binder thread; its Event and
        decision record follow the bind's outcome."""
        key = pod.key
        if result.relaxed_after_s is not None:
            self._metrics.relaxed.inc()
            self._event(
                pod, "Warning", "InterferenceRelaxed", relaxed_message(result.relaxed_after_s)
            )
        message = scheduled_message(key, node)
        with self._state_lock:
            self._bind_decisions[key] = self._decision(
                pod, result, "scheduled", node, now, message, trace_id
            )
            if traced is not None:
                self._bind_traces[key] = traced
        self._binder.bind(BindRequest(_ref(pod), key, node))

    def dry_run_found(self, pod: PodInfo, result: CycleResult, now: float, trace_id: str) -> None:
        """A dry run found a node: the decision record only; the pod stays pending."""
        node = result.node or ""
        decision = self._decision(pod, result, "dry_run", node, now, trace_id=trace_id)
        self._write_decision(decision)
        self._queue.backoff(pod.key)  # stays pending: look again later, not in a hot loop

    def unschedulable(
        self,
        pod: PodInfo,
        result: CycleResult,
        now: float,
        trace_id: str,
        retry_on: Callable[[ClusterEvent], bool] | None,
        preempting: Callable[[], None] | None,
    ) -> None:
        """Backoff (until an event ``retry_on`` accepts), and the FailedScheduling Event, the
        decision record and ``PodScheduled=False`` off the scheduling thread; then the
        preemption's calls (:meth:`preempting`), if any, on a preemption thread."""
        self._queue.backoff(pod.key, retry_on)
        decision = self._decision(pod, result, "unschedulable", "", now, trace_id=trace_id)
        if self._dry_run:  # a dry run writes decision records only
            self._write_decision(decision)
        else:
            ref = _ref(pod)
            # the preemption's status patch carries the PodScheduled condition (kube's one
            # patch): one API call and one watch event fewer per preemptor
            condition = preempting is None

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
        if preempting is not None:
            self._preemptions.submit(preempting, "preemption")

    def preempting(self, pod: PodInfo, result: CycleResult) -> Callable[[], None] | None:
        """Act on the PostFilter's outcome (caller holds the cache lock): hold the room on
        the nominated node at once and return the API calls for a writer thread (the loop
        does not wait for the victims to go: kube-scheduler's asynchronous preemption), or
        clear a nomination that no longer helps. A dry run changes nothing."""
        outcome = result.preemption
        preemptor = self._preemptor
        if outcome is None or preemptor is None or self._dry_run:
            return None
        holds = self._cache.holds
        ref = _ref(pod)
        node = outcome.node
        if node is None:
            if outcome.clear_nomination and holds.release(pod.key) is not None:
                return lambda: _quietly(preemptor.nominate, ref, "", result.message)
            return None
        lower = [  # nominated pods (not other reservations) of lower priority there
            p
            for p in holds.on_node(node)
            if p.priority < pod.priority and self._cache.pending_pod(p.key) is not None
        ]
        for other in lower:  # they may no longer fit there; they look again
            holds.release(other.key)
            self._queue.requeue(other.key)
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
                self._queue.requeue(key)
            finally:
                with self._state_lock:
                    self._preempting_now.discard(key)

        return act

    def warn(self, pod: PodInfo) -> None:
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

    def unparseable(self, broken: UnparseablePod) -> None:
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
            dry_run=self._dry_run,
        )
        if self._dry_run:
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

    def forget(self, key: str) -> None:
        """Drop the notes of a pod that is bound or gone."""
        self._relax.forget(key)
        with self._state_lock:
            self._warned.pop(key, None)

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
            self._queue.remove(key)
            self.forget(key)
            binder.write_now(
                lambda: self._cluster.record_event(
                    request.pod, "Normal", "Scheduled", scheduled_message(key, request.node)
                ),
                "event",
            )
            if decision is not None:
                binder.write_now(lambda: self._decisions.write(decision), "decision")
            return
        pending = self._cache.forget(key)
        if outcome.status is BindStatus.DROPPED:
            log.info("dropped bind of %s to %s: %s", key, request.node, outcome.error)
            if pending is None:
                self._queue.remove(key)
            else:
                self._queue.requeue(key)
            return
        log.warning("binding %s to %s failed: %s", key, request.node, outcome.error)
        if outcome.status is BindStatus.CONFLICT or pending is None:
            self._queue.remove(key)
            self.forget(key)
        else:
            self._queue.backoff(key)
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
            dry_run=self._dry_run,
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
