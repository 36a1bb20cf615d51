"""The rebalancer on a real apiserver (issue 17, items 1 and 5): the real scheduler process
with its deploy/ RBAC, kube-controller-manager's ReplicaSet and disruption controllers, a
real redis-server fed by the agent's real publisher.

Each test runs two fake nodes (no kubelet): on node A the agent reports the ReplicaSet's
pods waiting far beyond their tolerance (their own run-queue rows, neighbours' fault), while
both nodes look quiet as a whole. B is cordoned while the test places its pods on A, and it
is the smaller node, so without the rebalancer's record the scheduler would put a
replacement back on A. Pods are marked Running and Ready by the
test (what a kubelet would do), since the disruption controller counts only Ready pods.
"""

from __future__ import annotations

import json
import time
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from interference import keys
from interference.decision import parse_decision_hash
from interference.signals import NodeMetrics, NodeReport, PodMetrics, WindowMetrics, window_name
from scheduler.adapters.move_journal import journal_name
from tests.e2e.agents import agents_publishing
from tests.e2e.conftest import NAMESPACE as SCHEDULER_NAMESPACE
from tests.e2e.conftest import start_scheduler
from tests.e2e.control_plane import ControlPlane, controller_manager
from tests.e2e.kube import Kube, SchedulerProcess, wait_for

pytestmark = [pytest.mark.e2e]

NOISY = (0,) * 12 + (40,)  # 40 waits of 4–8 ms a second: p99 ≈ 8 ms
QUIET = (300,)
TOLERANCE_US = "500"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def controllers(control_plane: ControlPlane) -> Iterator[None]:
    """kube-controller-manager with the ReplicaSet and disruption (PDB status) controllers."""
    with controller_manager(control_plane, "replicaset,disruption", "kube-controller-manager"):
        yield


