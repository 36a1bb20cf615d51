"""The objects and API calls of the demo's acts on a real cluster
(:mod:`interference_demo.cluster_demo`): its manifests (the latency Deployment from
``deploy/demo/pods/latency.yaml``, the stress-ng antagonist, the cache pod), the few
Kubernetes API calls the acts make, and the pods' rows read from the agents' report
streams."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from interference import keys
from interference.codec import PayloadError, decode_report
from interference_cli.errors import CliError
from interference_cli.store import Store
from interference_demo.rebalance_act import TOLERANCE_ANNOTATION, PodRows

DEMO_DIR = Path(__file__).resolve().parent.parent / "deploy" / "demo"
LATENCY_POD_FILE = DEMO_DIR / "pods" / "latency.yaml"
NAMESPACE = "interference-demo"
SYSTEM_NAMESPACE = "interference-system"
SCHEDULER_CONFIG_MAP = "interference-scheduler-config"
SCHEDULER_CONFIG_KEY = "scheduler.yaml"


class DemoError(Exception):
    """The cluster did not do what an act needs; the message says what."""


class ReportFeed:
    """Every pod row of the nodes' report streams from now on, by pod UID.

    A read that fails (Redis behind ``kubectl port-forward`` on a loaded machine times out
    now and then) is told once and retried at the next poll: the streams keep the last
    :data:`~interference.keys.NODE_REPORTS_MAXLEN` seconds, so nothing is lost unless
    Redis stays unreachable for :data:`UNREACHABLE_LIMIT_S`."""

    UNREACHABLE_LIMIT_S = 8.0

    def __init__(
        self, store: Store, nodes: Iterable[str], log: Callable[[str], None] = print
    ) -> None:
        self._store = store
        self._log = log
        self._last = store.last_stream_ids([keys.reports_key(node) for node in nodes])
        self._failing_since: float | None = None
        self.failed_reads = 0
        self.rows: dict[str, PodRows] = {}

    def poll(self) -> None:
        try:
            self._read()
        except CliError as exc:
            now = time.monotonic()
            self.failed_reads += 1
            if self._failing_since is None:
                self._failing_since = now
                self._log(f"reading the report streams failed, retrying: {exc}")
            if now - self._failing_since > self.UNREACHABLE_LIMIT_S:
                raise
            return
        self._failing_since = None

    def _read(self) -> None:
        while True:
            entries = self._store.streams_after(self._last)
            for stream, entry_id, payload in entries:
                self._last[stream] = entry_id
                with contextlib.suppress(PayloadError):
                    report = decode_report(payload)
                    for row in report.pods:
                        if row.uid:
                            self.rows.setdefault(row.uid, PodRows()).rows[report.ts] = row
            if not entries:
                return

    def of(self, uid: str) -> PodRows:
        return self.rows.get(uid, PodRows())

    def follow(self, seconds: float) -> None:
        """Poll every second for ``seconds``: a stream keeps only its last
        :data:`~interference.keys.NODE_REPORTS_MAXLEN` entries."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            self.poll()


