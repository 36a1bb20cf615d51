"""``make demo``: the whole pipeline on this one machine, interference-aware vs blind.

1. a local redis-server on a free loopback port;
2. a :class:`~interference_demo.local_cluster.LocalCluster` from ``deploy/demo/``: two
   "nodes", each a cgroup partition with its own CPU (cpuset) — node-a already runs a
   BestEffort ``stress-ng`` batch pod, node-b an idle cache pod that requests 300m CPU;
3. one real ``interference-agent`` per node (``--cgroup-root`` = the node's partition);
4. two real scheduling loops over the same cluster: ``interference-scheduler`` with the
   default policy and Redis signals, and ``interference-blind`` with the same policy but no
   signals (the loop's documented interference-blind mode: tolerance filters off,
   interference weight 0), i.e. what a request-based scheduler such as LeastAllocated does;
5. the same latency-sensitive pod submitted to each, then its run-queue p99 measured by
   the agents on the node each scheduler chose, side by side, with the kernel's own
   ``/proc/PID/schedstat`` wait per run as a cross-check;
6. second act, interference that arrives after placement
   (:mod:`interference_demo.rebalance_act`): the batch pod gone, a latency workload owned by
   a ReplicaSet is placed on a quiet node, then a CPU antagonist on that node by the
   interference-blind loop; the rebalancer (enforcing) moves it, and its p99 before, during
   and after is printed.

Everything it starts is ended by PID and every cgroup removed, also on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import math
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.table import Table

from interference import hist, keys
from interference.decision import Decision
from interference_cli import views
from interference_cli.errors import CliError
from interference_cli.store import Store
from interference_cli.store_model import NodeRow
from interference_demo.lab import LabError, LocalLab
from interference_demo.local_cluster import LocalCluster, load_manifests, load_nodes
from interference_demo.rebalance_act import (
    ACT_REBALANCER,
    ACT_TOLERANCE_US,
    LocalReplicaSets,
    Workload,
    run_once,
    start_schedulers,
    tolerance_us,
    with_tolerance,
)
from scheduler.cycle.ports import ClusterError, K8sObject
from scheduler.entry.config import load_config

DEMO_DIR = Path(__file__).resolve().parent.parent / "deploy" / "demo"
AWARE_SCHEDULER = "interference-scheduler"
BLIND_SCHEDULER = "interference-blind"
LATENCY_POD = "latency-web"
NAMESPACE = "demo"
SIGNALS_TIMEOUT_S = 30.0
"""How long the scheduler's signal cache may take to load the agents' reports."""


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """Phases and inputs of one demo run."""

    nodes_file: Path = DEMO_DIR / "nodes.yaml"
    pods_dir: Path = DEMO_DIR / "pods"
    policy_file: Path = DEMO_DIR / "policies" / "interference-aware.yaml"
    """Scheduler config both loops use (the blind one without signals)."""
    partition: str = ""
    """Top-level cgroup name; empty means ``intf-demo-<pid>``."""
    warmup_s: float = 6.0
    """Seconds the agents report before the pods are submitted."""
    measure_s: float = 20.0
    """Seconds the latency pods' run-queue delay is measured after both are running."""
    linger_s: float = 0.0
    """Seconds to keep everything running at the end for the printed commands."""
    interval_s: float = 1.0
    """Agent report interval."""
    bind_timeout_s: float = 60.0
    """How long both schedulers get to bind their pod."""
    act2_before_s: float = 10.0
    """Second act: seconds the workload is measured before the antagonist arrives."""
    act2_give_up_s: float = 120.0
    """Second act: how long after the antagonist the move and recovery may take."""
    act2_after_s: float = 10.0
    """Second act: seconds measured after the replacement runs under its tolerance."""
    lab_cpus: frozenset[int] = frozenset({0})
    """CPUs the lab's own processes run on (Redis, the agents, both schedulers, this
    process): node-a's, so node-b's CPU holds only node-b's pods, as a machine of its own
    would. Empty leaves them wherever the kernel puts them."""


