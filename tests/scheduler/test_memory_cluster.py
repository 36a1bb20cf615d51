"""InMemoryCluster: list-then-watch delivery, Binding semantics, recorded writes."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from scheduler.adapters.memory import InMemoryCluster
from scheduler.adapters.object_builders import namespace_object, node_object, pod_object
from scheduler.api.quantity import resource_amount
from scheduler.cycle.ports import (
    INFORMED_KINDS,
    PREEMPTION_KINDS,
    ApiUnavailable,
    BindConflict,
    ClusterError,
    PodRef,
)


class RecordingHandler:
    """A ClusterHandler that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.changed = threading.Event()

    def replace(self, kind: str, objects: list[dict[str, Any]]) -> None:
        self.calls.append(("replace", kind, sorted(o["metadata"]["name"] for o in objects)))
        self.changed.set()

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        self.calls.append(("apply", kind, event, obj["metadata"]["name"]))
        self.changed.set()


def test_informer_lists_then_delivers_changes_in_order() -> None:
    cluster = InMemoryCluster()
    cluster.add_node(node_object("n1"))
    cluster.add_pod(pod_object("p1"))
    cluster.add_namespace(namespace_object("default"))
    handler = RecordingHandler()
    informer = cluster.informer(handler)
    informer.sync()
    listed = {"Node": ["n1"], "Namespace": ["default"], "Pod": ["p1"]}
    kinds = INFORMED_KINDS + PREEMPTION_KINDS  # it implements the Preemptor too
    assert handler.calls == [("replace", kind, listed.get(kind, [])) for kind in kinds]
    handler.calls.clear()
    cluster.add_node(node_object("n2"))
    cluster.add_node(node_object("n2", cpu="4"))
    cluster.delete_pod("default", "p1")
    cluster.delete_pod("default", "p1")  # already gone: no event
    cluster.add_namespace(namespace_object("team-a", {"team": "a"}))
    assert informer.sync() == 4
    assert handler.calls == [
        ("apply", "Node", "ADDED", "n2"),
        ("apply", "Node", "MODIFIED", "n2"),
        ("apply", "Pod", "DELETED", "p1"),
        ("apply", "Namespace", "ADDED", "team-a"),
    ]
    assert informer.sync() == 0


def test_resource_versions_increase() -> None:
    cluster = InMemoryCluster()
    cluster.add_node(node_object("n1"))
    cluster.add_pod(pod_object("p1"))
    first = int(cluster.get_pod("default", "p1")["metadata"]["resourceVersion"])  # type: ignore[index]
    cluster.bind(PodRef("default", "p1"), "n1")
    second = int(cluster.get_pod("default", "p1")["metadata"]["resourceVersion"])  # type: ignore[index]
    assert second > first > int(cluster.get_node("n1")["metadata"]["resourceVersion"])  # type: ignore[index]


def test_run_informers_follows_until_stopped() -> None:
    cluster = InMemoryCluster()
    handler = RecordingHandler()
    stop = threading.Event()
    thread = threading.Thread(target=cluster.run_informers, args=(handler, stop))
    thread.start()
    try:
        assert handler.changed.wait(30)
        handler.changed.clear()
        cluster.add_node(node_object("late"))
        assert handler.changed.wait(30)
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert ("apply", "Node", "ADDED", "late") in handler.calls


def test_bind_sets_node_and_condition() -> None:
    cluster = InMemoryCluster()
    cluster.add_node(node_object("n1"))
    cluster.add_pod(pod_object("p1"))
    cluster.bind(PodRef("default", "p1", "uid-default-p1"), "n1")
    assert cluster.node_of("default", "p1") == "n1"
    assert cluster.pod_condition("default", "p1") == {"type": "PodScheduled", "status": "True"}
    assert cluster.binds == [("default/p1", "n1")]


