"""What tracing every scheduling attempt costs: the loop's pods/s with tracing off and on.

The workload is ``bench/scheduler_throughput.py``'s (5,000 nodes, 50,000 running pods,
10,000 pending pods of every kind, fresh signals); the real SchedulingLoop binds every
pending pod, ``--path in-memory`` over the in-memory cluster (the scheduler's own ceiling,
where a per-decision cost shows most) or ``--path end-to-end`` through the real
Kubernetes client to the HTTP emulator with decision records in a real redis-server, as
``scheduler_throughput.py`` measures end to end. "On" traces every attempt (sample ratio
1.0) through the real exporter process to a real OTLP gRPC receiver (the
``opentelemetry-proto`` trace service in its own niced process, counting spans: it stands
for a collector on another machine). Runs alternate off/on so the shared machine's noise
hits both, each in a fresh process from the same collector state; the figure is the ratio
of the medians. Target: on ≥ 0.95 × off.

``--pin`` runs the scheduler on CPU 0 and the exporter process and the receiver on CPU 1:
a scheduler given a CPU beyond its scheduling thread, which is what the exporter being a
process of its own is for. Without it everything shares this machine's two CPUs, and what
the exporter spends comes off the scheduler.

Run from the repository root: ``.venv/bin/python bench/tracing_cost.py [--path in-memory]
[--nodes 5000] [--running 50000] [--pending 10000] [--rounds 3] [--pin]``.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry

from bench.scheduler_throughput import (
    ListSink,
    bench_end_to_end,
    build_cluster,
    followed_signals,
    run_loop,
)
from scheduler.adapters.tracing import OtlpTracer, TracingMetrics, TracingSettings

TARGET = 0.95
SCHEDULER_CPU = 0
EXPORTER_CPU = 1


def receive_spans(port_out: Any, counted: Any) -> None:
    """An OTLP gRPC trace receiver counting the spans it is sent (its own process, niced:
    it stands for a collector on another machine)."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import (
        trace_service_pb2,
        trace_service_pb2_grpc,
    )

    class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            spans = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            with counted.get_lock():
                counted.value += spans
            return trace_service_pb2.ExportTraceServiceResponse()

    os.nice(19)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(), server)
    port_out.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination()


@contextmanager
def on_cpu(pin: bool, cpu: int) -> Iterator[None]:
    """With ``pin``: this process on ``cpu`` inside the block (for the processes it spawns
    there), on ``SCHEDULER_CPU`` after."""
    if not pin:
        yield
        return
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, {SCHEDULER_CPU})


def one_run(args: argparse.Namespace, endpoint: str | None, results: Any) -> None:
    """A spawned process of its own (:func:`in_a_new_process`): puts the pods/s of the loop
    binding every pending pod, pods per CPU-second of this process (every thread of it: the
    loop, the binders, the hand-off to the exporter; not the exporter process) and the
    traces dropped in ``results``; traced through ``endpoint`` when given."""
    if args.pin:
        os.sched_setaffinity(0, {SCHEDULER_CPU})
    tracer, registry = None, CollectorRegistry()
    if endpoint is not None:
        with on_cpu(args.pin, EXPORTER_CPU):
            tracer = OtlpTracer(TracingSettings(endpoint=endpoint), TracingMetrics(registry))
    memory = build_cluster(args.nodes, args.running, args.pending, args.seed)
    with followed_signals([f"node-{i:05d}" for i in range(args.nodes)]) as signals:
        # Every run from the same collector state: a full collection of this heap takes
        # about 130 ms, a tenth of a 2,000-pod run, and whether one falls inside a run
        # otherwise depends on what was allocated before it (setting a tracer up was enough).
        gc.collect()
        if args.path == "end-to-end":
            run = bench_end_to_end(memory, signals, args.pending, 16, tracer).run
        else:
            run = run_loop(memory, memory, signals, ListSink(), args.pending, 16, tracer)
    if tracer is not None:
        tracer.close(60)
    dropped = registry.get_sample_value("interference_scheduler_traces_dropped_total") or 0.0
    results.put((run.bound / run.seconds, run.bound / (run.user_s + run.system_s), dropped))


def in_a_new_process(args: argparse.Namespace, endpoint: str | None) -> tuple[float, float, float]:
    """:func:`one_run` in a fresh process: no run inherits another's heap, collector state
    or memory layout (run in one process, the same untraced run swung from 1,100 to 1,700
    pods/s; in fresh ones, 1,650–1,770)."""
    context = multiprocessing.get_context("spawn")
    results: Any = context.Queue()
    process = context.Process(target=one_run, args=(args, endpoint, results))
    process.start()
    found: tuple[float, float, float] = results.get(timeout=1800)
    process.join(60)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=("in-memory", "end-to-end"), default="in-memory")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--running", type=int, default=50_000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--pin", action="store_true", help="scheduler on CPU 0, exporter and receiver on CPU 1"
    )
    args = parser.parse_args(argv)
    if args.pin and not {0, 1} <= os.sched_getaffinity(0):
        parser.error("--pin needs CPUs 0 and 1")
    context = multiprocessing.get_context("spawn")
    port_out: Any = context.Queue()
    counted: Any = context.Value("q", 0)
    receiver = context.Process(target=receive_spans, args=(port_out, counted), daemon=True)
    with on_cpu(args.pin, EXPORTER_CPU):  # a spawned process inherits the affinity
        receiver.start()
    endpoint = f"http://127.0.0.1:{port_out.get(timeout=30)}"
    off: list[tuple[float, float, float]] = []
    on: list[tuple[float, float, float]] = []
    try:
        for round_number in range(args.rounds):
            off.append(in_a_new_process(args, None))
            on.append(in_a_new_process(args, endpoint))
            print(f"round {round_number + 1}: off {off[-1][0]:.0f} pods/s "
                  f"({off[-1][1]:.0f} per CPU-s), on {on[-1][0]:.0f} pods/s "
                  f"({on[-1][1]:.0f} per CPU-s)", flush=True)  # fmt: skip
        time.sleep(1)
    finally:
        receiver.terminate()
    rate_off, rate_on = (statistics.median(run[0] for run in runs) for runs in (off, on))
    cpu_off, cpu_on = (statistics.median(run[1] for run in runs) for runs in (off, on))
    dropped = sum(run[2] for run in on)
    ratio = rate_on / rate_off
    pinned = ", scheduler on CPU 0, exporter and receiver on CPU 1" if args.pin else ""
    print(
        f"\n{args.path}: {args.nodes} nodes, {args.pending} pending pods, {args.rounds} rounds"
        f"{pinned}, medians:"
    )
    print(f"  tracing off: {rate_off:.0f} pods/s, {cpu_off:.0f} pods per CPU-second")
    print(f"  tracing on (ratio 1.0): {rate_on:.0f} pods/s, {cpu_on:.0f} pods per CPU-second")
    print(f"  on / off: {ratio:.3f} (target ≥ {TARGET}) {'ok' if ratio >= TARGET else 'MISSED'}; "
          f"per CPU-second {cpu_on / cpu_off:.3f}")  # fmt: skip
    print(f"  spans received: {counted.value}; traces dropped: {dropped:.0f}")
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
