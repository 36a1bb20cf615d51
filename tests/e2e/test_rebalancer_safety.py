"""What the rebalancer must not evict, and the evidence it must not act on (issue 29,
items 1 and 3), on a real apiserver with the real scheduler process, redis-server and the
agent's real publisher (the scene of tests/e2e/test_rebalancer.py).

Every test places its pods on node A while B is cordoned and A is quiet, then uncordons B
(smaller, so without the rebalancer's record the scheduler would put a replacement back on
A) and makes A's reports say what the case needs: a victim an eviction would lose (a Job's
pod, a pod with an emptyDir, a system-critical pod), two victims of unequal breach, or
noise the rebalancer must not believe (a report dated ahead, a burst, rows of an agent
whose keys expired, reports that did not measure the run queue, an agent whose clock is
behind).
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from interference import keys
from interference.signals import NodeMetrics, NodeReport, PodMetrics, WindowMetrics, window_name
from tests.e2e import test_rebalancer
from tests.e2e.agents import agents_publishing
from tests.e2e.kube import Kube, SchedulerProcess, wait_for
from tests.e2e.test_rebalancer import (
    NOISY,
    QUIET,
    Obj,
    Scene,
    evictions,
    hold_count,
    start,
    stays,
)

pytestmark = [pytest.mark.e2e]

controllers = test_rebalancer.controllers
"""kube-controller-manager's ReplicaSet and disruption controllers (a fixture)."""

LOUD = (0,) * 12 + (5000,)
"""One interval's worth of long waits that outweighs a window of quiet ones."""


@dataclass
class SafetyScene(Scene):
    """A scene whose node A is quiet until a test makes it noisy, with hooks on A's reports."""

    noisy: bool = False
    publish_a: bool = True
    change_a: Callable[[NodeReport], list[NodeReport]] | None = None
    """Turns each of A's reports into what is published instead."""
    published: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reports(self, now: float) -> list[NodeReport]:
        try:
            pods = self.kube.pods(self.namespace)
        except (OSError, urllib.error.URLError):
            pods = []
        rows: dict[str, list[PodMetrics]] = {self.node_a: [], self.node_b: []}
        for pod in pods:
            node = pod["spec"].get("nodeName", "")
            if node not in rows or pod["metadata"].get("deletionTimestamp"):
                continue
            noisy = self.noisy and node == self.node_a
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
        found: list[NodeReport] = []
        with self.lock:
            self.published += 1
            for node, node_rows in rows.items():
                report = NodeReport(
                    node=node, ts=now, interval_s=1.0, metrics=NodeMetrics(runq_p99_us=100.0),
                    measured=("psi", "runq"), windows=windows, histograms={"runq_us": [5]},
                    pods=node_rows,
                )  # fmt: skip
                if node != self.node_a:
                    found.append(report)
                elif self.publish_a:
                    found.extend(self.change_a(report) if self.change_a else [report])
        return found

    def workload(
        self, name: str, tolerance: str = "500", kind: str = "ReplicaSet", **spec: Any
    ) -> None:
        """A ReplicaSet of one (or, ``kind="Job"``, a suspended Job and one pod it controls)."""
        labels = {"app": name}
        template: Obj = {
            "metadata": {
                "labels": labels,
                "annotations": {"interference.io/max-runq-p99-us": tolerance},
            },
            "spec": {
                "schedulerName": self.namespace,
                "nodeSelector": {"rebalance-test": self.namespace},
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "c", "image": "registry.invalid/pause:1",
                                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
                **spec,
            },
        }  # fmt: skip
        ns = self.namespace
        if kind == "ReplicaSet":
            body = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                             "template": template}}  # fmt: skip
            self.kube.request("POST", f"/apis/apps/v1/namespaces/{ns}/replicasets", body)
            return
        job_template = {**template, "spec": {**template["spec"], "restartPolicy": "Never"}}
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"suspend": True, "backoffLimit": 0, "template": job_template}}  # fmt: skip
        created = self.kube.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job)
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {**job_template["metadata"], "name": f"{name}-0", "namespace": ns,
                            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                 "name": name, "uid": created["metadata"]["uid"],
                                                 "controller": True}]},
               "spec": job_template["spec"]}  # fmt: skip
        self.kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)

    def rebalancing_record(self, pod: str) -> Any:
        return self.record(keys.rebalance_decision_key, pod)


