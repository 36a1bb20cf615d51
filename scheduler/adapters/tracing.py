"""OpenTelemetry traces of scheduling attempts, exported over OTLP (gRPC or HTTP).

Every scheduling attempt — standalone, extender filter and prioritize, rebalancing — that
the sampler keeps is one trace: a root span for the attempt and a child span per stage
the cycle noted (PreFilter, each Filter with ``nodes_in``/``nodes_out`` and its reasons
counted, each Score, the selection; the bind later), each with ``decision_stage``
(``prefilter``, ``node_filter``, ``score_ranking``, ``selection``, ``bind``). The trace id
goes into the decision record, so ``interference explain`` leads from a pod to its trace.

Off by default. On when ``tracing.endpoint`` is set, or when the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` is; the OTLP
exporter reads the other ``OTEL_EXPORTER_OTLP_*`` variables (headers, certificates,
timeout, compression) itself. Sampling is parent-based with a trace-id ratio
(``tracing.sample_ratio``; attempts have no parent, so the ratio decides).

Why a child process: in CPython the SDK costs about 60 µs a span (24 µs to start and end
one through a ``Tracer``, 35 µs to encode it for OTLP); built on the scheduling thread,
ten spans a decision would cost more than the decision. The scheduling thread only notes
its stages (:mod:`scheduler.cycle.stage_trace`; a filter that let every node through is named on
the root span rather than being a span of its own, and a score with no preference is left
out) and hands them, each attempt pickled once, in batches of up to ``HANDOFF_BATCH``
traces, to a spawned, niced exporter process. That process makes the SDK's spans from
them — the scheduling process's trace and root span ids, the stages' own timestamps — and
exports them with the SDK's OTLP exporter (figures in docs/BENCHMARKS.md). When the
exporter falls behind, whole traces are dropped and counted, never the scheduling thread
slowed.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import queue
import random
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Literal

from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from prometheus_client import CollectorRegistry, Counter

from scheduler.cycle.stage_trace import Attributes, StageRecorder, expand

log = logging.getLogger(__name__)

Protocol = Literal["grpc", "http/protobuf"]
PROTOCOLS: tuple[Protocol, ...] = ("grpc", "http/protobuf")
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
TRACER_NAME = "interference-scheduler"
HANDOFF_BATCH = 64
"""Traces per hand-off to the exporter process. A ``multiprocessing`` queue costs about
40 µs of the scheduling process's CPU per item (its lock, semaphore and feeder thread
woken, a pipe write), against about 5 µs to pickle an attempt: one item per batch makes
that per-item cost 64 times smaller (docs/BENCHMARKS.md#tracing: the whole cost)."""
EXPORT_BATCH_SPANS = 512
"""Spans per export request (the SDK batch processor's default batch)."""
EXPORT_INTERVAL_S = 1.0
"""A batch not yet full is exported after this long."""
HANDOFF_INTERVAL_S = 0.2
"""A batch not yet full is handed over after this long, so a quiet scheduler's traces
still reach the backend within a fraction of a second."""


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """The ``tracing`` section (applies at restart)."""

    endpoint: str = ""
    """OTLP endpoint, e.g. ``http://jaeger-collector.tracing:4317`` (gRPC) or
    ``http://tempo.tracing:4318/v1/traces`` (HTTP); empty: the standard
    ``OTEL_EXPORTER_OTLP_*_ENDPOINT`` variables, and tracing is off without them."""
    protocol: Protocol | None = None
    """``grpc`` or ``http/protobuf``; unset: ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL``,
    else ``grpc``."""
    sample_ratio: float = 1.0
    """Share of attempts traced (parent-based trace-id ratio), 0–1."""
    service_name: str = "interference-scheduler"
    """``service.name`` of the spans (``OTEL_SERVICE_NAME`` wins, as the SDK reads it)."""
    queue_limit: int = 10_000
    """Traces waiting for the exporter process before new ones are dropped (and counted)."""

    def __post_init__(self) -> None:
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol: {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"sample_ratio: {self.sample_ratio!r} must be a number from 0 to 1")
        if self.queue_limit < 1:
            raise ValueError(f"queue_limit: {self.queue_limit!r} must be an integer ≥ 1")

    def resolved_endpoint(self) -> str:
        """The endpoint in effect: the setting, else the standard variables ("" = off)."""
        if self.endpoint:
            return self.endpoint
        return next((os.environ[v] for v in ENDPOINT_VARIABLES if os.environ.get(v)), "")

    def resolved_protocol(self) -> Protocol:
        if self.protocol is not None:
            return self.protocol
        found = next((os.environ[v] for v in PROTOCOL_VARIABLES if os.environ.get(v)), "grpc")
        if found not in PROTOCOLS:
            raise ValueError(
                f"{PROTOCOL_VARIABLES[1]}={found!r} is not one of {', '.join(PROTOCOLS)}"
            )
        return found


class TracingMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.dropped = Counter(
            "interference_scheduler_traces_dropped",
            "Sampled attempt traces dropped because the exporter process fell behind.",
            registry=registry,
        )
        self.sent = Counter(
            "interference_scheduler_traces",
            "Sampled attempt traces handed to the exporter process.",
            registry=registry,
        )


class OtlpTracer:
    """:class:`scheduler.cycle.ports.DecisionTracer` exporting through a spawned SDK process."""

    def __init__(self, settings: TracingSettings, metrics: TracingMetrics) -> None:
        self._sample_bound = TraceIdRatioBased(settings.sample_ratio).bound
        self._metrics = metrics
        self._random = random.Random()
        self._batch: list[bytes] = []
        self._batch_lock = threading.Lock()
        self._closing = threading.Event()
        context = multiprocessing.get_context("spawn")  # never fork a threaded process
        self._queue: Any = context.Queue(maxsize=max(1, settings.queue_limit // HANDOFF_BATCH))
        self._process = context.Process(
            target=export_forever,
            args=(
                self._queue,
                settings.resolved_endpoint(),
                settings.resolved_protocol(),
                settings.service_name,
            ),
            name="otlp-exporter",
            daemon=True,
        )
        self._process.start()
        self._flusher = threading.Thread(
            target=self._hand_over_periodically, name="otlp-handoff", daemon=True
        )
        self._flusher.start()

    def start(self) -> StageRecorder | None:
        trace_id = self._random.getrandbits(128) or 1
        if not sampled(trace_id, self._sample_bound):
            return None
        return StageRecorder(trace_id, self._random.getrandbits(64) or 1)

    def finish(
        self,
        recorder: StageRecorder,
        name: str,
        start_ns: int,
        attributes: Attributes,
        end_ns: int | None = None,
    ) -> None:
        message = (
            recorder.trace_id,
            recorder.root_span_id,
            name,
            start_ns,
            time.time_ns() if end_ns is None else end_ns,
            attributes,
            recorder.parts,  # raw: expanded into spans in the exporter process
        )
        # Pickled now rather than by the queue's feeder thread: bytes are not tracked by
        # the garbage collector, while the notes' lists and dicts, kept until their batch
        # is handed over, survived into older generations (274 young collections per
        # 2,000 decisions at 1,000 nodes against 231 untraced; now 233).
        self._put(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush what is queued and end the exporter process."""
        self._closing.set()
        self._flusher.join(timeout_s)
        self._hand_over()
        with suppress(ValueError, OSError):
            self._queue.put(None, timeout=timeout_s)
        self._process.join(timeout_s)
        if self._process.is_alive():
            self._process.terminate()

    def _put(self, message: bytes) -> None:
        with self._batch_lock:
            self._batch.append(message)
            if len(self._batch) < HANDOFF_BATCH:
                return
        self._hand_over()

    def _hand_over(self) -> None:
        """The batch so far to the exporter process, or counted as dropped when it is
        behind (whole traces: an attempt and its stages are one message)."""
        with self._batch_lock:
            batch, self._batch = self._batch, []
        if not batch:
            return
        attempts = len(batch)
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._metrics.dropped.inc(attempts)
        except (ValueError, OSError):  # closed: the scheduler is shutting down
            return
        else:
            self._metrics.sent.inc(attempts)

    def _hand_over_periodically(self) -> None:
        while not self._closing.wait(HANDOFF_INTERVAL_S):
            self._hand_over()


def sampled(trace_id: int, bound: int) -> bool:
    """The decision of the SDK's ``ParentBased(TraceIdRatioBased(ratio))`` for an attempt,
    which has no parent (so the ratio sampler decides), ``bound`` being that sampler's
    ``bound``. Its own ``should_sample`` builds a context lookup and a result object per
    call, 4 µs of the scheduling thread per attempt; the rule is this comparison
    (``tests/scheduler/test_tracing.py`` checks it against the SDK's)."""
    return trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < bound


def export_forever(messages: Any, endpoint: str, protocol: Protocol, service_name: str) -> None:
    """The exporter process: spans from the notes, exported by the SDK's OTLP exporter
    until ``None``.

    The spans are the SDK's :class:`~opentelemetry.sdk.trace.ReadableSpan`, made from the
    notes directly rather than started and ended through a ``Tracer``: the notes already
    hold every id and timestamp, and starting a span costs about 24 µs against 4 µs to
    make one (measured in docs/BENCHMARKS.md). They are exported in batches of up to
    :data:`EXPORT_BATCH_SPANS`, or after :data:`EXPORT_INTERVAL_S`, synchronously: an
    export that is slow or failing holds this process up, the queue from the scheduling
    process fills, and *whole* traces are dropped there and counted — where the SDK's
    batch processor would drop single spans of a trace, uncounted.

    It runs niced: under CPU pressure the scheduling thread wins."""
    with suppress(OSError):
        os.nice(10)
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    spans = _SpanMaker(
        Resource.create({SERVICE_NAME: service_name}), InstrumentationScope(TRACER_NAME)
    )
    exporter = _exporter(endpoint, protocol)
    ready: list[Any] = []
    exported_at = time.monotonic()
    try:
        while True:
            try:
                batch = messages.get(timeout=EXPORT_INTERVAL_S)
            except queue.Empty:
                batch = ()
            if batch is None:
                break
            for message in batch:
                spans.add(pickle.loads(message), ready)
            if len(ready) >= EXPORT_BATCH_SPANS or (
                ready and time.monotonic() - exported_at >= EXPORT_INTERVAL_S
            ):
                _export(exporter, ready)
                ready = []
                exported_at = time.monotonic()
    finally:
        if ready:
            _export(exporter, ready)
        exporter.shutdown()


def _export(exporter: Any, spans: list[Any]) -> None:
    for start in range(0, len(spans), EXPORT_BATCH_SPANS):
        request = spans[start : start + EXPORT_BATCH_SPANS]
        try:
            exporter.export(request)
        except Exception:  # a trace is not worth the exporter process
            log.exception("exporting %d spans failed", len(request))


class _SpanMaker:
    """The SDK's finished spans from the scheduling process's notes."""

    def __init__(self, resource: Any, scope: Any) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, TraceFlags

        self._span = ReadableSpan
        self._context = SpanContext
        self._sampled = TraceFlags(TraceFlags.SAMPLED)
        self._resource = resource
        self._scope = scope
        self._random = random.Random()

    def add(self, message: Sequence[Any], spans: list[Any]) -> None:
        """An attempt's root span and a span per stage, appended to ``spans``."""
        trace_id, root_id, name, start_ns, end_ns, attributes, parts = message
        stages, passed = expand(parts)
        if passed:
            attributes = {**attributes, "filters_passed_by_all": ",".join(passed)}
        root = self._context(trace_id, root_id, False, self._sampled)
        spans.append(self._make(name, root, None, start_ns, end_ns, attributes))
        for name, decision_stage, start_ns, end_ns, attributes in stages:
            context = self._context(trace_id, self._random.getrandbits(64) or 1, False,
                                    self._sampled)  # fmt: skip
            attributes = {"decision_stage": decision_stage, **attributes}
            spans.append(self._make(name, context, root, start_ns, end_ns, attributes))

    def _make(
        self,
        name: str,
        context: Any,
        parent: Any,
        start_ns: int,
        end_ns: int,
        attributes: Attributes,
    ) -> Any:
        return self._span(
            name,
            context,
            parent,
            self._resource,
            attributes,
            start_time=start_ns,
            end_time=end_ns,
            instrumentation_scope=self._scope,
        )


def _exporter(endpoint: str, protocol: Protocol) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=endpoint or None)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=endpoint or None)
