"""Preemption on a real kube-apiserver (issue 30): the real scheduler process with deploy/'s
RBAC, kube-controller-manager's disruption controller for PodDisruptionBudget status, a
real redis-server fed by the agent's real publisher.

Nodes are fake (no kubelet). A victim with a grace period stays, terminating, until the
test deletes it with grace 0 (what its kubelet would do); one with
``terminationGracePeriodSeconds: 0`` is gone as soon as the scheduler deletes it. Each
test has its own namespace, scheduler name, PriorityClasses and nodes, which its pods
select by label, so nodes left by other tests are never candidates.
"""

from __future__ import annotations

import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from interference.signals import (
    NodeMetrics,
    NodeReport,
    PodMetrics,
    WindowMetrics,
    window_name,
)
from tests.e2e.agents import agents_publishing
from tests.e2e.conftest import start_scheduler
from tests.e2e.control_plane import ControlPlane, controller_manager
from tests.e2e.kube import BindingWatch, Kube, SchedulerProcess, condition, wait_for

pytestmark = [pytest.mark.e2e]

Obj = dict[str, Any]
NOISY_US = 50_000.0
"""Run-queue p99 the agents report for a noisy node (a tolerance of 500 µs rejects it)."""
QUIET_US = 100.0
SELECTOR = "preemption-test"


@pytest.fixture(scope="module")
def disruption_controller(control_plane: ControlPlane) -> Iterator[None]:
    """kube-controller-manager with the disruption controller: it writes each
    PodDisruptionBudget's ``status.disruptionsAllowed``, which preemption reads."""
    with controller_manager(control_plane, "disruption", "preemption-controller-manager"):
        yield


@dataclass
class Scene:
    """One test's namespace (also its scheduler name), nodes and what the agents report."""

    kube: Kube
    namespace: str
    nodes: list[str] = field(default_factory=list)
    noisy: set[str] = field(default_factory=set)
    classes: list[str] = field(default_factory=list)
    antagonists: dict[str, tuple[str, str]] = field(default_factory=dict)
    """node → (a pod there, the antagonist its agent names): the node is noisy, and its
    agent names the antagonist as that pod's culprit, for as long as the antagonist exists."""

    def node(self, suffix: str, cpu: str = "4", gpus: int = 0) -> str:
        name = f"{self.namespace}-{suffix}"
        self.kube.create_node(name, cpu=cpu, memory="32Gi", gpus=gpus,
                              labels={SELECTOR: self.namespace})  # fmt: skip
        self.nodes.append(name)
        return name

    def priority_class(self, suffix: str, value: int, never: bool = False) -> str:
        name = f"{self.namespace}-{suffix}"
        body: Obj = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": name}, "value": value}  # fmt: skip
        if never:
            body["preemptionPolicy"] = "Never"
        self.kube.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body)
        self.classes.append(name)
        return name

    def pod(
        self, name: str, cpu: str = "1", *, priority_class: str = "", node: str = "",
        grace_s: int = 0, labels: dict[str, str] | None = None, gpus: int = 0,
        annotations: dict[str, str] | None = None,
    ) -> Obj:  # fmt: skip
        """A pod of this test's scheduler; with ``node`` it is created already placed."""
        resources: Obj = {"requests": {"cpu": cpu, "memory": "64Mi"}}
        if gpus:
            resources["requests"]["nvidia.com/gpu"] = str(gpus)
            resources["limits"] = {"nvidia.com/gpu": str(gpus)}
        spec: Obj = {
            "schedulerName": self.namespace,
            "nodeSelector": {SELECTOR: self.namespace},
            "terminationGracePeriodSeconds": grace_s,
            "containers": [{"name": "c", "image": "registry.invalid/pause:1",
                            "resources": resources}],
        }  # fmt: skip
        if priority_class:
            spec["priorityClassName"] = priority_class
        if node:
            spec["nodeName"] = node
        metadata = {"name": name, "labels": labels or {}, "annotations": annotations or {}}
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        created: Obj = self.kube.request("POST", path, {"metadata": metadata, "spec": spec})
        return created

    def running(self, name: str) -> None:
        """Mark a placed pod Running and Ready (what its kubelet would report)."""
        conditions = [{"type": "Ready", "status": "True"},
                      {"type": "PodScheduled", "status": "True"}]  # fmt: skip
        status = {"status": {"phase": "Running", "conditions": conditions}}
        self.kube.request("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{name}/status",
                          status, "application/merge-patch+json")  # fmt: skip

    def get(self, name: str) -> Obj | None:
        try:
            return self.kube.pod(self.namespace, name)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def finish_termination(self, name: str) -> None:
        """What the kubelet does once a terminating pod's containers stopped."""
        self.kube.delete_pod(self.namespace, name)

    def bound_to(self, name: str, timeout_s: float = 60.0) -> str:
        def node() -> str:
            pod = self.get(name)
            return str((pod or {}).get("spec", {}).get("nodeName", ""))

        found: str = wait_for(node, f"{name} to be bound", timeout_s)
        return found

    def events(self, reason: str, pod: str = "") -> list[Obj]:
        return [
            e
            for e in self.kube.events(self.namespace)
            if e["reason"] == reason and (not pod or e["regarding"]["name"] == pod)
        ]

    def budget(self, name: str, app: str, **spec: int) -> int:
        """A PodDisruptionBudget over ``app``; waits for the disruption controller's status
        and returns its ``disruptionsAllowed``."""
        path = f"/apis/policy/v1/namespaces/{self.namespace}/poddisruptionbudgets"
        body = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name},
                "spec": {**spec, "selector": {"matchLabels": {"app": app}}}}  # fmt: skip
        self.kube.request("POST", path, body)

        def observed() -> Obj | None:
            pdb: Obj = self.kube.request("GET", f"{path}/{name}")
            status = pdb.get("status", {})
            done = status.get("observedGeneration") == pdb["metadata"]["generation"]
            return status if done and status.get("expectedPods") else None

        status: Obj = wait_for(observed, f"the disruption controller to observe {name}")
        return int(status.get("disruptionsAllowed", 0))

    def reports(self, now: float) -> list[NodeReport]:
        """Every node of the test reports, the noisy ones a run-queue p99 of 50 ms."""
        out = []
        for node in self.nodes:
            rows: list[PodMetrics] = []
            noisy = node in self.noisy
            if node in self.antagonists:
                sufferer, antagonist = self.antagonists[node]
                try:
                    noisy = self.get(antagonist) is not None
                except OSError:
                    continue  # no report this round rather than a wrong one
                if noisy:
                    culprit = (f"{self.namespace}/{antagonist}", 400.0)
                    rows = [PodMetrics(self.namespace, sufferer, cpu_ms_per_s=200.0,
                                       runq_wait_ms_per_s=400.0, neighbour_wait_ms_per_s=400.0,
                                       culprits=(culprit,))]  # fmt: skip
            p99 = NOISY_US if noisy else QUIET_US
            windows = {
                window_name(span): WindowMetrics(span_s=span, covered_s=span,
                                                 intervals=int(span), runq_p99_us=p99)
                for span in (10.0, 60.0)
            }  # fmt: skip
            out.append(
                NodeReport(node=node, ts=now, interval_s=1.0,
                           metrics=NodeMetrics(runq_p99_us=p99), measured=("psi", "runq"),
                           windows=windows, histograms={"runq_us": [1]}, pods=rows)
            )  # fmt: skip
        return out


