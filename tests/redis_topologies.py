"""Real Redis Sentinel and Redis Cluster set-ups for tests: redis-server processes on free
loopback ports, each ended by pid afterwards; and reports shaped as the agent writes them."""

from __future__ import annotations

import dataclasses
import random
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import redis

from interference import hist
from interference.score import interference_index
from interference.signals import (
    WINDOWS_S,
    GpuDevice,
    NodeMetrics,
    NodeReport,
    PodMetrics,
    WindowMetrics,
    window_name,
)
from node_agent.publisher import PublisherSettings, RedisPublisher
from tests.conftest import free_port

MEASURED = ("net", "psi", "reclaim", "runq", "throttle")
"""What a healthy agent with its BPF probes measures (``runq`` is the core family)."""


def agent_report(
    node: str, *, pods: int = 30, ts: float | None = None, level: float = 1.0, gpus: int = 0
) -> NodeReport:
    """A NodeReport shaped as the agent writes it: ``pods`` pod rows (plus the ``system``
    bucket) each with its run-queue histogram, node histograms, the 10 s and 60 s windows,
    ``gpus`` devices and a measured list that holds ``runq``. ``level`` scales the load
    (so nodes rank apart); values are reproducible per node name."""
    rng = random.Random(node)
    runq = [rng.randrange(200, 2000), rng.randrange(50, 800), rng.randrange(10, 200)]
    runq += [rng.randrange(0, 50) for _ in range(7)]
    runq = [int(c * level) for c in runq]
    reclaim = [rng.randrange(0, 20) for _ in range(9)]
    metrics = NodeMetrics(
        runq_p50_us=hist.percentile(runq, 0.5),
        runq_p99_us=hist.percentile(runq, 0.99),
        runq_wait_ratio=0.02 * level,
        reclaim_stall_ms_per_s=0.5 * level,
        reclaim_events_per_s=3.0,
        throttled_ms_per_s=4.0 * level,
        psi_cpu_some=5.0 * level,
        psi_mem_some=0.5 * level,
        net_drops_per_s=0.1,
    )
    signals = {f.name: getattr(metrics, f.name) for f in dataclasses.fields(metrics)}
    metrics = dataclasses.replace(
        metrics, interference_index=interference_index(signals, measured=MEASURED)
    )
    rows = [PodMetrics(namespace="", name="system", cpu_ms_per_s=120.0)]
    for i in range(pods):
        pod_runq = hist.trimmed([rng.randrange(0, 300) for _ in range(rng.randrange(3, 12))])
        rows.append(
            PodMetrics(
                namespace=f"team-{i % 4}",
                name=f"{node}-worker-{i}",
                uid=f"{rng.getrandbits(128):032x}",
                qos=("guaranteed", "burstable", "besteffort")[i % 3],
                cpu_ms_per_s=rng.uniform(5.0, 900.0),
                runq_wait_ms_per_s=rng.uniform(0.0, 40.0),
                idle_wakeup_ms_per_s=rng.uniform(0.0, 2.0),
                runq_p99_us=hist.percentile(pod_runq, 0.99),
                reclaim_stall_ms_per_s=rng.uniform(0.0, 1.0),
                throttled_ms_per_s=rng.uniform(0.0, 10.0),
                runq_us=tuple(pod_runq),
            )
        )
    windows = {
        window_name(span): WindowMetrics(
            span_s=span,
            covered_s=span,
            intervals=int(span),
            runq_p99_us=metrics.runq_p99_us * 1.1,
            runq_wait_ratio_mean=metrics.runq_wait_ratio,
            runq_wait_ratio_max=2 * metrics.runq_wait_ratio,
            runq_wait_ratio_stddev=0.3 * metrics.runq_wait_ratio,
            reclaim_stall_ms_per_s_mean=metrics.reclaim_stall_ms_per_s,
            reclaim_stall_ms_per_s_max=2 * metrics.reclaim_stall_ms_per_s,
            reclaim_stall_ms_per_s_stddev=0.2,
            throttled_ms_per_s_mean=metrics.throttled_ms_per_s,
            throttled_ms_per_s_stddev=1.0,
            psi_cpu_some_mean=metrics.psi_cpu_some,
            psi_cpu_some_stddev=1.0,
            psi_mem_some_mean=metrics.psi_mem_some,
            psi_mem_some_stddev=0.1,
            net_drops_per_s_mean=metrics.net_drops_per_s,
            net_drops_per_s_stddev=0.05,
            index_mean=metrics.interference_index,
            index_max=metrics.interference_index * 1.5,
            index_stddev=2.0,
        )
        for span in WINDOWS_S
    }
    devices = [
        GpuDevice(i, f"GPU-{node}-{i}", "NVIDIA H100 80GB HBM3", 81559.0, 2048.0, 35.0, 1)
        for i in range(gpus)
    ]
    return NodeReport(
        node=node,
        ts=time.time() if ts is None else ts,
        interval_s=1.0,
        metrics=metrics,
        histograms={"runq_us": runq, "reclaim_us": reclaim},
        pods=rows,
        gpus=devices,
        measured=MEASURED,
        windows=windows,
    )


