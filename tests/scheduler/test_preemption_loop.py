"""Preemption in the scheduling loop: the real loop, cache, queue and binder over the
in-memory cluster (which implements the Preemptor port as the API server would see
kube-scheduler's calls): victims evicted with kube-scheduler's condition and Event, the
preemptor nominated and bound, nominated pods holding their room, re-nomination,
``preemptionPolicy: Never``, GPUs, and how preemption meets the interference rules."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import pytest

from interference.decision import decision_hash, parse_decision_hash
from interference.decision_page import render_decision_page
from interference_cli.views import preemption_line
from scheduler.api.objects import ANNOTATION_MAX_RUNQ_P99_US
from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.nominated import RoomHolds, TableRoom
from scheduler.cycle.ports import Preemption
from scheduler.cycle.preemption import PreemptionArgs, PreemptionInputs
from scheduler.cycle.settings import CycleSettings
from scheduler.standalone.loop import LoopSettings
from tests.builders import node_obj, pod_obj, table_of
from tests.scheduler.profiles import interference_settings
from tests.scheduler.runtime_helpers import START, LoopHarness, schedule_pending

LOW, HIGH = 0, 10


def _low(name: str, node: str, cpu: str = "900m") -> dict[str, Any]:
    return pod_obj(name, requests={"cpu": cpu}, nodeName=node, priority=LOW)


@pytest.fixture
def h() -> Iterator[LoopHarness]:
    """PreemptionBasic's node: 4 CPUs, four 900m pods of priority 0 on it."""
    harness = LoopHarness(preempts=True)
    harness.cluster.add_node(node_obj("n1", cpu="4"))
    for i in range(4):
        harness.cluster.add_pod(_low(f"low-{i}", "n1"))
    yield harness
    harness.close()


def _nominated(h: LoopHarness, name: str) -> str | None:
    pod = h.cluster.get_pod("default", name)
    assert pod is not None
    found: str | None = pod["status"].get("nominatedNodeName")
    return found


