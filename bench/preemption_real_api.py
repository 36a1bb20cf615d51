"""Preemption side by side with kube-scheduler on a real kube-apiserver: scheduler_perf's
``PreemptionBasic`` shape (issue 30).

One run, one control plane (etcd + kube-apiserver v1.36 on loopback, binaries found like
the e2e tests), ``--nodes`` fake nodes (no kubelet) of 4 CPU, 32Gi and 110 pods each, and
a PriorityClass of value 10. For each scheduler, in its own namespace:

1. ``--low-per-node`` low-priority pods (priority 0, 900m CPU and 500Mi each, as
   scheduler_perf's ``pod-low-priority.yaml``, ``terminationGracePeriodSeconds: 0``) are
   created already placed (``spec.nodeName``), the same number on every node: what either
   scheduler would have done with them, without timing it (scheduler_perf does not time
   them either). 4 per node use 3.6 of the 4 CPUs;
2. ``--high`` pods of 3 CPU and 500Mi with the PriorityClass are created while no scheduler
   runs; each fits on a node only once 3 of its 4 low-priority pods are gone;
3. the scheduler process is started and the bench waits until every high-priority pod is
   bound (or ``--timeout``). Nothing else deletes pods: the victims are what the scheduler
   deleted (with no kubelet and a grace period of 0, a deleted pod is gone at once).

Measured from outside, by one pod watch of the namespace:

* high-priority pods bound, and low-priority pods removed (the victims);
* pods/s — bound pods / (last bind − the scheduler's first visible act: a
  ``nominatedNodeName``, a victim's deletion or a bind), so neither side's start-up and
  initial list count;
* wall — from process start to the last bind; CPU per bound pod (``/proc/PID/stat``).

After a round its namespace's pods are deleted and the next round starts on empty nodes.
interference-scheduler runs as its CLI (leader election off, a real ``redis-server`` with
no signals: the interference filters pass every node); kube-scheduler with
``--kube-api-qps=5000 --kube-api-burst=5000`` and ``--leader-elect=false``. Both
schedulers' logs are scanned for rejected API writes (must be 0).

Run from the repository root (minutes; 2 cores shared with the API server and etcd)::

    .venv/bin/python bench/preemption_real_api.py [--nodes 500] [--high 500] [--runs 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.scheduler_real_api import REJECTED, Api, cpu_seconds, parallel  # noqa: E402
from interference_cli.redis_process import free_port, private_redis_server  # noqa: E402
from tests.e2e.control_plane import (  # noqa: E402
    AssetsMissing,
    ControlPlane,
    find_assets,
    terminate,
)

PRIORITY_CLASS = "bench-high-priority"
HIGH_PRIORITY = 10
Obj = dict[str, Any]


def create_nodes(api: Api, count: int) -> list[str]:
    """``count`` Ready nodes of 4 CPU, 32Gi and 110 pods (scheduler_perf's default node)."""
    names = [f"node-{i:05d}" for i in range(count)]
    create_ready_nodes(api, names, {"cpu": "4", "memory": "32Gi", "pods": "110"})
    return names


def create_ready_nodes(api: Api, names: list[str], allocatable: dict[str, str]) -> None:
    """Nodes without a kubelet, Ready, with ``allocatable`` as their capacity too."""

    def one(name: str) -> None:
        api.call("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name}}})  # fmt: skip
        status = {"status": {"capacity": allocatable, "allocatable": allocatable,
                             "conditions": [{"type": "Ready", "status": "True",
                                             "reason": "KubeletReady"}]}}  # fmt: skip
        api.call("PATCH", f"/api/v1/nodes/{name}/status", status, "application/merge-patch+json")

    parallel(lambda n=n: one(n) for n in names)  # type: ignore[misc]


def pod_body(name: str, scheduler: str, cpu: str, node: str = "", high: bool = False) -> Obj:
    spec: Obj = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "pause", "image": "registry.invalid/pause:3.10",
                        "ports": [{"containerPort": 80}],
                        "resources": {"requests": {"cpu": cpu, "memory": "500Mi"},
                                      "limits": {"cpu": cpu, "memory": "500Mi"}}}],
    }  # fmt: skip
    if node:
        spec["nodeName"] = node
    if high:
        spec["priorityClassName"] = PRIORITY_CLASS
    return {"metadata": {"name": name, "labels": {"tier": "high" if high else "low"}},
            "spec": spec}  # fmt: skip


