"""Extender mode's two verbs, ``filter`` and ``prioritize``, answered by the scheduling cycle.

In extender mode kube-scheduler (a second one, ``schedulerName: interference-scheduler``)
runs every one of its own plugins — volumes, topology spread, pod affinity, DRA,
preemption — and binds; it calls this extender for the nodes that passed them. The
extender runs the same scheduling cycle (:class:`scheduler.cycle.cycle.SchedulingCycle`) over
the offered nodes, from the same node table, informer cache, Redis signal cache and
decision records as standalone mode, and never binds. :class:`Extender` answers the two
verbs; the rest of the package: the wire protocol (requests, answers and the mapping of
scores to kube-scheduler's range) in :mod:`scheduler.extender.protocol`, the metrics in
:mod:`scheduler.extender.metrics`, which pods may have a decision record in
:mod:`scheduler.extender.decision_records`, the request bounds in
:mod:`scheduler.extender.bounds` and the pods' warning Events in
:mod:`scheduler.extender.pod_warnings`.

Filters: the cycle's profile (``cycle.profile``), in its order, less the plugins
marked not :attr:`~scheduler.plugins.base.FilterPlugin.in_extender` (PodTopologySpread,
InterPodAffinity, VolumeBinding: kube-scheduler's own plugins judge them, with volume
binding and preemption standalone lacks), the relaxable Interference filter last. So GPU
filtering (counts and GPU labels, derived from the agent's inventory when a node lacks
them) and interference tolerances hold as in standalone. kube-scheduler has already run
its own versions of NodeUnschedulable, TaintToleration, NodeAffinity, NodePorts and
NodeResourcesFit, so the answer is the intersection: never a node kube-scheduler refused.
Fields standalone mode refuses (:attr:`PodInfo.unsupported`) are left to kube-scheduler.
A rejection is ``FailedAndUnresolvableNodes`` when any of the node's reasons has the
status ``UnschedulableAndUnresolvable`` (:attr:`~scheduler.plugins.base.Filter.statuses`),
else ``FailedNodes`` (preemption may help).

Scores: the profile's score plugins and weights (``cycle.profile.scores``) less those
kube-scheduler scores itself (PodTopologySpread, NodeAffinity, InterPodAffinity), over the
plugins that run (the Interference quietness score only while signals are readable), their
weighted total mapped to kube-scheduler's extender range 0..10 by
:func:`~scheduler.extender.protocol.extender_scores` (the formula is in
:mod:`scheduler.extender.protocol`).

The cycle applies, as in standalone mode, the interference-blind fallback while signals
are unreadable and the relax rule: a pod whose every offered node is refused only by
interference filters for ``relax_after_s`` gets those filters dropped.

Decision records (``intf:decision:{ns}/{pod}``): ``result`` is ``filtered`` (the filter
verb's verdicts; some nodes passed), ``unschedulable`` (none passed) or ``prioritized``
(the scores of the nodes kube-scheduler asked about, the best first, with the rejected
nodes of the preceding filter call). ``node`` stays empty: kube-scheduler chooses and binds.
A record is written only for a pod the informers know, held a while for a pod our watch
has not delivered yet (:mod:`scheduler.extender.decision_records`,
:meth:`Extender.confirm_records`): a request about any other pod is answered and records
nothing.

A pod's warnings (an unknown ``interference.io/`` annotation, naming the closest known key;
a deprecated one) become Warning Events as in standalone mode, once per pod, written by a
thread of their own from a bounded queue (:mod:`scheduler.extender.pod_warnings`), only for pods the
informers know.

Served by :class:`scheduler.endpoint.http.ExtenderEndpoint` (HTTPS with client authentication, a
body limit and a bounded thread pool); the refusals are counted here. Before any
scheduling work a request is held to :mod:`scheduler.extender.bounds` (the Pod's lists,
its annotations' size, the number of node names): one over them is answered an error
(filter: ``Error``; prioritize: 400), counted (``refused{reason="too_complex"}``) and only
the first logged, so a repeated costly request neither stalls the other callers (the
filter runs under the cache lock) nor floods the log.

Size: about 570 lines, one class: the two verbs with their HTTP routes (parsing, refusals,
timing) and the filter verdict the prioritize call reuses; the protocol, the metrics and
the records are modules of their own, the rules are the scheduling cycle's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from interference.decision import (
    CandidateVerdict,
    Decision,
    FunnelStage,
    IndexRead,
    RunqCheck,
    runq_advice,
)
from scheduler.api.objects import PodInfo
from scheduler.api.reader import ObjectError
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.dry_run import unresolvable
from scheduler.cycle.messages import failed_scheduling_message
from scheduler.cycle.ports import DecisionSink, DecisionTracer, NoTracer, SignalSource
from scheduler.cycle.settings import CycleSettings
from scheduler.cycle.signal_gate import SignalGate
from scheduler.cycle.stage_trace import Attributes, StageRecorder
from scheduler.endpoint.http import PostRoute
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.extender.bounds import TOO_COMPLEX
from scheduler.extender.decision_records import DecisionRecords
from scheduler.extender.metrics import ExtenderMetrics
from scheduler.extender.pod_warnings import PodEvents, PodWarningEvents
from scheduler.extender.protocol import (
    FILTER_PATH,
    JSON,
    PRIORITIZE_PATH,
    ExtenderArgs,
    ExtenderRequestError,
    ExtenderRequestTooCostly,
    HostPriorities,
    extender_scores,
    node_name,
    parse_args,
    read_extender_pod,
)
from scheduler.signals.table import NodeTable

log = logging.getLogger(__name__)

UNKNOWN_NODE = "node(s) not yet in interference-scheduler's node cache"
NOT_SYNCED = "interference-scheduler is still listing nodes and pods; retry shortly"
REMEMBERED_FILTER_CALLS = 4096
"""Filter verdicts kept for the decision record of the following prioritize call."""
REMEMBERED_PODS = 1024
"""Parsed pods kept by UID and resourceVersion: prioritize (and a retry) sends the pod
filter just read."""


@dataclass(frozen=True, slots=True)
class FilterVerdict:
    """The filter verb's verdict per offered node."""

    passed: tuple[str, ...]
    failed: dict[str, str]
    """Name → reason, where preemption may help."""
    unresolvable: dict[str, str]
    """Name → reason, where preemption cannot help."""
    reason_counts: dict[str, int]
    rejected: list[CandidateVerdict]
    passed_rows: NDArray[np.intp]
    """The table rows of ``passed``, valid while the table's ``generation`` (which every
    node added or removed bumps) is ``generation``."""
    generation: int
    relaxed: bool = False
    funnel: tuple[FunnelStage, ...] = ()
    runq: RunqCheck | None = None
    """The pod's run-queue tolerance as compared on the nodes the record keeps."""
    interference_index: IndexRead | None = None
    """The index the Interference plugin read on the nodes the record keeps."""


