"""Binder: binds off the calling thread, reports outcomes, drops unsent binds on lost lease."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry

from scheduler.adapters.memory import InMemoryCluster
from scheduler.cycle.ports import ApiUnavailable, PodRef
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.standalone.binder import Binder, BindOutcome, BindRequest, BindStatus
from tests.builders import node_obj, pod_obj


class Outcomes:
    def __init__(self) -> None:
        self.items: list[BindOutcome] = []
        self.threads: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, outcome: BindOutcome) -> None:
        with self._lock:
            self.items.append(outcome)
            self.threads.append(threading.current_thread().name)

    def statuses(self) -> dict[str, BindStatus]:
        return {o.request.key: o.status for o in self.items}


def metric(metrics: SchedulerMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


def request(name: str, node: str = "n1") -> BindRequest:
    return BindRequest(PodRef("default", name, f"uid-default-{name}"), f"default/{name}", node)


@pytest.fixture
def cluster() -> InMemoryCluster:
    cluster = InMemoryCluster()
    cluster.add_node(node_obj("n1"))
    for name in ("a", "b", "c"):
        cluster.add_pod(pod_obj(name))
    return cluster


@pytest.fixture
def metrics() -> SchedulerMetrics:
    return SchedulerMetrics(CollectorRegistry())


def make_binder(
    cluster: InMemoryCluster,
    metrics: SchedulerMetrics,
    outcomes: Outcomes,
    leading: threading.Event | None = None,
    workers: int = 4,
) -> Binder:
    if leading is None:
        leading = threading.Event()
        leading.set()
    return Binder(cluster, leading, outcomes, metrics, workers)


def test_outcomes_bound_conflict_failed(
    cluster: InMemoryCluster, metrics: SchedulerMetrics
) -> None:
    cluster.add_pod(pod_obj("c", nodeName="n1"))  # already bound → 409
    outcomes = Outcomes()
    binder = make_binder(cluster, metrics, outcomes, workers=1)
    cluster.fail_next_binds(ApiUnavailable("API server answered 503"))
    binder.bind(request("b"))  # takes the injected failure
    binder.bind(request("a"))
    binder.bind(request("c"))
    assert binder.flush(30)
    binder.close()
    assert outcomes.statuses() == {
        "default/a": BindStatus.BOUND,
        "default/b": BindStatus.FAILED,
        "default/c": BindStatus.CONFLICT,
    }
    failed = next(o for o in outcomes.items if o.status is BindStatus.FAILED)
    assert "503" in failed.error
    assert all(name.startswith("binder") for name in outcomes.threads)
    assert cluster.node_of("default", "a") == "n1"
    assert cluster.node_of("default", "b") is None
    assert metric(metrics, "interference_scheduler_binds_total") == 1
    assert metric(metrics, "interference_scheduler_bind_errors_total", reason="error") == 1
    assert metric(metrics, "interference_scheduler_bind_errors_total", reason="conflict") == 1


def test_unexpected_adapter_exception_is_a_failure(
    cluster: InMemoryCluster, metrics: SchedulerMetrics
) -> None:
    class Broken(InMemoryCluster):
        def bind(self, pod: PodRef, node: str) -> None:
            raise KeyError("adapter bug")

    outcomes = Outcomes()
    binder = make_binder(Broken(), metrics, outcomes)
    binder.bind(request("a"))
    assert binder.flush(30)
    binder.close()
    assert outcomes.statuses() == {"default/a": BindStatus.FAILED}
    assert "adapter bug" in outcomes.items[0].error


def test_not_leading_sends_nothing(cluster: InMemoryCluster, metrics: SchedulerMetrics) -> None:
    outcomes = Outcomes()
    binder = make_binder(cluster, metrics, outcomes, leading=threading.Event())
    binder.bind(request("a"))
    assert binder.flush(30)
    binder.close()
    assert outcomes.statuses() == {"default/a": BindStatus.DROPPED}
    assert cluster.bind_calls == 0
    assert metric(metrics, "interference_scheduler_bind_errors_total", reason="dropped") == 1


def test_losing_the_lease_drops_queued_binds(
    cluster: InMemoryCluster, metrics: SchedulerMetrics
) -> None:
    entered = threading.Event()
    release = threading.Event()

    class Slow(InMemoryCluster):
        def bind(self, pod: PodRef, node: str) -> None:
            entered.set()
            assert release.wait(30)
            super().bind(pod, node)

    slow = Slow()
    slow.add_node(node_obj("n1"))
    for name in ("a", "b", "c"):
        slow.add_pod(pod_obj(name))
    leading = threading.Event()
    leading.set()
    outcomes = Outcomes()
    binder = make_binder(slow, metrics, outcomes, leading=leading, workers=1)
    binder.bind(request("a"))
    assert entered.wait(30)
    binder.bind(request("b"))
    binder.bind(request("c"))
    leading.clear()  # lease lost while "a" is on the wire and b, c wait
    release.set()
    assert binder.flush(30)
    binder.close()
    assert outcomes.statuses() == {
        "default/a": BindStatus.BOUND,
        "default/b": BindStatus.DROPPED,
        "default/c": BindStatus.DROPPED,
    }
    assert slow.binds == [("default/a", "n1")]


def test_failed_side_effect_is_counted_not_raised(
    cluster: InMemoryCluster, metrics: SchedulerMetrics
) -> None:
    binder = make_binder(cluster, metrics, Outcomes())
    ran = threading.Event()

    def unreachable() -> None:
        raise ApiUnavailable("connection refused")

    def fine() -> None:
        ran.set()

    binder.submit(unreachable, "event")
    binder.submit(lambda: [][0], "decision")
    binder.submit(fine, "condition")
    assert binder.flush(30)
    binder.close()
    assert ran.is_set()
    assert metric(metrics, "interference_scheduler_side_effect_errors_total", kind="event") == 1
    assert metric(metrics, "interference_scheduler_side_effect_errors_total", kind="decision") == 1


def test_submit_after_close_is_dropped_without_hanging(
    cluster: InMemoryCluster, metrics: SchedulerMetrics
) -> None:
    binder = make_binder(cluster, metrics, Outcomes())
    binder.close()
    binder.submit(lambda: None, "event")
    assert binder.flush(5)


def test_workers_must_be_positive(cluster: InMemoryCluster, metrics: SchedulerMetrics) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        make_binder(cluster, metrics, Outcomes(), workers=0)


def test_wait_for_room_blocks_until_writes_drain_below_the_limit(
    cluster: InMemoryCluster, metrics: SchedulerMetrics
) -> None:
    binder = make_binder(cluster, metrics, Outcomes(), workers=2)
    release = threading.Event()

    def slow_write() -> None:
        release.wait(10)

    try:
        for _ in range(3):
            binder.submit(slow_write, "event")
        assert binder.wait_for_room(3, timeout_s=0.05) is False  # three still running/queued
        assert binder.wait_for_room(4, timeout_s=0.05) is True
        waited: list[bool] = []
        waiter = threading.Thread(target=lambda: waited.append(binder.wait_for_room(1, 10)))
        waiter.start()
        release.set()
        waiter.join(10)
        assert waited == [True]
    finally:
        release.set()
        binder.close()