@pytest.fixture
def safe(
    request: pytest.FixtureRequest, kube: Kube, redis_url: str, controllers: None
) -> Iterator[SafetyScene]:
    name = request.node.name.removeprefix("test_").replace("_", "-")
    case = ""
    if "[" in name:  # a parametrized test: one namespace per case
        name, case = name.rstrip("]").split("[", 1)
    namespace = "rs-" + "-".join(p for p in (name[:30].rstrip("-"), case) if p)
    kube.ensure_namespace(namespace)
    scene = SafetyScene(kube, namespace, redis_url)
    kube.create_node(scene.node_a, cpu="8", memory="8Gi", labels={"rebalance-test": namespace})
    kube.create_node(scene.node_b, cpu="1", memory="1Gi", labels={"rebalance-test": namespace})
    scene.cordon(scene.node_b, True)
    with agents_publishing(redis_url, scene.reports):
        yield scene
    for group, kind in (("apps", "replicasets"), ("batch", "jobs")):
        path = f"/apis/{group}/v1/namespaces/{namespace}/{kind}"
        for item in kube.request("GET", path)["items"]:
            kube.request("DELETE", f"{path}/{item['metadata']['name']}")
    for pod in kube.pods(namespace):
        kube.delete_pod(namespace, pod["metadata"]["name"])
    for node in (scene.node_a, scene.node_b):
        kube.delete_node(node)


def placed_then_open(scene: SafetyScene, *apps: str) -> list[Obj]:
    """Wait for each app's pod bound to A (marked Running), then uncordon B."""
    pods = [pod for app in apps for pod in scene.placed(app, 1)]
    assert {p["spec"]["nodeName"] for p in pods} == {scene.node_a}
    scene.cordon(scene.node_b, False)
    return pods


def no_eviction_for(scene: SafetyScene, seconds: float, *apps: str) -> None:
    stays(lambda: all(scene.terminating(app) == [] for app in apps), "an eviction", seconds)
    assert evictions(scene, "evicted") == 0


@pytest.mark.parametrize(
    ("kind", "spec", "reason"),
    [
        ("Job", {}, "job_pod"),
        ("ReplicaSet", {"volumes": [{"name": "scratch", "emptyDir": {}}]}, "local_storage"),
        ("ReplicaSet", {"priorityClassName": "system-cluster-critical"}, "system_critical"),
    ],
    ids=["job", "emptydir", "critical"],
)
def test_a_pod_an_eviction_would_lose_is_held_with_its_reason(
    safe: SafetyScene,
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    tmp_path: Path,
    kind: str,
    spec: dict[str, Any],
    reason: str,
) -> None:
    start(safe, schedulers, scheduler_kubeconfig, tmp_path, mode="enforce", max_per_cluster=50)
    safe.workload("batch", kind=kind, **spec)
    (pod,) = placed_then_open(safe, "batch")
    safe.noisy = True
    no_eviction_for(safe, 6, "batch")  # sustained after 2 s: it would have gone by now
    assert hold_count(safe, reason) == 1  # once per streak
    record = wait_for(lambda: safe.rebalancing_record(pod["metadata"]["name"]), "the record")
    assert record.result == "held"
    assert record.message.startswith(f"{reason}: its run-queue p99")
    assert "an eviction would not move it whole" in record.message


