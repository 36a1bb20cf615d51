"""The Kubernetes preemptor (scheduler/adapters/preemption.py) over real HTTP against the
API emulator: kube-scheduler's calls, in its order, and what a failure does."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from scheduler.adapters.kubernetes import KubernetesCluster
from scheduler.adapters.preemption import KubernetesPreemptor, PreemptionMetrics
from scheduler.cycle.ports import ClusterError, EventType, K8sObject, ObjectKind, PodRef, Preemption
from tests.scheduler.k8s_emulator import EmulatorThread, pod, running_emulator

Obj = dict[str, Any]


@pytest.fixture
def emulator() -> Iterator[EmulatorThread]:
    with running_emulator() as server:
        yield server


def cluster_for(emulator: EmulatorThread) -> KubernetesCluster:
    configuration = client.Configuration()
    configuration.host = emulator.url
    return KubernetesCluster(client.ApiClient(configuration), identity="scheduler-0")


def preemptor_for(
    emulator: EmulatorThread, cluster: KubernetesCluster | None = None
) -> tuple[KubernetesPreemptor, CollectorRegistry]:
    """A preemptor; without informers running it waits only briefly for the victims'
    DELETED events."""
    registry = CollectorRegistry()
    preemptor = KubernetesPreemptor(
        cluster or cluster_for(emulator),
        PreemptionMetrics(registry),
        gone_timeout_s=5.0 if cluster else 0.05,
    )
    return preemptor, registry


def placed(emulator: EmulatorThread, name: str, node: str = "node-a") -> PodRef:
    obj = emulator.put("pods", pod(name, namespace="shop", node=node, phase="Running"))
    return PodRef("shop", name, obj["metadata"]["uid"])


def history(emulator: EmulatorThread, name: str) -> list[tuple[str, Obj]]:
    """(event type, object) of every change of pod ``shop/name``, in order."""
    return emulator.call(
        lambda e: [
            (kind, copy.deepcopy(obj))
            for _, plural, kind, obj, _ in e.history
            if plural == "pods" and obj["metadata"]["name"] == name
        ]
    )


def events(emulator: EmulatorThread) -> list[Obj]:
    return emulator.all("events")


def errors(registry: CollectorRegistry, call: str) -> float:
    value = registry.get_sample_value(
        "interference_scheduler_preemption_call_errors_total", {"call": call}
    )
    return value or 0.0


PREEMPTOR = PodRef("shop", "important", "uid-important")


def test_each_victim_gets_the_condition_then_is_deleted_then_gets_the_event(
    emulator: EmulatorThread,
) -> None:
    preemptor, registry = preemptor_for(emulator)
    victims = (placed(emulator, "low-1"), placed(emulator, "low-2"))
    waiting = emulator.put("pods", pod("mid", namespace="shop"))
    waiting["status"]["nominatedNodeName"] = "node-a"
    emulator.put("pods", waiting)

    preemptor.preempt(
        Preemption(
            PREEMPTOR, "interference-scheduler", "node-a", victims,
            clear_nominated=(PodRef("shop", "mid"),),
        )
    )  # fmt: skip

    for victim in victims:
        changes = history(emulator, victim.name)
        assert [kind for kind, _ in changes] == ["ADDED", "MODIFIED", "DELETED"]
        (condition,) = [
            c for c in changes[1][1]["status"]["conditions"] if c["type"] == "DisruptionTarget"
        ]
        assert condition["status"] == "True"
        assert condition["reason"] == "PreemptionByScheduler"
        assert condition["message"] == (
            "interference-scheduler: preempting to accommodate a higher priority pod"
        )
        assert emulator.get("pods", "shop", victim.name) is None
    preempted = sorted(events(emulator), key=lambda e: e["regarding"]["name"])
    assert [e["regarding"]["name"] for e in preempted] == ["low-1", "low-2"]
    for event, victim in zip(preempted, victims, strict=True):
        assert event["type"] == "Normal"
        assert event["reason"] == "Preempted"
        assert event["action"] == "Preempting"
        assert event["note"] == "Preempted by pod uid-important on node node-a"
        assert event["regarding"]["uid"] == victim.uid
        assert event["related"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "shop",
                                    "name": "important", "uid": "uid-important"}  # fmt: skip
        assert event["reportingInstance"] == "scheduler-0"
    mid = emulator.get("pods", "shop", "mid")
    assert mid is not None and "nominatedNodeName" not in mid["status"]
    deleted = registry.get_sample_value("interference_scheduler_preemption_victims_total")
    assert deleted == 2.0


@pytest.mark.parametrize(
    ("case", "expected_changes"),
    [
        ("gone before the condition", []),
        ("recreated under the same name", ["ADDED", "MODIFIED"]),
    ],
)
def test_a_victim_that_is_gone_is_skipped_without_an_event(
    emulator: EmulatorThread, case: str, expected_changes: list[str]
) -> None:
    """404 on the condition: nothing else is sent; a pod of the same name with another UID
    (a StatefulSet's replacement) fails the DELETE's precondition and is left running."""
    preemptor, registry = preemptor_for(emulator)
    victim = PodRef("shop", "low-1", "uid-of-the-old-pod")
    if case == "recreated under the same name":
        placed(emulator, "low-1")
    preemptor.preempt(Preemption(PREEMPTOR, "interference-scheduler", "node-a", (victim,)))
    assert [kind for kind, _ in history(emulator, "low-1")] == expected_changes
    assert events(emulator) == []
    assert registry.get_sample_value("interference_scheduler_preemption_victims_total") == 0.0


def test_a_failed_delete_fails_the_call_after_the_other_victims(
    emulator: EmulatorThread,
) -> None:
    preemptor, registry = preemptor_for(emulator)
    victims = (placed(emulator, "low-1"), placed(emulator, "low-2"))
    emulator.fail("DELETE", r"/pods/low-1$", 500)
    with pytest.raises(ClusterError, match=r"1 of 2 victims not preempted \(shop/low-1: "):
        preemptor.preempt(Preemption(PREEMPTOR, "interference-scheduler", "node-a", victims))
    assert emulator.get("pods", "shop", "low-1") is not None
    assert emulator.get("pods", "shop", "low-2") is None
    assert errors(registry, "delete") == 1.0
    assert [e["regarding"]["name"] for e in events(emulator)] == ["low-2"]


def test_a_failed_event_does_not_fail_the_preemption_and_is_logged_once(
    emulator: EmulatorThread, caplog: pytest.LogCaptureFixture
) -> None:
    preemptor, registry = preemptor_for(emulator)
    victims = (placed(emulator, "low-1"), placed(emulator, "low-2"))
    emulator.fail("POST", r"/events$", 500, times=2)
    preemptor.preempt(Preemption(PREEMPTOR, "interference-scheduler", "node-a", victims))
    assert emulator.get("pods", "shop", "low-1") is None
    assert emulator.get("pods", "shop", "low-2") is None
    assert errors(registry, "event") == 2.0
    logged = [r for r in caplog.records if "preemption: event failed" in r.getMessage()]
    assert len(logged) == 1


def test_nominate_sets_and_clears_and_a_missing_pod_is_no_error(
    emulator: EmulatorThread,
) -> None:
    preemptor, registry = preemptor_for(emulator)
    emulator.put("pods", pod("important", namespace="shop"))
    preemptor.nominate(PodRef("shop", "important"), "node-a")
    nominated = emulator.get("pods", "shop", "important")
    assert nominated is not None and nominated["status"]["nominatedNodeName"] == "node-a"
    preemptor.nominate(PodRef("shop", "important"), "")
    cleared = emulator.get("pods", "shop", "important")
    assert cleared is not None and "nominatedNodeName" not in cleared["status"]
    preemptor.nominate(PodRef("shop", "important"), "node-b", "0/2 nodes are available: …")
    both = emulator.get("pods", "shop", "important")
    assert both is not None and both["status"]["nominatedNodeName"] == "node-b"
    [condition] = [c for c in both["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False",
        "Unschedulable",
        "0/2 nodes are available: …",
    )
    preemptor.nominate(PodRef("shop", "gone"), "node-a")
    emulator.fail("PATCH", r"/pods/important/status$", 500)
    with pytest.raises(ClusterError, match="HTTP 500"):
        preemptor.nominate(PodRef("shop", "important"), "node-a")
    assert errors(registry, "nominate") == 1.0


class Deletions:
    """A ClusterHandler that notes the pods its DELETED events named."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    def replace(self, kind: ObjectKind, objects: list[K8sObject]) -> None:
        pass

    def apply(self, kind: ObjectKind, event: EventType, obj: K8sObject) -> None:
        if kind == "Pod" and event == "DELETED":
            self.deleted.append(obj["metadata"]["name"])


def test_preempt_returns_once_the_informer_has_handed_on_the_victims_deletion(
    emulator: EmulatorThread,
) -> None:
    """The loop does not attempt the preemptor while preempt() runs; returning before the
    cache saw the victims go would let an attempt see them placed and preempt again."""
    cluster = cluster_for(emulator)
    handler, stop = Deletions(), threading.Event()
    informers = threading.Thread(target=cluster.run_informers, args=(handler, stop), daemon=True)
    victims = (placed(emulator, "low-1"), placed(emulator, "low-2"))
    informers.start()
    try:
        deadline = time.monotonic() + 30
        while not cluster.synced():
            assert time.monotonic() < deadline, "informers did not sync"
            time.sleep(0.05)
        preemptor, _ = preemptor_for(emulator, cluster)
        preemptor.preempt(Preemption(PREEMPTOR, "interference-scheduler", "node-a", victims))
        assert sorted(handler.deleted) == ["low-1", "low-2"]
        assert cluster.wait_gone([v.uid for v in victims], 0.0)
        assert not cluster.wait_gone(["uid-never-deleted"], 0.05)
    finally:
        stop.set()
        informers.join(30)
