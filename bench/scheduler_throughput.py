"""Scheduler throughput: cycle decisions/s and end-to-end pods/s (issue 3, acceptance 6).

The cluster: 5,000 nodes (10 % GPU nodes with 8 GPUs, tainted; some dedicated nodes
tainted too; zone and instance-type labels), 50,000 running pods bound to them, 10,000
pending pods of ours — plain, GPU (toleration + GPU-model nodeSelector), node affinity
(In/NotIn/Exists), latency-sensitive (interference tolerance + host port), preferred pod
affinity and anti-affinity, topology spread over zones (``DoNotSchedule``), required pod
affinity to a running service's zone and pod anti-affinity on the hostname; 2 % of the
running pods carry preferred anti-affinity — and fresh interference signals for every
node as production has them: each node's scheduling record (a production-shaped report's)
written to a real ``redis-server`` every second by replay processes standing for the
agents, and read by the scheduler's own follower polling in this process
(:func:`followed_signals`).

1. **Cycle**: the real :class:`~scheduler.cycle.cycle.SchedulingCycle` over the real node
   table (filled by the real cache); every pending pod is decided and assumed. Prints decisions/s
   counted over ``SchedulingCycle.schedule`` alone and over the whole attempt (with assume).
2. **End to end**: the real :class:`~scheduler.standalone.loop.SchedulingLoop` (queue, cache,
   cycle, binder threads) binds every pending pod through the real
   :class:`~scheduler.adapters.kubernetes.KubernetesCluster` (the ``kubernetes`` client)
   against a local HTTP emulator (a minimal stdlib asyncio HTTP/1.1 server in its own
   process on 127.0.0.1, answering Binding POSTs, 409 on a second bind, Event POSTs and
   status PATCHes), and writes decision records to a real ``redis-server`` through
   ``QueuedDecisionSink`` over ``RedisDecisionSink``, as the scheduler does. The informer
   side comes from an in-memory cluster that mirrors each accepted Binding as a watch
   event, so assumed pods are confirmed as in production. Prints pods/s from the moment the
   cache is synced until the last pod is bound, and how long until every Event and
   decision record was written too.
3. **Loop, in-memory** (unless ``--skip-in-memory``): the same loop over the in-memory
   cluster, no network I/O: the scheduler's own ceiling.

Beside them: kube-scheduler's scheduler_perf thresholds (SchedulingBasic, 5,000 nodes:
680–810 pods/s; extended resources: 180 pods/s) and the bench process's RSS.
Targets: cycle ≥ 5,000 decisions/s with every filter on; end to end ≥ 680 pods/s.

Run from the repository root (``make bench`` runs it):
``.venv/bin/python bench/scheduler_throughput.py [--nodes 5000] [--running 50000]
[--pending 10000] [--bind-workers 16] [--profile] [--skip-cycle] [--skip-in-memory]
[--json]``. ``--json`` adds one last line to stdout: the headline figures as a JSON object
(``bench/throughput_versus.py`` reads it). With :data:`TURNS_ENV` set (by
``throughput_versus.py --turns``) it runs one phase in turns with another driver instead
(:class:`Turns`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import multiprocessing
import os
import pstats
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client
from prometheus_client import CollectorRegistry

from bench.signal_replay import start_replay
from interference.decision import Decision
from interference_cli.redis_process import RedisServerError, private_redis_server
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.kubernetes import KubernetesCluster
from scheduler.adapters.memory import InMemoryCluster
from scheduler.adapters.object_builders import node_object, pod_object
from scheduler.adapters.queued_decision_sink import QueuedDecisionSink
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.api.objects import ANNOTATION_MAX_INDEX, ANNOTATION_MAX_RUNQ_P99_US, HOSTNAME_LABEL
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.ports import (
    Cluster,
    ClusterHandler,
    DecisionSink,
    DecisionTracer,
    K8sObject,
    PodRef,
    SignalSource,
)
from scheduler.cycle.queue import SchedulingQueue
from scheduler.cycle.settings import CycleSettings
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.signals.table import NodeTable
from scheduler.standalone.loop import LoopSettings, SchedulingLoop

SCHEDULER = "interference-scheduler"
ZONES = ("zone-a", "zone-b", "zone-c", "zone-d", "zone-e")
CPU_TYPES = ("m6i.16xlarge", "c6i.16xlarge", "r6i.16xlarge")
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
DEDICATED_TAINT = {"key": "dedicated", "value": "batch", "effect": "NoSchedule"}
KUBE_SCHEDULER_BASIC = (680.0, 810.0)
KUBE_SCHEDULER_EXTENDED = 180.0
CYCLE_TARGET = 5000.0
CHUNK = 1000
"""Decisions per chunk for the median/best cycle rates (the machine's load varies)."""
END_TO_END_TARGET = 680.0


# ---- the cluster ------------------------------------------------------------------------


def build_cluster(nodes: int, running: int, pending: int, seed: int) -> InMemoryCluster:
    """Nodes, running pods and pending pods as API JSON (see the module docstring)."""
    rng = random.Random(seed)
    cluster = InMemoryCluster()
    gpu_nodes = [f"node-{i:05d}" for i in range(nodes) if i % 10 == 0]
    for i in range(nodes):
        name = f"node-{i:05d}"
        labels = {"topology.kubernetes.io/zone": ZONES[i % len(ZONES)]}
        if i % 10 == 0:
            labels |= {
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "nvidia.com/gpu.product": GPU_PRODUCT,
                "nvidia.com/gpu.memory": "81559",
            }
            cluster.add_node(
                node_object(
                    name, cpu="192", memory="2048Gi", gpus=8, labels=labels, taints=[GPU_TAINT]
                )
            )
            continue
        labels["node.kubernetes.io/instance-type"] = CPU_TYPES[i % len(CPU_TYPES)]
        taints = [DEDICATED_TAINT] if i % 20 == 1 else []
        cluster.add_node(node_object(name, cpu="64", memory="256Gi", labels=labels, taints=taints))
    for j in range(running):
        node = f"node-{j % nodes:05d}"
        gpus = 1 if node in gpu_nodes and rng.random() < 0.2 else 0
        app = f"svc-{j % 500}"
        # 2 % of the running pods carry preferred anti-affinity: placed pods' terms score too
        affinity = preferred_anti_affinity(app, 10) if j % 50 == 0 else None
        cluster.add_pod(
            pod_object(
                f"running-{j}",
                namespace=f"team-{j % 40}",
                cpu=f"{rng.choice((250, 500, 1000, 2000))}m",
                memory=f"{rng.choice((256, 512, 1024, 2048))}Mi",
                gpus=gpus,
                node_name=node,
                scheduler_name="default-scheduler",
                labels={"app": app},
                affinity=affinity,
            )
        )
    for k, obj in enumerate(pending_pods(pending, rng)):
        obj["metadata"]["creationTimestamp"] = (
            f"2026-01-01T00:{k // 600 % 60:02d}:{k // 10 % 60:02d}Z"
        )
        cluster.add_pod(obj)
    return cluster


def pending_pods(count: int, rng: random.Random) -> Iterator[K8sObject]:
    """45 % plain, 15 % GPU, 10 % node affinity, 10 % latency-sensitive, 5 % preferred pod
    affinity and anti-affinity (prefer a running service's zone in any namespace, avoid
    the hosts of their own group), 5 % required pod affinity (the zone of a running
    service, any namespace), 5 % zone topology spread (groups of 100 pods, maxSkew 1,
    DoNotSchedule), 5 % anti-affinity."""
    for k in range(count):
        name = f"pending-{k}"
        namespace = f"team-{k % 40}"
        cpu = f"{rng.choice((100, 250, 500, 1000))}m"
        kind = k % 20
        if kind < 9:
            yield pod_object(name, namespace=namespace, cpu=cpu, memory="512Mi")
        elif kind < 10:
            group = f"cache-{k // 100}"
            affinity = preferred_anti_affinity(group, 100)
            affinity["podAffinity"] = {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 50,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {"app": f"svc-{k % 500}"}},
                            "namespaceSelector": {},
                            "topologyKey": "topology.kubernetes.io/zone",
                        },
                    }
                ]
            }
            yield pod_object(
                name,
                namespace=namespace,
                cpu=cpu,
                memory="512Mi",
                labels={"app": group},
                affinity=affinity,
            )
        elif kind < 11:
            term = {
                "labelSelector": {"matchLabels": {"app": f"svc-{k % 500}"}},
                "namespaceSelector": {},
                "topologyKey": "topology.kubernetes.io/zone",
            }
            affinity = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
            yield pod_object(name, namespace=namespace, cpu=cpu, memory="512Mi", affinity=affinity)
        elif kind < 12:
            group = f"web-{k // 2000}"
            obj = pod_object(name, namespace="web", cpu=cpu, memory="512Mi", labels={"app": group})
            obj["spec"]["topologySpreadConstraints"] = [
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": group}},
                }
            ]
            yield obj
        elif kind < 15:
            yield pod_object(
                name,
                namespace=namespace,
                cpu="4",
                memory="32Gi",
                gpus=rng.choice((1, 1, 2)),
                tolerations=[
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                ],
                node_selector={"nvidia.com/gpu.product": GPU_PRODUCT},
            )
        elif kind < 17:
            yield pod_object(
                name,
                namespace=namespace,
                cpu=cpu,
                memory="1Gi",
                tolerations=[{"key": "dedicated", "operator": "Equal", "value": "batch"}],
                affinity=node_affinity(ZONES[k % 5], ZONES[(k + 1) % 5]),
            )
        elif kind < 19:
            ports = [{"containerPort": 8080, "hostPort": 20000 + k % 1000, "protocol": "TCP"}]
            obj = pod_object(
                name,
                namespace=namespace,
                cpu=cpu,
                memory="256Mi",
                annotations={ANNOTATION_MAX_RUNQ_P99_US: "2500", ANNOTATION_MAX_INDEX: "85"},
            )
            obj["spec"]["containers"][0]["ports"] = ports
            yield obj
        else:
            group = f"spread-{k // 100}"
            yield pod_object(
                name,
                namespace=namespace,
                cpu=cpu,
                memory="256Mi",
                labels={"app": group},
                affinity={
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "labelSelector": {"matchLabels": {"app": group}},
                                "topologyKey": "kubernetes.io/hostname",
                            }
                        ]
                    }
                },
            )