@dataclass
class Scene:
    """One test's namespace, nodes, scheduler and the agents' view of them."""

    kube: Kube
    namespace: str
    redis_url: str
    scheduler: SchedulerProcess | None = None

    @property
    def node_a(self) -> str:
        return f"{self.namespace}-a"

    @property
    def node_b(self) -> str:
        return f"{self.namespace}-b"

    def reports(self, now: float) -> list[NodeReport]:
        """What each node's agent reports: quiet nodes; on A every pod of ours waits long."""
        try:
            pods = self.kube.pods(self.namespace)
        except (OSError, urllib.error.URLError):
            pods = []
        rows: dict[str, list[PodMetrics]] = {self.node_a: [], self.node_b: []}
        for pod in pods:
            node = pod["spec"].get("nodeName", "")
            if node not in rows or pod["metadata"].get("deletionTimestamp"):
                continue
            noisy = node == self.node_a
            rows[node].append(
                PodMetrics(
                    self.namespace, pod["metadata"]["name"], uid=pod["metadata"]["uid"],
                    cpu_ms_per_s=200.0, runq_wait_ms_per_s=400.0 if noisy else 1.0,
                    neighbour_wait_ms_per_s=400.0 if noisy else 1.0,
                    runq_us=NOISY if noisy else QUIET,
                )
            )  # fmt: skip
        windows = {
            window_name(span): WindowMetrics(span_s=span, covered_s=span, intervals=int(span),
                                             runq_p99_us=100.0)
            for span in (10.0, 60.0)
        }  # fmt: skip
        return [
            NodeReport(node=node, ts=now, interval_s=1.0, metrics=NodeMetrics(runq_p99_us=100.0),
                       measured=("psi", "runq"), windows=windows, histograms={"runq_us": [5]},
                       pods=node_rows)
            for node, node_rows in rows.items()
        ]  # fmt: skip

    def replica_set(self, name: str, replicas: int) -> None:
        labels = {"app": name}
        template = {
            "metadata": {
                "labels": labels,
                "annotations": {"interference.io/max-runq-p99-us": TOLERANCE_US},
            },
            "spec": {
                "schedulerName": self.namespace,
                "nodeSelector": {"rebalance-test": self.namespace},
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "c", "image": "registry.invalid/pause:1",
                                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
            },
        }  # fmt: skip
        body = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                         "template": template}}  # fmt: skip
        self.kube.request("POST", f"/apis/apps/v1/namespaces/{self.namespace}/replicasets", body)

    def budget(self, app: str, min_available: int) -> None:
        body = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": app, "namespace": self.namespace},
                "spec": {"minAvailable": min_available,
                         "selector": {"matchLabels": {"app": app}}}}  # fmt: skip
        path = f"/apis/policy/v1/namespaces/{self.namespace}/poddisruptionbudgets"
        self.kube.request("POST", path, body)

        def observed() -> bool:
            pdb = self.kube.request("GET", f"{path}/{app}")
            status = pdb.get("status", {})
            return status.get("observedGeneration") == pdb["metadata"]["generation"]

        wait_for(observed, f"the disruption controller to observe PDB {app}")

    def pods_of(self, app: str) -> list[Obj]:
        return [
            p for p in self.kube.pods(self.namespace) if p["metadata"]["labels"].get("app") == app
        ]

    def placed(self, app: str, count: int) -> list[Obj]:
        """Wait for ``count`` live pods of ``app`` bound, mark them Running and Ready."""

        def bound() -> list[Obj] | None:
            live = [p for p in self.pods_of(app) if not p["metadata"].get("deletionTimestamp")]
            done = [p for p in live if p["spec"].get("nodeName")]
            return done if len(done) == count and len(live) == count else None

        pods: list[Obj] = wait_for(bound, f"{count} pods of {app} bound")
        for pod in pods:
            if pod["status"].get("phase") != "Running":
                self.mark_ready(pod["metadata"]["name"])
        return pods

    def mark_ready(self, name: str) -> None:
        status = {
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "PodScheduled", "status": "True"},
                ],
            }
        }
        self.kube.request("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{name}/status",
                          status, "application/merge-patch+json")  # fmt: skip

    def cordon(self, node: str, cordoned: bool) -> None:
        patch = {"spec": {"unschedulable": cordoned}}
        self.kube.request("PATCH", f"/api/v1/nodes/{node}", patch, "application/merge-patch+json")

    def events(self, reason: str) -> list[Obj]:
        return [e for e in self.kube.events(self.namespace) if e["reason"] == reason]

    def metric(self, name: str) -> float:
        assert self.scheduler is not None
        return self.scheduler.metrics().get(name, 0.0)

    def record(self, key: Callable[[str, str], str], pod: str) -> Any:
        """The pod's record under ``key`` (placement or rebalancing record), or None."""
        client = redis.Redis.from_url(self.redis_url)
        try:
            raw = client.hgetall(key(self.namespace, pod))
        finally:
            client.close()
        return parse_decision_hash(raw) if raw else None

    def decided(self, pod: str, result: str) -> Any:
        """The pod's placement record once it has ``result``."""
        return self._awaited(keys.decision_key, pod, result, "placement record")

    def rebalanced(self, pod: str, result: str) -> Any:
        """The pod's rebalancing record once it has ``result`` (written behind the Events)."""
        return self._awaited(keys.rebalance_decision_key, pod, result, "rebalancing record")

    def _awaited(self, key: Callable[[str, str], str], pod: str, result: str, what: str) -> Any:
        def found() -> Any:
            record = self.record(key, pod)
            return record if record is not None and record.result == result else None

        return wait_for(found, f"the {result} {what} of {pod}")

    def journal_path(self) -> str:
        """The rebalancer's journal: a ConfigMap beside its Lease (named after the scheduler)."""
        name = journal_name(self.namespace)
        return f"/api/v1/namespaces/{SCHEDULER_NAMESPACE}/configmaps/{name}"

    def forget_moves(self) -> None:
        try:
            self.kube.request("DELETE", self.journal_path())
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise

    def journal(self) -> list[Obj]:
        """The moves (and "did not help" marks) the next leader reads back."""
        return [m for m in self.journal_entries() if not m.get("helped")]

    def journal_entries(self) -> list[Obj]:
        """Everything the journal holds, the verdicts that a move helped included."""
        try:
            config_map = self.kube.request("GET", self.journal_path())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise
        moves: list[Obj] = json.loads(config_map.get("data", {}).get("moves", "[]"))
        return moves

    def terminating(self, app: str) -> list[Obj]:
        return [p for p in self.pods_of(app) if p["metadata"].get("deletionTimestamp")]


