"""interference-scheduler vs kube-scheduler on a real kube-apiserver, side by side.

One run, one control plane (etcd + kube-apiserver v1.36 on loopback, binaries found like
the e2e tests: ``KUBEBUILDER_ASSETS`` else ``../shared/k8s``): ``--nodes`` nodes (a third
with 8 ``nvidia.com/gpu``), then for each pod kind (plain: 100m CPU; GPU: one
``nvidia.com/gpu``) and each scheduler: ``--pods`` pods are created in a fresh namespace
while no scheduler runs, then the scheduler process is started and the bench waits until
every pod is bound; the round's pods are deleted after it, so every round finds the same
free capacity. Measured from outside the process:

* drain rate — pods / (last bind − first bind), seen through a pod watch;
* wall — first pod bound counted from process start (list + cache sync);
* the same for interference-scheduler while every node's agent publishes its report each
  second (``interference-signals``, the production load): ``--publishers`` processes
  replay production-shaped reports (``--signal-pods`` pods with histograms, node
  histograms, windows) as the agent's own publishing code writes them, encoded ahead
  with a fresh record timestamp at each send (:mod:`bench.signal_replay`);
* CPU per bound pod — the process's user+system CPU (``/proc/PID/stat``) from start to
  the last bind, divided by the pods; and from the first to the last bind (the drain
  alone, without start-up and the initial list).

interference-scheduler runs as its CLI (``interference-scheduler``, leader election off,
a real ``redis-server`` with no signals, so its interference filters pass every node);
kube-scheduler with ``--kube-api-qps=5000 --kube-api-burst=5000`` (its default 50 QPS
would be what is measured) and ``--leader-elect=false``. Both write a ``Scheduled`` Event
per pod. Our scheduler's log is scanned for rejected API writes (must be 0).

Run from the repository root (takes several minutes; 2 cores are shared with the API
server and etcd, so the figures are what this machine gives, ± 20 %)::

    .venv/bin/python bench/scheduler_real_api.py [--nodes 5000] [--pods 5000] [--kinds plain,gpu]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


from bench.signal_replay import MODES, start_replay  # noqa: E402
from interference_cli.redis_process import free_port, private_redis_server  # noqa: E402
from tests.e2e.control_plane import (  # noqa: E402
    AssetsMissing,
    ControlPlane,
    find_assets,
    terminate,
)

TICKS = os.sysconf("SC_CLK_TCK")
REJECTED = re.compile(r"could not write|failed with HTTP|refused|Traceback|binding .* failed")


class Api:
    """Keep-alive HTTPS to the apiserver, one connection per thread (bulk set-up)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.context = plane.ssl_context()
        self.local = threading.local()

    def call(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        for attempt in range(5):
            conn: http.client.HTTPSConnection | None = getattr(self.local, "conn", None)
            if conn is None:
                conn = http.client.HTTPSConnection(
                    "127.0.0.1", self.plane.port, context=self.context, timeout=60
                )
                self.local.conn = conn
            headers = {"Authorization": f"Bearer {self.plane.admin_token}"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = content_type or "application/json"
            try:
                conn.request(method, path, data, headers)
                answer = conn.getresponse()
                text = answer.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                time.sleep(0.2 * (attempt + 1))
                continue
            if answer.status == 429 or answer.status >= 500:
                time.sleep(0.2 * (attempt + 1))
                continue
            if answer.status >= 300:
                raise RuntimeError(f"{method} {path}: HTTP {answer.status}: {text[:300]!r}")
            return json.loads(text) if text else None
        raise RuntimeError(f"{method} {path}: the API server kept failing")


def parallel(work: Iterable[Callable[[], object]], threads: int = 12) -> None:
    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(task) for task in work]:
            future.result()


def create_nodes(api: Api, count: int, start: int = 0) -> None:
    """Nodes ``node-{start:05d}`` … up to ``start + count`` (a third with 8 GPUs)."""

    def one(i: int) -> None:
        name = f"node-{i:05d}"
        gpus = 8 if i % 3 == 0 else 0
        api.call("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name}}})  # fmt: skip
        allocatable = {"cpu": "32", "memory": "128Gi", "pods": "110"}
        if gpus:
            allocatable["nvidia.com/gpu"] = str(gpus)
        status = {"status": {"capacity": allocatable, "allocatable": allocatable,
                             "conditions": [{"type": "Ready", "status": "True",
                                             "reason": "KubeletReady"}]}}  # fmt: skip
        api.call("PATCH", f"/api/v1/nodes/{name}/status", status, "application/merge-patch+json")

    parallel(lambda i=i: one(i) for i in range(start, start + count))  # type: ignore[misc]


def create_pods(api: Api, namespace: str, count: int, scheduler: str, gpu: bool) -> None:
    api.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    requests: dict[str, str] = {"cpu": "100m", "memory": "64Mi"}
    limits: dict[str, str] = {}
    if gpu:
        requests["nvidia.com/gpu"] = "1"
        limits["nvidia.com/gpu"] = "1"

    def one(i: int) -> None:
        body = {"metadata": {"name": f"p-{i:05d}"}, "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "c", "image": "registry.invalid/pause:1",
                            "resources": {"requests": requests, "limits": limits}}]}}  # fmt: skip
        api.call("POST", f"/api/v1/namespaces/{namespace}/pods", body)

    parallel(lambda i=i: one(i) for i in range(count))  # type: ignore[misc]