def preferred_anti_affinity(app: str, weight: int) -> dict[str, Any]:
    """Prefer hosts without another pod of ``app`` (a score, never a filter)."""
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOSTNAME_LABEL}
    preferred = [{"weight": weight, "podAffinityTerm": term}]
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}


def node_affinity(zone_a: str, zone_b: str) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/zone",
                                "operator": "In",
                                "values": [zone_a, zone_b],
                            },
                            {
                                "key": "node.kubernetes.io/instance-type",
                                "operator": "NotIn",
                                "values": ["r6i.16xlarge"],
                            },
                            {"key": "nvidia.com/gpu.product", "operator": "DoesNotExist"},
                        ]
                    }
                ]
            }
        }
    }


REPORT_PODS = 30
"""Pod rows in each node's report: a busy node's, as the signal plane bench replays."""


@contextlib.contextmanager
def followed_signals(nodes: list[str], replayers: int = 2) -> Iterator[RedisSignalCache]:
    """Fresh signals for every node, reaching the scheduler as they do in production:
    ``replayers`` processes write every node's scheduling record to a real ``redis-server``
    once a second (:mod:`bench.signal_replay`: a production-shaped report's record, the
    bytes 5,000 agents' publishers send), and the scheduler's own follower polls them from
    a thread of this process. Yields the follower once it holds a record of every node."""
    with redis_server() as url:
        settings = RedisSettings(url=url)
        stop_replay = multiprocessing.Event()
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        processes, _sent = start_replay(port, nodes, REPORT_PODS, "records", replayers, stop_replay)
        follower = RedisSignalCache(
            connect(settings, {}), settings, SignalMetrics(CollectorRegistry()), lambda: nodes
        )
        stop = threading.Event()
        polling = threading.Thread(target=follower.run, args=(stop,), daemon=True)
        polling.start()
        try:
            deadline = time.monotonic() + 60
            while len(follower.snapshot()) < len(nodes) or not follower.healthy():
                if time.monotonic() > deadline:
                    raise RuntimeError("the follower did not read every node's record in 60 s")
                time.sleep(0.1)
            yield follower
        finally:
            stop.set()
            stop_replay.set()
            polling.join(10)
            for process in processes:
                process.join(10)