@pytest.fixture
def scene(
    request: pytest.FixtureRequest, kube: Kube, redis_url: str, controllers: None
) -> Iterator[Scene]:
    namespace = "rb-" + request.node.name.removeprefix("test_").replace("_", "-")[:40].rstrip("-")
    kube.ensure_namespace(namespace)
    scene = Scene(kube, namespace, redis_url)
    scene.forget_moves()  # the session's Redis: earlier tests' moves count in the limits
    kube.create_node(scene.node_a, cpu="8", memory="8Gi", labels={"rebalance-test": namespace})
    kube.create_node(scene.node_b, cpu="1", memory="1Gi", labels={"rebalance-test": namespace})
    scene.cordon(scene.node_b, True)  # until the test has placed its pods on A
    with agents_publishing(redis_url, scene.reports):
        yield scene
    for kind in ("replicasets", "poddisruptionbudgets"):
        group = "apps" if kind == "replicasets" else "policy"
        for item in kube.request("GET", f"/apis/{group}/v1/namespaces/{namespace}/{kind}")["items"]:
            kube.request(
                "DELETE", f"/apis/{group}/v1/namespaces/{namespace}/{kind}/"
                f"{item['metadata']['name']}"
            )  # fmt: skip
    for pod in kube.pods(namespace):
        kube.delete_pod(namespace, pod["metadata"]["name"])
    for node in (scene.node_a, scene.node_b):
        kube.delete_node(node)


def start(
    scene: Scene,
    schedulers: list[SchedulerProcess],
    kubeconfig: Path,
    tmp_path: Path,
    **rebalancer: object,
) -> SchedulerProcess:
    settings: dict[str, object] = {"interval_s": 1, "sustained_for_s": 2, "window": "10s"}
    settings.update(rebalancer)
    scheduler = start_scheduler(schedulers, tmp_path, kubeconfig, scene.redis_url,
                                scene.namespace, extra={"rebalancer": settings})  # fmt: skip
    scene.scheduler = scheduler
    name = "interference_scheduler_signal_age_seconds_count"
    wait_for(lambda: scheduler.metrics().get(name, 0) >= 2, "the scheduler to read the reports")
    return scheduler


def hold_count(scene: Scene, reason: str) -> float:
    return scene.metric(f'interference_scheduler_rebalance_holds_total{{reason="{reason}"}}')


def evictions(scene: Scene, result: str) -> float:
    return scene.metric(f'interference_scheduler_rebalance_evictions_total{{result="{result}"}}')