def test_the_worst_breach_on_a_node_moves_first(
    safe: SafetyScene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    start(safe, schedulers, scheduler_kubeconfig, tmp_path, mode="enforce", max_per_cluster=50)
    safe.workload("first", tolerance="500")  # placed first: ~16× over
    safe.placed("first", 1)
    safe.workload("worst", tolerance="150")  # ~55× over
    placed_then_open(safe, "worst")
    safe.noisy = True
    wait_for(lambda: evictions(safe, "evicted") == 1, "one eviction", 60)
    assert len(safe.terminating("worst")) == 1
    stays(lambda: safe.terminating("first") == [], "the lesser breach moved too", 3)


def test_a_report_dated_ahead_is_refused_not_kept(
    safe: SafetyScene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    start(safe, schedulers, scheduler_kubeconfig, tmp_path, mode="enforce", max_per_cluster=50)
    safe.workload("web")
    placed_then_open(safe, "web")
    ahead = [3]  # three reports 600 s ahead, full of long waits; the on-time ones quiet

    def one_ahead(report: NodeReport) -> list[NodeReport]:
        if not ahead[0]:
            return [report]
        ahead[0] -= 1
        loud = [dataclasses.replace(p, runq_us=LOUD) for p in report.pods]
        return [report, dataclasses.replace(report, ts=report.ts + 600, pods=loud)]

    safe.change_a = one_ahead
    no_eviction_for(safe, 8, "web")
    assert safe.metric("interference_scheduler_rebalance_over_tolerance_pods") == 0
    metric = 'interference_scheduler_rebalance_refused_reports_total{reason="clock_ahead"}'
    assert safe.metric(metric) == 3


def test_a_burst_inside_the_window_is_no_sustained_breach(
    safe: SafetyScene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    start(
        safe,
        schedulers,
        scheduler_kubeconfig,
        tmp_path,
        mode="enforce",
        sustained_for_s=4,
        max_per_cluster=50,
    )
    safe.workload("web")
    placed_then_open(safe, "web")
    safe.noisy = True
    time.sleep(2.0)  # a 2 s burst: the 10 s window's merged p99 stays over for ~10 s
    safe.noisy = False
    no_eviction_for(safe, 12, "web")


def test_rows_of_an_agent_whose_keys_expired_are_no_evidence(
    safe: SafetyScene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    # looks 5 s apart: the rows it read stay in its memory longer than the agent's keys live
    start(safe, schedulers, scheduler_kubeconfig, tmp_path, mode="enforce", interval_s=5,
          max_per_cluster=50)  # fmt: skip
    safe.workload("web")
    safe.placed("web", 1)
    safe.noisy = True  # B still cordoned: a sustained victim with nowhere to go
    wait_for(lambda: hold_count(safe, "no_better_node") >= 1, "the no-better-node hold", 60)
    with safe.lock:
        safe.publish_a = False  # the agent dies; its keys expire (TTL 5 s)
    client = redis.Redis.from_url(safe.redis_url)
    try:
        wait_for(lambda: not client.exists(keys.sched_key(safe.node_a)), "A's record expired")
    finally:
        client.close()
    safe.cordon(safe.node_b, False)
    no_eviction_for(safe, 8, "web")


def test_reports_that_did_not_measure_the_run_queue_are_no_evidence(
    safe: SafetyScene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    start(safe, schedulers, scheduler_kubeconfig, tmp_path, mode="enforce", max_per_cluster=50)
    safe.workload("web")
    placed_then_open(safe, "web")

    def unmeasured_noise(report: NodeReport) -> list[NodeReport]:
        if safe.published % 2:
            return [report]  # measured, quiet
        loud = [dataclasses.replace(p, runq_us=NOISY) for p in report.pods]
        return [dataclasses.replace(report, measured=("psi",), pods=loud)]

    safe.change_a = unmeasured_noise
    no_eviction_for(safe, 8, "web")
    metric = 'interference_scheduler_rebalance_refused_reports_total{reason="unmeasured"}'
    assert safe.metric(metric) >= 1


def test_an_agent_whose_clock_is_behind_is_a_warning(
    safe: SafetyScene, schedulers: list[SchedulerProcess], scheduler_kubeconfig: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    start(safe, schedulers, scheduler_kubeconfig, tmp_path, mode="enforce", max_per_cluster=50)
    safe.workload("web")
    (pod,) = placed_then_open(safe, "web")
    safe.change_a = lambda report: [dataclasses.replace(report, ts=report.ts - 8)]
    safe.noisy = True
    events = wait_for(lambda: safe.events("InterferenceAgentClockSkewed"), "the Warning", 30)
    assert (
        events[0]["type"] == "Warning" and events[0]["regarding"]["name"] == pod["metadata"]["name"]
    )
    # 8 s, plus the time between the report and the look that read it
    assert re.search(r"stamped (8|9) s behind", events[0]["note"]), events[0]["note"]
    assert "NTP" in events[0]["note"]
    assert safe.metric("interference_scheduler_rebalance_skewed_agents") == 1