def rss_mib() -> float:
    """Resident memory of this process now, MiB."""
    match = re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


# ---- in turns with another driver ------------------------------------------------------


TURNS_ENV = "THROUGHPUT_TURNS"
"""Set by ``bench/throughput_versus.py --turns``: ``DIRECTORY:DECISIONS:PHASE`` (see
:class:`Turns`); the driver then runs that phase only (``cycle``, ``loop`` in memory, or
``end-to-end``)."""


class Turns:
    """One phase in turns with another driver (``throughput_versus.py --turns``).

    Before each turn of ``decisions`` decisions the driver reads one byte from the FIFO
    ``DIRECTORY/go``; after it, it writes ``decisions wall_s cpu_s`` to ``DIRECTORY/done``.
    The comparer lets the two drivers take turns, so the host's noise, which drifts over
    seconds on a shared VM, falls on both sides of each pair of turns alike, and both sides
    decide the same pods in the same order, turn by turn.
    """

    def __init__(self, spec: str) -> None:
        directory, decisions, _ = spec.rsplit(":", 2)
        self.decisions = int(decisions)
        self._go = open(f"{directory}/go", "rb", buffering=0)  # noqa: SIM115 - held all run
        self._done = open(f"{directory}/done", "w", buffering=1)  # noqa: SIM115

    @staticmethod
    def phase() -> str:
        """The phase :data:`TURNS_ENV` asks for, ``""`` when it is not set."""
        return os.environ.get(TURNS_ENV, "").rpartition(":")[2]

    @classmethod
    def from_env(cls, phase: str) -> Turns | None:
        return cls(os.environ[TURNS_ENV]) if cls.phase() == phase else None

    def wait(self) -> None:
        """Until the comparer says go."""
        if not self._go.read(1):
            raise SystemExit("throughput_versus went away")

    def report(self, decisions: int, wall_s: float, cpu_s: float) -> None:
        self._done.write(f"{decisions} {wall_s!r} {cpu_s!r}\n")


