"""OpenTelemetry traces of scheduling attempts against a real OTLP receiver.

The receiver is the OTLP trace service from the ``opentelemetry-proto`` definitions,
served over gRPC (and OTLP/HTTP's protobuf body over HTTP): no collector binary is
obtainable here. The scheduler side is the real loop over the in-memory cluster and the
real exporter process (the SDK's spans and OTLP exporters)."""

from __future__ import annotations

import http.server
import random
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, TraceIdRatioBased
from prometheus_client import CollectorRegistry

from scheduler.adapters.tracing import OtlpTracer, TracingMetrics, TracingSettings, sampled
from scheduler.cycle.stage_trace import BIND, SELECTION
from tests.builders import node_obj, pod_obj
from tests.scheduler.runtime_helpers import KeptTraces, LoopHarness, schedule_pending


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span it is sent, by span id."""

    def __init__(self) -> None:
        self.spans: dict[bytes, Any] = {}
        self.resources: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:
        self.take(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def take(self, request: Any) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                self.resources.append(_attributes(resource_spans.resource.attributes))
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans[span.span_id] = span

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.spans) >= count:
                    return list(self.spans.values())
            time.sleep(0.05)
        with self.lock:
            return list(self.spans.values())


def _attributes(pairs: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in pairs:
        value = pair.value
        kind = value.WhichOneof("value")
        found[pair.key] = getattr(value, kind) if kind else None
    return found


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[Receiver, str]]:
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


@pytest.fixture
def http_receiver() -> Iterator[tuple[Receiver, str]]:
    receiver = Receiver()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            receiver.take(request)
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver, f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()
        server.server_close()


def _schedule_three_pods(tracer: OtlpTracer) -> LoopHarness:
    harness = LoopHarness(tracer=tracer)
    harness.cluster.add_node(node_obj("small", cpu="1"))
    harness.cluster.add_node(node_obj("big", cpu="8"))
    harness.cluster.add_node(node_obj("tainted", cpu="8", unschedulable=True))
    harness.cluster.add_pod(pod_obj("fits", requests={"cpu": "2"}))
    harness.cluster.add_pod(pod_obj("nowhere", requests={"cpu": "16"}))
    harness.step()
    harness.close()
    tracer.close()
    return harness


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_each_attempt_is_a_trace_with_a_span_per_stage(
    protocol: str, grpc_receiver: tuple[Receiver, str], http_receiver: tuple[Receiver, str]
) -> None:
    receiver, endpoint = grpc_receiver if protocol == "grpc" else http_receiver
    settings = TracingSettings(endpoint=endpoint, protocol=protocol)  # type: ignore[arg-type]
    tracer = OtlpTracer(settings, TracingMetrics(CollectorRegistry()))
    harness = _schedule_three_pods(tracer)
    fits = harness.decisions.last("fits")
    nowhere = harness.decisions.last("nowhere")
    assert len(fits.trace_id) == 32 and len(nowhere.trace_id) == 32
    # a span per filter that rejected a node (the others are named on the root span) and
    # per score with a preference: fits: root, PreFilter, NodeUnschedulable,
    # NodeResourcesFit, 3 scores, select, bind; nowhere: root, PreFilter, the two filters
    spans = receiver.wait_for(9 + 4)
    assert len(spans) == 13
    assert {"service.name": "interference-scheduler"}.items() <= receiver.resources[0].items()
    by_trace: dict[str, list[Any]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id.hex(), []).append(span)

    # the scheduled pod: root, a span per filter with the record's funnel, scores, select, bind
    trace = by_trace[fits.trace_id]
    (root,) = [s for s in trace if not s.parent_span_id]
    assert root.name == "schedule"
    root_attributes = _attributes(root.attributes)
    assert root_attributes["k8s.pod.name"] == "fits"
    assert root_attributes["result"] == "scheduled" and root_attributes["node"] == "big"
    children = [s for s in trace if s.parent_span_id]
    assert all(s.parent_span_id == root.span_id for s in children)
    stages = {s.name: _attributes(s.attributes) for s in children}
    passed_by_all = root_attributes["filters_passed_by_all"].split(",")
    for stage in fits.funnel:
        if stage.nodes_in == stage.nodes_out:
            assert stage.name in passed_by_all
            continue
        attributes = stages[f"Filter {stage.name}"]
        assert attributes["decision_stage"] == "node_filter"
        assert (attributes["nodes_in"], attributes["nodes_out"]) == (
            stage.nodes_in,
            stage.nodes_out,
        )
    assert len(passed_by_all) == 9  # every filter but NodeUnschedulable and NodeResourcesFit
    assert stages["Filter NodeUnschedulable"]["reason.node(s) were unschedulable"] == 1
    assert stages["Filter NodeResourcesFit"]["reason.Insufficient cpu"] == 1
    assert stages["Score NodeResourcesFit"]["decision_stage"] == "score_ranking"
    assert stages["Select"]["chosen"] == "big" and stages["Select"]["feasible"] == 1
    assert stages["Bind"] == {"decision_stage": "bind", "node": "big", "status": "bound"}
    assert stages["PreFilter"] == {"decision_stage": "prefilter"}
    assert all(s.start_time_unix_nano <= s.end_time_unix_nano for s in trace)

    # the unschedulable pod: its reasons counted, no selection, no bind
    trace = by_trace[nowhere.trace_id]
    names = {s.name for s in trace}
    assert "Select" not in names and "Bind" not in names
    fit = next(s for s in trace if s.name == "Filter NodeResourcesFit")
    assert _attributes(fit.attributes)["nodes_out"] == 0


def test_a_zero_ratio_traces_nothing_and_records_no_trace_id(
    grpc_receiver: tuple[Receiver, str],
) -> None:
    receiver, endpoint = grpc_receiver
    settings = TracingSettings(endpoint=endpoint, sample_ratio=0.0)
    metrics = TracingMetrics(CollectorRegistry())
    harness = _schedule_three_pods(OtlpTracer(settings, metrics))
    assert harness.decisions.last("fits").trace_id == ""
    assert receiver.wait_for(1, timeout_s=2.0) == []


def test_the_standard_variables_turn_tracing_on(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TracingSettings().resolved_endpoint() == ""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    settings = TracingSettings()
    assert settings.resolved_endpoint() == "http://collector:4317"
    assert settings.resolved_protocol() == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        settings.resolved_protocol()


@pytest.mark.parametrize("ratio", [0.0, 0.001, 0.1, 0.5, 0.999, 1.0])
def test_the_sampling_rule_is_the_sdks_parent_based_ratio_sampler(ratio: float) -> None:
    sdk = ParentBased(TraceIdRatioBased(ratio))
    bound = TraceIdRatioBased(ratio).bound
    rng = random.Random(7)
    limit = TraceIdRatioBased.TRACE_ID_LIMIT
    edges = [1, bound - 1, bound, bound + 1, limit, limit + 1, (1 << 128) - 1]
    trace_ids = [t for t in edges if 0 < t < 1 << 128]
    trace_ids += [rng.getrandbits(128) or 1 for _ in range(2000)]
    for trace_id in trace_ids:
        expected = sdk.should_sample(None, trace_id, "attempt").decision
        assert sampled(trace_id, bound) == (expected is Decision.RECORD_AND_SAMPLE), trace_id


class SlowReceiver(Receiver):
    """A collector that takes ``delay_s`` to answer each export."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def Export(self, request: Any, context: Any) -> Any:
        time.sleep(self.delay_s)
        return super().Export(request, context)


