"""Admin-side helpers of the e2e tests (set-up and assertions) and the scheduler process."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.control_plane import ControlPlane, terminate

Obj = dict[str, Any]

REJECTED_WRITE = re.compile(
    r"could not write|failed with HTTP|refused|unexpected error|Traceback|binding .* failed"
)
"""Scheduler log lines that mean an API write was refused or crashed."""


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


class Kube:
    """Admin access to the test apiserver."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.kubeconfig = plane.kubeconfig(
            plane.workdir / "admin.kubeconfig", plane.admin_token, "admin"
        )

    def kubectl(self, *args: str, stdin: str = "", kubeconfig: Path | None = None) -> str:
        done = subprocess.run(
            [str(self.plane.assets.kubectl), f"--kubeconfig={kubeconfig or self.kubeconfig}",
             *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        return self.plane.request(method, path, body, content_type=content_type)

    # --- objects ---

    def ensure_namespace(self, name: str) -> None:
        try:
            self.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise

    def create_node(
        self, name: str, cpu: str = "4", memory: str = "8Gi", pods: str = "110",
        labels: dict[str, str] | None = None, gpus: int = 0,
    ) -> None:  # fmt: skip
        """A Ready node with allocatable resources (status is its own write)."""
        self.request("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": labels or {}}})
        allocatable = {"cpu": cpu, "memory": memory, "pods": pods}
        if gpus:
            allocatable["nvidia.com/gpu"] = str(gpus)
        status = {
            "status": {
                "capacity": allocatable,
                "allocatable": allocatable,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "e2e", "lastHeartbeatTime": None,
                                "lastTransitionTime": None}],
            }
        }  # fmt: skip
        self.request(
            "PATCH", f"/api/v1/nodes/{name}/status", status, "application/merge-patch+json"
        )
        # Admission taints new nodes not-ready; the node lifecycle controller (not run
        # here) would lift it once Ready.
        untaint = {"spec": {"taints": None}}
        self.request("PATCH", f"/api/v1/nodes/{name}", untaint, "application/merge-patch+json")

    def delete_node(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/nodes/{name}")

    def label_node(self, name: str, labels: dict[str, str]) -> None:
        patch = {"metadata": {"labels": labels}}
        self.request("PATCH", f"/api/v1/nodes/{name}", patch, "application/merge-patch+json")

    def create_pod(
        self, namespace: str, name: str, scheduler: str, cpu: str = "100m",
        node_selector: dict[str, str] | None = None, node_name: str = "",
        annotations: dict[str, str] | None = None,
    ) -> Obj:  # fmt: skip
        spec: Obj = {
            "schedulerName": scheduler,
            "containers": [{"name": "c", "image": "registry.invalid/pause:1",
                            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}],
        }  # fmt: skip
        if node_selector:
            spec["nodeSelector"] = node_selector
        if node_name:
            spec["nodeName"] = node_name
        metadata = {"name": name, "namespace": namespace, "annotations": annotations or {}}
        body = {"metadata": metadata, "spec": spec}
        pod: Obj = self.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
        return pod

    def pod(self, namespace: str, name: str) -> Obj:
        pod: Obj = self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        return pod

    def pods(self, namespace: str) -> list[Obj]:
        items: list[Obj] = self.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        return items

    def delete_pod(self, namespace: str, name: str) -> None:
        self.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", {"gracePeriodSeconds": 0}
        )

    def bind(self, namespace: str, name: str, node: str) -> None:
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
        self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body)

    def events(self, namespace: str) -> list[Obj]:
        """``events.k8s.io/v1`` Events of the namespace."""
        path = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
        items: list[Obj] = self.request("GET", path)["items"]
        return items

    def kubectl_events(self, namespace: str) -> list[Obj]:
        """``kubectl get events`` (core/v1) of the namespace."""
        items: list[Obj] = json.loads(self.kubectl("get", "events", "-n", namespace, "-o", "json"))[
            "items"
        ]
        return items

    def lease(self, namespace: str, name: str) -> Obj:
        lease: Obj = self.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        )
        return lease


def _logged_at(line: str) -> float:
    """Unix time of a scheduler log line (``2026-01-01 00:00:00,123 LEVEL ...``), else 0."""
    try:
        stamp = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return 0.0
    return stamp.timestamp()


def condition(pod: Obj, kind: str) -> Obj | None:
    for item in pod.get("status", {}).get("conditions", []) or []:
        if item.get("type") == kind:
            return dict(item)
    return None


@dataclass
class BindingWatch:
    """Every ``spec.nodeName`` each pod of a namespace was seen with, by a pod watch
    (a pod bound twice, or moved, shows two nodes)."""

    kube: Kube
    namespace: str
    nodes: dict[str, list[tuple[str, float]]] = field(default_factory=lambda: defaultdict(list))
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        plane = self.kube.plane
        rv = ""
        while not self.stop.is_set():
            path = f"/api/v1/namespaces/{self.namespace}/pods?watch=true&timeoutSeconds=5"
            if rv:
                path += f"&resourceVersion={rv}"
            req = urllib.request.Request(plane.url + path)
            req.add_header("Authorization", f"Bearer {plane.admin_token}")
            try:
                with urllib.request.urlopen(req, context=plane.ssl_context(), timeout=10) as s:
                    for line in s:
                        event = json.loads(line)
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            rv = ""
                            break
                        rv = obj["metadata"]["resourceVersion"]
                        self._see(obj)
            except (OSError, ValueError):
                time.sleep(0.2)

    def _see(self, pod: Obj) -> None:
        node = pod.get("spec", {}).get("nodeName") or ""
        name = pod["metadata"]["name"]
        with self.lock:
            seen = self.nodes[name]
            if node and (not seen or seen[-1][0] != node):
                seen.append((node, time.time()))

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(15)

    def bound(self) -> dict[str, list[tuple[str, float]]]:
        with self.lock:
            return {k: list(v) for k, v in self.nodes.items() if v}


@dataclass
class SchedulerProcess:
    """One ``interference-scheduler`` subprocess and its log."""

    replica: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    http_port: int
    expected_conflicts: int = 0
    """Bind conflicts this test provokes on purpose (logged, not a rejected write)."""
    outage: tuple[float, float] | None = None
    """(start, end) Unix times while the test had the API server down or not yet ready:
    writes failing then are expected (a restarted apiserver answers 403 until its RBAC
    cache has synced, which /readyz waits for)."""

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples of ours as ``name{labels}`` → value ({} when unreachable)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.http_port}/metrics", timeout=5
            ) as answer:
                text = answer.read().decode()
        except OSError:
            return {}
        samples = {}
        for line in text.splitlines():
            if line.startswith("interference_scheduler_"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def leading(self) -> bool:
        return self.metrics().get("interference_scheduler_leader") == 1.0

    def kill(self) -> None:
        """SIGKILL (no lease hand-back, no goodbye)."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def stop(self) -> None:
        terminate(self.popen, grace_s=30)

    def rejected_writes(self) -> list[str]:
        lines = [line for line in self.log().splitlines() if REJECTED_WRITE.search(line)]
        if self.outage is not None:
            start, end = self.outage
            lines = [line for line in lines if not start <= _logged_at(line) <= end]
        conflicts = [line for line in lines if "binding" in line and "already" in line]
        if len(conflicts) <= self.expected_conflicts:
            lines = [line for line in lines if line not in conflicts]
        return lines

    def assert_no_rejected_writes(self) -> None:
        rejected = self.rejected_writes()
        assert not rejected, f"{self.replica}: {len(rejected)} rejected writes:\n" + "\n".join(
            rejected[:10]
        )