class CycleTurns:
    """The cycle phase's turns: the decisions' own wall and thread CPU time."""

    def __init__(self, turns: Turns) -> None:
        self._turns = turns
        self._taken = 0
        self._wall_s = self._cpu_s = 0.0
        turns.wait()

    def count(self, wall_s: float, cpu_s: float) -> None:
        """One decision done; at the end of a turn, report it and wait for the next go."""
        self._taken += 1
        self._wall_s += wall_s
        self._cpu_s += cpu_s
        if self._taken == self._turns.decisions:
            self.close()
            self._turns.wait()

    def close(self) -> None:
        if self._taken:
            self._turns.report(self._taken, self._wall_s, self._cpu_s)
        self._taken, self._wall_s, self._cpu_s = 0, 0.0, 0.0


def loop_in_turns(loop: SchedulingLoop, sink: DecisionSink, turns: Turns) -> None:
    """Make ``loop`` schedule in turns: a turn starts at the comparer's go and ends when its
    pods' binds, Events and records are written, timed by the wall clock and the process's
    CPU time (every thread's)."""
    run_once = loop.run_once
    state = {"in_turn": 0, "wall": 0.0, "cpu": 0.0}

    def process_cpu_s() -> float:
        times = os.times()
        return times.user + times.system

    def start_turn() -> None:
        turns.wait()
        state["in_turn"], state["wall"], state["cpu"] = 0, time.perf_counter(), process_cpu_s()

    def run_once_in_turns(wait: bool = False) -> bool:
        if not state["wall"] and loop.cache.synced():
            start_turn()
        attempted = run_once(wait)
        if attempted and state["wall"]:
            state["in_turn"] += 1
            if state["in_turn"] == turns.decisions:
                loop.flush(60)
                if isinstance(sink, QueuedDecisionSink):
                    sink.flush(60)
                wall_s = time.perf_counter() - state["wall"]
                turns.report(turns.decisions, wall_s, process_cpu_s() - state["cpu"])
                start_turn()
        return attempted

    loop.run_once = run_once_in_turns  # type: ignore[method-assign]


# ---- 1. cycle --------------------------------------------------------------------------


@dataclass
class CycleFigures:
    decisions: int
    scheduled: int
    cycle_s: float
    attempt_s: float
    chunk_rates: list[float]
    """Cycle decisions/s of each run of ``CHUNK`` consecutive decisions."""
    sync_s: float
    cache_rss_mib: float
    cycle_cpu_s: float = 0.0
    """The scheduling thread's CPU time inside the decisions: unlike the wall clock, not
    lengthened while other processes hold the CPU."""


