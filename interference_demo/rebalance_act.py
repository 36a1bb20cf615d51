"""Interference that arrives after placement, on this machine: the second act of
``make demo`` and the runs of ``bench/rebalance.py`` (issue 17).

On a :class:`~interference_demo.lab.LocalLab` (Redis, cgroup-partition nodes, one real
agent per node), a latency pod owned by a ReplicaSet is placed by the interference-aware
scheduling loop on a quiet node; then a CPU antagonist is placed on that same node by the
interference-blind loop (what a request-based scheduler does: the antagonist requests
nothing). The real :class:`scheduler.rebalancing.rebalancer.Rebalancer`, enforcing, reads the pod's
own rows from the agents' report streams, sees its run-queue p99 break its tolerance,
finds a node that passes every filter and evicts it; :class:`LocalReplicaSets` stands in
for the ReplicaSet controller and the kubelet (the pod's processes stopped, a replacement
created), and the aware loop places the replacement away from the node it left.

Every figure comes from the agents' per-interval pod rows (the pod's own run-queue
histogram), merged over each phase.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from prometheus_client import CollectorRegistry

from interference import hist, keys
from interference.codec import PayloadError, decode_report
from interference.signals import PodMetrics
from interference_demo.lab import LabError, LocalLab
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.node_reports import RedisNodeReportSource
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.cycle.ports import K8sObject, NodeSignals, PodRef, SignalSource
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.entry.config import SchedulerConfig
from scheduler.rebalancing.metrics import RebalanceMetrics
from scheduler.rebalancing.mover import RebalanceAction
from scheduler.rebalancing.ports import EvictionAnswer, EvictionStatus
from scheduler.rebalancing.rebalance import RebalancerSettings
from scheduler.rebalancing.rebalancer import Rebalancer
from scheduler.standalone.loop import SchedulingLoop

AWARE = "interference-scheduler"
BLIND = "interference-blind"
NAMESPACE = "demo"
TOLERANCE_ANNOTATION = "interference.io/max-runq-p99-us"
SIGNALS_TIMEOUT_S = 30.0
ACT_TOLERANCE_US = 3000.0
"""The act's workload tolerates 3 ms of run-queue p99, not latency.yaml's 6 ms: on a
tick-based kernel a CPU hog delays a 100 Hz waker by at most about one tick (HZ=250:
4 ms), whatever the number of hogs or their cgroups (measured on this VM: quiet 0.3 ms,
4 hogs in one cgroup 3.3 ms, 4 in four cgroups 4.0 ms, 16 in one 3.0 ms). A tolerance
above that tick is never broken by CPU contention, so the act would have nothing to move;
3 ms lies between the quiet node (0.1–1.9 ms in the act) and the contended one (4–6 ms)."""

ACT_REBALANCER = RebalancerSettings(
    mode="enforce",
    interval_s=2.0,
    window="10s",
    sustained_for_s=6.0,
    max_per_node=10,
    max_per_namespace=10,
    max_per_cluster=10,
)
"""Enforcing, and quicker than the defaults (60 s window, 30 s sustained, a look every
5 s) so a run fits in a minute; the per-node and per-namespace rate limits raised so
several runs fit in one lab (they are tested on the real apiserver, tests/e2e); the
per-workload cool-down (600 s) is the default."""


@dataclass
class Workload:
    """A ReplicaSet of one replica: its pod template and the replicas it will create
    (names and UIDs chosen up front, so the agents' pods file names them)."""

    name: str
    template: K8sObject
    replicas: list[tuple[str, str]]
    current: int = 0
    moves: list[tuple[float, str, str]] = field(default_factory=list)
    """``(time, evicted pod, node it left)``."""

    @classmethod
    def of(cls, name: str, template: K8sObject, replicas: int = 4) -> Workload:
        return cls(name, template, [(f"{name}-{i}", str(uuid.uuid4())) for i in range(replicas)])

    @property
    def pod_name(self) -> str:
        return self.replicas[self.current][0]

    @property
    def pod_uid(self) -> str:
        return self.replicas[self.current][1]

    def manifest(self) -> K8sObject:
        """The current replica as the ReplicaSet controller would create it."""
        pod = copy.deepcopy(self.template)
        name, uid = self.replicas[self.current]
        meta = pod.setdefault("metadata", {})
        meta.update(name=name, uid=uid, namespace=NAMESPACE)
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": self.name,
             "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, self.name)), "controller": True}
        ]  # fmt: skip
        pod["spec"]["schedulerName"] = AWARE
        pod["spec"].pop("nodeName", None)
        return pod

    def future_pods(self) -> dict[str, str]:
        return {uid: f"{NAMESPACE}/{name}" for name, uid in self.replicas}


