"""Where the rebalancer moves a workload and how often (issue 29, items 2, 4 and 5), on a
real apiserver with kube-controller-manager's ReplicaSet, StatefulSet and disruption
controllers, the real scheduler processes, redis-server and the agent's real publisher.

* Two victims, one room: two StatefulSets' pods on two noisy nodes and one quiet node
  with room for one. One look evicts one of them and holds the quiet node's room for its
  replacement; the other is held (no better node) and no replacement goes back to a node
  its workload left. A replacement whose room turned noisy before it came is relaxed
  (after ``relax_after_s``) onto that room, never back onto the node its workload left
  (RebalancedAway is not relaxable).
* Memory that survives: after a move, redis-server restarts empty and the leader is
  killed; the new leader reads the move journal (a ConfigMap) and keeps the workload where
  it is for the cool-down, though its new node is noisy now and the old one quiet.
* No ping-pong: the node a workload lands on turns noisy after a while, every time; it is
  moved ``max_moves_per_workload`` times and then held (``move_budget``). A dry run's
  "would evict" spends no enforce cool-down: switching to ``enforce`` evicts at once.

No kubelet runs: the test does a kubelet's part for the scene's nodes (a bound pod is
marked Running and Ready; a terminating one is deleted at once, which a StatefulSet
controller waits for before it recreates the pod).
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from interference import keys
from interference.signals import NodeMetrics, NodeReport, PodMetrics, WindowMetrics, window_name
from interference_cli.redis_process import free_port
from tests.conftest import RedisServer
from tests.e2e.agents import agents_publishing
from tests.e2e.conftest import start_scheduler
from tests.e2e.control_plane import ControlPlane, controller_manager
from tests.e2e.kube import Kube, SchedulerProcess, wait_for
from tests.e2e.test_rebalancer import NOISY, QUIET, Obj, Scene, evictions, hold_count, stays

pytestmark = [pytest.mark.e2e]

TOLERANCE_US = "500"
LOUD_P99_US = 8000.0
"""A loud node's own run-queue p99: over every tolerance here, so the Interference filter
refuses it to a pod with one."""
OUTAGE_LOGGED_S = 5.0
"""How long after Redis is back a scheduler may still log the outage (its next reads)."""
FAST = {"interval_s": 1, "sustained_for_s": 2, "window": "10s", "mode": "enforce",
        "max_per_node": 10, "max_per_namespace": 10, "max_per_cluster": 50}  # fmt: skip
"""Looks every second, a victim after 2 s; the rate limits out of the way."""


@pytest.fixture(scope="module")
def controllers(control_plane: ControlPlane) -> Iterator[None]:
    """kube-controller-manager with the ReplicaSet, StatefulSet and disruption controllers."""
    controllers = "replicaset,statefulset,disruption"
    with controller_manager(control_plane, controllers, "kube-controller-manager"):
        yield


def _created(pod: Obj) -> float:
    stamp = pod["metadata"]["creationTimestamp"].replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


@dataclass
class MovesScene(Scene):
    """Nodes of the test's own, what their agents report, and a kubelet's part for them."""

    nodes: tuple[str, ...] = ()
    loud: set[str] = field(default_factory=set)
    """Nodes noisy as a whole (their own p99 and every pod's rows)."""
    noisy_after_s: float | None = None
    """When set: a pod's rows turn noisy once it is this old, on whatever node it is."""
    loud_rows: set[str] = field(default_factory=set)
    """Nodes whose pods' rows are noisy while the node's own p99 is quiet."""
    deleting: bool = True
    """Whether the kubelet finishes terminating pods (False: they linger)."""

    def reports(self, now: float) -> list[NodeReport]:
        try:
            pods = self.kube.pods(self.namespace)
        except (OSError, urllib.error.URLError):
            pods = []
        rows: dict[str, list[PodMetrics]] = {node: [] for node in self.nodes}
        for pod in pods:
            node = pod["spec"].get("nodeName", "")
            if node not in rows:
                continue
            if not self._kubelet(pod):
                continue
            age = now - _created(pod)
            noisy = (
                node in self.loud
                or node in self.loud_rows
                or (self.noisy_after_s is not None and age >= self.noisy_after_s)
            )
            rows[node].append(
                PodMetrics(
                    self.namespace, pod["metadata"]["name"], uid=pod["metadata"]["uid"],
                    cpu_ms_per_s=200.0, runq_wait_ms_per_s=400.0 if noisy else 1.0,
                    neighbour_wait_ms_per_s=400.0 if noisy else 1.0,
                    runq_us=NOISY if noisy else QUIET,
                )
            )  # fmt: skip
        found = []
        for node, node_rows in rows.items():
            p99 = LOUD_P99_US if node in self.loud else 100.0
            windows = {
                window_name(span): WindowMetrics(span_s=span, covered_s=span,
                                                 intervals=int(span), runq_p99_us=p99)
                for span in (10.0, 60.0)
            }  # fmt: skip
            found.append(
                NodeReport(node=node, ts=now, interval_s=1.0,
                           metrics=NodeMetrics(runq_p99_us=p99), measured=("psi", "runq"),
                           windows=windows, histograms={"runq_us": [5]}, pods=node_rows)
            )  # fmt: skip
        return found

    def _kubelet(self, pod: Obj) -> bool:
        """What the node's kubelet would do with ``pod``; whether it is still running."""
        name = pod["metadata"]["name"]
        with contextlib.suppress(OSError, urllib.error.URLError):
            if pod["metadata"].get("deletionTimestamp"):
                if self.deleting:
                    self.kube.delete_pod(self.namespace, name)  # its containers stopped
                return False
            if pod["status"].get("phase") != "Running":
                self.mark_ready(name)
        return True

    def stateful_set(self, name: str) -> None:
        """A StatefulSet of one pod with a run-queue tolerance (``Parallel``: a pod is
        recreated without waiting for the others' readiness)."""
        body = {"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {"replicas": 1, "serviceName": name,
                         "podManagementPolicy": "Parallel",
                         "selector": {"matchLabels": {"app": name}},
                         "template": self.template(name)}}  # fmt: skip
        self.kube.request("POST", f"/apis/apps/v1/namespaces/{self.namespace}/statefulsets", body)

    def template(self, name: str) -> Obj:
        return {
            "metadata": {
                "labels": {"app": name},
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

    def live(self, app: str) -> list[Obj]:
        return [p for p in self.pods_of(app) if not p["metadata"].get("deletionTimestamp")]

    def bound_to(self, app: str) -> str:
        """The node of ``app``'s one live pod, once it is bound."""

        def bound() -> str | None:
            pods = self.live(app)
            return pods[0]["spec"].get("nodeName") or None if len(pods) == 1 else None

        node: str = wait_for(bound, f"the pod of {app} bound", 60)
        return node

    def evicted(self) -> list[Obj]:
        return self.events("InterferenceEvicted")


@pytest.fixture
def moves(
    request: pytest.FixtureRequest, kube: Kube, redis_url: str, controllers: None
) -> Iterator[MovesScene]:
    namespace = "rm-" + request.node.name.removeprefix("test_").replace("_", "-")[:40].rstrip("-")
    kube.ensure_namespace(namespace)
    scene = MovesScene(kube, namespace, redis_url)
    scene.forget_moves()
    yield scene
    for kind in ("replicasets", "statefulsets"):
        path = f"/apis/apps/v1/namespaces/{namespace}/{kind}"
        for item in kube.request("GET", path)["items"]:
            kube.request("DELETE", f"{path}/{item['metadata']['name']}")
    for pod in kube.pods(namespace):
        kube.delete_pod(namespace, pod["metadata"]["name"])
    for node in scene.nodes:
        kube.delete_node(node)
    scene.forget_moves()


@contextlib.contextmanager
def nodes_reporting(scene: MovesScene, sizes: dict[str, str]) -> Iterator[None]:
    """Create the scene's nodes (suffix → CPU), all cordoned, and their agents."""
    scene.nodes = tuple(f"{scene.namespace}-{suffix}" for suffix in sizes)
    for node, cpu in zip(scene.nodes, sizes.values(), strict=True):
        scene.kube.create_node(node, cpu=cpu, memory="1Gi",
                               labels={"rebalance-test": scene.namespace})  # fmt: skip
        scene.cordon(node, True)
    with agents_publishing(scene.redis_url, scene.reports):
        yield


def start(
    scene: MovesScene,
    schedulers: list[SchedulerProcess],
    kubeconfig: Path,
    tmp_path: Path,
    replica: str = "scheduler-0",
    extra: dict[str, object] | None = None,
    **rebalancer: object,
) -> SchedulerProcess:
    settings = {**FAST, **rebalancer}
    config: dict[str, object] = {"rebalancer": settings, **(extra or {})}
    scheduler = start_scheduler(schedulers, tmp_path, kubeconfig, scene.redis_url,
                                scene.namespace, replica=replica, extra=config)  # fmt: skip
    name = "interference_scheduler_signal_age_seconds_count"
    wait_for(lambda: scheduler.metrics().get(name, 0) >= 2, "the scheduler to read the reports")
    return scheduler


def place(scene: MovesScene, app: str, node: str, create: Any) -> None:
    """Create ``app`` with only ``node`` open, and wait for it bound there."""
    for other in scene.nodes:
        scene.cordon(other, other != node)
    create(app)
    assert scene.bound_to(app) == node


def open_all(scene: MovesScene) -> None:
    for node in scene.nodes:
        scene.cordon(node, False)


def test_two_victims_and_one_room_evict_one_and_hold_its_room(
    moves: MovesScene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    # each node has room for one pod: the quiet one (q) for one of the two victims
    with nodes_reporting(moves, {"n1": "150m", "n2": "150m", "q": "150m"}):
        n1, n2, quiet = moves.nodes
        moves.scheduler = start(moves, schedulers, scheduler_kubeconfig, tmp_path)
        place(moves, "one", n1, moves.stateful_set)
        place(moves, "two", n2, moves.stateful_set)
        originals = {p["metadata"]["uid"] for p in moves.kube.pods(moves.namespace)}
        open_all(moves)
        moves.loud = {n1, n2}
        (event,) = wait_for(moves.evicted, "an InterferenceEvicted Event", 60)
        gone = event["regarding"]["name"]  # "one-0" or "two-0": equal breaches
        app, stayed = ("one", "two") if gone == "one-0" else ("two", "one")
        left = n1 if app == "one" else n2
        assert "holds its replacement's room" in event["note"], event["note"]
        assert f"{quiet} passes every filter" in event["note"]
        # the other victim found the room held: no better node, no eviction
        wait_for(lambda: hold_count(moves, "no_better_node") >= 1, "the other victim held", 30)
        assert evictions(moves, "evicted") == 1
        # the StatefulSet recreates its pod (same name) once the old one is gone: on q
        replaced = wait_for(
            lambda: [p for p in moves.live(app) if p["metadata"]["uid"] not in originals
                     and p["spec"].get("nodeName")],
            "the replacement bound",
            60,
        )  # fmt: skip
        assert replaced[0]["spec"]["nodeName"] == quiet

        def placement() -> Any:
            record = moves.record(keys.decision_key, gone)  # the replacement's, same name
            return record if record is not None and record.node == quiet else None

        placed = wait_for(placement, "the replacement's placement record")
        (back,) = [c for c in placed.candidates if c.node == left]
        assert not back.passed  # still loud (and left by its workload)
        # nothing else moves, and the other pod stays on the node it is on
        stays(
            lambda: len(moves.evicted()) == 1 and moves.terminating(stayed) == [],
            "a second eviction",
            6,
        )
        assert evictions(moves, "evicted") == 1
        assert moves.bound_to(stayed) == (n2 if stayed == "two" else n1)
        assert moves.bound_to(app) == quiet


def test_a_replacement_that_lost_its_room_is_never_relaxed_back(
    moves: MovesScene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    with nodes_reporting(moves, {"n1": "8", "q": "8"}):
        left, quiet = moves.nodes
        # the room is held 1 s; the relax rule would drop relaxable filters after 2 s
        cycle = {"relax_after_s": 2}
        moves.scheduler = start(moves, schedulers, scheduler_kubeconfig, tmp_path,
                                extra={"cycle": cycle}, reserve_for_s=1)  # fmt: skip
        place(moves, "one", left, moves.stateful_set)
        open_all(moves)
        moves.deleting = False  # the evicted pod lingers: its replacement comes late
        moves.loud_rows = {left}  # its pods wait long; the node as a whole looks quiet
        (event,) = wait_for(moves.evicted, "the eviction", 60)
        assert f"{quiet} passes every filter" in event["note"]
        scheduler = moves.scheduler
        wait_for(lambda: "room on" in scheduler.log(), "the held room let go", 30)
        # the room it found turned noisy meanwhile; the node it left is quiet again
        moves.loud, moves.loud_rows = {quiet}, set()
        time.sleep(3)  # reports every 0.5 s, read every 0.5 s: the scheduler knows by now
        moves.deleting = True

        def refused() -> Any:
            record = moves.record(keys.decision_key, "one-0")  # the replacement's
            return record if record is not None and record.result != "scheduled" else None

        record = wait_for(refused, "the replacement's unschedulable record", 30)
        (back,) = [c for c in record.candidates if c.node == left]
        assert back.reasons == [
            r for r in back.reasons if r.startswith("node(s) were left by this pod's workload")
        ], back.reasons  # RebalancedAway alone refuses it: relaxing all else changes nothing
        stays(
            lambda: all(p["spec"].get("nodeName") != left for p in moves.live("one")),
            "a replacement relaxed back onto the node it left",
            8,
        )
        # relaxed, it takes the noisy room (Interference is the relaxable filter), not n1
        assert moves.bound_to("one") == quiet


def test_moves_survive_a_redis_restart_and_a_leader_change(
    moves: MovesScene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    own = RedisServer(port=free_port(), workdir=str(tmp_path))  # restarted by this test
    own.start()
    try:
        moves.redis_url = own.url
        with nodes_reporting(moves, {"a": "8", "b": "8"}):
            a, b = moves.nodes
            first = start(moves, schedulers, scheduler_kubeconfig, tmp_path)
            wait_for(first.leading, "scheduler-0 leading")
            second = start(moves, schedulers, scheduler_kubeconfig, tmp_path, "scheduler-1")
            moves.scheduler = first
            place(moves, "web", a, lambda app: moves.replica_set(app, 1))
            open_all(moves)
            moves.loud = {a}
            wait_for(lambda: evictions(moves, "evicted") == 1, "the first move", 60)
            assert moves.bound_to("web") == b
            (move,) = moves.journal()
            assert (move["node"], move["workload"], move["departed"]) == (a, "ReplicaSet/web", True)
            time.sleep(3)  # looks that see the replacement quiet: the move helped
            # Redis forgets everything, the leader dies, and the noise moves to b
            stopped = time.time()
            own.stop()
            own.start()
            for scheduler in (first, second):  # its Redis warnings then are this test's doing
                scheduler.outage = (stopped, time.time() + OUTAGE_LOGGED_S)
            first.kill()
            moves.loud = set()
            moves.scheduler = second
            wait_for(second.leading, "scheduler-1 leading", 30)
            wait_for(lambda: "1 earlier moves read back" in second.log(), "the journal read")
            # the new leader sees the replacement quiet first (it cannot know the move
            # helped otherwise), then b turns noisy and a is quiet: the way back is open
            time.sleep(3)
            moves.loud = {b}
            wait_for(lambda: hold_count(moves, "cooldown") >= 1, "the cool-down hold", 30)
            stays(lambda: moves.terminating("web") == [], "a move back", 6)
            assert evictions(moves, "evicted") == 0
            assert moves.bound_to("web") == b
    finally:
        for scheduler in schedulers:  # before their Redis goes
            scheduler.stop()
        own.stop()


def test_a_workload_noisy_wherever_it_goes_moves_at_most_its_budget(
    moves: MovesScene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    with nodes_reporting(moves, {"a": "8", "b": "8"}):
        a, b = moves.nodes
        # a pod is quiet for its first 6 s wherever it lands (so each move helped), then its
        # node turns noisy: without a budget it would move every cool-down (4 s) for ever
        avoid = {"profile": {"plugin_config": [{"name": "RebalancedAway",
                                                "args": {"avoid_for_s": 4}}]}}  # fmt: skip
        moves.scheduler = start(moves, schedulers, scheduler_kubeconfig, tmp_path,
                                extra={"cycle": avoid}, cooldown_s=4, max_moves_per_workload=2,
                                move_budget_window_s=600)  # fmt: skip
        place(moves, "web", a, lambda app: moves.replica_set(app, 1))
        open_all(moves)
        moves.noisy_after_s = 6.0
        wait_for(lambda: evictions(moves, "evicted") == 2, "two moves", 90)
        wait_for(lambda: hold_count(moves, "move_budget") >= 1, "the move-budget hold", 30)
        stays(lambda: evictions(moves, "evicted") == 2, "a third move", 10)
        notes = [e["note"] for e in moves.evicted()]
        assert len(notes) == 2
        assert any(f"to leave {a}" in n for n in notes) and any(f"to leave {b}" in n for n in notes)
        assert hold_count(moves, "move_did_not_help") == 0  # each move helped for a while
        assert [m["dry_run"] for m in moves.journal()] == [False, False]
        # each verdict journaled, so a later leader does not judge those moves again
        assert sum(bool(m.get("helped")) for m in moves.journal_entries()) == 2


def test_a_dry_run_spends_no_enforce_budget(
    moves: MovesScene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    with nodes_reporting(moves, {"a": "8", "b": "8"}):
        a, b = moves.nodes
        scheduler = start(moves, schedulers, scheduler_kubeconfig, tmp_path,
                          mode="dry_run",
                          max_moves_per_workload=1)  # fmt: skip
        moves.scheduler = scheduler
        place(moves, "web", a, lambda app: moves.replica_set(app, 1))
        open_all(moves)
        moves.loud = {a}
        wait_for(lambda: evictions(moves, "would_evict") == 1, "the would-evict", 60)
        # the dry run's own cool-down (600 s) holds its next "would evict"
        wait_for(lambda: hold_count(moves, "cooldown") >= 1, "the dry run's cool-down", 30)
        assert evictions(moves, "evicted") == 0 and moves.terminating("web") == []
        config_path = tmp_path / "scheduler-0.yaml"
        config = yaml.safe_load(config_path.read_text())
        config["rebalancer"]["mode"] = "enforce"
        rewritten = config_path.with_suffix(".new")
        rewritten.write_text(yaml.safe_dump(config))
        os.replace(rewritten, config_path)  # as a ConfigMap update does; read within 5 s
        # at the next look, not after the 600 s cool-down the dry run spent on its own moves
        wait_for(lambda: evictions(moves, "evicted") == 1, "the eviction once enforcing", 20)
        assert moves.bound_to("web") == b
        (event,) = moves.evicted()
        assert f"to leave {a}" in event["note"]
        assert [m["dry_run"] for m in moves.journal()] == [True, False]
