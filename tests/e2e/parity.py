"""What the parity tests share: the real kube-scheduler on the test apiserver, our cycle
deciding for the same pod over the objects read back from the API server, and what
kube-scheduler decided as the pod shows it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from interference_cli.redis_process import free_port
from scheduler.api.pods import parse_pod
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.ports import INFORMED_KINDS, ObjectKind
from scheduler.cycle.queue import SchedulingQueue
from scheduler.cycle.settings import CycleSettings
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.signals.table import NodeTable
from tests.e2e.control_plane import Assets, terminate
from tests.e2e.kube import Kube, Obj, condition, wait_for

PENDING = "<pending>"
"""The decision of a scheduler that leaves the pod pending."""
LIST_PATHS: dict[ObjectKind, str] = {
    "Node": "/api/v1/nodes",
    "Namespace": "/api/v1/namespaces",
    "StorageClass": "/apis/storage.k8s.io/v1/storageclasses",
    "CSINode": "/apis/storage.k8s.io/v1/csinodes",
    "PersistentVolume": "/api/v1/persistentvolumes",
    "PersistentVolumeClaim": "/api/v1/persistentvolumeclaims",
    "Pod": "/api/v1/pods",
}
"""Where each informed kind is listed (every namespace)."""


def read_log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def kube_scheduler_argv(binary: Path, config: Path, kubeconfig: Path, cert_dir: Path) -> list[str]:
    """kube-scheduler with ``config`` as the identity in ``kubeconfig``, serving on a free
    loopback port."""
    return [
        str(binary),
        f"--config={config}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={free_port()}",
        f"--cert-dir={cert_dir}",
    ]


@contextmanager
def kube_scheduler(
    assets: Assets,
    kube: Kube,
    workdir: Path,
    scheduler_name: str,
    first_pod: Obj,
    timeout_s: float,
) -> Iterator[None]:
    """kube-scheduler (default plugins, a profile named ``scheduler_name``, no leader
    election) as the admin, entered once it has bound ``first_pod`` (created and deleted
    here): then it has seen every object made before. Stopped on exit, its log's tail
    printed (shown when a test failed)."""
    assert assets.kube_scheduler is not None
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kube.kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": scheduler_name}],
    }
    config_path = workdir / "kube-scheduler.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = workdir / "kube-scheduler.log"
    argv = kube_scheduler_argv(
        assets.kube_scheduler, config_path, kube.kubeconfig, workdir / "certs"
    )
    with log_path.open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        namespace, name = first_pod["metadata"]["namespace"], first_pod["metadata"]["name"]
        kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", first_pod)
        wait_for(lambda: kube.pod(namespace, name)["spec"].get("nodeName"),
                 "kube-scheduler to bind a first pod", timeout_s)  # fmt: skip
        kube.delete_pod(namespace, name)
        yield
    finally:
        terminate(proc, grace_s=20)
        print("--- kube-scheduler log (last 30 lines) ---")
        print("\n".join(read_log(log_path).splitlines()[-30:]))


def cluster_table(kube: Kube) -> NodeTable:
    """Our node table of the cluster as the API server has it now, built the way the
    scheduler builds it: its cache given a list of every informed kind."""
    metrics = SchedulerMetrics(CollectorRegistry())
    cache = ClusterCache(NodeTable(), SchedulingQueue(), metrics, scheduler_name="")
    for kind in INFORMED_KINDS:
        cache.replace(kind, kube.request("GET", LIST_PATHS[kind])["items"])
    return cache.table


def decide(table: NodeTable, pod: Obj) -> tuple[str, str]:
    """Our cycle's node (or :data:`PENDING`) for ``pod`` and its ``FailedScheduling``
    message (empty when placed); interference signals play no part."""
    result = SchedulingCycle(CycleSettings(interference_aware=False), seed=0).schedule(
        parse_pod(pod), table, 0.0
    )
    return result.node or PENDING, "" if result.node else result.message


def kube_decision(kube: Kube, namespace: str, name: str, timeout_s: float) -> tuple[str, str]:
    """kube-scheduler's node (or :data:`PENDING`, once it marked the pod unschedulable)
    and its ``PodScheduled`` message (empty when bound)."""

    def decided() -> tuple[str, str] | None:
        pod = kube.pod(namespace, name)
        if pod["spec"].get("nodeName"):
            return str(pod["spec"]["nodeName"]), ""
        scheduled = condition(pod, "PodScheduled")
        if scheduled and scheduled.get("reason") == "Unschedulable":
            return PENDING, str(scheduled.get("message", ""))
        return None

    decision: tuple[str, str] = wait_for(decided, f"kube-scheduler to decide on {name}", timeout_s)
    return decision