class Extender:
    """Answers filter and prioritize calls from the cluster cache and the signal cache."""

    def __init__(
        self,
        cache: ClusterCache,
        signals: SignalSource,
        decisions: DecisionSink,
        settings: CycleSettings,
        metrics: SchedulerMetrics,
        extender_metrics: ExtenderMetrics,
        *,
        clock: Callable[[], float] = time.time,
        tracer: DecisionTracer | None = None,
        events: PodEvents | None = None,
    ) -> None:
        """``events``: where the pods' warning Events go (none written without it)."""
        self._cache = cache
        self._settings = settings
        self._cycle = SchedulingCycle(settings, extender=True)
        self._cycle.register_lookups(cache.table)
        self._signal_gate = SignalGate(signals, metrics, "answering")
        self._metrics = metrics
        self._extender_metrics = extender_metrics
        self._clock = clock
        self._tracer: DecisionTracer = tracer or NoTracer()
        self._lock = threading.Lock()
        self._filtered: OrderedDict[str, FilterVerdict] = OrderedDict()
        """Pod key → its latest filter verdict (for the prioritize call's record)."""
        self._pods: OrderedDict[tuple[str, str], PodInfo] = OrderedDict()
        self._refused_costly = False
        """Whether a request over the bounds was refused (and logged) yet."""
        self._logged_bad_request = False
        """Whether a malformed request was logged at warning yet."""
        self._records = DecisionRecords(
            decisions, cache.vouches_for, extender_metrics.unknown_pod_records, clock
        )
        self._pod_warnings = (
            None
            if events is None
            else PodWarningEvents(
                events, cache.vouches_for, metrics, extender_metrics.unwritten_pod_warnings, clock
            )
        )

    def update_settings(self, settings: CycleSettings) -> None:
        """Apply a reloaded ``cycle`` section (between two requests)."""
        with self._cache.lock:
            if settings != self._settings:
                relax = self._cycle.relax  # pods keep their waiting time across a reload
                self._cycle = SchedulingCycle(settings, extender=True)
                self._cycle.relax = relax
                self._cycle.register_lookups(self._cache.table)
            self._settings = settings

    def routes(self) -> dict[str, PostRoute]:
        """The POST routes to serve: ``/filter`` and ``/prioritize``."""
        return {FILTER_PATH: self.filter_route, PRIORITIZE_PATH: self.prioritize_route}

    # ---- HTTP ------------------------------------------------------------------------

    def filter_route(self, body: bytes) -> tuple[int, bytes, str]:
        started = time.perf_counter()
        code, answer = 200, dict[str, Any]()
        try:
            args = parse_args(body, self._read_pod, self._known_nodes())
            # before the first list an unknown node must not look refused, nor a node free
            answer = self.filter(args) if self._cache.synced() else {"Error": NOT_SYNCED}
        except ExtenderRequestError as exc:
            self._log_bad_request("filter", exc)
            code, answer = 400, {"Error": str(exc)}
        except ExtenderRequestTooCostly as exc:
            answer = {"Error": self._refuse_costly("filter", exc)}
        except ObjectError as exc:
            answer = {"Error": f"interference-scheduler cannot read the pod: {exc}"}
        self._observe("filter", started, code == 200 and "Error" not in answer)
        return code, _json(answer), JSON

    def prioritize_route(self, body: bytes) -> tuple[int, bytes, str]:
        started = time.perf_counter()
        try:
            args = parse_args(body, self._read_pod, self._known_nodes())
        except ExtenderRequestTooCostly as exc:
            self._observe("prioritize", started, False)
            return 400, f"{self._refuse_costly('prioritize', exc)}\n".encode(), "text/plain"
        except (ExtenderRequestError, ObjectError) as exc:
            self._log_bad_request("prioritize", exc)
            self._observe("prioritize", started, False)
            return 400, f"{exc}\n".encode(), "text/plain"
        answer = self.prioritize(args).json()
        self._observe("prioritize", started, True)
        return 200, answer, JSON

    def _log_bad_request(self, verb: str, exc: Exception) -> None:
        """The first bad request at warning, later ones at debug: each is counted in
        ``requests_total{result="error"}``, and a caller repeating one must not flood
        the log."""
        with self._lock:
            first = not self._logged_bad_request
            self._logged_bad_request = True
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "bad extender %s request: %s", verb, exc)

    def _known_nodes(self) -> int | None:
        """The cache's node count for the node-name bound; ``None`` before the first list
        (the filter answers "still listing" then, not a refusal)."""
        return len(self._cache.table) if self._cache.synced() else None

    def _refuse_costly(self, verb: str, exc: ExtenderRequestTooCostly) -> str:
        """Count the refusal and log the first one (a caller repeating it gets the same
        answer and counter, not a log line each time); the answer's error text."""
        self._extender_metrics.refused.labels(TOO_COMPLEX).inc()
        with self._lock:
            first = not self._refused_costly
            self._refused_costly = True
        if first:
            log.warning(
                "refused an extender %s request: %s (later ones only counted in"
                " interference_scheduler_extender_refused_total{reason=%r})",
                verb,
                exc,
                TOO_COMPLEX,
            )
        return f"interference-scheduler refuses the request: {exc} (docs/operations.md, Limits)"

    def _read_pod(self, obj: Mapping[str, Any]) -> PodInfo:
        """:func:`read_extender_pod`, remembered by UID and resourceVersion (a pod object
        with both never changes)."""
        metadata = obj.get("metadata")
        uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
        version = metadata.get("resourceVersion") if isinstance(metadata, Mapping) else None
        if not (isinstance(uid, str) and uid and isinstance(version, str) and version):
            return read_extender_pod(obj)
        key = (uid, version)
        with self._lock:
            pod = self._pods.get(key)
        if pod is None:
            pod = read_extender_pod(obj)
            with self._lock:
                self._pods[key] = pod
                while len(self._pods) > REMEMBERED_PODS:
                    self._pods.popitem(last=False)
        return pod

    def _observe(self, verb: str, started: float, ok: bool) -> None:
        metrics = self._extender_metrics
        metrics.request_duration.labels(verb).observe(time.perf_counter() - started)
        metrics.requests.labels(verb, "ok" if ok else "error").inc()

    # ---- verbs -----------------------------------------------------------------------

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        """The ``ExtenderFilterResult`` for ``args`` (see the module docstring)."""
        pod = args.pod
        with self._cache.lock:
            now = self._clock()
            table = self._cache.table
            settings = self._settings
            readable = self._signal_gate.readable(table)
            recorder = self._tracer.start()
            started_ns = time.time_ns()
            verdict = self._filter(pod, args.names, table, readable, now, recorder)
        with self._lock:
            self._filtered[pod.key] = verdict
            self._filtered.move_to_end(pod.key)
            while len(self._filtered) > REMEMBERED_FILTER_CALLS:
                self._filtered.popitem(last=False)
        metrics = self._extender_metrics
        metrics.filtered_nodes.labels("passed").inc(len(verdict.passed))
        metrics.filtered_nodes.labels("failed").inc(len(args.names) - len(verdict.passed))
        if verdict.relaxed:
            metrics.relaxed.inc()
        trace_id = ""
        if recorder is not None:
            trace_id = recorder.trace_hex
            attributes: Attributes = {
                "k8s.namespace.name": pod.namespace,
                "k8s.pod.name": pod.name,
                "mode": "extender",
                "offered": len(args.names),
                "passed": len(verdict.passed),
                "relaxed": verdict.relaxed,
            }
            self._tracer.finish(recorder, "extender filter", started_ns, attributes)
        self._records.write(pod, self._filter_decision(pod, args, verdict, now, settings, trace_id))
        if self._pod_warnings is not None:
            self._pod_warnings.note(pod)
        answer: dict[str, Any] = {
            "FailedNodes": verdict.failed,
            "FailedAndUnresolvableNodes": verdict.unresolvable,
        }
        if args.nodes is None:
            answer["NodeNames"] = list(verdict.passed)
        else:
            keep = set(verdict.passed)
            answer["Nodes"] = {
                "apiVersion": "v1",
                "kind": "NodeList",
                "items": [node for node in args.nodes if node_name(node) in keep],
            }
        return answer

    def prioritize(self, args: ExtenderArgs) -> HostPriorities:
        """The ``HostPriorityList`` for ``args``: each offered node scored 0..10."""
        pod = args.pod
        with self._lock:
            filtered = self._filtered.pop(pod.key, None)
        with self._cache.lock:
            now = self._clock()
            table = self._cache.table
            settings = self._settings
            readable = self._signal_gate.readable(table)
            recorder = self._tracer.start()
            started_ns = time.time_ns()
            plugins = self._cycle.score(
                pod, table, now, signals_readable=readable, recorder=recorder
            )
            max_total = 100.0 * sum(weight for weight, _ in plugins.values())
            rows = _offered_rows(table, args.names, filtered)
            known = rows >= 0
            at = np.where(known, rows, 0)
            totals = np.zeros(len(rows))
            for weight, score in plugins.values():
                totals += weight * score[at]
            totals[~known] = 0.0
            ranked = np.argsort(-totals, kind="stable")[: max(1, settings.record_top_k)]
            candidates = [
                CandidateVerdict(
                    args.names[i],
                    True,
                    [],
                    {p: s.item(rows[i]) for p, (_, s) in plugins.items()} if known[i] else {},
                    totals.item(i),
                )
                for i in ranked.tolist()
            ]
            recorded = [c.node for c in candidates + (filtered.rejected if filtered else [])]
            index_read = self._cycle.index_read_of(
                pod, table, now, recorded, signals_readable=readable
            )
        priorities = HostPriorities(
            args.names, np.where(known, extender_scores(totals, max_total), 0).tolist()
        )
        decision = Decision(
            namespace=pod.namespace,
            pod=pod.name,
            result="prioritized",
            node="",
            message=f"scored {len(args.names)} node(s) for kube-scheduler, which picks and binds",
            ts=now,
            candidates=candidates + (filtered.rejected if filtered else []),
            rejected_by_reason=dict(filtered.reason_counts) if filtered else {},
            trace_id="" if recorder is None else recorder.trace_hex,
            interference_index=index_read,
        )
        if recorder is not None:
            attributes: Attributes = {
                "k8s.namespace.name": pod.namespace,
                "k8s.pod.name": pod.name,
                "mode": "extender",
                "offered": len(args.names),
            }
            self._tracer.finish(recorder, "extender prioritize", started_ns, attributes)
        self._records.write(pod, decision)
        return priorities

    # ---- decision records and warning Events (threads of their own) -------------------

    def confirm_records(self) -> None:
        """Write the held records whose pods the informer now knows; drop (and count) those
        past :data:`~scheduler.extender.decision_records.RECORD_CONFIRM_S`
        (:meth:`DecisionRecords.confirm`)."""
        self._records.confirm()

    def run_record_confirmer(self, stop: threading.Event, interval_s: float = 0.25) -> None:
        """:meth:`confirm_records` every ``interval_s`` until ``stop`` is set."""
        self._records.run(stop, interval_s)

    def write_pod_warnings(self) -> int:
        """Write the noted pods' warning Events the informers now vouch for (see
        :class:`PodWarningEvents`); how many were written."""
        return 0 if self._pod_warnings is None else self._pod_warnings.write_due()

    def run_pod_warnings(self, stop: threading.Event) -> None:
        """Write the pods' warning Events (:class:`PodWarningEvents`) until ``stop`` is set."""
        if self._pod_warnings is not None:
            self._pod_warnings.run(stop)

    # ---- internals (the first ones run under the cache lock) ---------------------------

    def _filter(
        self,
        pod: PodInfo,
        names: Sequence[str],
        table: NodeTable,
        signals_readable: bool,
        now: float,
        recorder: StageRecorder | None = None,
    ) -> FilterVerdict:
        offered = list(dict.fromkeys(names))
        rows = table.rows_of(offered)
        known = rows >= 0
        candidates = np.zeros(len(table), dtype=np.bool_)
        candidates[rows[known]] = True
        outcome = self._cycle.filter(
            pod, table, now, candidates, signals_readable=signals_readable, recorder=recorder
        )
        passed_at = np.flatnonzero(known & outcome.passed[np.where(known, rows, 0)])
        passed = [offered[i] for i in passed_at.tolist()]
        # an unknown node may become known: preemption "may help" (kube-scheduler retries)
        why: dict[int, tuple[bool, list[str]]] = {
            i: (True, [UNKNOWN_NODE]) for i in np.flatnonzero(~known).tolist()
        }
        position = np.full(len(table), -1, dtype=np.intp)
        position[rows[known]] = np.flatnonzero(known)
        for plugin, stage, failing in outcome.rejections.failing:
            at_rows = np.flatnonzero(failing)  # reasons looked up for its rejected nodes only
            found = stage.failure_reasons(at_rows)
            for i, reasons in zip(position[at_rows].tolist(), found, strict=True):
                why[i] = (not unresolvable(plugin, reasons), reasons)
        failed: dict[str, str] = {}
        unresolvable_nodes: dict[str, str] = {}
        counts: dict[str, int] = {}
        rejected: list[CandidateVerdict] = []
        for i in sorted(why):
            resolvable, reasons = why[i]
            name = offered[i]
            for reason in reasons:
                counts[reason] = counts.get(reason, 0) + 1
            text = ", ".join(reasons)
            if not resolvable:
                unresolvable_nodes[name] = text
            else:
                failed[name] = text
            if len(rejected) < self._settings.record_top_k:
                rejected.append(CandidateVerdict(name, False, reasons))
        recorded = [*passed[: self._settings.record_top_k], *(c.node for c in rejected)]
        runq = self._cycle.runq_of(pod, table, now, recorded, signals_readable=signals_readable)
        if runq is not None and outcome.runq is not None:  # with the nearest node, relax_at
            measured = {**runq.measured_us, **outcome.runq.measured_us}
            runq = dataclasses.replace(outcome.runq, measured_us=measured)
        index_read = self._cycle.index_read_of(
            pod, table, now, recorded, signals_readable=signals_readable
        )
        return FilterVerdict(
            tuple(passed),
            failed,
            unresolvable_nodes,
            counts,
            rejected,
            rows[passed_at],
            table.generation,
            outcome.relaxed_after_s is not None,
            outcome.funnel,
            runq,
            index_read,
        )

    def _filter_decision(
        self,
        pod: PodInfo,
        args: ExtenderArgs,
        verdict: FilterVerdict,
        now: float,
        settings: CycleSettings,
        trace_id: str = "",
    ) -> Decision:
        if verdict.passed:
            result = "filtered"
            message = (
                f"{len(verdict.passed)}/{len(args.names)} nodes passed interference-scheduler's"
                " filters; kube-scheduler picks and binds"
            )
            if verdict.relaxed:
                message += " (interference filters relaxed after relax_after_s)"
        else:
            result = "unschedulable"
            message = failed_scheduling_message(len(args.names), verdict.reason_counts)
            # the reasons carry each node's measurement: "… tolerance (measured 900 µs > …)"
            if verdict.runq is not None and self._cycle.refused_for_runq(verdict.reason_counts):
                message += " " + runq_advice(verdict.runq, now)
        return Decision(
            namespace=pod.namespace,
            pod=pod.name,
            result=result,
            node="",
            message=message,
            ts=now,
            candidates=[CandidateVerdict(n, True) for n in verdict.passed[: settings.record_top_k]]
            + verdict.rejected,
            rejected_by_reason=dict(verdict.reason_counts),
            funnel=list(verdict.funnel),
            trace_id=trace_id,
            runq=verdict.runq,
            interference_index=verdict.interference_index,
            omitted={
                "rejected": len(args.names) - len(verdict.passed) - len(verdict.rejected),
                "feasible": max(0, len(verdict.passed) - settings.record_top_k),
            },
        )


def _offered_rows(
    table: NodeTable, names: tuple[str, ...], filtered: FilterVerdict | None
) -> NDArray[np.intp]:
    """The table rows of a prioritize call's ``names``: those of the preceding filter
    call when kube-scheduler offers exactly the nodes it passed (it does, unless another
    extender removed some) and no node came or went since; else a lookup per name."""
    if (
        filtered is not None
        and filtered.generation == table.generation
        and filtered.passed == names
    ):
        return filtered.passed_rows
    return table.rows_of(names)


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
