"""The scheduler binding pods on a real kube-apiserver while a chaos run goes on (issue 28).

:class:`BindingProbe` starts one control plane (etcd + kube-apiserver v1.36 on loopback,
found like the e2e tests), creates a Ready Node object for every node the run's Redis
hears from (no kubelet: the pods are only bound), and runs the interference-scheduler
CLI against that Redis, leader election off. Pods that declare an interference tolerance
(``interference.io/max-runq-p99-us``) are then created at a steady rate. The scheduler runs
with ``stale_policy: reject`` and no relaxing within the run, so a pod binds only to a node
whose signals it reads as fresh: a node it sees as stale is one it cannot use. Measured
from one watch of the namespace: how many bound, creation-to-bind p50/p99 split by whether
the pod was created before or during the attack, pods bound on the attacking node, and
whether the scheduler is the same process at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.preemption_real_api import PodWatch, create_ready_nodes
from bench.scheduler_real_api import REJECTED, Api
from interference.annotations import MAX_RUNQ_P99_US
from tests.conftest import free_port
from tests.e2e.control_plane import ControlPlane, find_assets

NAMESPACE = "chaos"
TOLERANCE_US = 1_000_000
"""Far above any replayed node's run-queue p99: every fresh node passes, a stale one never."""


def tolerant_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"tier": "high"},
                     "annotations": {MAX_RUNQ_P99_US: str(TOLERANCE_US)}},
        "spec": {"schedulerName": "interference-scheduler", "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "pause", "image": "registry.invalid/pause:3.10",
                                 "resources": {"requests": {"cpu": "100m",
                                                            "memory": "64Mi"}}}]},
    }  # fmt: skip


@dataclass
class BindingResult:
    created: int
    bound: int
    bound_on_attacker: int
    bind_p50_ms_before: float
    bind_p99_ms_before: float
    bind_p50_ms_during: float
    bind_p99_ms_during: float
    scheduler_same_process: bool
    rejected_writes: int


class BindingProbe:
    def __init__(self, redis_port: int, nodes: list[str], rate_per_s: float, work: Path) -> None:
        self.redis_port, self.nodes, self.rate = redis_port, nodes, rate_per_s
        self.work = work
        self.plane = ControlPlane(
            find_assets(), apiserver_args=["--disable-admission-plugins=TaintNodesByCondition"]
        )
        self.created: dict[str, float] = {}
        self.stop = threading.Event()
        self.scheduler: subprocess.Popen[bytes] | None = None
        self.watch: PodWatch | None = None
        self.creator = threading.Thread(target=self._create_pods, daemon=True)

    def start_control_plane(self) -> None:
        """Before the run's Redis fills: the API server and its nodes take a while."""
        self.plane.start()
        self.api = Api(self.plane)
        began = time.time()
        create_ready_nodes(self.api, self.nodes, {"cpu": "64", "memory": "256Gi", "pods": "110"})
        self.api.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        print(f"binding probe: {len(self.nodes)} nodes in {time.time() - began:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip

    def start_scheduling(self) -> None:
        admin = self.plane.kubeconfig(self.work / "admin.kubeconfig", self.plane.admin_token,
                                      "admin")  # fmt: skip
        config = self.work / "interference.yaml"
        config.write_text(json.dumps({
            "redis": {"url": f"redis://127.0.0.1:{self.redis_port}/0"},
            # A node without fresh, readable signals is filtered out for every pod, and a
            # pod is never relaxed to ignore that during the run: a node the scheduler
            # sees as stale (the attacker's, cut off; an honest one it crowded out) shows
            # as a pod not bound or bound late, never as a pod bound there anyway.
            "cycle": {"relax_after_s": 3600, "profile": {"plugin_config": [
                {"name": "Interference", "args": {"stale_policy": "reject"}}]}},
            "leader_election": {"enabled": False},
            "http": {"port": free_port(), "host": "127.0.0.1"},
        }))  # fmt: skip
        self.log_path = self.work / "scheduler.log"
        with self.log_path.open("ab") as log:
            self.scheduler = subprocess.Popen(
                [str(Path(sys.executable).parent / "interference-scheduler"),
                 "--config", str(config), "--kubeconfig", str(admin)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.watch = PodWatch(self.plane, NAMESPACE)
        # Timed pods start once the scheduler binds: its start-up is not the attack's doing.
        self.api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", tolerant_pod("warm-up"))
        deadline = time.time() + 120
        while "warm-up" not in self.watch.bound:
            if time.time() > deadline or self.scheduler.poll() is not None:
                raise RuntimeError(
                    f"the scheduler bound nothing: {self.log_path.read_text()[-2000:]}"
                )
            time.sleep(0.1)
        self.creator.start()

    def _create_pods(self) -> None:
        pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
        started, count = time.monotonic(), 0
        while not self.stop.is_set():
            name = f"tolerant-{count:05d}"
            self.created[name] = time.time()
            self.api.call("POST", pods, tolerant_pod(name))
            count += 1
            self.stop.wait(max(0.0, started + count / self.rate - time.monotonic()))

    def finish(self, attack_began: float, attacker: str) -> BindingResult:
        """Stops creating, gives the last pods 10 s to bind, then reads the outcome."""
        self.stop.set()
        self.creator.join(30)
        assert self.watch is not None and self.scheduler is not None
        deadline = time.time() + 10
        while len(self.watch.bound) <= len(self.created) and time.time() < deadline:
            time.sleep(0.2)
        same_process = self.scheduler.poll() is None
        listed = self.api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        on_attacker = sum(1 for pod in listed if pod["spec"].get("nodeName") == attacker)
        before, during = [], []
        for name, made in self.created.items():
            if name in self.watch.bound:
                (before if made < attack_began else during).append(
                    1000 * (self.watch.bound[name] - made)
                )

        def pct(values: list[float], q: float) -> float:
            return round(float(np.percentile(values, q)), 1) if values else float("nan")

        text = self.log_path.read_text(errors="replace")
        return BindingResult(
            created=len(self.created),
            bound=len(self.watch.bound) - 1,  # not the warm-up pod
            bound_on_attacker=on_attacker,
            bind_p50_ms_before=pct(before, 50),
            bind_p99_ms_before=pct(before, 99),
            bind_p50_ms_during=pct(during, 50),
            bind_p99_ms_during=pct(during, 99),
            scheduler_same_process=same_process,
            rejected_writes=sum(1 for line in text.splitlines() if REJECTED.search(line)),
        )

    def close(self) -> list[str]:
        self.stop.set()
        if self.watch is not None:
            self.watch.close()
        if self.scheduler is not None and self.scheduler.poll() is None:
            self.scheduler.terminate()
            try:
                self.scheduler.wait(30)
            except subprocess.TimeoutExpired:
                self.scheduler.kill()
        return list(self.plane.stop() or [])