SHORT_WARMUP_S = 3.0
SHORT_MEASURE_S = 6.0
"""``--short`` (the test): shorter warm-up and measurement."""


class Stopped(Exception):
    """SIGTERM/SIGHUP arrived; unwind and clean up."""


@dataclass
class PodResult:
    """What one scheduler did with its copy of the latency pod, and what it cost."""

    pod: str
    node: str = ""
    runq_p99_us: list[float] = dataclasses.field(default_factory=list)
    """The agent's per-interval run-queue p99 of the pod."""
    runq_us: list[int] = dataclasses.field(default_factory=list)
    """The pod's run-queue histogram over the whole measurement: its intervals merged."""
    schedstat_start: tuple[int, int] = (0, 0)
    """Kernel ``run_delay`` ns and run count of the pod's processes at measurement start."""
    schedstat_end: tuple[int, int] = (0, 0)

    @property
    def median_p99_us(self) -> float:
        return statistics.median(self.runq_p99_us) if self.runq_p99_us else float("nan")

    @property
    def windowed_p99_us(self) -> float:
        """p99 over every wake-up of the measurement (not a statistic of per-second p99s)."""
        return hist.percentile(self.runq_us, 0.99) if hist.total(self.runq_us) else float("nan")

    @property
    def wait_per_run_us(self) -> float:
        delay = self.schedstat_end[0] - self.schedstat_start[0]
        runs = self.schedstat_end[1] - self.schedstat_start[1]
        return delay / runs / 1000 if runs > 0 else float("nan")


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 on success, 1 with one line on stderr when it cannot run."""
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="short phases (for tests)")
    parser.add_argument("--partition", default="", help="cgroup name (default intf-demo-PID)")
    parser.add_argument(
        "--linger", type=float, default=0.0, help="keep running S seconds at the end"
    )
    args = parser.parse_args(argv)
    settings = DemoSettings(partition=args.partition, linger_s=args.linger)
    if args.short:
        settings = dataclasses.replace(
            settings,
            warmup_s=SHORT_WARMUP_S,
            measure_s=SHORT_MEASURE_S,
            act2_before_s=5.0,
            act2_give_up_s=90.0,
            act2_after_s=3.0,
        )
    console = Console(width=None if sys.stdout.isatty() else 120)
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        run_demo(settings, console)
        return 0
    except (ClusterError, CliError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Stopped):
        print("demo: interrupted; everything it started has been stopped", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_demo(settings: DemoSettings, console: Console) -> None:
    """Build, run, measure and tear down the local cluster (cleanup in ``finally``)."""
    partition = settings.partition or f"intf-demo-{os.getpid()}"
    nodes = load_nodes(settings.nodes_file)
    manifests = load_manifests(sorted(settings.pods_dir.glob("*.yaml")))
    manifests.append(_blind_copy(_find(manifests, LATENCY_POD)))
    config = load_config(str(settings.policy_file))
    workload = Workload.of(
        f"{LATENCY_POD}-rs", with_tolerance(_find(manifests, LATENCY_POD), ACT_TOLERANCE_US)
    )
    lab = LocalLab(
        nodes,
        manifests,
        partition,
        interval_s=settings.interval_s,
        log=console.print,
        future_pods=workload.future_pods(),
    )
    evictor = LocalReplicaSets(lab, [workload])
    stop = threading.Event()
    threads: list[threading.Thread] = []
    host_cpus = os.sched_getaffinity(0)
    lab_cpus = settings.lab_cpus & host_cpus
    try:
        console.rule("local cluster")
        if lab_cpus and lab_cpus != host_cpus:
            # Inherited by Redis, the agents and the scheduling threads; pods take their
            # node's cpuset when they join it.
            os.sched_setaffinity(0, lab_cpus)
        lab.start()
        console.print(f"cgroup partition /{partition}, redis at {lab.url}")
        if lab_cpus and lab_cpus != host_cpus:
            console.print(
                f"the lab's own processes (Redis, agents, schedulers) run on CPU "
                f"{','.join(map(str, sorted(lab_cpus)))}, so the other nodes' CPUs hold only "
                "their pods, as separate machines would"
            )
        for node in nodes:
            console.print(f"  {node.name}: cpuset {node.cpus} — {node.description}")
        store = Store(lab.url)
        console.print("waiting for every agent's first report (they compile BPF programs)…")
        console.print(f"all agents reporting after {lab.await_reports():.1f} s")
        console.rule(f"live signals ({settings.warmup_s:g} s)")
        _watch_signals(lab, store, settings.warmup_s, console)

        console.rule("scheduling the latency-sensitive pod with both policies")
        console.print(
            f"{AWARE_SCHEDULER} reads the agents' signals; {BLIND_SCHEDULER} runs the same "
            "loop without any (it logs that it schedules interference-blind)"
        )
        # The rebalancer runs throughout; the first act's pods have no controller, so it
        # never moves them.
        threads = start_schedulers(lab, config, evictor, stop, ACT_REBALANCER).threads
        results = {
            AWARE_SCHEDULER: PodResult(LATENCY_POD),
            BLIND_SCHEDULER: PodResult(f"{LATENCY_POD}-blind"),
        }
        for result in results.values():
            result.node = _await_bound(lab.cluster, result.pod, settings.bind_timeout_s)
            decision = _await_decision(store, result.pod, settings.bind_timeout_s)
            console.print(views.decision_view(decision, time.time()))

        console.rule(f"measuring both copies of the pod ({settings.measure_s:g} s)")
        _measure(lab, store, results, settings.measure_s, console)
        _print_result(results, console)
        judged = _second_act(lab, workload, evictor, settings, console)
        _print_next_steps(lab.url, nodes[0].name, judged, console, settings.linger_s)
        if settings.linger_s > 0:
            time.sleep(settings.linger_s)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        lab.close()
        os.sched_setaffinity(0, host_cpus)
        console.print(f"cleaned up: every process stopped, cgroups under /{partition} removed")


# ---- setup -------------------------------------------------------------------------------


def _find(manifests: list[K8sObject], name: str) -> K8sObject:
    for manifest in manifests:
        if manifest["metadata"]["name"] == name:
            return manifest
    raise LabError(f"deploy/demo/pods has no pod named {name}")


def _blind_copy(manifest: K8sObject) -> K8sObject:
    """The same pod for the interference-blind scheduler, without its interference
    tolerance: a request-based scheduler does not read it, and a loop without signals
    holds a pod that has one until the signals come back (fail closed)."""
    blind = copy.deepcopy(manifest)
    blind["metadata"]["name"] = f"{manifest['metadata']['name']}-blind"
    blind["spec"]["schedulerName"] = BLIND_SCHEDULER
    annotations = blind["metadata"].get("annotations", {})
    for name in [a for a in annotations if a.startswith("interference.io/max-")]:
        del annotations[name]
    return blind


# ---- watching ----------------------------------------------------------------------------


def _watch_signals(lab: LocalLab, store: Store, seconds: float, console: Console) -> None:
    """Print each node's live signals once per second."""
    nodes = [n.name for n in lab.nodes]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        console.print(_signals_line(store, nodes))