class LocalReplicaSets:
    """:class:`scheduler.rebalancing.ports.Evictor` of the local cluster: the kubelet stops the
    evicted pod, the ReplicaSet controller creates the next replica (Pending)."""

    def __init__(self, lab: LocalLab, workloads: list[Workload]) -> None:
        self._lab = lab
        self._by_pod = workloads
        self.evictions: list[tuple[float, str]] = []

    def evict(self, pod: PodRef, dry_run: bool) -> EvictionAnswer:
        workload = next((w for w in self._by_pod if w.pod_name == pod.name), None)
        if workload is None or workload.current + 1 >= len(workload.replicas):
            return EvictionAnswer(EvictionStatus.BLOCKED, "no replacement replica left")
        if dry_run:
            return EvictionAnswer(EvictionStatus.EVICTED)
        node = self._lab.cluster.pod(pod.namespace, pod.name)["spec"].get("nodeName", "")
        self._lab.cluster.delete_pod(pod.namespace, pod.name)
        now = time.time()
        workload.moves.append((now, pod.name, node))
        self.evictions.append((now, f"{pod.namespace}/{pod.name}"))
        workload.current += 1
        self._lab.cluster.add_pod(workload.manifest())
        return EvictionAnswer(EvictionStatus.EVICTED)


def antagonist(name: str, node: str, cpus: int = 4) -> K8sObject:
    """A BestEffort CPU hog for the interference-blind loop, which places it on ``node``
    (it requests nothing, so by requests every node has room)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": str(uuid.uuid4())},
        "spec": {
            "schedulerName": BLIND,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "stress",
                    "image": "stress-ng",
                    "command": [
                        "stress-ng",
                        "--cpu",
                        str(cpus),
                        "--cpu-method",
                        "int64",
                        "--quiet",
                    ],
                }
            ],
        },
    }


class _NoSignals:
    def snapshot(self) -> dict[str, NodeSignals]:
        return {}

    def healthy(self) -> bool:
        return False


@dataclass
class Schedulers:
    """The aware and blind loops, the signal cache and the rebalancer, in threads."""

    aware: SchedulingLoop
    rebalancer: Rebalancer
    registry: CollectorRegistry
    threads: list[threading.Thread]
    actions: list[RebalanceAction] = field(default_factory=list)


def start_schedulers(
    lab: LocalLab,
    config: SchedulerConfig,
    evictor: LocalReplicaSets,
    stop: threading.Event,
    rebalancer_settings: RebalancerSettings,
) -> Schedulers:
    """Signal cache, aware loop, blind loop and rebalancer, each in a daemon thread."""
    redis_settings = RedisSettings(
        url=lab.url,
        index_references=config.redis.index_references,
        max_agent_interval_s=config.redis.max_agent_interval_s,
    )
    client = connect(redis_settings)
    metrics = SignalMetrics(CollectorRegistry())
    nodes = tuple(n.name for n in lab.nodes)
    cache = RedisSignalCache(client, redis_settings, metrics, lambda: nodes)
    sink = RedisDecisionSink(client, redis_settings, metrics)
    rebalancing_records = RedisDecisionSink(
        client, redis_settings, metrics, record_key=keys.rebalance_decision_key
    )
    threads = [threading.Thread(target=cache.run, args=(stop,), name="signals", daemon=True)]
    threads[0].start()
    deadline = time.monotonic() + SIGNALS_TIMEOUT_S
    while not (cache.healthy() and all(map(cache.snapshot().has_record, nodes))):
        if time.monotonic() > deadline:
            raise LabError(f"the scheduler's signal cache did not load {lab.url} in time")
        time.sleep(0.1)
    leading = threading.Event()
    leading.set()
    loops: dict[str, SchedulingLoop] = {}
    sources: list[tuple[str, SignalSource]] = [(AWARE, cache), (BLIND, _NoSignals())]
    for name, signals in sources:
        loops[name] = SchedulingLoop(
            lab.cluster,
            signals,
            sink,
            config.cycle,
            dataclasses.replace(config.loop, scheduler_name=name),
            leading,
            SchedulerMetrics(CollectorRegistry()),
        )
        threads.append(threading.Thread(target=loops[name].run, args=(stop,), name=name))
    registry = CollectorRegistry()
    rebalancer = Rebalancer(
        loops[AWARE].cache,
        cache,
        RedisNodeReportSource(client),
        evictor,
        lab.cluster,
        rebalancing_records,
        config.cycle,
        rebalancer_settings,
        AWARE,
        RebalanceMetrics(registry),
    )
    found = Schedulers(loops[AWARE], rebalancer, registry, threads)

    def rebalance() -> None:
        while not stop.wait(rebalancer_settings.interval_s):
            if loops[AWARE].cache.synced():
                found.actions.extend(rebalancer.step())

    threads.append(threading.Thread(target=rebalance, name="rebalancer"))
    for thread in threads[1:]:
        thread.daemon = True
        thread.start()
    return found


@dataclass
class PodRows:
    """A pod's per-interval rows from its node's report stream, by report time."""

    rows: dict[float, PodMetrics] = field(default_factory=dict)

    def p99_us(self, since: float, until: float) -> float:
        """p99 of the merged run-queue histograms of the rows in ``[since, until)``."""
        merged: list[int] = []
        for ts, row in self.rows.items():
            if since <= ts < until:
                merged = hist.add(merged, list(row.runq_us))
        return hist.percentile(merged, 0.99) if hist.total(merged) else float("nan")

    def intervals(self, since: float, until: float) -> int:
        return sum(1 for ts in self.rows if since <= ts < until)


def read_rows(url: str, nodes: list[str], uids: set[str], into: dict[str, PodRows]) -> None:
    """Add the rows of the pods ``uids`` from every node's report stream."""
    client = redis.Redis.from_url(url, socket_timeout=2.0)
    try:
        for node in nodes:
            for _, fields in client.xrevrange(
                keys.reports_key(node), count=keys.NODE_REPORTS_MAXLEN
            ):
                try:
                    report = decode_report(fields[keys.REPORTS_FIELD.encode()])
                except (PayloadError, KeyError):
                    continue
                for row in report.pods:
                    if row.uid in uids:
                        into.setdefault(row.uid, PodRows()).rows[report.ts] = row
    finally:
        client.close()


