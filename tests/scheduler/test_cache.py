"""ClusterCache: pending set, table accounting, assume/forget/confirm, malformed objects."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from scheduler.adapters.memory import InMemoryCluster, InMemoryInformer
from scheduler.adapters.object_builders import (
    claim_object,
    csi_node_object,
    storage_class_object,
    volume_object,
)
from scheduler.api.objects import PodInfo
from scheduler.api.pods import parse_pod
from scheduler.cycle import informed_objects, recent_binds
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.listed_heap import FULL_COLLECTION_THRESHOLD
from scheduler.cycle.ports import PodRef
from scheduler.cycle.queue import QueueState, SchedulingQueue
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.plugins.node_ready import HOLDS_UNREADABLE_POD, node_ready
from scheduler.signals.table import NodeTable
from tests.builders import node_obj, pod_obj

NAME = "interference-scheduler"


class Harness:
    """A cache fed by an in-memory cluster through a hand-driven informer."""

    def __init__(self, ignore: tuple[str, ...] = (), freeze_after_list: bool = True) -> None:
        self.now = 1000.0
        self.cluster = InMemoryCluster()
        self.queue = SchedulingQueue(clock=lambda: self.now)
        self.metrics = SchedulerMetrics(CollectorRegistry())
        self.table = NodeTable()
        self.cache = ClusterCache(
            self.table,
            self.queue,
            self.metrics,
            NAME,
            ignore,
            clock=lambda: self.now,
            freeze_after_list=freeze_after_list,
        )
        self.informer: InMemoryInformer = self.cluster.informer(self.cache)

    def sync(self) -> None:
        self.informer.sync()

    def cpu_requested(self, node: str) -> int:
        row = self.table.row_of(node)
        assert row is not None, f"{node} is not in the table"
        cpu = self.table.resource_row("cpu")
        assert cpu is not None
        return int(self.table.requested[cpu, row])

    def malformed(self, kind: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "interference_scheduler_malformed_objects_total", {"kind": kind}
        )
        return value or 0.0

    def pod(self, name: str) -> PodInfo:
        obj = self.cluster.get_pod("default", name)
        assert obj is not None
        return parse_pod(obj)


@pytest.fixture
def h() -> Harness:
    harness = Harness(ignore=("kube-system",))
    harness.cluster.add_node(node_obj("n1", cpu="4"))
    harness.cluster.add_node(node_obj("n2", cpu="4"))
    return harness


@pytest.mark.parametrize(
    ("pod", "pending"),
    [
        pytest.param(pod_obj("ours"), True, id="ours-unbound"),
        pytest.param(
            pod_obj("theirs", schedulerName="default-scheduler"), False, id="other-scheduler"
        ),
        pytest.param(pod_obj("bound", nodeName="n1"), False, id="already-bound"),
        pytest.param(pod_obj("sys", "kube-system"), False, id="ignored-namespace"),
        pytest.param(
            {
                **pod_obj("gone"),
                "metadata": {
                    **pod_obj("gone")["metadata"],
                    "deletionTimestamp": "2026-01-01T00:00:00Z",
                },
            },
            False,
            id="terminating",
        ),
        pytest.param(
            {
                **pod_obj("gated"),
                "spec": {**pod_obj("gated")["spec"], "schedulingGates": [{"name": "wait"}]},
            },
            False,
            id="scheduling-gate",
        ),
        pytest.param(pod_obj("done", phase="Succeeded"), False, id="finished"),
    ],
)
def test_pending_selection(h: Harness, pod: dict[str, Any], pending: bool) -> None:
    h.cluster.add_pod(pod)
    h.sync()
    meta = pod["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    assert (h.cache.pending_pod(key) is not None) is pending
    assert (h.queue.state(key) is QueueState.ACTIVE) is pending


def test_bound_pods_count_on_their_node(h: Harness) -> None:
    h.cluster.add_pod(pod_obj("a", requests={"cpu": "1"}, nodeName="n1"))
    h.cluster.add_pod(
        pod_obj("b", requests={"cpu": "500m"}, nodeName="n1", schedulerName="default-scheduler")
    )
    h.cluster.add_pod(pod_obj("kube", "kube-system", requests={"cpu": "250m"}, nodeName="n2"))
    h.sync()
    assert h.cpu_requested("n1") == 1500
    assert h.cpu_requested("n2") == 250  # ignored namespaces still occupy nodes
    h.cluster.delete_pod("default", "a")
    h.sync()
    assert h.cpu_requested("n1") == 500


def test_pod_watched_before_its_node_counts_once_the_node_arrives() -> None:
    h = Harness()
    h.sync()
    h.cluster.add_pod(pod_obj("early", requests={"cpu": "2"}, nodeName="late"))
    h.sync()
    h.cluster.add_node(node_obj("late", cpu="4"))
    h.sync()
    assert h.cpu_requested("late") == 2000


def test_finished_pod_frees_its_node_and_requeues_backed_off_pods(h: Harness) -> None:
    h.cluster.add_pod(pod_obj("job", requests={"cpu": "3"}, nodeName="n1"))
    h.cluster.add_pod(pod_obj("waiting"))
    h.sync()
    assert h.queue.pop() == "default/waiting"
    h.queue.backoff("default/waiting")
    h.queue.pop()
    h.queue.backoff("default/waiting")  # 2 s
    h.now += 1.0
    h.cluster.add_pod(pod_obj("job", requests={"cpu": "3"}, nodeName="n1", phase="Succeeded"))
    h.sync()
    assert h.cpu_requested("n1") == 0
    assert h.queue.state("default/waiting") is QueueState.ACTIVE


def test_assume_forget_and_confirm(h: Harness) -> None:
    h.cluster.add_pod(pod_obj("p", requests={"cpu": "2"}))
    h.sync()
    pod = h.pod("p")
    h.cache.assume(pod, "n2")
    assert h.cache.pending_pod("default/p") is None
    assert h.cache.assumed_node("default/p") == "n2"
    assert h.cpu_requested("n2") == 2000
    # Our own status update arrives while the bind is in flight: still assumed, not pending.
    h.cluster.add_pod(pod_obj("p", requests={"cpu": "2"}, labels={"touched": "yes"}))
    h.sync()
    assert h.cache.assumed_node("default/p") == "n2"
    assert h.cache.pending_pod("default/p") is None
    forgotten = h.cache.forget("default/p")
    assert forgotten is not None and forgotten.labels == {"touched": "yes"}
    assert h.cpu_requested("n2") == 0
    assert h.cache.pending_pod("default/p") is not None
    # Assume again and let the watch confirm the bind.
    h.cache.assume(forgotten, "n2")
    h.cluster.bind(PodRef("default", "p"), "n2")
    h.sync()
    assert h.cache.assumed_node("default/p") is None
    assert h.cache.placed_node("default/p") == "n2"
    assert h.cpu_requested("n2") == 2000  # counted once
    assert h.queue.state("default/p") is None
    assert h.cache.forget("default/p") is None  # nothing to undo after confirmation
    assert h.cpu_requested("n2") == 2000


def test_bound_elsewhere_moves_the_assumed_pod(h: Harness) -> None:
    h.cluster.add_pod(pod_obj("p", requests={"cpu": "2"}))
    h.sync()
    h.cache.assume(h.pod("p"), "n1")
    h.cluster.add_pod(pod_obj("p", requests={"cpu": "2"}, nodeName="n2"))  # another binder won
    h.sync()
    assert h.cpu_requested("n1") == 0
    assert h.cpu_requested("n2") == 2000
    assert h.cache.forget("default/p") is None


def test_deleted_while_assumed(h: Harness) -> None:
    h.cluster.add_pod(pod_obj("p", requests={"cpu": "2"}))
    h.sync()
    h.cache.assume(h.pod("p"), "n1")
    h.cluster.delete_pod("default", "p")
    h.sync()
    assert h.cpu_requested("n1") == 0
    assert h.cache.forget("default/p") is None


def test_malformed_objects_are_skipped_and_counted(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    bad_pod = pod_obj("bad")
    bad_pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    h.cluster.add_pod(bad_pod)
    h.cluster.add_raw("Node", {"metadata": {"labels": "oops"}})
    h.cluster.add_pod(pod_obj("good"))
    h.sync()
    assert h.cache.pending_pod("default/good") is not None
    assert h.cache.pending_pod("default/bad") is None
    assert h.malformed("Pod") == 1
    assert h.malformed("Node") == 1
    assert "spec.containers[0].resources.requests.cpu" in caplog.text
    # The same in the watch stream.
    h.cluster.add_raw("Pod", {"kind": "Pod", "metadata": {"name": "x"}, "spec": []})
    h.cluster.add_pod(pod_obj("after"))
    h.sync()
    assert h.malformed("Pod") == 2
    assert h.cache.pending_pod("default/after") is not None


def test_deleting_an_object_that_became_malformed_removes_its_last_good_version(
    h: Harness,
) -> None:
    h.cluster.add_pod(pod_obj("p", requests={"cpu": "2"}, nodeName="n1"))
    h.sync()
    assert h.cpu_requested("n1") == 2000
    broken = pod_obj("p", requests={"cpu": "2"}, nodeName="n1")
    broken["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "two"
    h.cluster.add_pod(broken)
    h.sync()
    assert h.malformed("Pod") == 1
    assert h.cpu_requested("n1") == 2000  # the last good version still counts
    h.cluster.delete_pod("default", "p")
    h.sync()
    assert h.cpu_requested("n1") == 0
    broken_node = node_obj("n2", cpu="4")
    broken_node["status"]["allocatable"]["cpu"] = "-1"
    h.cluster.add_node(broken_node)
    h.cluster.delete_node("n2")
    h.sync()
    assert h.table.row_of("n2") is None
    h.cache.apply("Pod", "DELETED", {"metadata": {}})  # no name at all: counted, skipped
    assert h.malformed("Pod") == 2


def test_node_heartbeat_does_not_requeue_but_a_real_change_does(h: Harness) -> None:
    h.cluster.add_pod(pod_obj("w"))
    h.sync()
    h.queue.pop()
    h.queue.backoff("default/w")
    h.queue.pop()
    h.queue.backoff("default/w")  # ready in 2 s
    h.now += 1.5
    heartbeat = node_obj("n1", cpu="4")
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-11-22T00:00:00Z"
    h.cluster.add_node(heartbeat)
    h.sync()
    assert h.queue.state("default/w") is QueueState.BACKOFF
    h.cluster.add_node(node_obj("n1", cpu="16"))
    h.sync()
    assert h.queue.state("default/w") is QueueState.ACTIVE


def test_relist_removes_what_disappeared(h: Harness) -> None:
    h.cluster.add_pod(pod_obj("stay", requests={"cpu": "1"}, nodeName="n1"))
    h.cluster.add_pod(pod_obj("vanish", requests={"cpu": "1"}, nodeName="n1"))
    h.cluster.add_pod(pod_obj("pending-vanish"))
    h.sync()
    assert h.cpu_requested("n1") == 2000
    h.cache.replace("Node", [h.cluster.get_node("n1")])  # type: ignore[list-item]
    h.cache.replace("Pod", [h.cluster.get_pod("default", "stay")])  # type: ignore[list-item]
    assert h.cpu_requested("n1") == 1000
    assert h.table.row_of("n2") is None
    assert h.cache.pending_pod("default/pending-vanish") is None
    assert h.queue.state("default/pending-vanish") is None
    assert h.cache.synced()


def test_configure_moves_pods_between_schedulers(h: Harness) -> None:
    h.cluster.add_pod(pod_obj("mine"))
    h.cluster.add_pod(pod_obj("other", schedulerName="gpu-scheduler"))
    h.sync()
    h.cache.configure("gpu-scheduler", ())
    assert h.cache.pending_pod("default/mine") is None
    assert h.queue.state("default/mine") is None
    assert h.queue.state("default/other") is QueueState.ACTIVE


def test_concurrent_informer_and_assume_stay_consistent() -> None:
    h = Harness()
    for i in range(4):
        h.cluster.add_node(node_obj(f"n{i}", cpu="1000"))
    h.sync()
    names = [f"p{i}" for i in range(300)]
    stop = threading.Event()
    informer = threading.Thread(target=h.cluster.run_informers, args=(h.cache, stop))
    informer.start()
    try:
        for name in names:
            h.cluster.add_pod(pod_obj(name, requests={"cpu": "1"}))
        assumed = 0
        deadline = 300
        while assumed < len(names) and deadline:
            key = h.queue.pop()
            if key is None:
                h.queue.wait(0.1)
                deadline -= 1
                continue
            pod = h.cache.pending_pod(key)
            assert pod is not None
            h.cache.assume(pod, f"n{assumed % 4}")
            if assumed % 3 == 0:
                h.cache.forget(key)
                h.queue.remove(key)
            assumed += 1
        assert assumed == len(names)
    finally:
        stop.set()
        informer.join(30)
    total = sum(h.cpu_requested(f"n{i}") for i in range(4))
    kept = len([i for i in range(len(names)) if i % 3 != 0])
    assert total == kept * 1000  # millicores


def _gt_toleration_pod(name: str = "gated") -> dict[str, Any]:
    """A pending pod with a ``Gt`` toleration (an alpha feature gate's operator)."""
    pod = pod_obj(name)
    pod["spec"]["tolerations"] = [{"key": "gen", "operator": "Gt", "value": "3"}]
    return pod


def test_unparseable_pod_of_ours_is_reported_once_per_version_and_reread_when_it_changes(
    h: Harness,
) -> None:
    h.cluster.add_pod(_gt_toleration_pod())
    h.sync()
    assert h.cache.pending_pod("default/gated") is None
    [broken] = h.cache.take_unparseable()
    assert (broken.ref.namespace, broken.ref.name) == ("default", "gated")
    assert "spec.tolerations[0].operator" in broken.error
    assert h.cache.take_unparseable() == []
    h.cache.replace("Pod", [h.cluster.get_pod("default", "gated") or {}])  # a relist
    assert h.cache.take_unparseable() == []  # the same pod is not reported again
    status_write = _gt_toleration_pod()
    status_write["status"] = {"conditions": [{"type": "PodScheduled", "status": "False"}]}
    h.cluster.add_pod(status_write)
    h.sync()
    assert h.cache.take_unparseable() == []  # nor after our own condition write
    still_broken = _gt_toleration_pod()
    still_broken["metadata"]["labels"] = {"edited": "yes"}
    h.cluster.add_pod(still_broken)
    h.sync()
    assert len(h.cache.take_unparseable()) == 1  # a new version: reported again
    h.cluster.add_pod(pod_obj("gated"))  # fixed
    h.sync()
    assert h.cache.pending_pod("default/gated") is not None
    assert h.queue.state("default/gated") is QueueState.ACTIVE
    assert h.cache.take_unparseable() == []


def test_pod_that_stops_parsing_leaves_the_pending_set(h: Harness) -> None:
    h.cluster.add_pod(pod_obj("p"))
    h.sync()
    assert h.cache.pending_pod("default/p") is not None
    h.cluster.add_pod(_gt_toleration_pod("p"))
    h.sync()
    assert h.cache.pending_pod("default/p") is None  # its last good version is not scheduled
    assert h.queue.state("default/p") is None
    assert len(h.cache.take_unparseable()) == 1
    h.cluster.add_pod(_gt_toleration_pod("p"))
    h.cluster.delete_pod("default", "p")
    h.sync()
    assert h.cache.take_unparseable() == []  # deleted before it was reported


def test_bound_pod_with_a_toleration_we_cannot_read_still_counts_on_its_node(h: Harness) -> None:
    """Tolerations only matter for the pod's own scheduling, which is over."""
    pod = _gt_toleration_pod()
    pod["spec"]["nodeName"] = "n1"
    h.cluster.add_pod(pod)
    h.sync()
    assert h.malformed("Pod") == 0
    assert "default/gated" in h.cache.table.pods_on_node("n1")
    assert h.cache.take_unparseable() == []


@pytest.mark.parametrize("change", ["other-scheduler", "ignored-namespace", "terminating"])
def test_unparseable_pods_not_ours_to_schedule_are_not_reported(h: Harness, change: str) -> None:
    pod = _gt_toleration_pod()
    if change == "other-scheduler":
        pod["spec"]["schedulerName"] = "default-scheduler"
    elif change == "ignored-namespace":
        pod["metadata"]["namespace"] = "kube-system"
    else:
        pod["metadata"]["deletionTimestamp"] = "2024-05-01T12:01:00Z"
    h.cluster.add_pod(pod)
    h.sync()
    assert h.malformed("Pod") == 1
    assert h.cache.take_unparseable() == []


def test_volume_objects_are_relisted_and_a_real_change_requeues(h: Harness) -> None:
    h.cluster.put("PersistentVolumeClaim", claim_object("data"))
    h.cluster.put("PersistentVolume", volume_object("pv-1"))
    h.cluster.put("StorageClass", storage_class_object("local"))
    h.cluster.put("CSINode", csi_node_object("n1", {"ebs.csi.aws.com": 25}))
    h.cluster.add_pod(pod_obj("w"))
    h.sync()
    volumes = h.table.volumes
    assert volumes.claim("default", "data") is not None and volumes.volume("pv-1") is not None
    assert volumes.storage_class("local") is not None and len(volumes.csi_nodes()) == 1
    h.queue.pop()
    h.queue.backoff("default/w")
    h.queue.pop()
    h.queue.backoff("default/w")  # ready in 2 s
    h.now += 1.5
    h.cluster.put("PersistentVolumeClaim", claim_object("data"))  # the same claim again
    h.sync()
    assert h.queue.state("default/w") is QueueState.BACKOFF
    h.cluster.put("PersistentVolumeClaim", claim_object("data", volume_name="pv-1"))
    h.sync()
    assert h.queue.state("default/w") is QueueState.ACTIVE
    h.cache.replace("PersistentVolume", [])
    h.cache.replace("StorageClass", [])
    h.cache.replace("CSINode", [])
    assert volumes.volume("pv-1") is None and volumes.storage_class("local") is None
    assert volumes.csi_nodes() == [] and volumes.claim("default", "data") is not None


def _unreadable_placed_pod(node: str) -> dict[str, Any]:
    """A pod bound to ``node`` whose CPU request does not parse (what it holds is unknown)."""
    pod = pod_obj("mystery", nodeName=node, schedulerName="default-scheduler")
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    return pod


@pytest.mark.parametrize("how", ["watch", "relist"])
def test_node_holding_a_pod_that_does_not_parse_takes_no_pod_until_it_parses(
    h: Harness, how: str
) -> None:
    """Fail closed: kube-scheduler counts that pod's requests; we cannot, so its node is
    filtered out for every pod (NodeReady's second reason) until the pod parses again."""
    h.sync()
    h.cluster.add_pod(_unreadable_placed_pod("n1"))
    if how == "watch":
        h.sync()
    else:
        h.cache.replace("Pod", h.cluster.pods())
    assert h.malformed("Pod") == 1
    tolerant = parse_pod(pod_obj("any", tolerations=[{"operator": "Exists"}]))
    for pod in (parse_pod(pod_obj("pending")), tolerant):
        verdict = node_ready(h.table, pod)
        assert verdict is not None
        assert verdict.passed.tolist() == [False, True]  # n1, n2
        assert verdict.reasons_for(0) == [HOLDS_UNREADABLE_POD]
    fixed = pod_obj(
        "mystery", requests={"cpu": "1"}, nodeName="n1", schedulerName="default-scheduler"
    )
    h.cluster.add_pod(fixed)
    if how == "watch":
        h.sync()
    else:
        h.cache.replace("Pod", h.cluster.pods())
    assert not h.table.unreadable_pod_keys()
    assert h.cpu_requested("n1") == 1000
    assert node_ready(h.table, tolerant) is None


def test_deleting_the_unreadable_pod_frees_its_node(h: Harness) -> None:
    h.cluster.add_pod(_unreadable_placed_pod("n2"))
    h.sync()
    assert h.table.holds_unreadable_pod().tolist() == [False, True]
    h.cluster.delete_pod("default", "mystery")
    h.sync()
    assert not h.table.unreadable_pod_keys()
    assert h.table.holds_unreadable_pod().tolist() == [False, False]


@pytest.mark.parametrize(
    ("change", "requeued"),
    [
        ("another scheduler places a pod", True),
        ("a placed pod's labels change", True),
        ("a placed pod's status changes", False),
        ("our own bind is confirmed", False),
    ],
)
def test_assigned_pod_events_requeue_pods_waiting_for_affinity_or_spread(
    h: Harness, change: str, requeued: bool
) -> None:
    """As kube-scheduler's InterPodAffinity and PodTopologySpread react to an assigned pod
    added or relabelled: a pending pod waiting for a peer is retried at once, not after its
    backoff. Our own confirmations and status updates bring nothing new."""
    h.cluster.add_pod(pod_obj("peer", nodeName="n1", labels={"app": "db"}))
    h.cluster.add_pod(pod_obj("mine"))
    h.sync()
    assert h.queue.pop() == "default/mine"
    h.cache.assume(h.pod("mine"), "n2")
    h.cluster.add_pod(pod_obj("w"))
    h.sync()
    assert h.queue.pop() == "default/w"
    h.queue.backoff("default/w")
    h.queue.pop()
    h.queue.backoff("default/w")  # ready in 2 s
    h.now += 1.5
    if change == "another scheduler places a pod":
        h.cluster.add_pod(pod_obj("cache", nodeName="n2", schedulerName="default-scheduler"))
    elif change == "a placed pod's labels change":
        h.cluster.add_pod(pod_obj("peer", nodeName="n1", labels={"app": "web"}))
    elif change == "a placed pod's status changes":
        h.cluster.add_pod(pod_obj("peer", nodeName="n1", labels={"app": "db"}, phase="Running"))
    else:
        h.cluster.add_pod(pod_obj("mine", nodeName="n2"))
    h.sync()
    expected = QueueState.ACTIVE if requeued else QueueState.BACKOFF
    assert h.queue.state("default/w") is expected


def test_a_pod_seen_pending_is_vouched_for_until_a_while_after_its_bind(h: Harness) -> None:
    """kube-scheduler's bind can reach our watch right behind the pod's creation (extender
    mode): the extender still knows the pod it was asked about, for a while."""
    h.cluster.add_pod(pod_obj("web"))
    h.sync()
    uid = h.pod("web").uid
    assert h.cache.vouches_for("default/web", uid)
    assert not h.cache.vouches_for("default/web", "another-uid")
    assert not h.cache.vouches_for("default/web", "")
    h.cluster.bind(PodRef("default", "web", uid), "n1")
    h.sync()
    assert h.cache.pending_pod("default/web") is None
    assert h.cache.vouches_for("default/web", uid)
    assert not h.cache.vouches_for("default/web", "another-uid")
    h.now += recent_binds.VOUCHED_AFTER_BIND_S - 0.1
    assert h.cache.vouches_for("default/web", uid)
    h.now += 0.2
    assert not h.cache.vouches_for("default/web", uid)


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(pod_obj("bound", nodeName="n1"), id="first-seen-bound"),
        pytest.param(pod_obj("theirs", schedulerName="default-scheduler"), id="other-scheduler"),
    ],
)
def test_a_pod_never_pending_here_is_not_vouched_for(h: Harness, pod: dict[str, Any]) -> None:
    h.cluster.add_pod(pod)
    h.sync()
    meta = pod["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    uid = h.pod(meta["name"]).uid
    if meta["name"] != "bound":
        h.cluster.bind(PodRef("default", meta["name"], uid), "n1")
        h.sync()
    assert uid and not h.cache.vouches_for(key, uid)


def test_remembered_binds_are_bounded(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recent_binds, "VOUCHED_AFTER_BIND_PODS", 3)
    uids = {}
    for i in range(5):
        h.cluster.add_pod(pod_obj(f"p{i}"))
        h.sync()
        uids[i] = h.pod(f"p{i}").uid
        h.cluster.bind(PodRef("default", f"p{i}", uids[i]), "n1")
        h.sync()
    assert [h.cache.vouches_for(f"default/p{i}", uids[i]) for i in range(5)] == [
        False, False, True, True, True,
    ]  # fmt: skip


def _pod_with_every_field_parsed(name: str, node: str | None) -> dict[str, Any]:
    term = {
        "labelSelector": {"matchLabels": {"app": "web"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    pod = pod_obj(
        name,
        requests={"cpu": "1", "nvidia.com/gpu": "1"},
        nodeName=node,
        labels={"app": "web"},
        annotations={"interference.io/max-index": "60"},
        nodeSelector={"pool": "gpu"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [term],
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "podAffinityTerm": term}
                ],
            },
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
                    ]
                }
            },
        },
    )
    pod["metadata"]["ownerReferences"] = [
        {"kind": "ReplicaSet", "name": "web-1", "uid": "u1", "controller": True}
    ]
    pod["spec"]["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    return pod


@pytest.mark.parametrize("freeze", [True, False])
def test_the_listed_cluster_is_frozen_once_every_kind_is_listed(freeze: bool) -> None:
    gc.unfreeze()
    thresholds = (700, 10, 10)  # CPython's defaults; a fixture's cache may have changed them
    gc.set_threshold(*thresholds)
    h = Harness(freeze_after_list=freeze)
    h.cluster.add_node(node_obj("n1", cpu="4"))
    h.cluster.add_pod(pod_obj("placed", requests={"cpu": "1"}, nodeName="n1"))
    h.cache.replace("Node", [h.cluster.get_node("n1")])  # type: ignore[list-item]
    assert gc.get_freeze_count() == 0, "frozen before every kind was listed"
    h.cluster.informer(h.cache).sync()
    assert h.cache.synced()
    assert (gc.get_freeze_count() > 0) is freeze
    expected = (*thresholds[:2], FULL_COLLECTION_THRESHOLD) if freeze else thresholds
    assert gc.get_threshold() == expected


@pytest.mark.parametrize("reference_cycle_per_parse", [False, True])
def test_the_objects_a_cache_keeps_hold_no_reference_cycles(
    reference_cycle_per_parse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frozen objects are freed only by their reference counts (``freeze_listed_heap``):
    pods and nodes that come, change and go must leave no reference cycle for the collector
    to find. Nothing is frozen here, so the collector sees every object the cache made and dropped;
    the second case plants a reference cycle per parse to show it would be found."""
    h = Harness(freeze_after_list=False)
    if reference_cycle_per_parse:
        parse = informed_objects.parse_pod

        def parse_with_a_cycle(obj: Any) -> PodInfo:
            cycle: list[Any] = []
            cycle.append(cycle)
            return parse(obj)

        monkeypatch.setattr(informed_objects, "parse_pod", parse_with_a_cycle)
    gc.collect()
    gc.disable()
    try:
        for i in range(3):
            h.cluster.add_node(
                node_obj(f"gpu-{i}", cpu="8", extra={"nvidia.com/gpu": "4"}, labels={"pool": "gpu"})
            )
        for i in range(20):
            node = f"gpu-{i % 3}" if i % 2 else None
            h.cluster.add_pod(_pod_with_every_field_parsed(f"p{i}", node))
        h.sync()
        assert h.table.row_of("gpu-0") is not None
        assert h.cache.pending_pod("default/p0") is not None
        for i in range(0, 20, 2):
            h.cluster.bind(PodRef("default", f"p{i}"), "gpu-1")
        h.sync()
        assert h.cache.pending_pod("default/p0") is None
        for i in range(20):
            h.cluster.delete_pod("default", f"p{i}")
        for i in range(3):
            h.cluster.delete_node(f"gpu-{i}")
        h.sync()
        assert h.table.row_of("gpu-0") is None
        assert (gc.collect() > 0) is reference_cycle_per_parse
    finally:
        gc.enable()