class PodWatch:
    """From one watch of a namespace: when each high-priority pod was bound or nominated,
    when each low-priority pod was deleted."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane, self.namespace = plane, namespace
        self.bound: dict[str, float] = {}
        self.nominated: dict[str, float] = {}
        self.deleted: dict[str, float] = {}
        self.rv = ""
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self.ready.wait(30):
            raise RuntimeError(f"the watch of {namespace} did not open")

    def _run(self) -> None:
        context = self.plane.ssl_context()
        rv = ""
        while not self.stop.is_set():
            conn = http.client.HTTPSConnection(
                "127.0.0.1", self.plane.port, context=context, timeout=30
            )
            path = f"/api/v1/namespaces/{self.namespace}/pods?watch=true&timeoutSeconds=20"
            if rv:
                path += f"&resourceVersion={rv}"
            try:
                conn.request("GET", path, headers={
                    "Authorization": f"Bearer {self.plane.admin_token}"})  # fmt: skip
                answer = conn.getresponse()
                self.ready.set()
                for line in answer:
                    self._see(json.loads(line))
                    rv = self.rv or rv
            except (OSError, http.client.HTTPException, ValueError):
                time.sleep(0.1)
            finally:
                conn.close()

    def _see(self, event: Obj) -> None:
        if self.stop.is_set():
            return  # the bench's own clean-up deletes the rest
        obj = event["object"]
        if event["type"] == "ERROR":
            self.rv = ""
            return
        self.rv = obj["metadata"]["resourceVersion"]
        name, now = obj["metadata"]["name"], time.time()
        if obj["metadata"]["labels"].get("tier") == "low":
            if event["type"] == "DELETED":
                self.deleted.setdefault(name, now)
            return
        if obj["spec"].get("nodeName"):
            self.bound.setdefault(name, now)
        if (obj.get("status") or {}).get("nominatedNodeName"):
            self.nominated.setdefault(name, now)

    def close(self) -> None:
        self.stop.set()


@dataclass
class Result:
    scheduler: str
    high: int
    bound: int
    victims: int
    pods_per_s: float
    wall_s: float
    cpu_ms_per_pod: float
    rejected_writes: int
    counters: dict[str, float]
    """interference-scheduler's own counters at the end (attempts, preemptions)."""


COUNTERS = (
    "interference_scheduler_attempts_total",
    "interference_scheduler_preemptions_total",
    "interference_scheduler_preemption_victims_total",
    "interference_scheduler_preemption_call_errors_total",
)