@dataclass
class RunResult:
    """One run: the workload's p99 before, during and after, and when it recovered."""

    first_node: str
    first_pod: str = ""
    """The workload's pod the antagonist met (the one the rebalancer judged)."""
    antagonist_at: float = float("nan")
    moved_at: float = float("nan")
    second_node: str = ""
    recovered_after_s: float = float("nan")
    """Antagonist placed → the end of the first 10 s of the replacement's own rows under
    the tolerance (:func:`first_window_under`)."""
    p99_before_us: float = float("nan")
    p99_during_us: float = float("nan")
    p99_after_us: float = float("nan")
    evictions: int = 0


RECOVERY_WINDOW_S = 10.0
"""Recovered: a full window this long of the replacement's own rows under its tolerance."""


def first_window_under(rows: PodRows, limit_us: float) -> float | None:
    """The end of the first :data:`RECOVERY_WINDOW_S` of ``rows`` (at least 80 % of its
    intervals present) whose merged p99 is at most ``limit_us``; None while there is none."""
    times = sorted(rows.rows)
    for end in times:
        start = end - RECOVERY_WINDOW_S
        if start < times[0] - 0.5:
            continue  # not yet a full window of the replacement's rows
        span = (start + 1e-6, end + 1e-6)
        if rows.intervals(*span) >= 0.8 * RECOVERY_WINDOW_S and rows.p99_us(*span) <= limit_us:
            return end
    return None