@pytest.mark.parametrize(
    ("setup", "ref", "node", "error"),
    [
        pytest.param("bound", PodRef("default", "p1"), "n1", BindConflict, id="already-bound-409"),
        pytest.param("none", PodRef("default", "p1"), "n1", BindConflict, id="missing-pod-404"),
        pytest.param(
            "pending", PodRef("default", "p1", "other-uid"), "n1", BindConflict, id="recreated-pod"
        ),
        pytest.param(
            "pending", PodRef("default", "p1"), "nowhere", ClusterError, id="no-such-node"
        ),
    ],
)
def test_bind_errors(setup: str, ref: PodRef, node: str, error: type[Exception]) -> None:
    cluster = InMemoryCluster()
    cluster.add_node(node_object("n1"))
    if setup == "pending":
        cluster.add_pod(pod_object("p1"))
    elif setup == "bound":
        cluster.add_pod(pod_object("p1", node_name="n1"))
    with pytest.raises(error):
        cluster.bind(ref, node)
    assert cluster.binds == []
    assert cluster.bind_calls == 1


def test_injected_bind_failures_come_first_and_in_order() -> None:
    cluster = InMemoryCluster()
    cluster.add_node(node_object("n1"))
    cluster.add_pod(pod_object("p1"))
    cluster.fail_next_binds(ApiUnavailable("503"), BindConflict("409"))
    with pytest.raises(ApiUnavailable):
        cluster.bind(PodRef("default", "p1"), "n1")
    with pytest.raises(BindConflict):
        cluster.bind(PodRef("default", "p1"), "n1")
    cluster.bind(PodRef("default", "p1"), "n1")
    assert cluster.node_of("default", "p1") == "n1"


def test_events_and_unschedulable_condition_are_recorded() -> None:
    cluster = InMemoryCluster()
    cluster.add_pod(pod_object("p1"))
    handler = RecordingHandler()
    informer = cluster.informer(handler)
    informer.sync()
    ref = PodRef("default", "p1")
    cluster.record_event(ref, "Warning", "FailedScheduling", "0/0 nodes are available.")
    cluster.set_unschedulable(ref, "0/0 nodes are available.")
    assert [(e.type, e.reason) for e in cluster.events_for("default", "p1")] == [
        ("Warning", "FailedScheduling")
    ]
    assert cluster.pod_condition("default", "p1") == {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/0 nodes are available.",
    }
    informer.sync()
    assert handler.calls[-1] == ("apply", "Pod", "MODIFIED", "p1")
    with pytest.raises(BindConflict):
        cluster.set_unschedulable(PodRef("default", "gone"), "x")


def test_builders_make_parseable_quantities() -> None:
    node = node_object("g1", gpus=4, labels={"nvidia.com/gpu.product": "H100"})
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "g1"
    pod = pod_object("p", cpu="1500m", gpus=2, created_at=0.0)
    requests = pod["spec"]["containers"][0]["resources"]["requests"]
    assert resource_amount("cpu", requests["cpu"]) == 1500
    assert requests["nvidia.com/gpu"] == "2"
    assert pod["metadata"]["creationTimestamp"] == "1970-01-01T00:00:00Z"
    assert pod_object("r", node_name="n1")["status"]["phase"] == "Running"


def test_change_log_is_trimmed_once_every_informer_has_seen_it() -> None:
    cluster = InMemoryCluster()
    fast, slow = RecordingHandler(), RecordingHandler()
    fast_informer, slow_informer = cluster.informer(fast), cluster.informer(slow)
    fast_informer.sync()
    slow_informer.sync()
    for i in range(10_000):
        cluster.add_node(node_object("churn", cpu=str(i % 7 + 1)))
        if i % 100 == 0:
            fast_informer.sync()
    fast_informer.sync()
    assert len(cluster._changes) == 10_000  # the slow informer has not read them yet
    assert slow_informer.sync() == 10_000  # and still gets every one
    fast_informer.sync()
    slow_informer.sync()
    assert len(cluster._changes) < 4096
    cluster.add_node(node_object("after"))
    assert fast_informer.sync() == slow_informer.sync() == 1
    assert fast.calls[-1] == slow.calls[-1] == ("apply", "Node", "ADDED", "after")