@pytest.mark.slow
def test_a_slow_collector_costs_whole_traces_counted_never_parts_of_one() -> None:
    receiver = SlowReceiver(delay_s=1.0)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    registry = CollectorRegistry()
    settings = TracingSettings(endpoint=f"http://127.0.0.1:{port}", queue_limit=64)
    tracer = OtlpTracer(settings, TracingMetrics(registry))
    attempts = 3000
    time.sleep(1.5)  # the exporter process up, so that it is its export that falls behind
    try:
        for attempt in range(attempts):
            if attempt % 64 == 0:
                time.sleep(0.05)  # about 1,300 attempts a second, 5,000 spans: over 512 a second
            recorder = tracer.start()
            assert recorder is not None
            started = time.time_ns()
            recorder.note("PreFilter", "prefilter", started)
            recorder.note_score("NodeResourcesFit", 1.0, started, time.time_ns())
            recorder.note_selection(started, "big", 2, [("big", 90.0), ("small", 40.0)])
            tracer.finish(recorder, "schedule", started, {"k8s.pod.name": "p"})
        tracer.close(timeout_s=60)
    finally:
        server.stop(grace=None)
    sent = registry.get_sample_value("interference_scheduler_traces_total")
    dropped = registry.get_sample_value("interference_scheduler_traces_dropped_total")
    assert sent is not None and dropped is not None
    assert dropped > 0 and sent + dropped == attempts
    by_trace: dict[bytes, list[Any]] = {}
    for span in receiver.spans.values():
        by_trace.setdefault(span.trace_id, []).append(span)
    assert len(by_trace) == sent  # every trace handed over arrived …
    for spans in by_trace.values():  # … whole: its root and its three stages
        assert sorted(s.name for s in spans) == ["PreFilter", "Score NodeResourcesFit",
                                                 "Select", "schedule"]  # fmt: skip


def test_an_attempt_whose_bind_never_reported_is_still_traced_when_the_loop_closes() -> None:
    traces = KeptTraces()
    harness = LoopHarness(tracer=traces)
    harness.cluster.add_node(node_obj("big", cpu="8"))
    harness.cluster.add_pod(pod_obj("fits", requests={"cpu": "2"}))
    harness.informer.sync()
    harness.loop.close()  # the scheduler is stopping: its binder takes no more binds
    assert schedule_pending(harness.loop) == 1
    assert traces.finished == []  # a scheduled attempt's trace waits for its bind
    harness.loop.close()
    ((name, recorder, attributes, end_ns),) = traces.finished
    assert name == "schedule"
    assert attributes["result"] == "scheduled" and attributes["node"] == "big"
    stages = [note.stage for note in recorder.stages]
    assert SELECTION in stages and BIND not in stages  # the attempt, without a bind span
    assert end_ns is not None  # ends when the decision was made, not at close
