"""What one Prometheus scrape of an agent's interference signals costs at 110 pods a node
(the kubelet's default pod limit), in process (docs/BENCHMARKS.md, "Agent /metrics").

A report like a busy node's: 110 named pods (plus ``system``), each with a run-queue
histogram, culprits and contention; windows 10 s and 60 s; every pod declaring a
tolerance, so the per-pod cap (``--metrics-max-pods``) is what bounds the output. For each
cap it prints the median over ``--repetitions`` of: one ``collect()`` of the collector
(the families, built from the latest report), one whole exposition of the agent's
registry (``generate_latest``, what ``/metrics`` sends; the agent's own metrics
included), its size in bytes and series, one ``observe()`` (what the measure loop pays
per interval), the bytes a scrape allocates at its peak (tracemalloc, one run), and the
bytes the collector keeps for the pods' windows (60 intervals of 110 pods' slots).

Run from the repository root:
``.venv/bin/python bench/agent_metrics_scrape.py [--pods 110] [--repetitions 300]``.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest

from interference import hist
from interference.signals import (
    SIGNAL_FAMILIES,
    NodeMetrics,
    NodeReport,
    PodMetrics,
    WindowMetrics,
)
from node_agent.health import AgentMetrics
from node_agent.signal_metrics import SignalCollector
from node_agent.tolerances import PodTolerance


def busy_report(pods: int, seed: int = 1) -> NodeReport:
    """A node of ``pods`` named pods, each waiting behind its neighbours now and then."""
    rng = random.Random(seed)
    rows: list[PodMetrics] = []
    names = [f"web-{i:03d}-7d9c8f6b5-q4k2m" for i in range(pods)]
    for i, name in enumerate(names):
        slots = [rng.randrange(0, 400) for _ in range(rng.randrange(8, 16))]
        culprits = tuple(
            (f"shop/{names[rng.randrange(pods)]}", round(rng.uniform(0.1, 50), 3)) for _ in range(5)
        )
        rows.append(
            PodMetrics(
                namespace="shop",
                name=name,
                uid=f"6f1c2d3e-0000-4000-8000-{i:012d}",
                qos="burstable",
                cpu_ms_per_s=rng.uniform(10, 900),
                runq_wait_ms_per_s=rng.uniform(0, 200),
                runq_p99_us=hist.percentile(slots, 0.99),
                runq_us=tuple(slots),
                reclaim_stall_ms_per_s=rng.uniform(0, 2),
                throttled_ms_per_s=rng.uniform(0, 20),
                own_wait_ms_per_s=rng.uniform(0, 50),
                neighbour_wait_ms_per_s=rng.uniform(0, 150),
                culprits=culprits,
            )
        )
    rows.append(PodMetrics("", "system", cpu_ms_per_s=100.0))
    node_slots = [0] * hist.MAX_SLOTS
    for row in rows:
        node_slots = hist.add(node_slots, row.runq_us)
    metrics = NodeMetrics(
        runq_p50_us=40.0,
        runq_p99_us=hist.percentile(node_slots, 0.99),
        runq_wait_ratio=0.3,
        reclaim_stall_ms_per_s=0.8,
        throttled_ms_per_s=40.0,
        psi_cpu_some=20.0,
        psi_mem_some=1.0,
        net_drops_per_s=3.0,
        interference_index=35.0,
    )
    windows = {
        name: WindowMetrics(span_s=span, covered_s=span, intervals=int(span), runq_p99_us=900.0)
        for name, span in (("10s", 10.0), ("60s", 60.0))
    }
    return NodeReport(
        node="bench-node",
        ts=time.time(),
        interval_s=1.0,
        metrics=metrics,
        histograms={"runq_us": node_slots, "reclaim_us": []},
        pods=rows,
        measured=tuple(f for f in SIGNAL_FAMILIES),
        windows=windows,
    )


def median_s(action: Callable[[], object], repetitions: int) -> float:
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(pods: int, max_pods: int, repetitions: int) -> dict[str, float]:
    report = busy_report(pods)
    declared = {p.uid: PodTolerance(max_runq_p99_us=2000, max_index=40) for p in report.pods}
    registry = CollectorRegistry()
    AgentMetrics(registry)  # the agent's own metrics are on the same page
    collector = SignalCollector(report.node, max_pods, tolerance_of=declared.get)
    registry.register(collector)
    # Steady state: the longest window (60 s) full of intervals, one a second.
    for second in range(61):
        collector.observe(replace(report, ts=report.ts + second), ncpu=16)
    later = iter([replace(report, ts=report.ts + 61 + i) for i in range(repetitions)])
    page = generate_latest(registry)
    series = sum(1 for line in page.splitlines() if line and not line.startswith(b"#"))
    collect_s = median_s(lambda: list(collector.collect()), repetitions)
    expose_s = median_s(lambda: generate_latest(registry), repetitions)
    observe_s = median_s(lambda: collector.observe(next(later), 16), repetitions)
    tracemalloc.start()
    generate_latest(registry)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    kept = kept_bytes(report, max_pods)
    return {
        "collect_ms": collect_s * 1e3,
        "expose_ms": expose_s * 1e3,
        "observe_ms": observe_s * 1e3,
        "bytes": float(len(page)),
        "series": float(series),
        "peak_kib": peak / 1024,
        "kept_kib": kept / 1024,
    }


def kept_bytes(report: NodeReport, max_pods: int) -> int:
    """Bytes a collector keeps alive after 61 intervals of fresh reports (each with its
    own pod rows and slot tuples, as the agent's are), less the latest report itself,
    which the agent holds anyway."""
    gc.collect()
    tracemalloc.start()
    collector = SignalCollector(report.node, max_pods)
    for second in range(61):
        fresh = replace(report, ts=report.ts + second, pods=copied(report.pods))
        collector.observe(fresh, ncpu=16)
    del fresh
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    one = replace(report, pods=copied(report.pods))
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del one, collector
    return held - (after - before)


def copied(pods: list[PodMetrics]) -> list[PodMetrics]:
    return [replace(p, runq_us=tuple(list(p.runq_us))) for p in pods]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--repetitions", type=int, default=300)
    args = parser.parse_args()
    print(f"{args.pods} pods, every one with a tolerance; median of {args.repetitions}")
    print(
        f"{'max pods':>8} {'collect ms':>10} {'/metrics ms':>11} {'bytes':>7} {'series':>6}"
        f" {'observe ms':>10} {'scrape peak KiB':>15} {'kept KiB':>8}"
    )
    for max_pods in (0, 50, args.pods):
        row = measure(args.pods, max_pods, args.repetitions)
        print(
            f"{max_pods:>8} {row['collect_ms']:>10.2f} {row['expose_ms']:>11.2f}"
            f" {row['bytes']:>7.0f} {row['series']:>6.0f} {row['observe_ms']:>10.3f}"
            f" {row['peak_kib']:>15.0f} {row['kept_kib']:>8.0f}"
        )


if __name__ == "__main__":
    main()