def _signals_line(store: Store, nodes: list[str]) -> str:
    parts = []
    now = time.time()
    rows = {r.node: r for r in _rows_or_empty(store, now)}
    for node in nodes:
        row = rows.get(node)
        if row is None or row.metrics is None:
            parts.append(f"{node}: (no report yet)")
            continue
        m = row.metrics
        parts.append(
            f"{node}: index {m.interference_index:4.1f} runq p99 {m.runq_p99_us / 1000:6.1f} ms "
            f"wait {m.runq_wait_ratio:4.2f}"
        )
    return time.strftime("%H:%M:%S ") + " | ".join(parts)


def _rows_or_empty(store: Store, now: float) -> list[NodeRow]:
    try:
        return store.node_rows(now)
    except CliError:
        return []


def _await_bound(cluster: LocalCluster, pod: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        node = cluster.pod(NAMESPACE, pod)["spec"].get("nodeName")
        if node:
            return str(node)
        time.sleep(0.1)
    raise LabError(f"pod {NAMESPACE}/{pod} was not bound within {timeout_s:g} s")


def _await_decision(store: Store, pod: str, timeout_s: float) -> Decision:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return store.decision(NAMESPACE, pod)
        except CliError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _measure(
    lab: LocalLab,
    store: Store,
    results: Mapping[str, PodResult],
    seconds: float,
    console: Console,
) -> None:
    """Collect the agents' per-interval p99 of both pods and their kernel schedstat."""
    for result in results.values():
        result.schedstat_start = _schedstat(lab.cluster.pod_pids(NAMESPACE, result.pod))
    seen: dict[str, float] = {}
    end = time.monotonic() + seconds
    nodes = [n.name for n in lab.nodes]
    while time.monotonic() < end:
        time.sleep(1.0)
        console.print(_signals_line(store, nodes))
        for result in results.values():
            row = store.pod_row(result.node, NAMESPACE, result.pod)
            if row is not None and row.updated_at > seen.get(result.pod, 0.0):
                seen[result.pod] = row.updated_at
                result.runq_p99_us.append(row.metrics.runq_p99_us)
                result.runq_us = hist.add(result.runq_us, row.metrics.runq_us)
    for result in results.values():
        result.schedstat_end = _schedstat(lab.cluster.pod_pids(NAMESPACE, result.pod))


def _schedstat(pids: list[int]) -> tuple[int, int]:
    """Σ ``run_delay`` ns and Σ run count of the processes (``/proc/PID/schedstat``)."""
    delay = runs = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            _, wait_ns, count = Path(f"/proc/{pid}/schedstat").read_text().split()
            delay += int(wait_ns)
            runs += int(count)
    return delay, runs


# ---- report ------------------------------------------------------------------------------


def _print_result(results: Mapping[str, PodResult], console: Console) -> None:
    aware, blind = results[AWARE_SCHEDULER], results[BLIND_SCHEDULER]
    table = views.side_by_side(
        "latency-sensitive pod: interference-aware vs interference-blind",
        ("interference-aware", "interference-blind (LeastAllocated)"),
        [
            ("node chosen", aware.node, blind.node),
            (
                "pod run-queue p99 over the measurement, µs (agent, merged histogram)",
                f"{aware.windowed_p99_us:.0f}",
                f"{blind.windowed_p99_us:.0f}",
            ),
            ("wake-ups in it", str(hist.total(aware.runq_us)), str(hist.total(blind.runq_us))),
            (
                "pod run-queue p99, µs (agent, median of per-interval p99s)",
                f"{aware.median_p99_us:.0f}",
                f"{blind.median_p99_us:.0f}",
            ),
            ("intervals measured", str(len(aware.runq_p99_us)), str(len(blind.runq_p99_us))),
            (
                "mean wait per run, µs (kernel schedstat)",
                f"{aware.wait_per_run_us:.0f}",
                f"{blind.wait_per_run_us:.0f}",
            ),
        ],
    )
    console.print(table)
    if aware.node == blind.node:
        console.print("both schedulers chose the same node this time: no difference to show")
        return
    console.print(
        f"the blind choice ({blind.node}) gave the pod a "
        f"{_ratio(blind.windowed_p99_us, aware.windowed_p99_us)} higher run-queue p99 over "
        f"the measurement ({_ratio(blind.median_p99_us, aware.median_p99_us)} by the median "
        f"of per-second p99s) and a {_ratio(blind.wait_per_run_us, aware.wait_per_run_us)} "
        f"longer mean wait than the interference-aware choice ({aware.node})"
    )
    console.print(
        "(p99s are read from log2 histograms and interpolated within one power of two; a "
        "wake-up onto an idle CPU counts as a zero wait; the mean wait is exact)",
        style="dim",
    )


def _second_act(
    lab: LocalLab,
    workload: Workload,
    evictor: LocalReplicaSets,
    settings: DemoSettings,
    console: Console,
) -> str:
    """Interference after placement: the rebalancer moves the victim (module docstring).
    Returns the pod it judged."""
    console.rule("second act: interference that arrives after placement")
    for pod in ("batch-stress", LATENCY_POD, f"{LATENCY_POD}-blind"):
        lab.cluster.delete_pod(NAMESPACE, pod)
    console.print(
        f"the batch pod and the first act's pods are gone; {workload.name} (a ReplicaSet, "
        f"tolerance {tolerance_us(workload) / 1000:g} ms) goes to {AWARE_SCHEDULER}, then a "
        f"CPU antagonist to its node through {BLIND_SCHEDULER}; the rebalancer enforces"
    )
    result = run_once(
        lab,
        workload,
        evictor,
        before_s=settings.act2_before_s,
        give_up_s=settings.act2_give_up_s,
        after_s=settings.act2_after_s,
        log=console.print,
    )
    table = Table(title=f"{workload.name}: its run-queue p99 (agent, merged histograms)")
    for column in ("", "before", "during", "after"):
        table.add_column(column, justify="right" if column else "left")
    table.add_row(
        "node",
        result.first_node,
        result.first_node,
        result.second_node or "(not moved)",
    )
    table.add_row(
        "p99, µs",
        *(f"{v:.0f}" for v in (result.p99_before_us, result.p99_during_us, result.p99_after_us)),
    )
    console.print(table)
    if math.isnan(result.recovered_after_s):
        console.print(
            f"not back under its tolerance within {settings.act2_give_up_s:g} s of the "
            "antagonist (see the rebalancer's Events above for why)"
        )
    else:
        console.print(
            f"back under its tolerance {result.recovered_after_s:.0f} s after the antagonist "
            f"arrived (moved after {result.moved_at - result.antagonist_at:.0f} s)"
        )
    return result.first_pod


def _ratio(worse: float, better: float) -> str:
    """``worse / better`` as ``N.N×``; a floor of 1 µs keeps a zero from dividing."""
    if math.isnan(worse) or math.isnan(better):  # nothing measured
        return "n/a"
    return f"{worse / max(better, 1.0):.1f}×"


def _print_next_steps(
    url: str, node: str, judged_pod: str, console: Console, linger_s: float
) -> None:
    port = url.rsplit(":", 1)[1].split("/")[0]
    console.rule("look further")
    for command in (
        f"redis-cli -p {port} ZREVRANGE {keys.NODES_BY_INDEX} 0 -1 WITHSCORES",
        f"redis-cli -p {port} HGETALL {keys.node_key(node)}",
        f"redis-cli -p {port} SMEMBERS {keys.node_pods_key(node)}",
        f"redis-cli -p {port} HGETALL {keys.decision_key(NAMESPACE, LATENCY_POD)}",
        f"interference --redis-url {url} top --watch",
        f"interference --redis-url {url} node {node}",
        f"interference --redis-url {url} explain {NAMESPACE}/{LATENCY_POD}",
        # the second act: the rebalancer's look at the pod it moved, beside its placement
        f"redis-cli -p {port} HGETALL {keys.rebalance_decision_key(NAMESPACE, judged_pod)}",
        f"interference --redis-url {url} explain {NAMESPACE}/{judged_pod}",
    ):
        console.print(f"  {command}")
    if linger_s > 0:
        console.print(f"(everything keeps running for {linger_s:g} s; Ctrl-C ends it sooner)")
    else:
        console.print(
            "(this Redis stops with the demo; to try them while it runs: "
            ".venv/bin/python -m interference_demo.demo --linger 300)"
        )


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signal.Signals(signum).name)


if __name__ == "__main__":
    sys.exit(main())