class Cluster:
    """The few API calls the acts make."""

    def __init__(self) -> None:
        config.load_kube_config()  # type: ignore[no-untyped-call]
        # The client's models are used as plain objects here (pods as dicts, replies read
        # by attribute): untyped, as the manifests this module writes.
        self.core: Any = client.CoreV1Api()
        self.apps: Any = client.AppsV1Api()

    def pods(self, selector: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items)

    def running_pod(self, selector: str, timeout_s: float, not_uid: str = "") -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for pod in self.pods(selector):
                if (
                    pod.metadata.uid != not_uid
                    and pod.status.phase == "Running"
                    and pod.metadata.deletion_timestamp is None
                ):
                    return pod
            time.sleep(0.5)
        raise DemoError(f"no Running pod {selector} in {NAMESPACE} within {timeout_s:g} s")

    def delete_all(self) -> None:
        """Delete every Deployment (foreground: its ReplicaSets and pods first, so none
        recreates a pod meanwhile) and every pod of the namespace; wait for all to go."""
        for deployment in self.apps.list_namespaced_deployment(NAMESPACE).items:
            self.apps.delete_namespaced_deployment(
                deployment.metadata.name, NAMESPACE, propagation_policy="Foreground"
            )
        for pod in self.core.list_namespaced_pod(NAMESPACE).items:
            if not pod.metadata.owner_references:
                with contextlib.suppress(ApiException):
                    self.core.delete_namespaced_pod(
                        pod.metadata.name, NAMESPACE, grace_period_seconds=0
                    )
        deadline = time.monotonic() + 180
        while (
            self.apps.list_namespaced_deployment(NAMESPACE).items
            or self.apps.list_namespaced_replica_set(NAMESPACE).items
            or self.core.list_namespaced_pod(NAMESPACE).items
        ):
            if time.monotonic() > deadline:
                raise DemoError(f"Deployments or pods of {NAMESPACE} still there after 180 s")
            time.sleep(0.5)

    def events(self) -> list[Any]:
        found = self.core.list_namespaced_event(NAMESPACE).items
        return sorted(found, key=event_time)

    def set_rebalancer(self, settings: dict[str, Any]) -> None:
        cm = self.core.read_namespaced_config_map(SCHEDULER_CONFIG_MAP, SYSTEM_NAMESPACE)
        document = yaml.safe_load(cm.data[SCHEDULER_CONFIG_KEY]) or {}
        document.setdefault("rebalancer", {}).update(settings)
        self.core.patch_namespaced_config_map(
            SCHEDULER_CONFIG_MAP,
            SYSTEM_NAMESPACE,
            {"data": {SCHEDULER_CONFIG_KEY: yaml.safe_dump(document, sort_keys=False)}},
        )

    def _lease_holder(self) -> str:
        """The identity holding the scheduler's Lease: ``<pod name>_<suffix>``."""
        lease: Any = client.CoordinationV1Api().read_namespaced_lease(
            "interference-scheduler", SYSTEM_NAMESPACE
        )
        return str(lease.spec.holder_identity or "")

    def leader_node(self) -> str:
        """The node of the scheduler replica that holds the Lease (the rebalancer's)."""
        holder = self._lease_holder()
        for pod in self.core.list_namespaced_pod(SYSTEM_NAMESPACE).items:
            if pod.metadata.name and holder.startswith(pod.metadata.name + "_"):
                return str(pod.spec.node_name)
        return f"? (holder {holder!r})"

    def scheduler_log_lines(self, text: str) -> dict[str, int]:
        """Each scheduler replica's count of log lines holding ``text``, by pod name."""
        counts: dict[str, int] = {}
        for pod in self.core.list_namespaced_pod(
            SYSTEM_NAMESPACE, label_selector="app.kubernetes.io/name=interference-scheduler"
        ).items:
            log = self.core.read_namespaced_pod_log(pod.metadata.name, SYSTEM_NAMESPACE)
            counts[pod.metadata.name] = log.count(text)
        return counts

    def leader_log_lines(self, text: str, last: int = 10) -> list[str]:
        """The last ``last`` lines of the Lease holder's log that hold ``text``."""
        holder = self._lease_holder()
        pod = holder.split("_", 1)[0]
        try:
            log = self.core.read_namespaced_pod_log(pod, SYSTEM_NAMESPACE)
        except client.ApiException:
            return [f"(no log of the Lease holder {holder!r})"]
        return [line for line in log.splitlines() if text in line][-last:]


def latency_deployment(
    name: str, image: str, scheduler: str, tolerance_us: float | None
) -> dict[str, Any]:
    """deploy/demo/pods/latency.yaml's pod as a Deployment of one replica."""
    pod = yaml.safe_load(LATENCY_POD_FILE.read_text())
    annotations = dict(pod["metadata"].get("annotations", {}))
    annotations.pop(TOLERANCE_ANNOTATION, None)
    if tolerance_us is not None:
        annotations[TOLERANCE_ANNOTATION] = str(int(tolerance_us))
    template = {
        "metadata": {"labels": {"app": name}, "annotations": annotations},
        "spec": copy.deepcopy(pod["spec"]),
    }
    template["spec"]["schedulerName"] = scheduler
    # Python as PID 1 ignores SIGTERM: a deleted or evicted pod would run out its 30 s.
    template["spec"]["terminationGracePeriodSeconds"] = 2
    for container in template["spec"]["containers"]:
        container["image"] = image
        container["imagePullPolicy"] = "Never"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": template,
        },
    }