def await_bound(lab: LocalLab, name: str, timeout_s: float, sleep: Callable[[float], None]) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        node = lab.cluster.pod(NAMESPACE, name)["spec"].get("nodeName")
        if node:
            return str(node)
        sleep(0.2)
    raise LabError(f"pod {NAMESPACE}/{name} was not bound within {timeout_s:g} s")


def with_tolerance(template: K8sObject, us: float) -> K8sObject:
    """A copy of ``template`` whose run-queue tolerance is ``us``."""
    changed = copy.deepcopy(template)
    changed["metadata"].setdefault("annotations", {})[TOLERANCE_ANNOTATION] = f"{us:.0f}"
    return changed


def tolerance_us(workload: Workload) -> float:
    return float(workload.template["metadata"]["annotations"][TOLERANCE_ANNOTATION])


def run_once(
    lab: LocalLab,
    workload: Workload,
    evictor: LocalReplicaSets,
    *,
    before_s: float,
    give_up_s: float,
    after_s: float,
    log: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> RunResult:
    """Place the workload, measure it quiet, add an antagonist on its node, wait for the
    rebalancer to move it and for the replacement to run under its tolerance; the
    antagonist is removed at the end."""
    nodes = [n.name for n in lab.nodes]
    lab.cluster.add_pod(workload.manifest())
    first_uid = workload.pod_uid
    first = await_bound(lab, workload.pod_name, 60.0, sleep)
    result = RunResult(first_node=first, first_pod=workload.pod_name)
    log(f"{workload.pod_name} placed on {first} by {AWARE}; measuring it quiet ({before_s:g} s)")
    uids = {uid for _, uid in workload.replicas}
    rows: dict[str, PodRows] = {}
    start = time.time()
    sleep(before_s)
    hog = antagonist(f"{workload.name}-antagonist", first)
    lab.cluster.add_pod(hog)
    await_bound(lab, hog["metadata"]["name"], 60.0, sleep)
    result.antagonist_at = time.time()
    log(f"antagonist {hog['metadata']['name']} placed on {first} by {BLIND} (4 CPU hogs)")
    evictions_before = len(evictor.evictions)
    limit = tolerance_us(workload)
    try:
        while time.time() - result.antagonist_at < give_up_s:
            sleep(1.0)
            read_rows(lab.url, nodes, uids, rows)
            if workload.moves and not result.second_node:
                result.moved_at = workload.moves[-1][0]
                result.second_node = lab.cluster.pod(NAMESPACE, workload.pod_name)["spec"].get(
                    "nodeName", ""
                )
                if result.second_node:
                    after = result.moved_at - result.antagonist_at
                    when = (
                        f"{after:.0f} s after the antagonist"
                        if after >= 0
                        else "before the antagonist arrived (its node was not quiet enough)"
                    )
                    log(
                        f"rebalancer evicted {workload.moves[-1][1]} {when}; "
                        f"{workload.pod_name} placed on {result.second_node}"
                    )
            if result.second_node:
                recovered = first_window_under(rows.get(workload.pod_uid, PodRows()), limit)
                if recovered is not None:
                    result.recovered_after_s = recovered - result.antagonist_at
                    break
        sleep(after_s)
        read_rows(lab.url, nodes, uids, rows)
    finally:
        lab.cluster.delete_pod(NAMESPACE, hog["metadata"]["name"])
    first_rows = rows.get(first_uid, PodRows())
    moved = result.moved_at if result.second_node else float("inf")
    result.p99_before_us = first_rows.p99_us(start + 2.0, result.antagonist_at)
    result.p99_during_us = first_rows.p99_us(result.antagonist_at, moved)
    if result.second_node:
        replacement = rows.get(workload.pod_uid, PodRows())
        result.p99_after_us = replacement.p99_us(moved, float("inf"))
    result.evictions = len(evictor.evictions) - evictions_before
    return result