def bench_cycle(cluster: InMemoryCluster, signals: SignalSource, profile: bool) -> CycleFigures:
    metrics = SchedulerMetrics(CollectorRegistry())
    queue = SchedulingQueue()
    before = rss_mib()
    started = time.perf_counter()
    cache = ClusterCache(NodeTable(), queue, metrics, SCHEDULER)
    cycle = SchedulingCycle(CycleSettings(), seed=1)
    cycle.register_lookups(cache.table)  # as the loop does: kept current while listing
    cluster.informer(cache).sync()
    sync_s = time.perf_counter() - started
    cache_rss = rss_mib() - before
    keys = []
    while (key := queue.pop()) is not None:
        keys.append(key)
    profiler = cProfile.Profile() if profile else None
    cycle_s = attempt_s = chunk_s = cycle_cpu_s = 0.0
    chunk_rates = []
    scheduled = 0
    in_turns = Turns.from_env("cycle")
    turns = CycleTurns(in_turns) if in_turns else None
    for done, key in enumerate(keys, start=1):
        pod = cache.pending_pod(key)
        assert pod is not None
        t0 = time.perf_counter()
        now = time.time()
        cache.table.set_signals(signals.snapshot())
        t1 = time.perf_counter()
        if profiler:
            profiler.enable()
        c1 = time.thread_time()
        result = cycle.schedule(pod, cache.table, now)
        c2 = time.thread_time()
        cycle_cpu_s += c2 - c1
        if profiler:
            profiler.disable()
        t2 = time.perf_counter()
        if turns:
            turns.count(t2 - t1, c2 - c1)
        if result.node is not None:
            cache.assume(pod, result.node)
            scheduled += 1
        t3 = time.perf_counter()
        cycle_s += t2 - t1
        attempt_s += t3 - t0
        chunk_s += t2 - t1
        if done % CHUNK == 0:
            chunk_rates.append(CHUNK / chunk_s)
            chunk_s = 0.0
    if turns:
        turns.close()
    if profiler:
        print("\nSchedulingCycle.schedule profile (top 25 by cumulative time):")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    return CycleFigures(
        len(keys), scheduled, cycle_s, attempt_s, chunk_rates, sync_s, cache_rss, cycle_cpu_s
    )


# ---- 2. end to end ----------------------------------------------------------------------


class _ApiEmulator:
    """The API calls the scheduler writes, answered the way the API server does: Binding
    (201, or 409 when the pod is bound already), Events (201), pods/status (200).

    A minimal HTTP/1.1 keep-alive server on asyncio streams, so the emulator's own cost
    stays small next to the scheduler's (``http.server`` parses headers with the email
    package, which costs more per request than the scheduler spends on a pod).
    """

    BINDING = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/binding")
    EVENTS = re.compile(r"/apis/events\.k8s\.io/v1/namespaces/[^/]+/events")
    STATUS = re.compile(r"/api/v1/namespaces/[^/]+/pods/[^/]+/status")

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.counts = {"binding": 0, "conflict": 0, "event": 0, "status": 0}

    def answer(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        if method == "POST" and (binding := self.BINDING.fullmatch(path)):
            key = f"{binding.group(1)}/{binding.group(2)}"
            if key in self.bound:
                self.counts["conflict"] += 1
                return 409, {
                    "kind": "Status",
                    "status": "Failure",
                    "reason": "Conflict",
                    "code": 409,
                }
            self.bound.add(key)
            self.counts["binding"] += 1
            return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
        if method == "POST" and self.EVENTS.fullmatch(path):
            self.counts["event"] += 1
            return 201, {"kind": "Event", "apiVersion": "events.k8s.io/v1"}
        if method == "PATCH" and self.STATUS.fullmatch(path):
            self.counts["status"] += 1
            return 200, {"kind": "Pod", "apiVersion": "v1"}
        if method == "GET" and path == "/stats":
            return 200, dict(self.counts)
        return 404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, _, headers = head.partition(b"\r\n")
                method, target, _ = request_line.decode("latin-1").split(" ", 2)
                length = 0
                for line in headers.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if length:
                    await reader.readexactly(length)
                status, body = self.answer(method, target.split("?", 1)[0])
                data = json.dumps(body).encode()
                writer.write(
                    b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                    % (status, len(data))
                    + data
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed its keep-alive connection
        finally:
            writer.close()


def _serve_emulator(port_out: Any) -> None:
    async def main() -> None:
        emulator = _ApiEmulator()
        server = await asyncio.start_server(emulator.serve, "127.0.0.1", 0)
        port_out.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


@contextlib.contextmanager
def http_emulator() -> Iterator[str]:
    """The Binding/Event emulator in its own process; yields its base URL."""
    context = multiprocessing.get_context("spawn")
    port_out = context.Queue()
    process = context.Process(target=_serve_emulator, args=(port_out,), daemon=True)
    process.start()
    try:
        yield f"http://127.0.0.1:{port_out.get(timeout=60)}"
    finally:
        process.terminate()
        process.join(10)


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server on a free loopback port; yields its URL."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-redis-") as workdir,
        private_redis_server(workdir) as url,
    ):
        yield url