@pytest.fixture
def scene(request: pytest.FixtureRequest, kube: Kube, redis_url: str) -> Iterator[Scene]:
    namespace = "pre-" + request.node.name.removeprefix("test_").replace("_", "-")[:40]
    namespace = namespace.rstrip("-")
    kube.ensure_namespace(namespace)
    scene = Scene(kube, namespace)
    with agents_publishing(redis_url, scene.reports):
        yield scene
    for pdb in kube.request("GET", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets")[
        "items"
    ]:
        kube.request("DELETE", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/"
                     f"{pdb['metadata']['name']}")  # fmt: skip
    for pod in kube.pods(namespace):
        kube.delete_pod(namespace, pod["metadata"]["name"])
    for node in scene.nodes:
        kube.delete_node(node)
    for name in scene.classes:
        kube.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


def scheduler_for(
    scene: Scene, schedulers: list[SchedulerProcess], kubeconfig: Path, redis_url: str,
    workdir: Path, cycle: dict[str, object] | None = None,
) -> SchedulerProcess:  # fmt: skip
    """The real scheduler process for the scene's pods; relaxing tolerances is pushed far
    out so no test sees a pod placed (or preempting) without its interference filter."""
    scheduler = start_scheduler(
        schedulers, workdir, kubeconfig, redis_url, scene.namespace,
        extra={"cycle": {"relax_after_s": 3600, **(cycle or {})}},
    )  # fmt: skip
    wait_for(scheduler.leading, "the scheduler to lead")
    reports = "interference_scheduler_signal_age_seconds_count"
    wait_for(lambda: scheduler.metrics().get(reports, 0) >= 2 * len(scene.nodes),
             "the scheduler to receive the nodes' reports")  # fmt: skip
    return scheduler


def disruption_target(pod: Obj | None) -> Obj | None:
    return condition(pod, "DisruptionTarget") if pod else None