def scrape(port: int) -> dict[str, float]:
    """Our scheduler's counters of :data:`COUNTERS`, summed over their labels ({} if none)."""
    if not port:
        return {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    found: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in COUNTERS:
            found[name] = found.get(name, 0.0) + float(line.rpartition(" ")[2])
    return found


def run_round(
    plane: ControlPlane, api: Api, name: str, nodes: list[str], low_per_node: int, high: int,
    argv: list[str], scheduler_name: str, log_path: Path, timeout_s: float, metrics_port: int = 0,
    run: int = 0,
) -> Result:  # fmt: skip
    namespace = f"bench-{name}-{run}"
    api.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    pods = f"/api/v1/namespaces/{namespace}/pods"
    low = [(f"low-{i:05d}", nodes[i % len(nodes)]) for i in range(len(nodes) * low_per_node)]
    parallel(lambda p=p: api.call("POST", pods, pod_body(p[0], scheduler_name, "900m", p[1]))  # type: ignore[misc]
             for p in low)  # fmt: skip
    parallel(lambda i=i: api.call("POST", pods, pod_body(f"high-{i:05d}", scheduler_name,  # type: ignore[misc]
                                                         "3", high=True))
             for i in range(high))  # fmt: skip
    watch = PodWatch(plane, namespace)
    with log_path.open("ab") as log:
        started = time.time()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    cpu = 0.0
    counters: dict[str, float] = {}
    try:
        deadline = started + timeout_s
        while len(watch.bound) < high and time.time() < deadline and proc.poll() is None:
            cpu = cpu_seconds(proc.pid)
            time.sleep(0.05)
        if proc.poll() is None:
            cpu = cpu_seconds(proc.pid)
        time.sleep(1.0)  # the last victims' deletions reach the watch
        counters = scrape(metrics_port)
    finally:
        terminate(proc, grace_s=30)
        watch.close()
    api.call("DELETE", f"{pods}?gracePeriodSeconds=0")
    deadline = time.time() + 120
    while api.call("GET", f"{pods}?limit=1")["items"] and time.time() < deadline:
        time.sleep(0.5)
    binds = sorted(watch.bound.values())
    acts = [*binds, *watch.nominated.values(), *watch.deleted.values()]
    window = binds[-1] - min(acts) if binds else 0.0
    text = log_path.read_text(errors="replace")
    return Result(
        scheduler=name,
        high=high,
        bound=len(binds),
        victims=len(watch.deleted),
        pods_per_s=len(binds) / window if window > 0 else 0.0,
        wall_s=(binds[-1] - started) if binds else float("nan"),
        cpu_ms_per_pod=1000 * cpu / max(1, len(binds)),
        rejected_writes=sum(1 for line in text.splitlines() if REJECTED.search(line)),
        counters=counters,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--low-per-node", type=int, default=4)
    parser.add_argument("--high", type=int, default=500, help="high-priority pods")
    parser.add_argument("--timeout", type=float, default=600.0, help="per round, seconds")
    parser.add_argument("--runs", type=int, default=1,
                        help="side-by-side runs; each odd run in the reverse order")  # fmt: skip
    parser.add_argument(
        "--schedulers", default="kube-scheduler,interference-scheduler",
        help="comma-separated, run in this order",
    )  # fmt: skip
    args = parser.parse_args()
    wanted = [s for s in args.schedulers.split(",") if s]
    if not set(wanted) <= {"kube-scheduler", "interference-scheduler"}:
        parser.error(f"--schedulers: {args.schedulers!r}: kube-scheduler, interference-scheduler")
    try:
        assets = find_assets()
    except AssetsMissing as exc:
        print(f"preemption_real_api: {exc}", file=sys.stderr)
        return 2
    if assets.kube_scheduler is None:
        print("preemption_real_api: no kube-scheduler next to kube-apiserver", file=sys.stderr)
        return 2
    # Nodes come up Ready without the not-ready taint no lifecycle controller would lift.
    plane = ControlPlane(
        assets, apiserver_args=["--disable-admission-plugins=TaintNodesByCondition"]
    )
    work = Path(tempfile.mkdtemp(prefix="bench-preemption-"))
    results: list[Result] = []
    try:
        plane.start()
        api = Api(plane)
        admin = plane.kubeconfig(work / "admin.kubeconfig", plane.admin_token, "admin")
        began = time.time()
        nodes = create_nodes(api, args.nodes)
        api.call("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
            "metadata": {"name": PRIORITY_CLASS}, "value": HIGH_PRIORITY})  # fmt: skip
        print(f"{args.nodes} nodes in {time.time() - began:.0f} s", flush=True)
        with private_redis_server(str(work)) as redis_url:
            config = work / "interference.yaml"
            metrics_port = free_port()
            config.write_text(json.dumps({
                "redis": {"url": redis_url},
                "leader_election": {"enabled": False},
                "http": {"port": metrics_port, "host": "127.0.0.1"},
            }))  # fmt: skip
            ours = [str(Path(sys.executable).parent / "interference-scheduler"),
                    "--config", str(config), "--kubeconfig", str(admin)]  # fmt: skip
            kube = [str(assets.kube_scheduler), f"--kubeconfig={admin}",
                    f"--authentication-kubeconfig={admin}", f"--authorization-kubeconfig={admin}",
                    "--authentication-skip-lookup=true", "--leader-elect=false",
                    "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
                    "--kube-api-qps=5000", "--kube-api-burst=5000", "--v=0"]  # fmt: skip
            rounds = {"kube-scheduler": (kube, "default-scheduler", 0),
                      "interference-scheduler": (ours, "interference-scheduler",
                                                 metrics_port)}  # fmt: skip
            for run in range(args.runs):
                for name in wanted if run % 2 == 0 else wanted[::-1]:
                    argv, scheduler_name, port = rounds[name]
                    log_path = work / f"{name}-{run}.log"
                    result = run_round(plane, api, name, nodes, args.low_per_node, args.high,
                                       argv, scheduler_name, log_path, args.timeout, port,
                                       run)  # fmt: skip
                    results.append(result)
                    print(f"  run {run} {name:<24} {result.bound}/{result.high} bound, "
                          f"{result.victims} victims, {result.pods_per_s:,.1f} pods/s",
                          flush=True)  # fmt: skip
                    if result.counters:
                        print("    " + ", ".join(f"{k.removeprefix('interference_scheduler_')} "
                                                 f"{v:,.0f}" for k, v in result.counters.items()),
                              flush=True)  # fmt: skip
                    if result.rejected_writes:
                        print(log_path.read_text(errors="replace")[-3000:])
    finally:
        survivors = plane.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    report(results, args)
    if survivors:
        print(f"processes left behind: {survivors}", file=sys.stderr)
        return 1
    return 0


def report(results: list[Result], args: argparse.Namespace) -> None:
    print(f"\nPreemptionBasic: {args.nodes} nodes (4 CPU, 32Gi, 110 pods), "
          f"{args.nodes * args.low_per_node} low-priority 900m pods, {args.high} pods of 3 CPU "
          f"at priority {HIGH_PRIORITY}; real kube-apiserver v1.36 on loopback, "
          f"{os.cpu_count()} CPUs shared by apiserver, etcd and the scheduler")  # fmt: skip
    print(f"{'scheduler':<24} {'bound':>11} {'victims':>8} {'pods/s':>8} {'wall s':>7} "
          f"{'CPU ms/pod':>11} {'rejected':>9}")  # fmt: skip
    for r in results:
        print(f"{r.scheduler:<24} {r.bound:>5}/{r.high:<5} {r.victims:>8} {r.pods_per_s:>8.1f} "
              f"{r.wall_s:>7.1f} {r.cpu_ms_per_pod:>11.1f} {r.rejected_writes:>9}")  # fmt: skip
    theirs = [r for r in results if r.scheduler == "kube-scheduler"]
    ours = [r for r in results if r.scheduler == "interference-scheduler"]
    ratios = sorted(
        o.pods_per_s / t.pods_per_s for o, t in zip(ours, theirs, strict=False) if t.pods_per_s
    )
    if ratios:
        median = statistics.median(ratios)
        print(f"interference-scheduler / kube-scheduler, per run: "
              f"{', '.join(f'{r:.2f}x' for r in ratios)}; median {median:.2f}x "
              f"(spread {ratios[0]:.2f}-{ratios[-1]:.2f}x; target >= 1.0x: "
              f"{'met' if median >= 1.0 else 'missed'}); victims "
              f"{[o.victims for o in ours]} vs {[t.victims for t in theirs]}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