class HttpBoundCluster:
    """Writes over HTTP with the real client; informers from the in-memory cluster, which
    mirrors every accepted Binding as the watch event the API server would send."""

    def __init__(self, memory: InMemoryCluster, http: KubernetesCluster) -> None:
        self._memory = memory
        self._http = http

    def run_informers(self, handler: ClusterHandler, stop: threading.Event) -> None:
        self._memory.run_informers(handler, stop)

    def bind(self, pod: PodRef, node: str) -> None:
        self._http.bind(pod, node)
        self._memory.bind(pod, node)

    def record_event(self, pod: PodRef, event_type: str, reason: str, message: str) -> None:
        self._http.record_event(pod, event_type, reason, message)

    def set_unschedulable(self, pod: PodRef, message: str) -> None:
        self._http.set_unschedulable(pod, message)


@dataclass
class LoopRun:
    """One run of the real scheduling loop until every pending pod is bound."""

    pods: int
    bound: int
    seconds: float
    """From the cache being synced to the last bind."""
    drained_s: float
    """From the cache being synced to the last Event and decision record written."""
    user_s: float
    """User CPU time of this process (all threads) from sync until every write is done."""
    system_s: float
    sync_s: float
    """From starting the loop to the cache being synced (initial list)."""
    peak_rss_mib: float

    @property
    def rate(self) -> float:
        return self.bound / self.seconds

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.system_s


@dataclass
class EndToEndFigures:
    run: LoopRun
    emulator: dict[str, int]
    decisions: int