STRESS_CPU_REQUEST = "300m"
"""The antagonist requests some CPU and has no limit: a batch pod that bursts to the whole
CPU. A BestEffort one would barely delay a Burstable neighbour on a real kubelet: its QoS
cgroup's ``cpu.shares`` is 2 against the neighbour's 204 (measured: 1.4 ms run-queue p99
beside ``stress-ng --cpu 4``, no more than the quiet node)."""


def stress_pod(name: str, node: str, image: str, *, through_scheduler: bool) -> dict[str, Any]:
    """A Burstable ``stress-ng --cpu 4`` (:data:`STRESS_CPU_REQUEST`, no limit): bound to
    ``node`` directly, or placed there by kube-scheduler (a nodeSelector)."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "stress",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["stress-ng", "--cpu", "4", "--cpu-method", "int64", "--quiet"],
                "resources": {"requests": {"cpu": STRESS_CPU_REQUEST, "memory": "32Mi"}},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if through_scheduler:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    else:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": name}},
        "spec": spec,
    }


def cache_pod(node: str, cpu_millis: int) -> dict[str, Any]:
    """An idle pod that reserves CPU on ``node``: by requests, that node looks fuller."""
    resources = {"cpu": f"{cpu_millis}m", "memory": "64Mi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cache", "namespace": NAMESPACE, "labels": {"app": "cache"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "cache",
                    "image": "interference-pause:bookworm",
                    "imagePullPolicy": "Never",
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
        },
    }


def requested_cpu_millis(cluster: Cluster, node: str) -> int:
    total = 0
    for pod in cluster.core.list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={node}"
    ).items:
        if pod.status.phase in ("Succeeded", "Failed"):
            continue
        for container in pod.spec.containers:
            requests = (container.resources.requests or {}) if container.resources else {}
            total += millis(requests.get("cpu", "0"))
    return total


def allocatable_cpu_millis(cluster: Cluster, node: str) -> int:
    return millis(cluster.core.read_node(node).status.allocatable["cpu"])


def millis(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def event_time(event: Any) -> float:
    when = event.event_time or event.last_timestamp or event.first_timestamp
    return when.timestamp() if when else 0.0


def schedstat(cgroup_roots: Iterable[str], uid: str) -> tuple[int, int]:
    """Σ run_delay ns and Σ run count of the processes in the pod's cgroups."""
    delay = runs = 0
    for root in cgroup_roots:
        for pod_dir in Path(root).rglob(f"pod{uid}"):
            for procs in pod_dir.rglob("cgroup.procs"):
                for pid in procs.read_text().split():
                    with contextlib.suppress(OSError, ValueError):
                        _, wait_ns, count = Path(f"/proc/{pid}/schedstat").read_text().split()
                        delay += int(wait_ns)
                        runs += int(count)
            return delay, runs
    return delay, runs


def cpu_times() -> dict[int, tuple[int, int]]:
    """Per CPU, ``(busy, total)`` jiffies from ``/proc/stat`` (idle and iowait not busy)."""
    times: dict[int, tuple[int, int]] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            values = [int(v) for v in fields]
            idle = values[3] + values[4]
            times[int(name[3:])] = (sum(values) - idle, sum(values))
    return times


def busy_share(
    before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]
) -> dict[int, float]:
    """Each CPU's busy share of the time between two :func:`cpu_times`."""
    return {
        cpu: (after[cpu][0] - before[cpu][0]) / max(1, after[cpu][1] - before[cpu][1])
        for cpu in before
        if cpu in after
    }