def test_a_pod_preempts_lower_priority_pods_and_gets_their_room(h: LoopHarness) -> None:
    h.cluster.add_pod(pod_obj("urgent", requests={"cpu": "3"}, priority=HIGH))
    assert h.step() == 1
    [preemption] = h.cluster.preemptions
    assert (preemption.preemptor.name, preemption.node) == ("urgent", "n1")
    assert preemption.scheduler_name == "interference-scheduler"
    victims = sorted(v.name for v in preemption.victims)
    assert len(victims) == 3  # 3 × 900m go, one stays: 900m + 3 CPUs fit in 4
    for name in victims:
        assert h.cluster.get_pod("default", name) is None
        [event] = h.cluster.events_for("default", name)
        assert (event.type, event.reason, event.message) == (
            "Normal",
            "Preempted",
            "Preempted by pod uid-default-urgent on node n1",
        )
        [condition] = h.cluster.deleted_conditions[f"default/{name}"]
        assert condition == {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": "interference-scheduler: preempting to accommodate a higher priority pod",
        }
    assert _nominated(h, "urgent") == "n1"
    decision = h.decisions.last("urgent")
    assert decision.result == "unschedulable"
    assert decision.message == "0/1 nodes are available: 1 Insufficient cpu."
    # the nomination and PodScheduled=False in one status update, as kube-scheduler's patch
    urgent = h.cluster.get_pod("default", "urgent")
    assert urgent is not None
    [scheduled] = [c for c in urgent["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert scheduled["message"] == decision.message
    assert decision.preemption is not None
    assert decision.preemption.node == "n1"
    assert sorted(decision.preemption.victims) == [f"default/{v}" for v in victims]
    assert (decision.preemption.why, decision.preemption.candidates) == ("the only candidate", 1)
    assert h.metric("interference_scheduler_preemptions_total", rule="priority") == 1
    # the victims' deletion retries it once its backoff (1 s) is over: to its nominated node
    h.clock.advance(1.0)
    assert h.step() == 1
    assert h.cluster.node_of("default", "urgent") == "n1"
    assert not h.loop.cache.holds.on_node("n1")  # bound: the room is its own now


def test_the_nominated_room_is_held_against_a_pod_of_equal_priority(h: LoopHarness) -> None:
    """``late`` has urgent's priority and is older, so it is tried first once the victims
    are gone: without the held room it would take n1 and urgent would preempt again."""
    h.cluster.add_node(node_obj("n2", cpu="4"))
    h.cluster.add_pod(pod_obj("n2-full", requests={"cpu": "4"}, nodeName="n2", priority=HIGH))
    h.cluster.add_pod(pod_obj("urgent", requests={"cpu": "3"}, priority=HIGH, created_at=START))
    assert h.step() == 1
    assert h.loop.cache.holds.node_of("default/urgent") == "n1"
    h.cluster.add_pod(pod_obj("late", requests={"cpu": "3"}, priority=HIGH, created_at=START - 60))
    h.clock.advance(1.0)
    h.step()
    assert h.cluster.node_of("default", "late") is None
    assert h.decisions.for_pod("late")[0].message.startswith("0/2 nodes are available: 2 ")
    assert h.cluster.node_of("default", "urgent") == "n1"
    assert len(h.cluster.preemptions) == 1  # urgent never had to preempt again


def test_a_preemptor_whose_node_no_longer_fits_is_nominated_again(h: LoopHarness) -> None:
    h.cluster.add_node(node_obj("n2", cpu="4"))
    for i in range(4):
        h.cluster.add_pod(_low(f"n2-low-{i}", "n2"))
    h.cluster.add_pod(pod_obj("urgent", requests={"cpu": "3"}, priority=HIGH))
    h.step()
    [first] = h.cluster.preemptions
    taken = first.node
    other = "n2" if taken == "n1" else "n1"
    # before urgent comes back, a pod of higher priority takes the room (another scheduler)
    h.cluster.add_pod(pod_obj("vip", requests={"cpu": "3"}, nodeName=taken, priority=HIGH + 1))
    h.clock.advance(1.0)
    h.step()
    assert [p.node for p in h.cluster.preemptions] == [taken, other]
    assert _nominated(h, "urgent") == other
    assert h.loop.cache.holds.node_of("default/urgent") == other
    h.clock.advance(2.0)
    h.step()
    assert h.cluster.node_of("default", "urgent") == other


def test_preemption_policy_never_waits_and_preempts_no_one(h: LoopHarness) -> None:
    pod = pod_obj("polite", requests={"cpu": "3"}, priority=HIGH)
    pod["spec"]["preemptionPolicy"] = "Never"
    h.cluster.add_pod(pod)
    h.step()
    assert h.cluster.preemptions == []
    assert len([p for p in h.cluster.pods() if p["spec"].get("nodeName") == "n1"]) == 4
    assert h.decisions.last("polite").message == (
        "0/1 nodes are available: 1 Insufficient cpu."
        " preemption: not eligible due to preemptionPolicy=Never."
    )
    assert _nominated(h, "polite") is None


def test_equal_priority_is_never_preempted(h: LoopHarness) -> None:
    h.cluster.add_pod(pod_obj("peer", requests={"cpu": "3"}, priority=LOW))
    h.step()
    assert h.cluster.preemptions == []
    assert h.decisions.last("peer").preemption is None


def test_a_gpu_pod_preempts_for_nvidia_gpus() -> None:
    h = LoopHarness(preempts=True)
    try:
        h.cluster.add_node(node_obj("g1", cpu="32", extra={"nvidia.com/gpu": "8"}))
        h.cluster.add_pod(
            pod_obj("batch-a", requests={"nvidia.com/gpu": "4"}, nodeName="g1", priority=LOW)
        )
        h.cluster.add_pod(
            pod_obj("batch-b", requests={"nvidia.com/gpu": "4"}, nodeName="g1", priority=LOW)
        )
        h.cluster.add_pod(pod_obj("train", requests={"nvidia.com/gpu": "4"}, priority=HIGH))
        h.step()
        [preemption] = h.cluster.preemptions
        assert len(preemption.victims) == 1 and preemption.node == "g1"
        assert h.decisions.last("train").message.startswith(
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
        )
        h.clock.advance(1.0)
        h.step()
        assert h.cluster.node_of("default", "train") == "g1"
    finally:
        h.close()


# ---- nominated room in the cycle ---------------------------------------------------------


@pytest.mark.parametrize(
    ("priority", "takes_the_room"),
    [(HIGH - 1, False), (HIGH, False), (HIGH + 1, True)],
    ids=["lower priority", "equal priority", "higher priority"],
)
def test_held_room_keeps_out_pods_of_lower_or_equal_priority(
    priority: int, takes_the_room: bool
) -> None:
    table = table_of([node_obj("n1", cpu="4")])
    holds = RoomHolds()
    holds.hold(parse_pod(pod_obj("nominated", requests={"cpu": "3"}, priority=HIGH)), "n1")
    pod = parse_pod(pod_obj("newcomer", requests={"cpu": "3"}, priority=priority))
    result = SchedulingCycle(CycleSettings()).schedule(
        pod, table, 0.0, preemption=PreemptionInputs(holds=holds)
    )
    assert (result.node == "n1") is takes_the_room
    assert table.pods_on_node("n1") == {}  # the held pod is never left on the table


def test_a_pod_only_a_held_pod_satisfies_does_not_count_on_it() -> None:
    """kube's second pass: pod affinity to a nominated pod that is not there yet."""
    table = table_of([node_obj("n1", cpu="4")])
    holds = RoomHolds()
    holds.hold(
        parse_pod(pod_obj("db", requests={"cpu": "1"}, priority=HIGH, labels={"app": "db"})),
        "n1",
    )
    affinity = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "db"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    pod = parse_pod(pod_obj("web", requests={"cpu": "1"}, priority=LOW, affinity=affinity))
    result = SchedulingCycle(CycleSettings()).schedule(
        pod, table, 0.0, preemption=PreemptionInputs(holds=holds)
    )
    assert result.node is None


# ---- interference ------------------------------------------------------------------------

TOLERANT = {ANNOTATION_MAX_RUNQ_P99_US: "500"}


def _noisy_cluster(h: LoopHarness, antagonist_priority: int) -> None:
    """n1: room for the pod but noisy because of ``noisy`` (900m), and a quiet low-priority
    ``bystander``; n2: quiet, full of pods of the pod's own priority. The pod tolerates
    500 µs of run-queue p99."""
    h.cluster.add_node(node_obj("n1", cpu="4"))
    h.cluster.add_node(node_obj("n2", cpu="4"))
    h.cluster.add_pod(
        pod_obj("noisy", requests={"cpu": "900m"}, nodeName="n1", priority=antagonist_priority)
    )
    h.cluster.add_pod(pod_obj("n2-full", requests={"cpu": "4"}, nodeName="n2", priority=HIGH))
    h.cluster.add_pod(_low("bystander", "n1", cpu="100m"))  # a pod it could preempt
    h.signals.report("n1", START, runq_p99_us=3000.0)
    h.signals.report("n2", START, runq_p99_us=100.0)
    h.cluster.add_pod(pod_obj("picky", requests={"cpu": "2"}, priority=HIGH, annotations=TOLERANT))


def _named(named: Mapping[str, Collection[str]]) -> Any:
    asked: list[Sequence[str]] = []

    def antagonists(nodes: Sequence[str]) -> Mapping[str, Collection[str]]:
        asked.append(list(nodes))
        return {node: named[node] for node in nodes if node in named}

    antagonists.asked = asked  # type: ignore[attr-defined]
    return antagonists


def test_a_node_the_pods_tolerance_rejects_is_never_a_candidate() -> None:
    """Default (rule off): evicting lower-priority pods does not make a noisy node quiet."""
    h = LoopHarness(cycle=interference_settings(), preempts=True)
    try:
        _noisy_cluster(h, LOW)
        h.cluster.add_pod(_low("n1-low", "n1", cpu="3"))  # n1 is also full of low pods
        h.step()
        assert h.cluster.preemptions == []
        decision = h.decisions.last("picky")
        assert " preemption: 0/2 nodes are available: " in decision.message
        assert decision.message.split(" preemption: ")[1] == (
            "0/2 nodes are available: 1 No preemption victims found for incoming pod,"
            " 1 node(s) had run-queue p99 above the pod's interference tolerance."
        )
        assert h.cluster.get_pod("default", "n1-low") is not None
    finally:
        h.close()


@pytest.mark.parametrize(
    ("rule_on", "antagonist_priority", "preempts"),
    [(True, LOW, True), (True, HIGH, False), (False, LOW, False)],
    ids=["opt-in, lower-priority antagonist", "opt-in, antagonist not lower", "rule off"],
)
def test_evicting_named_antagonists_of_lower_priority_makes_the_node_pass(
    rule_on: bool, antagonist_priority: int, preempts: bool
) -> None:
    cycle = interference_settings(preemption=PreemptionArgs(preempt_antagonists=rule_on))
    antagonists = _named({"n1": {"default/noisy"}})
    h = LoopHarness(cycle=cycle, preempts=True, antagonists=antagonists)
    try:
        _noisy_cluster(h, antagonist_priority)
        h.step()
        record = h.decisions.last("picky").preemption
        if not preempts:
            assert h.cluster.preemptions == [] and record is None
            assert h.cluster.get_pod("default", "noisy") is not None
            assert bool(antagonists.asked) is rule_on
            return
        [preemption] = h.cluster.preemptions
        assert preemption.node == "n1"
        assert [v.name for v in preemption.victims] == ["noisy"]
        assert record is not None and record.antagonists == ["default/noisy"]
        assert h.metric("interference_scheduler_preemptions_total", rule="antagonists") == 1
        assert antagonists.asked == [["n1"]]
    finally:
        h.close()


def test_system_named_as_an_antagonist_is_never_preemptible() -> None:
    cycle = interference_settings(preemption=PreemptionArgs(preempt_antagonists=True))
    h = LoopHarness(
        cycle=cycle, preempts=True, antagonists=_named({"n1": {"default/noisy", "system"}})
    )
    try:
        _noisy_cluster(h, LOW)
        h.step()
        assert h.cluster.preemptions == []
    finally:
        h.close()


def test_the_record_says_who_was_preempted_and_why_in_explain_and_the_page(
    h: LoopHarness,
) -> None:
    h.cluster.add_pod(pod_obj("urgent", requests={"cpu": "3"}, priority=HIGH))
    h.step()
    decision = h.decisions.last("urgent")
    assert parse_decision_hash(decision_hash(decision)) == decision
    record = decision.preemption
    assert record is not None
    line = preemption_line(record)
    assert line.startswith("preemption: nominated to n1, evicting default/low-")
    assert "the only candidate (1 candidate node(s), 0 PDB violation(s))" in line
    page = render_decision_page(decision)
    assert '<p id="preemption" data-node="n1">' in page
    assert page.count("<li>default/low-") == 3


def test_the_table_room_keeps_held_pods_placed_and_never_touches_a_real_placement() -> None:
    table = table_of([node_obj("n1", cpu="4"), node_obj("n2", cpu="4")])
    holds = RoomHolds()
    high = parse_pod(pod_obj("high", requests={"cpu": "3"}, priority=HIGH))
    low = parse_pod(pod_obj("low", requests={"cpu": "1"}, priority=LOW))
    holds.hold(high, "n1")
    holds.hold(low, "n2")
    room = TableRoom(table)
    room.sync(holds)
    assert set(table.pods_on_node("n1")) == {"default/high"}
    with room.counting_for(low, holds) as counting:  # its own hold does not count
        assert counting == 1 and not table.pods_on_node("n2")
    assert set(table.pods_on_node("n2")) == {"default/low"}
    with room.counting_for(high, holds):  # lower priorities do not count against it
        assert not table.pods_on_node("n1") and not table.pods_on_node("n2")
    real = dataclasses.replace(high, node_name="n1")
    table.add_pod(real, "n1", 0.0)  # bound: replaces the held pod on the table
    holds.release(high.key)
    room.sync(holds)
    assert table.pods_on_node("n1") == {"default/high": real}
    room.clear()
    assert table.pods_on_node("n1") == {"default/high": real} and not table.pods_on_node("n2")


def test_a_pod_is_not_attempted_while_its_preemption_calls_are_still_being_made(
    h: LoopHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kube's PreEnqueue while preempting: a slow API server never gets the same victims
    deleted twice for one pod."""
    release = threading.Event()
    real = h.cluster.preempt

    def slow(preemption: Preemption) -> None:
        release.wait(30)
        real(preemption)

    monkeypatch.setattr(h.cluster, "preempt", slow)
    h.cluster.add_pod(pod_obj("urgent", requests={"cpu": "3"}, priority=HIGH))
    h.informer.sync()
    assert schedule_pending(h.loop) == 1
    attempts = len(h.decisions.for_pod("urgent"))
    h.clock.advance(2.0)
    h.loop.queue.requeue("default/urgent")
    h.loop.schedule("default/urgent")  # popped again before the calls are done
    assert len(h.decisions.for_pod("urgent")) == attempts
    release.set()
    assert h.loop.flush(30)
    assert len(h.cluster.preemptions) == 1


def test_binds_go_on_while_preemptions_wait_for_their_victims(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Preemptions have their own threads: with every one of them waiting on the API
    server, a pod that fits elsewhere is still bound (one bind thread, two stuck
    preemptions: on a shared pool the bind would wait behind them)."""
    h = LoopHarness(preempts=True, loop=LoopSettings(bind_workers=1, preemption_workers=2))
    release = threading.Event()
    entered = threading.Semaphore(0)
    real = h.cluster.preempt

    def slow(preemption: Preemption) -> None:
        entered.release()
        release.wait(30)
        real(preemption)

    monkeypatch.setattr(h.cluster, "preempt", slow)
    try:
        for node in ("n1", "n2"):
            h.cluster.add_node(node_obj(node, cpu="4"))
            for i in range(4):
                h.cluster.add_pod(_low(f"low-{node}-{i}", node))
        h.cluster.add_node(node_obj("free", cpu="1"))
        for name in ("urgent-a", "urgent-b"):
            h.cluster.add_pod(pod_obj(name, requests={"cpu": "3"}, priority=HIGH))
        h.informer.sync()
        assert schedule_pending(h.loop) == 2
        for _ in range(2):
            assert entered.acquire(timeout=30)  # both preemption threads are stuck
        h.cluster.add_pod(pod_obj("small", requests={"cpu": "500m"}, priority=LOW))
        h.informer.sync()
        assert schedule_pending(h.loop) == 1
        assert h.loop.flush(0.0) is False  # the preemptions are still waiting
        for _ in range(600):
            if h.cluster.node_of("default", "small"):
                break
            release.wait(0.05)
        assert h.cluster.node_of("default", "small") == "free"
        assert h.cluster.preemptions == []
    finally:
        release.set()
        assert h.loop.flush(30)
        assert len(h.cluster.preemptions) == 2
        h.close()