class ListSink:
    """Decision records kept in a list (the in-memory run)."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def write(self, decision: Decision) -> None:
        self.decisions.append(decision)


def run_loop(
    cluster: Cluster,
    memory: InMemoryCluster,
    signals: SignalSource,
    sink: DecisionSink,
    pending: int,
    workers: int,
    tracer: DecisionTracer | None = None,
) -> LoopRun:
    """Run the real SchedulingLoop over ``cluster`` until ``pending`` pods are bound."""
    leading = threading.Event()
    leading.set()
    loop = SchedulingLoop(
        cluster,
        signals,
        sink,
        CycleSettings(),
        LoopSettings(scheduler_name=SCHEDULER, bind_workers=workers),
        leading,
        SchedulerMetrics(CollectorRegistry()),
        seed=2,
        tracer=tracer,
    )
    turns = Turns.from_env("loop") or Turns.from_env("end-to-end")
    if turns:
        loop_in_turns(loop, sink, turns)
    stop = threading.Event()
    started = time.perf_counter()
    runner = threading.Thread(target=loop.run, args=(stop,), name="scheduler")
    runner.start()
    peak = rss_mib()
    try:
        while not loop.cache.synced():
            time.sleep(0.01)
        synced = time.perf_counter()
        cpu_at_sync = os.times()
        progress = (0, synced)
        while len(memory.binds) < pending:
            time.sleep(0.01)
            peak = max(peak, rss_mib())
            bound = len(memory.binds)
            if bound != progress[0]:
                progress = (bound, time.perf_counter())
            elif time.perf_counter() - progress[1] > 30:
                print(f"stalled: {pending - bound} pods not bound after 30 s", flush=True)
                break
        loop.flush(60)
        if isinstance(sink, QueuedDecisionSink):
            sink.flush(60)
        drained = time.perf_counter()
        cpu_now = os.times()
    finally:
        stop.set()
        runner.join(60)
    return LoopRun(
        pods=pending,
        bound=len(memory.binds),
        seconds=progress[1] - synced,
        drained_s=drained - synced,
        user_s=cpu_now.user - cpu_at_sync.user,
        system_s=cpu_now.system - cpu_at_sync.system,
        sync_s=synced - started,
        peak_rss_mib=peak,
    )


def bench_in_memory(
    memory: InMemoryCluster, signals: SignalSource, pending: int, workers: int
) -> LoopRun:
    """The loop alone: binds, Events and decisions stay in memory (no HTTP, no Redis)."""
    return run_loop(memory, memory, signals, ListSink(), pending, workers)


def bench_end_to_end(
    memory: InMemoryCluster,
    signals: SignalSource,
    pending: int,
    workers: int,
    tracer: DecisionTracer | None = None,
) -> EndToEndFigures:
    with http_emulator() as url, redis_server() as redis_url:
        configuration = client.Configuration()
        configuration.host = url
        configuration.connection_pool_maxsize = workers * 2
        http = KubernetesCluster(client.ApiClient(configuration))
        settings = RedisSettings(url=redis_url)
        store = connect(settings, {})
        sink = QueuedDecisionSink(
            RedisDecisionSink(store, settings, SignalMetrics(CollectorRegistry())), settings
        )
        run = run_loop(
            HttpBoundCluster(memory, http), memory, signals, sink, pending, workers, tracer
        )
        sink.close(60)
        stats = http_stats(url)
        decisions = sum(1 for _ in store.client().scan_iter(match="intf:decision:*", count=1000))
        store.close()
    return EndToEndFigures(run, stats, decisions)


def http_stats(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/stats", timeout=30) as response:
        stats: dict[str, int] = json.loads(response.read())
    return stats


# ---- report -----------------------------------------------------------------------------


def verdict(value: float, target: float) -> str:
    return "met" if value >= target else "MISSED"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--running", type=int, default=50_000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--bind-workers", type=int, default=16)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--profile", action="store_true", help="cProfile SchedulingCycle.schedule")
    parser.add_argument("--skip-end-to-end", action="store_true")
    parser.add_argument("--skip-cycle", action="store_true")
    parser.add_argument(
        "--skip-in-memory", action="store_true", help="end to end only, without the in-memory loop"
    )
    parser.add_argument(
        "--json", action="store_true", help="end with one line: the headline figures as JSON"
    )
    args = parser.parse_args(argv)
    turns_phase = Turns.phase()
    if turns_phase:  # that phase alone
        args.skip_cycle = turns_phase != "cycle"
        args.skip_end_to_end = turns_phase != "end-to-end"
        args.skip_in_memory = True

    print(
        f"cluster: {args.nodes} nodes, {args.running} running pods, {args.pending} pending "
        "(45% plain, 15% GPU, 10% node affinity, 10% interference tolerance + host port, "
        "5% preferred pod affinity + anti-affinity, 5% required pod affinity, 5% zone "
        "topology spread, 5% required pod anti-affinity; 2% of running pods with preferred "
        "anti-affinity); every node's scheduling record written to Redis each second, followed"
    )
    t0 = time.perf_counter()
    cluster = build_cluster(args.nodes, args.running, args.pending, args.seed)
    node_names = [f"node-{i:05d}" for i in range(args.nodes)]
    exit_stack = contextlib.ExitStack()
    signals = exit_stack.enter_context(followed_signals(node_names))
    try:
        print(f"built in {time.perf_counter() - t0:.1f}s; process RSS {rss_mib():.0f} MiB\n")

        rows: list[tuple[str, str, str]] = []
        figures: dict[str, float] = {}
        if not args.skip_cycle:
            cycle = bench_cycle(cluster, signals, args.profile)
            cycle_rate = cycle.decisions / cycle.cycle_s
            attempt_rate = cycle.decisions / cycle.attempt_s
            cpu_rate = cycle.decisions / cycle.cycle_cpu_s
            figures |= {
                "cycle_decisions_per_s": cycle_rate,
                "cycle_decisions_per_cpu_s": cpu_rate,
                "attempt_decisions_per_s": attempt_rate,
            }
            rows += [
                (
                    "cycle: SchedulingCycle.schedule only",
                    f"{cycle_rate:,.0f} decisions/s",
                    f"target ≥ {CYCLE_TARGET:,.0f}: {verdict(cycle_rate, CYCLE_TARGET)}",
                ),
                ("cycle: per CPU-second", f"{cpu_rate:,.0f} decisions/s", "scheduling thread"),
                ("cycle: + signals refresh + assume", f"{attempt_rate:,.0f} decisions/s", ""),
                ("cycle: pods placed", f"{cycle.scheduled}/{cycle.decisions}", ""),
                (
                    "cache: initial list → table",
                    f"{cycle.sync_s:.1f} s",
                    f"+{cycle.cache_rss_mib:.0f} MiB RSS",
                ),
            ]
            if cycle.chunk_rates:
                rows.insert(
                    1,
                    (
                        f"cycle: {CHUNK}-decision chunks",
                        f"median {statistics.median(cycle.chunk_rates):,.0f}/s",
                        f"best {max(cycle.chunk_rates):,.0f}/s, worst "
                        f"{min(cycle.chunk_rates):,.0f}/s (the machine's load varies)",
                    ),
                )

        def run_in_memory(fresh: InMemoryCluster | None = None) -> None:
            local = bench_in_memory(
                fresh or build_cluster(args.nodes, args.running, args.pending, args.seed),
                signals,
                args.pending,
                args.bind_workers,
            )
            figures["in_memory_pods_per_s"] = local.rate
            rows.append(
                (
                    "loop, in-memory cluster (no HTTP)",
                    f"{local.rate:,.0f} pods/s",
                    f"{local.bound / local.cpu_s:,.0f} pods per CPU-second",
                )
            )

        if turns_phase == "loop":
            run_in_memory(cluster)
        if not args.skip_end_to_end:
            try:
                e2e = bench_end_to_end(cluster, signals, args.pending, args.bind_workers)
            except RedisServerError as exc:
                sys.exit(str(exc))
            run = e2e.run
            if not args.skip_in_memory:
                run_in_memory()
            figures |= {
                "end_to_end_pods_per_s": run.rate,
                "end_to_end_pods_per_cpu_s": run.bound / run.cpu_s,
            }
            rows += [
                (
                    "end to end: bound over HTTP",
                    f"{run.rate:,.0f} pods/s",
                    f"target ≥ {END_TO_END_TARGET:,.0f}: {verdict(run.rate, END_TO_END_TARGET)}; "
                    f"{run.bound}/{run.pods} in {run.seconds:.1f} s",
                ),
                (
                    "end to end: pods per CPU-second",
                    f"{run.bound / run.cpu_s:,.0f} pods/s",
                    f"scheduler process used {run.cpu_s / run.drained_s:.2f} cores until every "
                    f"write was done, {run.drained_s:.1f} s after sync "
                    f"({run.system_s / run.cpu_s:.0%} of it in the kernel)",
                ),
                (
                    "kube-scheduler scheduler_perf",
                    f"{KUBE_SCHEDULER_BASIC[0]:.0f}–{KUBE_SCHEDULER_BASIC[1]:.0f} pods/s",
                    "SchedulingBasic, 5,000 nodes",
                ),
                (
                    "kube-scheduler scheduler_perf",
                    f"{KUBE_SCHEDULER_EXTENDED:.0f} pods/s",
                    "extended resources",
                ),
                (
                    "ratio to SchedulingBasic (low end)",
                    f"{run.rate / KUBE_SCHEDULER_BASIC[0]:.2f}×",
                    "",
                ),
                (
                    "emulator saw",
                    f"{e2e.emulator['binding']} binds",
                    f"{e2e.emulator['conflict']} conflicts, {e2e.emulator['event']} Events, "
                    f"{e2e.emulator['status']} status patches",
                ),
                ("decision records in Redis", f"{e2e.decisions}", ""),
                ("scheduler start → cache synced", f"{run.sync_s:.1f} s", "list of nodes + pods"),
                (
                    "peak RSS during end to end",
                    f"{run.peak_rss_mib:.0f} MiB",
                    "whole bench process",
                ),
            ]
    finally:
        exit_stack.close()
    rows.append(
        ("bench process RSS now", f"{rss_mib():.0f} MiB", "includes the in-memory clusters")
    )
    width = max(len(r[0]) for r in rows)
    for label, value, note in rows:
        print(f"{label:<{width}}  {value:>22}  {note}")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