def test_nominated_node_is_set_held_against_a_lower_priority_pod_then_used(
    scene: Scene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    redis_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    """The victim (30 s grace, no kubelet) stays terminating: the preemptor waits with
    ``status.nominatedNodeName``; a lower-priority pod created meanwhile, which would fit
    in the room left beside the terminating victim, must not take the preemptor's room;
    once the victim is gone the preemptor is bound there, before that pod."""
    node = scene.node("a")
    high = scene.priority_class("high", 1000)
    scene.pod("victim", "3", node=node, grace_s=30)
    scene.running("victim")
    watch = BindingWatch(scene.kube, scene.namespace)
    watch.start()
    try:
        scheduler_for(scene, schedulers, scheduler_kubeconfig, redis_url, tmp_path)
        preemptor = scene.pod("important", "2", priority_class=high)

        nominated = wait_for(
            lambda: (scene.get("important") or {}).get("status", {}).get("nominatedNodeName"),
            "the preemptor's nominatedNodeName",
        )
        assert nominated == node
        victim = wait_for(
            lambda: (p := scene.get("victim")) and p["metadata"].get("deletionTimestamp") and p,
            "the victim to be deleted (terminating, 30 s grace)",
        )
        target = disruption_target(victim)
        assert target is not None, victim["status"]
        assert (target["status"], target["reason"]) == ("True", "PreemptionByScheduler")
        assert target["message"] == (
            f"{scene.namespace}: preempting to accommodate a higher priority pod"
        )
        (event,) = wait_for(lambda: scene.events("Preempted", "victim"), "the Preempted Event")
        assert event["type"] == "Normal" and event["action"] == "Preempting"
        assert event["note"] == f"Preempted by pod {preemptor['metadata']['uid']} on node {node}"
        assert event["related"]["name"] == "important"

        scene.pod("latecomer", "1")  # priority 0: fits beside the victim, not beside both
        wait_for(lambda: scene.events("FailedScheduling", "latecomer"),
                 "the latecomer to be refused")  # fmt: skip
        assert not (scene.get("latecomer") or {}).get("spec", {}).get("nodeName")
        assert not (scene.get("important") or {}).get("spec", {}).get("nodeName")

        scene.finish_termination("victim")
        assert scene.bound_to("important") == node
        assert scene.bound_to("latecomer") == node  # 2 + 1 of 4 CPUs once the victim is gone
        bound = watch.bound()
        assert bound["important"][0][1] <= bound["latecomer"][0][1]
    finally:
        watch.close()


def test_a_budget_that_allows_no_disruption_sends_preemption_to_another_node(
    scene: Scene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    redis_url: str, tmp_path: Path, disruption_controller: None,
) -> None:  # fmt: skip
    """Node A's victim has the lower priority, so A would be chosen, but its budget allows
    no disruption; node B's victim is covered by a budget that allows one: B is chosen,
    A's pod is left alone (kube-scheduler: fewest PodDisruptionBudget violations first)."""
    node_a, node_b = scene.node("a"), scene.node("b")
    middle = scene.priority_class("middle", 100)
    high = scene.priority_class("high", 1000)
    scene.pod("guarded", "3", node=node_a, labels={"app": "guarded"})
    scene.pod("allowed", "3", node=node_b, priority_class=middle, labels={"app": "allowed"})
    for name in ("guarded", "allowed"):
        scene.running(name)
    assert scene.budget("guarded", "guarded", minAvailable=1) == 0
    assert scene.budget("allowed", "allowed", minAvailable=0) == 1  # bare pods: no maxUnavailable
    scheduler_for(scene, schedulers, scheduler_kubeconfig, redis_url, tmp_path)

    scene.pod("important", "2", priority_class=high)
    assert scene.bound_to("important") == node_b
    assert scene.get("allowed") is None
    guarded = scene.get("guarded")
    assert guarded is not None and disruption_target(guarded) is None
    assert not guarded["metadata"].get("deletionTimestamp")
    assert [e["regarding"]["name"] for e in scene.events("Preempted")] == ["allowed"]


def test_preemption_policy_never_waits_without_preempting(
    scene: Scene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    redis_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    node = scene.node("a")
    polite = scene.priority_class("polite", 1000, never=True)
    scene.pod("victim", "3", node=node)
    scheduler = scheduler_for(scene, schedulers, scheduler_kubeconfig, redis_url, tmp_path)

    scene.pod("polite", "2", priority_class=polite)
    wait_for(lambda: scene.events("FailedScheduling", "polite"), "the polite pod to be refused")
    attempts = 'interference_scheduler_attempts_total{result="unschedulable"}'
    seen = scheduler.metrics().get(attempts, 0)
    wait_for(lambda: scheduler.metrics().get(attempts, 0) > seen, "another attempt", 20)
    pod = scene.get("polite")
    assert pod is not None and not pod["spec"].get("nodeName")
    assert not pod["status"].get("nominatedNodeName")
    victim = scene.get("victim")
    assert victim is not None and not victim["metadata"].get("deletionTimestamp")
    assert scene.events("Preempted") == []


def test_a_gpu_pod_preempts_for_nvidia_com_gpu(
    scene: Scene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    redis_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    """The node has CPU to spare but its one GPU (an extended resource in its status, as
    the device plugin reports it) is held by a lower-priority pod."""
    node = scene.node("gpu", cpu="16", gpus=1)
    training = scene.priority_class("training", 1000)
    scene.pod("batch", "1", node=node, gpus=1)
    scheduler_for(scene, schedulers, scheduler_kubeconfig, redis_url, tmp_path)

    scene.pod("trainer", "1", priority_class=training, gpus=1)
    assert scene.bound_to("trainer") == node
    assert scene.get("batch") is None
    (event,) = scene.events("Preempted", "batch")
    assert event["note"].endswith(f"on node {node}")


def test_a_node_the_pods_tolerance_rejects_is_never_a_candidate(
    scene: Scene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    redis_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    """A is noisy beyond the pod's tolerance: removing its lower-priority pods would make
    room, not quiet. With B cordoned the pod waits and A's pod stays; once B is schedulable
    the preemption happens there, although A's victim has the lower priority."""
    node_a, node_b = scene.node("a"), scene.node("b")
    scene.noisy.add(node_a)
    middle = scene.priority_class("middle", 100)
    high = scene.priority_class("high", 1000)
    scene.pod("on-noisy", "3", node=node_a)
    scene.pod("on-quiet", "3", node=node_b, priority_class=middle)
    cordon = {"spec": {"unschedulable": True}}
    scene.kube.request("PATCH", f"/api/v1/nodes/{node_b}", cordon, "application/merge-patch+json")
    scheduler = scheduler_for(scene, schedulers, scheduler_kubeconfig, redis_url, tmp_path)

    scene.pod("picky", "2", priority_class=high,
              annotations={"interference.io/max-runq-p99-us": "500"})  # fmt: skip
    wait_for(lambda: scene.events("FailedScheduling", "picky"), "the picky pod to be refused")
    attempts = 'interference_scheduler_attempts_total{result="unschedulable"}'
    seen = scheduler.metrics().get(attempts, 0)
    wait_for(lambda: scheduler.metrics().get(attempts, 0) > seen, "another attempt", 20)
    assert scene.get("on-noisy") is not None and scene.events("Preempted") == []
    assert not (scene.get("picky") or {}).get("status", {}).get("nominatedNodeName")

    uncordon = {"spec": {"unschedulable": False}}
    scene.kube.request("PATCH", f"/api/v1/nodes/{node_b}", uncordon,
                       "application/merge-patch+json")  # fmt: skip
    assert scene.bound_to("picky") == node_b
    assert scene.get("on-quiet") is None
    on_noisy = scene.get("on-noisy")
    assert on_noisy is not None and disruption_target(on_noisy) is None


def test_opt_in_antagonists_of_lower_priority_are_preempted_to_quiet_a_node(
    scene: Scene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    redis_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    """``cycle.preemption.preempt_antagonists``: the only node has room, but its agent
    reports it noisy beyond the pod's tolerance and names one pod as the culprit of a
    neighbour's waits. The culprit has a lower priority than the pod: it is preempted
    (DisruptionTarget, Preempted Event), the node turns quiet and the pod is bound there.
    The neighbour, of the pod's own priority, stays."""
    node = scene.node("a")
    high = scene.priority_class("high", 1000)
    scene.pod("steady", "500m", node=node, priority_class=high)
    scene.pod("hog", "1", node=node, grace_s=30)
    scene.antagonists[node] = ("steady", "hog")
    scheduler_for(scene, schedulers, scheduler_kubeconfig, redis_url, tmp_path,
                  cycle={"preemption": {"preempt_antagonists": True}})  # fmt: skip

    scene.pod("picky", "1", priority_class=high,
              annotations={"interference.io/max-runq-p99-us": "500"})  # fmt: skip
    hog = wait_for(
        lambda: (p := scene.get("hog")) and p["metadata"].get("deletionTimestamp") and p,
        "the antagonist to be preempted",
    )
    target = disruption_target(hog)
    assert target is not None and target["reason"] == "PreemptionByScheduler"
    (event,) = wait_for(lambda: scene.events("Preempted", "hog"), "the Preempted Event")
    assert event["note"].endswith(f"on node {node}")
    nominated = (scene.get("picky") or {}).get("status", {}).get("nominatedNodeName")
    assert nominated == node
    scene.finish_termination("hog")  # its kubelet; the agent then reports the node quiet
    assert scene.bound_to("picky") == node
    steady = scene.get("steady")
    assert steady is not None and disruption_target(steady) is None