def stays(check: Callable[[], bool], what: str, seconds: float) -> None:
    """``check`` holds for ``seconds`` (a guard rail keeps holding, not just once)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check(), what
        time.sleep(0.5)


def test_evicted_through_a_budget_that_allows_and_replaced_elsewhere(
    scene: Scene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path, tmp_path: Path
) -> None:
    start(scene, schedulers, scheduler_kubeconfig, tmp_path, mode="enforce")
    scene.replica_set("web", 2)
    first = scene.placed("web", 2)
    assert {p["spec"]["nodeName"] for p in first} == {scene.node_a}
    scene.budget("web", 1)  # one of the two may go
    scene.cordon(scene.node_b, False)
    (evicted,) = wait_for(lambda: scene.terminating("web") or None, "an eviction", 60)
    name = evicted["metadata"]["name"]
    (event,) = wait_for(
        lambda: [e for e in scene.events("InterferenceEvicted") if e["regarding"]["name"] == name],
        "the InterferenceEvicted Event",
    )
    assert event["type"] == "Warning"
    assert f"evicted to leave {scene.node_a}: its run-queue p99" in event["note"]
    assert f"{scene.node_b} passes every filter" in event["note"]
    record = scene.rebalanced(name, "evicted")  # records are written behind the Events
    assert record.node == scene.node_b
    placement = scene.record(keys.decision_key, name)  # kept beside the rebalancing record
    assert (placement.result, placement.node) == ("scheduled", scene.node_a)
    # the ReplicaSet's replacement, placed by our scheduler away from the node it left
    old = {p["metadata"]["name"] for p in first}

    def replacement() -> Obj | None:
        fresh = [p for p in scene.pods_of("web") if p["metadata"]["name"] not in old]
        return fresh[0] if fresh and fresh[0]["spec"].get("nodeName") else None

    new = wait_for(replacement, "the replacement bound", 60)
    assert new["spec"]["nodeName"] == scene.node_b
    placed = scene.decided(new["metadata"]["name"], "scheduled")
    assert placed.node == scene.node_b
    (left,) = [c for c in placed.candidates if c.node == scene.node_a]
    assert not left.passed
    assert left.reasons[0].startswith(
        "node(s) were left by this pod's workload because of interference (ReplicaSet/web left"
    )
    assert evictions(scene, "evicted") == 1
    (move,) = scene.journal()  # what the next leader reads back
    assert (move["node"], move["workload"], move["departed"]) == (
        scene.node_a,
        "ReplicaSet/web",
        True,
    )
    # the other replica on A: its workload is cooling down, so it stays
    stays(lambda: len(scene.terminating("web")) == 1, "a second eviction", 4)
    assert hold_count(scene, "cooldown") >= 1


def test_a_budget_that_blocks_means_wait(
    scene: Scene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path, tmp_path: Path
) -> None:
    start(scene, schedulers, scheduler_kubeconfig, tmp_path, mode="enforce", retry_after_s=2)
    scene.replica_set("web", 1)
    scene.placed("web", 1)
    scene.budget("web", 1)  # no disruption allowed
    scene.cordon(scene.node_b, False)
    wait_for(lambda: scene.events("InterferenceEvictionBlocked"), "the blocked eviction Event", 60)
    (event,) = scene.events("InterferenceEvictionBlocked")
    assert "disruption budget" in event["note"] and "trying again in 2 s" in event["note"]
    wait_for(lambda: evictions(scene, "eviction_blocked") >= 2, "a retry after 429", 30)
    assert scene.terminating("web") == []
    assert evictions(scene, "evicted") == 0


def test_dry_run_writes_events_and_records_only(
    scene: Scene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path, tmp_path: Path
) -> None:
    start(scene, schedulers, scheduler_kubeconfig, tmp_path)  # the default mode: dry_run
    scene.replica_set("web", 1)
    (pod,) = scene.placed("web", 1)
    scene.cordon(scene.node_b, False)
    name = pod["metadata"]["name"]
    wait_for(lambda: scene.events("InterferenceWouldEvict"), "the would-evict Event", 60)
    (event,) = scene.events("InterferenceWouldEvict")
    assert event["type"] == "Normal" and event["regarding"]["name"] == name
    assert event["note"].startswith("would evict (dry run): its run-queue p99")
    record = scene.rebalanced(name, "would_evict")
    assert (record.node, record.dry_run) == (scene.node_b, True)
    placement = scene.record(keys.decision_key, name)  # why it was placed: still there
    assert (placement.result, placement.node) == ("scheduled", scene.node_a)
    assert evictions(scene, "would_evict") == 1
    stays(lambda: scene.terminating("web") == [] and len(scene.pods_of("web")) == 1,
          "a dry run that evicts", 4)  # fmt: skip
    assert scene.events("InterferenceEvicted") == []


def test_at_most_one_eviction_per_node_per_window(
    scene: Scene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path, tmp_path: Path
) -> None:
    start(scene, schedulers, scheduler_kubeconfig, tmp_path, mode="enforce", max_per_node=1)
    scene.replica_set("web", 1)
    scene.replica_set("api", 1)
    scene.placed("web", 1)
    scene.placed("api", 1)
    scene.cordon(scene.node_b, False)
    wait_for(lambda: evictions(scene, "evicted") == 1, "one eviction", 60)
    wait_for(lambda: hold_count(scene, "node_limit") >= 1, "the other held by the node limit")
    stays(lambda: len(scene.terminating("web") + scene.terminating("api")) == 1,
          "a second eviction from the same node", 4)  # fmt: skip


def test_a_workload_cools_down_after_a_move(
    scene: Scene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path, tmp_path: Path
) -> None:
    start(scene, schedulers, scheduler_kubeconfig, tmp_path, mode="enforce", max_per_node=5,
          max_per_namespace=5)  # fmt: skip
    scene.replica_set("web", 3)
    scene.placed("web", 3)
    scene.cordon(scene.node_b, False)
    wait_for(lambda: evictions(scene, "evicted") == 1, "one eviction", 60)
    wait_for(lambda: hold_count(scene, "cooldown") >= 1, "the others held by the cool-down")
    stays(lambda: len(scene.terminating("web")) == 1, "a second move of the workload", 4)


def test_no_eviction_without_a_better_node(
    scene: Scene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path, tmp_path: Path
) -> None:
    start(scene, schedulers, scheduler_kubeconfig, tmp_path, mode="enforce")
    scene.replica_set("web", 1)
    scene.placed("web", 1)  # B stays cordoned: no other node would take it
    wait_for(lambda: hold_count(scene, "no_better_node") >= 1, "the no-better-node hold", 60)
    stays(lambda: scene.terminating("web") == [], "an eviction to nowhere", 4)
    assert evictions(scene, "evicted") == 0
    assert scene.events("InterferenceEvicted") == []
