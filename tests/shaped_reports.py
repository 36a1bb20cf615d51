"""NodeReports shaped as the agent writes them: pod rows with their run-queue histograms,
the node's run-queue and reclaim histograms, both windows, and GPUs on GPU nodes — what
tests and benchmarks of the signal plane publish (an empty report measures nothing)."""

from __future__ import annotations

import random

from interference import hist
from interference.index import interference_index
from interference.signals import (
    SIGNAL_FAMILIES,
    WINDOWS_S,
    GpuDevice,
    NodeMetrics,
    NodeReport,
    PodMetrics,
    WindowMetrics,
    window_name,
)


def histogram(rng: random.Random, samples: int, centre_slot: int) -> list[int]:
    """A log2 histogram of ``samples`` waits around ``2**centre_slot`` µs (a bell over the
    neighbouring slots, with some jitter)."""
    buckets = [0] * hist.MAX_SLOTS
    for offset, share in ((-3, 0.02), (-2, 0.1), (-1, 0.22), (0, 0.32), (1, 0.22), (2, 0.1)):
        slot = min(hist.MAX_SLOTS - 1, max(0, centre_slot + offset))
        buckets[slot] += int(samples * share * rng.uniform(0.7, 1.3))
    buckets[min(hist.MAX_SLOTS - 1, centre_slot + 3)] += rng.randint(0, 2)  # the tail
    return hist.trimmed(buckets)


def pod_row(rng: random.Random, namespace: str, name: str) -> PodMetrics:
    runq = histogram(rng, rng.randint(50, 400), rng.randint(3, 9))
    return PodMetrics(
        namespace=namespace,
        name=name,
        uid=f"{rng.getrandbits(128):032x}",
        qos=rng.choice(("guaranteed", "burstable", "besteffort")),
        cpu_ms_per_s=rng.uniform(1, 900),
        runq_wait_ms_per_s=rng.uniform(0, 40),
        idle_wakeup_ms_per_s=rng.uniform(0, 3),
        runq_p99_us=float(hist.percentile(runq, 0.99)),
        reclaim_stall_ms_per_s=rng.choice((0.0, 0.0, rng.uniform(0, 2))),
        throttled_ms_per_s=rng.choice((0.0, rng.uniform(0, 30))),
        runq_us=tuple(runq),
    )


def window(rng: random.Random, span_s: float, metrics: NodeMetrics) -> WindowMetrics:
    def moments(value: float) -> tuple[float, float, float]:
        return value, value * rng.uniform(1.0, 2.0), value * rng.uniform(0.0, 0.5)

    wait, reclaim, index = (
        moments(metrics.runq_wait_ratio),
        moments(metrics.reclaim_stall_ms_per_s),
        moments(metrics.interference_index),
    )
    return WindowMetrics(
        span_s=span_s,
        covered_s=span_s,
        intervals=int(span_s),
        runq_p99_us=metrics.runq_p99_us * rng.uniform(0.8, 1.2),
        runq_wait_ratio_mean=wait[0],
        runq_wait_ratio_max=wait[1],
        runq_wait_ratio_stddev=wait[2],
        reclaim_stall_ms_per_s_mean=reclaim[0],
        reclaim_stall_ms_per_s_max=reclaim[1],
        reclaim_stall_ms_per_s_stddev=reclaim[2],
        throttled_ms_per_s_mean=metrics.throttled_ms_per_s,
        throttled_ms_per_s_stddev=metrics.throttled_ms_per_s * 0.2,
        psi_cpu_some_mean=metrics.psi_cpu_some,
        psi_cpu_some_stddev=metrics.psi_cpu_some * 0.2,
        psi_mem_some_mean=metrics.psi_mem_some,
        psi_mem_some_stddev=metrics.psi_mem_some * 0.2,
        net_drops_per_s_mean=metrics.net_drops_per_s,
        net_drops_per_s_stddev=metrics.net_drops_per_s * 0.2,
        index_mean=index[0],
        index_max=index[1],
        index_stddev=index[2],
    )


def shaped_report(
    node: str, ts: float, pods: int = 30, seed: int | None = None, gpus: int | None = None
) -> NodeReport:
    """One node's report with ``pods`` pod rows; a quarter of the nodes (by seed) carry 8
    GPUs unless ``gpus`` says how many."""
    rng = random.Random(seed if seed is not None else node)
    runq = histogram(rng, rng.randint(2_000, 20_000), rng.randint(4, 12))
    signals = {
        "runq_p99_us": float(hist.percentile(runq, 0.99)),
        "runq_wait_ratio": rng.uniform(0.01, 1.2),
        "reclaim_stall_ms_per_s": rng.choice((0.0, rng.uniform(0, 8))),
        "throttled_ms_per_s": rng.uniform(0, 50),
        "psi_cpu_some": rng.uniform(0, 40),
        "psi_mem_some": rng.uniform(0, 5),
        "net_drops_per_s": rng.uniform(0, 20),
    }
    metrics = NodeMetrics(
        runq_p50_us=float(hist.percentile(runq, 0.5)),
        reclaim_events_per_s=rng.uniform(0, 5),
        psi_mem_full=signals["psi_mem_some"] / 2,
        idle_wakeup_ms_per_s=rng.uniform(0, 5),
        interference_index=interference_index(signals),
        **signals,
    )
    device_count = gpus if gpus is not None else (8 if rng.random() < 0.25 else 0)
    devices = [
        GpuDevice(
            i,
            f"GPU-{rng.getrandbits(64):016x}",
            "NVIDIA H100 80GB HBM3",
            81559.0,
            rng.uniform(0, 80000),
            rng.uniform(0, 100),
            rng.randint(0, 3),
        )
        for i in range(device_count)
    ]
    return NodeReport(
        node=node,
        ts=ts,
        interval_s=1.0,
        metrics=metrics,
        histograms={"runq_us": runq, "reclaim_us": histogram(rng, rng.randint(0, 50), 10)},
        pods=[pod_row(rng, f"team-{i % 7}", f"{node}-pod-{i}") for i in range(pods)],
        gpus=devices,
        measured=SIGNAL_FAMILIES,
        windows={window_name(span): window(rng, span, metrics) for span in WINDOWS_S},
    )