class BindWatch:
    """Times at which pods of a namespace got a node, from one pod watch."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane, self.namespace = plane, namespace
        self.bound: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

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
                for line in answer:
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        rv = ""
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if obj["spec"].get("nodeName"):
                        self.bound.setdefault(obj["metadata"]["name"], time.time())
            except (OSError, http.client.HTTPException, ValueError):
                time.sleep(0.1)
            finally:
                conn.close()

    def close(self) -> None:
        self.stop.set()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class Result:
    scheduler: str
    kind: str
    pods: int
    bound: int
    drain_pods_per_s: float
    first_bind_s: float
    cpu_ms_per_pod: float
    drain_cpu_ms_per_pod: float
    rejected_writes: int


def run_round(
    plane: ControlPlane, api: Api, name: str, kind: str, pods: int, argv: list[str],
    scheduler_name: str, log_path: Path, timeout_s: float,
) -> Result:  # fmt: skip
    namespace = f"{name}-{kind}"
    create_pods(api, namespace, pods, scheduler_name, gpu=kind == "gpu")
    watch = BindWatch(plane, namespace)
    time.sleep(1.0)  # the watch is open before the scheduler starts
    with log_path.open("ab") as log:
        started = time.time()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    cpu_at_end = cpu_at_first = 0.0
    try:
        deadline = started + timeout_s
        while len(watch.bound) < pods and time.time() < deadline and proc.poll() is None:
            cpu_at_end = cpu_seconds(proc.pid)
            if not watch.bound:
                cpu_at_first = cpu_at_end
            time.sleep(0.02)
        if proc.poll() is None:
            cpu_at_end = cpu_seconds(proc.pid)
    finally:
        terminate(proc, grace_s=30)
        watch.close()
    # Free the capacity (GPUs above all) for the next round: one DELETE of the collection,
    # immediate since no kubelet holds the pods.
    api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0")
    times = sorted(watch.bound.values())
    drain = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    text = log_path.read_text(errors="replace")
    rejected = sum(1 for line in text.splitlines() if REJECTED.search(line))
    return Result(
        scheduler=name,
        kind=kind,
        pods=pods,
        bound=len(times),
        drain_pods_per_s=drain,
        first_bind_s=(times[0] - started) if times else float("nan"),
        cpu_ms_per_pod=1000 * cpu_at_end / max(1, len(times)),
        drain_cpu_ms_per_pod=1000 * (cpu_at_end - cpu_at_first) / max(1, len(times) - 1),
        rejected_writes=rejected,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--kinds", default="plain,gpu", help="comma-separated: plain, gpu")
    parser.add_argument("--timeout", type=float, default=300.0, help="per round, seconds")
    parser.add_argument("--signal-pods", type=int, default=30, help="pods per replayed report")
    parser.add_argument(
        "--signal-mode", default="records", choices=MODES,
        help="full: everything an agent writes; records: only the scheduling records",
    )  # fmt: skip
    parser.add_argument("--publishers", type=int, default=2, help="replaying processes")
    parser.add_argument(
        "--no-signals",
        action="store_true",
        help="skip the rounds with every node's signals re-published each second",
    )
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if not set(kinds) <= {"plain", "gpu"}:
        parser.error(f"--kinds: {args.kinds!r}: use plain, gpu or both")
    try:
        assets = find_assets()
    except AssetsMissing as exc:
        print(f"scheduler_real_api: {exc}", file=sys.stderr)
        return 2
    if assets.kube_scheduler is None:
        print("scheduler_real_api: no kube-scheduler next to kube-apiserver", file=sys.stderr)
        return 2
    # Nodes come up Ready without the not-ready taint no lifecycle controller would lift.
    plane = ControlPlane(
        assets, apiserver_args=["--disable-admission-plugins=TaintNodesByCondition"]
    )
    work = Path(tempfile.mkdtemp(prefix="bench-real-api-"))
    results: list[Result] = []
    try:
        plane.start()
        api = Api(plane)
        admin = plane.kubeconfig(work / "admin.kubeconfig", plane.admin_token, "admin")
        began = time.time()
        create_nodes(api, args.nodes)
        print(f"{args.nodes} nodes ({args.nodes // 3 + 1} with 8 GPUs) in "
              f"{time.time() - began:.0f} s", flush=True)  # fmt: skip
        with private_redis_server(str(work)) as redis_url:
            config = work / "interference.yaml"
            config.write_text(json.dumps({
                "redis": {"url": redis_url},
                "leader_election": {"enabled": False},
                "http": {"port": free_port(), "host": "127.0.0.1"},
            }))  # fmt: skip
            ours = [str(Path(sys.executable).parent / "interference-scheduler"),
                    "--config", str(config), "--kubeconfig", str(admin)]  # fmt: skip
            kube = [str(assets.kube_scheduler), f"--kubeconfig={admin}",
                    f"--authentication-kubeconfig={admin}", f"--authorization-kubeconfig={admin}",
                    "--authentication-skip-lookup=true", "--leader-elect=false",
                    "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
                    "--kube-api-qps=5000", "--kube-api-burst=5000", "--v=0"]  # fmt: skip
            rounds = [("kube-scheduler", kube, "default-scheduler"),
                      ("interference-scheduler", ours, "interference-scheduler")]  # fmt: skip
            if not args.no_signals:
                rounds.append(("interference-signals", ours, "interference-scheduler"))
            redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
            for kind in kinds:
                for name, argv, scheduler_name in rounds:
                    stop = multiprocessing.Event()
                    publishers = []
                    if name == "interference-signals":
                        names = [f"node-{i:05d}" for i in range(args.nodes)]
                        publishers, _ = start_replay(
                            redis_port, names, args.signal_pods, args.signal_mode,
                            args.publishers, stop,
                        )  # fmt: skip
                        time.sleep(2.0)  # a full second of reports is in Redis
                    try:
                        result = run_round(plane, api, name, kind, args.pods, argv,
                                           scheduler_name, work / f"{name}-{kind}.log",
                                           args.timeout)  # fmt: skip
                    finally:
                        stop.set()
                        for publisher in publishers:
                            publisher.join(30)
                    results.append(result)
                    print(f"  {name:<24} {kind:<6} {result.bound}/{result.pods} bound, "
                          f"{result.drain_pods_per_s:,.0f} pods/s, "
                          f"{result.cpu_ms_per_pod:.2f} ms CPU/pod", flush=True)  # fmt: skip
    finally:
        survivors = plane.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    report(results, args.nodes)
    if survivors:
        print(f"processes left behind: {survivors}", file=sys.stderr)
        return 1
    return 0


def report(results: list[Result], nodes: int) -> None:
    print(f"\n{nodes} nodes, real kube-apiserver v1.36 on loopback, this machine's "
          f"{os.cpu_count()} CPUs shared by apiserver, etcd and the scheduler")  # fmt: skip
    print(f"{'kind':<6} {'scheduler':<24} {'bound':>11} {'drain pods/s':>13} "
          f"{'first bind s':>13} {'CPU ms/pod':>11} {'drain CPU ms/pod':>17} "
          f"{'rejected':>9}")  # fmt: skip
    for r in results:
        print(f"{r.kind:<6} {r.scheduler:<24} {r.bound:>5}/{r.pods:<5} "
              f"{r.drain_pods_per_s:>13,.0f} {r.first_bind_s:>13.1f} {r.cpu_ms_per_pod:>11.2f} "
              f"{r.drain_cpu_ms_per_pod:>17.2f} {r.rejected_writes:>9}")  # fmt: skip
    by = {(r.scheduler, r.kind): r for r in results}
    targets = {"plain": 1.0, "gpu": 2.0}
    for kind, target in targets.items():
        theirs = by.get(("kube-scheduler", kind))
        ours = by.get(("interference-scheduler", kind))
        loaded = by.get(("interference-signals", kind))
        if ours and theirs and theirs.drain_pods_per_s:
            ratio = ours.drain_pods_per_s / theirs.drain_pods_per_s
            print(f"{kind}: interference-scheduler / kube-scheduler drain = {ratio:.2f}x; "
                  f"CPU per pod while draining {ours.drain_cpu_ms_per_pod:.2f} ms "
                  f"(kube-scheduler {theirs.drain_cpu_ms_per_pod:.2f} ms)")  # fmt: skip
        if loaded and theirs and theirs.drain_pods_per_s:
            ratio = loaded.drain_pods_per_s / theirs.drain_pods_per_s
            print(f"{kind}, every node publishing each second: "
                  f"{ratio:.2f}x kube-scheduler (target >= {target}x: "
                  f"{'met' if ratio >= target else 'missed'})")  # fmt: skip
        if loaded and ours and ours.drain_pods_per_s:
            ratio = loaded.drain_pods_per_s / ours.drain_pods_per_s
            print(f"{kind}, with signals / without: {ratio:.2f}x (target >= 0.9x: "
                  f"{'met' if ratio >= 0.9 else 'missed'}), "
                  f"{loaded.drain_cpu_ms_per_pod:.2f} ms CPU/pod while draining")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
