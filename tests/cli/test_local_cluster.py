"""LocalCluster against the real cgroup hierarchies of this host (needs root)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from interference_demo.local_cluster import (
    LocalCluster,
    container_id,
    host_settings,
    load_manifests,
    load_nodes,
    qos_class,
)
from scheduler.cycle.ports import INFORMED_KINDS, BindConflict, ClusterError, K8sObject, PodRef

DEMO = Path(__file__).resolve().parents[2] / "deploy" / "demo"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="creates cgroups: needs root")


class RecordingHandler:
    """A ClusterHandler that keeps what the informer delivered."""

    def __init__(self) -> None:
        self.replaced: dict[str, list[K8sObject]] = {}
        self.events: list[tuple[str, str, K8sObject]] = []

    def replace(self, kind: str, objects: list[K8sObject]) -> None:
        self.replaced[kind] = objects

    def apply(self, kind: str, event: str, obj: K8sObject) -> None:
        self.events.append((kind, event, obj))


def _cgroup_of(pid: int, hierarchy: str) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == hierarchy:
            return path
    raise AssertionError(f"pid {pid} has no {hierarchy!r} cgroup")


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ([{}], "BestEffort"),
        ([{"requests": {"cpu": "1"}}], "Burstable"),
        ([{"limits": {"cpu": "1", "memory": "1Gi"}}], "Guaranteed"),
        (
            [{"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}],
            "Guaranteed",
        ),
        ([{"limits": {"cpu": "1", "memory": "1Gi"}}, {}], "Burstable"),
        ([{"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}}], "Burstable"),
    ],
)
def test_qos_class(resources: list[dict[str, object]], expected: str) -> None:
    pod = {
        "spec": {"containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(resources)]}
    }
    assert qos_class(pod) == expected


def test_demo_files_load() -> None:
    nodes = load_nodes(DEMO / "nodes.yaml")
    assert [n.name for n in nodes] == ["node-a", "node-b"]
    assert {n.cpus for n in nodes} == {"0", "1"}
    pods = load_manifests(sorted((DEMO / "pods").glob("*.yaml")))
    assert {p["metadata"]["name"] for p in pods} == {"batch-stress", "cache", "latency-web"}


def test_malformed_node_file_names_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "nodes.yaml"
    bad.write_text("nodes:\n  - name: x\n")
    with pytest.raises(ClusterError, match=r"malformed.*name, cpus and allocatable"):
        load_nodes(bad)


@needs_root
def test_pods_run_in_their_node_partition_and_close_removes_everything(tmp_path: Path) -> None:
    partition = f"intf-test-lc-{os.getpid()}"
    settings = host_settings(partition, log=lambda _: None)
    cluster = LocalCluster(
        load_nodes(DEMO / "nodes.yaml"),
        load_manifests(sorted((DEMO / "pods").glob("*.yaml"))),
        settings,
    )
    v2_top = Path(settings.cgroup_v2_mount, partition)
    stop = threading.Event()
    handler = RecordingHandler()
    informer = threading.Thread(target=cluster.run_informers, args=(handler, stop))
    pids: list[int] = []
    try:
        cluster.create_partitions()
        informer.start()
        batch_pids = cluster.pod_pids("demo", "batch-stress")
        assert len(batch_pids) == 1
        batch = cluster.pod("demo", "batch-stress")
        uid = batch["metadata"]["uid"]
        expected = f"/{partition}/node-a/kubepods/besteffort/pod{uid}/{container_id(uid, 'stress')}"
        assert _cgroup_of(batch_pids[0], "") == expected
        if settings.cpuset_mount is not None:
            assert _cgroup_of(batch_pids[0], "cpuset") == f"/{partition}/node-a"
            cpus = Path(settings.cpuset_mount, partition, "node-b", "cpuset.cpus").read_text()
            assert cpus.strip() == "1"
        assert cluster.pod("demo", "cache")["status"]["qosClass"] == "Guaranteed"

        latency = cluster.pod("demo", "latency-web")
        ref = PodRef("demo", "latency-web", latency["metadata"]["uid"])
        cluster.bind(ref, "node-b")
        pids = cluster.pod_pids("demo", "latency-web")
        assert _cgroup_of(pids[0], "").startswith(f"/{partition}/node-b/kubepods/burstable/pod")
        with pytest.raises(BindConflict, match="already bound to node-b"):
            cluster.bind(ref, "node-a")
        cluster.set_unschedulable(PodRef("demo", "cache"), "test")
        deadline = time.monotonic() + 10
        while len(handler.events) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {n["metadata"]["name"] for n in handler.replaced["Node"]} == {"node-a", "node-b"}
        assert set(handler.replaced) == set(INFORMED_KINDS)  # else the cache never syncs
        bound = [o for _, e, o in handler.events if o["metadata"]["name"] == "latency-web"]
        assert bound[0]["spec"]["nodeName"] == "node-b"
        assert cluster.pods_file_content()[ref.uid] == "demo/latency-web"
        pids += batch_pids
    finally:
        stop.set()
        if informer.is_alive():
            informer.join(timeout=10)
        cluster.close()
    assert not v2_top.exists()
    if settings.cpuset_mount is not None:
        assert not Path(settings.cpuset_mount, partition).exists()
    for pid in pids:
        assert (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        )