@contextmanager
def redis_process(args: list[str], port: int) -> Iterator[None]:
    """A redis-server (or sentinel) this test owns, answering PING; ended by pid after."""
    proc = subprocess.Popen(
        ["redis-server", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                redis.Redis(port=port, socket_timeout=0.5).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"redis-server {args} did not start on port {port}")
                time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def sentinel(workdir: Path, master: str, master_port: int | None) -> Iterator[int]:
    """A Redis Sentinel monitoring ``master`` at ``127.0.0.1:master_port`` (None: it
    monitors nothing); yields its port."""
    port = free_port()
    conf = workdir / f"sentinel-{port}.conf"
    monitor = f"sentinel monitor {master} 127.0.0.1 {master_port} 1\n" if master_port else ""
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {workdir}\n{monitor}")
    with redis_process([str(conf), "--sentinel"], port):
        yield port


def sentinel_publisher(port: int, master: str) -> RedisPublisher:
    """The agent's publisher writing to the master named ``master`` by the Sentinel on
    ``port``."""
    settings = PublisherSettings(
        redis_url="redis://127.0.0.1/0", sentinels=(("127.0.0.1", port),), sentinel_master=master
    )
    return RedisPublisher(settings)


@contextmanager
def replica_of(workdir: Path, master_port: int) -> Iterator[int]:
    """A redis-server replicating ``127.0.0.1:master_port`` and in sync with it; yields
    its port."""
    port = free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), "--save", ""]
    args += ["--appendonly", "no", "--replicaof", "127.0.0.1", str(master_port)]
    with redis_process(args, port):
        deadline = time.monotonic() + 30
        while redis.Redis(port=port).info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced with its master"
            time.sleep(0.1)
        yield port


@contextmanager
def redis_cluster(workdir: Path, shards: int = 3) -> Iterator[list[int]]:
    """A Redis Cluster of ``shards`` primaries (no replicas) with every slot assigned;
    yields the nodes' ports."""
    ports = [free_port() for _ in range(shards)]
    # Explicit bus ports: the default (port + 10000) may be taken or out of range.
    bus_ports = [free_port() for _ in range(shards)]
    with ExitStack() as nodes:
        for port, bus in zip(ports, bus_ports, strict=True):
            nodes.enter_context(
                redis_process(
                    [
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-port",
                        str(bus),
                        "--cluster-config-file",
                        f"nodes-{port}.conf",
                        "--dir",
                        str(workdir),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ],
                    port,
                )
            )
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        # Every node must agree before a client reads the slot map from any one of them.
        deadline = time.monotonic() + 30
        for port in ports:
            while b"cluster_state:ok" not in redis.Redis(port=port).execute_command(
                "CLUSTER", "INFO"
            ):
                assert time.monotonic() < deadline, "the test cluster never became ready"
                time.sleep(0.2)
        yield ports
