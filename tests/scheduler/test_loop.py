"""SchedulingLoop mechanics: bind path, Events, conditions, decisions, backoff, leadership,
dry run, signal health, settings reload — the real loop over an InMemoryCluster."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterator

import pytest

from scheduler.adapters.memory import InMemoryCluster
from scheduler.api.objects import ANNOTATION_MAX_RUNQ_P99_US
from scheduler.cycle.ports import ApiUnavailable, BindConflict, PodRef
from scheduler.cycle.queue import QueueState
from scheduler.plugins.interference import StalePolicy
from scheduler.standalone.loop import LoopSettings
from tests.builders import node_obj, pod_obj
from tests.scheduler.profiles import interference_settings
from tests.scheduler.runtime_helpers import LoopHarness, schedule_pending


@pytest.fixture
def h() -> Iterator[LoopHarness]:
    harness = LoopHarness()
    harness.cluster.add_node(node_obj("n1", cpu="4", memory="32Gi"))
    harness.cluster.add_node(node_obj("n2", cpu="4", memory="32Gi"))
    yield harness
    harness.close()


def events(h: LoopHarness, name: str) -> list[tuple[str, str, str]]:
    return [(e.type, e.reason, e.message) for e in h.cluster.events_for("default", name)]


def test_pod_is_bound_with_event_and_decision(h: LoopHarness) -> None:
    h.cluster.add_pod(pod_obj("web", requests={"cpu": "1", "memory": "128Mi"}))
    assert h.step() == 1
    node = h.cluster.node_of("default", "web")
    assert node in ("n1", "n2")
    assert events(h, "web") == [
        ("Normal", "Scheduled", f"Successfully assigned default/web to {node}")
    ]
    decision = h.decisions.last("web")
    assert (decision.result, decision.node, decision.dry_run) == ("scheduled", node, False)
    assert decision.candidates and decision.candidates[0].node == node
    assert {c.node for c in decision.candidates} == {"n1", "n2"}
    assert h.metric("interference_scheduler_attempts_total", result="scheduled") == 1
    assert h.metric("interference_scheduler_binds_total") == 1
    assert h.loop.queue.state("default/web") is None
    assert h.loop.cache.placed_node("default/web") == node


def test_other_schedulers_pods_are_left_alone(h: LoopHarness) -> None:
    h.cluster.add_pod(
        pod_obj(
            "theirs", requests={"cpu": "100m", "memory": "128Mi"}, schedulerName="default-scheduler"
        )
    )
    assert h.step() == 0
    assert h.cluster.bind_calls == 0
    assert h.cluster.events == []


def test_unschedulable_pod_gets_event_condition_backoff_then_fits(h: LoopHarness) -> None:
    h.cluster.add_pod(pod_obj("big", requests={"cpu": "6", "memory": "128Mi"}))
    assert h.step() == 1
    message = "0/2 nodes are available: 2 Insufficient cpu."
    assert events(h, "big") == [("Warning", "FailedScheduling", message)]
    assert h.cluster.pod_condition("default", "big") == {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
    }
    decision = h.decisions.last("big")
    assert (decision.result, decision.node, decision.message) == ("unschedulable", "", message)
    assert all(not c.passed and c.reasons == ["Insufficient cpu"] for c in decision.candidates)
    assert h.loop.queue.state("default/big") is QueueState.BACKOFF
    assert h.step() == 0  # still backing off: not retried in a hot loop
    # A bigger node arrives: a relevant event requeues the pod before its backoff ends.
    h.clock.advance(1.0)
    h.cluster.add_node(node_obj("n3", cpu="8", memory="32Gi"))
    assert h.step() == 1
    assert h.cluster.node_of("default", "big") == "n3"


def test_backoff_doubles_between_attempts(h: LoopHarness) -> None:
    h.cluster.add_pod(pod_obj("big", requests={"cpu": "6", "memory": "128Mi"}))
    attempts_at = []
    for _ in range(80):  # 40 s in half-second steps
        if h.step():
            attempts_at.append(h.clock.now)
        h.clock.advance(0.5)
    gaps = [b - a for a, b in itertools.pairwise(attempts_at)]
    assert gaps[:6] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_bind_conflict_drops_the_pod(h: LoopHarness) -> None:
    h.cluster.add_pod(pod_obj("raced", requests={"cpu": "1", "memory": "128Mi"}))
    h.cluster.fail_next_binds(BindConflict("pod default/raced is already assigned (409)"))
    h.step()
    decision = h.decisions.last("raced")
    assert decision.result == "bind_failed"
    assert "409" in decision.message
    assert h.loop.queue.state("default/raced") is None
    assert h.loop.cache.placed_node("default/raced") is None  # the assumption was forgotten
    assert h.metric("interference_scheduler_bind_errors_total", reason="conflict") == 1


def test_bind_error_forgets_and_retries_with_backoff(h: LoopHarness) -> None:
    h.cluster.add_pod(pod_obj("flaky", requests={"cpu": "1", "memory": "128Mi"}))
    h.cluster.fail_next_binds(ApiUnavailable("API server answered 503"))
    h.step()
    assert h.cluster.node_of("default", "flaky") is None
    assert ("Warning", "FailedScheduling", "Binding rejected: API server answered 503") in events(
        h, "flaky"
    )
    assert h.decisions.last("flaky").result == "bind_failed"
    assert h.loop.queue.state("default/flaky") is QueueState.BACKOFF
    assert h.loop.cache.placed_node("default/flaky") is None
    h.clock.advance(1.0)
    assert h.step() == 1
    assert h.cluster.node_of("default", "flaky") is not None
    assert h.decisions.last("flaky").result == "scheduled"


def test_follower_schedules_nothing_until_it_leads() -> None:
    h = LoopHarness(leading=False)
    try:
        h.cluster.add_node(node_obj("n1", cpu="8", memory="32Gi"))
        h.cluster.add_pod(pod_obj("p", requests={"cpu": "100m", "memory": "128Mi"}))
        assert h.step() == 0
        assert h.cluster.bind_calls == 0
        assert h.decisions.items == []
        assert h.metric("interference_scheduler_leader") == 0
        h.leading.set()
        assert h.step() == 1
        assert h.cluster.node_of("default", "p") == "n1"
        assert h.metric("interference_scheduler_leader") == 1
    finally:
        h.close()


def test_losing_the_lease_stops_binding_at_once() -> None:
    entered = threading.Event()
    release = threading.Event()

    class SlowCluster(InMemoryCluster):
        def bind(self, pod: PodRef, node: str) -> None:
            entered.set()
            assert release.wait(60)
            super().bind(pod, node)

    h = LoopHarness(cluster=SlowCluster(), loop=LoopSettings(bind_workers=1))
    try:
        h.cluster.add_node(node_obj("n1", cpu="64", memory="32Gi"))
        for i in range(5):
            h.cluster.add_pod(
                pod_obj(f"p{i}", requests={"cpu": "100m", "memory": "128Mi"}, created_at=1000.0 + i)
            )
        h.informer.sync()
        assert schedule_pending(h.loop) == 5  # all assumed, p0's bind is on the wire
        assert entered.wait(60)
        h.leading.clear()
        release.set()
        assert h.loop.flush(60)
        h.informer.sync()
        assert h.cluster.binds == [("default/p0", "n1")]
        for i in range(1, 5):
            key = f"default/p{i}"
            assert h.loop.queue.state(key) is QueueState.ACTIVE
            assert h.loop.cache.placed_node(key) is None
        assert h.metric("interference_scheduler_bind_errors_total", reason="dropped") == 4
        assert h.step() == 0  # follower: nothing more
        h.leading.set()
        assert h.step() == 4
        assert len(h.cluster.binds) == 5
    finally:
        h.close()


def test_dry_run_records_decisions_and_touches_nothing() -> None:
    h = LoopHarness(loop=LoopSettings(dry_run=True))
    try:
        h.cluster.add_node(node_obj("n1", cpu="4", memory="32Gi"))
        h.cluster.add_pod(pod_obj("fits", requests={"cpu": "1", "memory": "128Mi"}))
        h.cluster.add_pod(pod_obj("huge", requests={"cpu": "64", "memory": "128Mi"}))
        assert h.step() == 2
        assert h.cluster.bind_calls == 0
        assert h.cluster.events == []
        assert h.cluster.pod_condition("default", "huge") is None
        fits, huge = h.decisions.last("fits"), h.decisions.last("huge")
        assert (fits.result, fits.node, fits.dry_run) == ("dry_run", "n1", True)
        assert (huge.result, huge.dry_run) == ("unschedulable", True)
        row = h.loop.cache.table.row_of("n1")
        cpu = h.loop.cache.table.resource_row("cpu")
        assert row is not None and cpu is not None
        assert h.loop.cache.table.requested[cpu, row] == 0  # nothing assumed
        assert h.metric("interference_scheduler_attempts_total", result="dry_run") == 1
    finally:
        h.close()


UNSUPPORTED_SHAPES = {
    "inline-gce-persistent-disk": (
        {"volumes": [{"name": "data", "gcePersistentDisk": {"pdName": "data-0"}}]},
        "spec.volumes[0].gcePersistentDisk (inline in-tree volume: disk conflicts)",
    ),
    "resource-claims": (
        {"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-0"}]},
        "spec.resourceClaims",
    ),
}


@pytest.mark.parametrize(
    ("spec", "field"), list(UNSUPPORTED_SHAPES.values()), ids=list(UNSUPPORTED_SHAPES)
)
def test_pod_with_an_unsupported_field_is_refused_not_placed(
    h: LoopHarness, spec: dict[str, object], field: str
) -> None:
    pod = pod_obj(
        "refused", requests={"cpu": "100m", "memory": "128Mi"}
    )  # fits anywhere but for the field
    pod["spec"].update(spec)
    h.cluster.add_pod(pod)
    assert h.step() == 1
    assert h.cluster.bind_calls == 0
    assert h.cluster.node_of("default", "refused") is None
    [(kind, reason, message)] = events(h, "refused")
    assert (kind, reason) == ("Warning", "FailedScheduling")
    assert message.startswith("0/2 nodes are available: standalone interference-scheduler")
    assert field in message and "extender mode" in message
    condition = h.cluster.pod_condition("default", "refused")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    assert field in condition["message"]
    decision = h.decisions.last("refused")
    assert (decision.result, decision.node) == ("unschedulable", "")
    assert h.loop.queue.state("default/refused") is QueueState.BACKOFF


def test_refused_pod_is_placed_once_the_field_is_removed(h: LoopHarness) -> None:
    pod = pod_obj("spread", requests={"cpu": "100m", "memory": "128Mi"})
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "gpu-0"}]
    h.cluster.add_pod(pod)
    h.step()
    assert h.cluster.node_of("default", "spread") is None
    h.cluster.delete_pod("default", "spread")
    h.step()
    h.cluster.add_pod(pod_obj("spread", requests={"cpu": "100m", "memory": "128Mi"}))
    h.clock.advance(1.0)
    h.step()
    assert h.cluster.node_of("default", "spread") in ("n1", "n2")


def test_unparseable_pod_gets_event_and_condition_and_is_scheduled_once_fixed(
    h: LoopHarness,
) -> None:
    broken = pod_obj("gated", requests={"cpu": "100m", "memory": "128Mi"})
    broken["spec"]["tolerations"] = [{"key": "gen", "operator": "Gt", "value": "3"}]
    h.cluster.add_pod(broken)
    h.step()
    [(kind, reason, message)] = events(h, "gated")
    assert (kind, reason) == ("Warning", "FailedScheduling")
    assert "spec.tolerations[0].operator" in message and "'Gt'" in message
    condition = h.cluster.pod_condition("default", "gated")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    assert condition["message"] == message
    assert h.decisions.last("gated").message == message
    h.step()
    assert len(events(h, "gated")) == 1  # reported once per version of the pod
    h.cluster.add_pod(
        pod_obj("gated", requests={"cpu": "100m", "memory": "128Mi"})
    )  # fixed: read again and scheduled
    h.step()
    assert h.cluster.node_of("default", "gated") in ("n1", "n2")


UNREADABLE = (
    "0/2 nodes are available: 2 node(s) had no readable interference signals"
    " (the signal store cannot be read)."
)


@pytest.mark.parametrize(
    ("policy", "tolerance", "placed"),
    [
        # A pod with a tolerance waits whatever the policy: no node can be shown within it.
        pytest.param("neutral", True, False, id="neutral-tolerance"),
        pytest.param("avoid", True, False, id="avoid-tolerance"),
        pytest.param("reject", True, False, id="reject-tolerance"),
        # Without one, the stale policy decides, as it does for one node without signals.
        pytest.param("neutral", False, True, id="neutral-plain"),
        pytest.param("avoid", False, True, id="avoid-plain"),
        pytest.param("reject", False, False, id="reject-plain"),
    ],
)
def test_unreadable_signals_fail_closed(
    policy: StalePolicy, tolerance: bool, placed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    h = LoopHarness(cycle=interference_settings(stale_policy=policy))
    try:
        for name in ("n1", "n2"):
            h.cluster.add_node(node_obj(name, cpu="4", memory="32Gi"))
        h.signals.is_healthy = False
        annotations = {ANNOTATION_MAX_RUNQ_P99_US: "500"} if tolerance else {}
        h.cluster.add_pod(
            pod_obj("p", requests={"cpu": "1", "memory": "128Mi"}, annotations=annotations)
        )
        assert h.step() == 1
        assert h.metric("interference_scheduler_signals_healthy") == 0
        assert h.metric("interference_scheduler_interference_blind_attempts_total") == 1
        assert "interference signals cannot be read" in caplog.text
        if placed:
            assert h.cluster.node_of("default", "p") in ("n1", "n2")
            assert h.decisions.last("p").result == "scheduled"
            return
        assert h.cluster.node_of("default", "p") is None
        assert h.decisions.last("p").message == UNREADABLE
        [(kind, reason, message)] = events(h, "p")
        assert (kind, reason, message) == ("Warning", "FailedScheduling", UNREADABLE)
        # Readable again (two quiet nodes): the pod is placed at its next attempt.
        h.signals.is_healthy = True
        h.clock.advance(30.0)
        for name in ("n1", "n2"):
            h.signals.report(name, h.clock.now - 1, runq_p99_us=100, index=5)
        h.step()
        assert h.cluster.node_of("default", "p") in ("n1", "n2")
        assert h.metric("interference_scheduler_signals_healthy") == 1
    finally:
        h.close()


def test_unreadable_signals_relax_after_waiting() -> None:
    """The relax rule applies to the refusal as to any interference filter's: after
    ``relax_after_s`` the pod is placed interference-blind, with the Event saying so."""
    h = LoopHarness(cycle=interference_settings(relax_after_s=30.0))
    try:
        h.cluster.add_node(node_obj("n1", cpu="4", memory="32Gi"))
        h.signals.is_healthy = False
        h.cluster.add_pod(
            pod_obj(
                "patient",
                requests={"cpu": "1", "memory": "128Mi"},
                annotations={ANNOTATION_MAX_RUNQ_P99_US: "500"},
            )
        )
        h.cluster.add_pod(
            pod_obj(
                "too-big",
                requests={"cpu": "64", "memory": "128Mi"},
                annotations={ANNOTATION_MAX_RUNQ_P99_US: "500"},
            )
        )
        h.step()
        started = h.clock.now
        while h.clock.now < started + 29:
            h.clock.advance(1.0)
            h.step()
            assert h.cluster.node_of("default", "patient") is None, "relaxed too early"
        for _ in range(15):
            h.clock.advance(1.0)
            h.step()
        assert h.cluster.node_of("default", "patient") == "n1"
        record = h.decisions.last("patient")
        assert record.result == "scheduled"
        relaxed = [
            e
            for e in h.cluster.events_for("default", "patient")
            if e.reason == "InterferenceRelaxed"
        ]
        assert len(relaxed) == 1 and relaxed[0].type == "Warning"
        # Short of CPU as well: not blocked by the signals alone, so never relaxed.
        assert h.cluster.node_of("default", "too-big") is None
        assert "Insufficient cpu" in h.decisions.last("too-big").message
        assert not [
            e
            for e in h.cluster.events_for("default", "too-big")
            if e.reason == "InterferenceRelaxed"
        ]
    finally:
        h.close()


def test_cycle_crash_is_contained(h: LoopHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    h.cluster.add_pod(pod_obj("p", requests={"cpu": "100m", "memory": "128Mi"}))

    def explode(*args: object, **kwargs: object) -> None:
        raise RuntimeError("cycle bug")

    monkeypatch.setattr(h.loop._cycle, "schedule", explode)
    assert h.step() == 1
    assert h.metric("interference_scheduler_attempts_total", result="error") == 1
    assert h.loop.queue.state("default/p") is QueueState.BACKOFF
    assert h.loop.cache.placed_node("default/p") is None


def test_update_settings_switches_scheduler_name_and_dry_run(h: LoopHarness) -> None:
    h.cluster.add_pod(
        pod_obj("renamed", requests={"cpu": "1", "memory": "128Mi"}, schedulerName="gpu-scheduler")
    )
    assert h.step() == 0
    h.loop.update_settings(
        h.loop.cycle_settings, LoopSettings(scheduler_name="gpu-scheduler", dry_run=True)
    )
    assert h.step() == 1
    assert h.decisions.last("renamed").result == "dry_run"
    h.loop.update_settings(
        h.loop.cycle_settings, LoopSettings(scheduler_name="gpu-scheduler", bind_workers=2)
    )
    h.clock.advance(1.0)
    assert h.step() == 1
    assert h.cluster.node_of("default", "renamed") is not None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("scheduler_name", "", "scheduler_name"),
        ("bind_workers", 0, "bind_workers"),
        ("max_writes_in_flight", 0, "max_writes_in_flight"),
        ("idle_wait_s", 0.0, "idle_wait_s"),
    ],
)
def test_loop_settings_validation(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoopSettings(**{field: value})  # type: ignore[arg-type]


def test_run_binds_with_real_threads() -> None:
    h = LoopHarness()
    stop = threading.Event()
    thread = threading.Thread(target=h.loop.run, args=(stop,))
    try:
        h.cluster.add_node(node_obj("n1", cpu="32", memory="32Gi"))
        thread.start()
        for i in range(20):
            h.cluster.add_pod(pod_obj(f"p{i}", requests={"cpu": "1", "memory": "128Mi"}))
        deadline = threading.Event()
        for _ in range(600):
            if len(h.cluster.binds) == 20:
                break
            deadline.wait(0.1)
        assert len(h.cluster.binds) == 20
        assert {node for _, node in h.cluster.binds} == {"n1"}
        beat = h.loop.last_cycle_at
        for _ in range(600):  # idle, the loop still goes round (a liveness heartbeat)
            if h.loop.last_cycle_at > beat:
                break
            h.clock.advance(1.0)
            deadline.wait(0.1)
        assert h.loop.last_cycle_at > beat
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()


def test_an_unknown_annotation_gets_one_warning_event_naming_the_closest_key() -> None:
    h = LoopHarness()
    h.cluster.add_node(node_obj("n1", cpu="1", memory="32Gi"))
    typo = {"interference.io/max-runq-p99": "500"}  # without -us: no tolerance at all
    h.cluster.add_pod(pod_obj("typo", requests={"cpu": "2", "memory": "128Mi"}, annotations=typo))
    h.step()
    h.clock.advance(30)  # past the backoff: attempted again, still unschedulable
    h.step()
    warnings = [e for e in events(h, "typo") if e[1] == "UnknownAnnotation"]
    assert len(warnings) == 1
    assert warnings[0][0] == "Warning"
    assert "did you mean interference.io/max-runq-p99-us?" in warnings[0][2]
    pod = h.loop.cache.pending_pod("default/typo")
    assert pod is not None and pod.tolerance is None
