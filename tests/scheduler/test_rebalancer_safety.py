"""The rebalancer's steps (over the in-memory cluster of tests/scheduler/
test_rebalancer.py) on what it must not move and the evidence it must not trust; the same
cases on a real apiserver are in tests/e2e/test_rebalancer_safety.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

import pytest

from interference.signals import NodeReport
from scheduler.rebalancing.evictable import JOB_POD, LOCAL_STORAGE
from scheduler.rebalancing.evidence import CLOCK_AHEAD, UNMEASURED
from scheduler.rebalancing.metrics import EVICTED
from scheduler.rebalancing.mover import HELD, RebalanceAction
from scheduler.rebalancing.rebalance import RebalancerSettings
from tests.scheduler.test_rebalancer import NOISY, QUIET, World

TOLERANCE = "interference.io/max-runq-p99-us"


@pytest.fixture
def world() -> Iterator[World]:
    yield World(RebalancerSettings(mode="enforce", max_per_node=5, max_per_namespace=5))


def actions(w: World, after_s: float = 0.0) -> list[RebalanceAction]:
    return [a for a in w.step(after_s) if isinstance(a, RebalanceAction)]


def owned_by(w: World, name: str, kind: str, **spec: object) -> None:
    obj = World._pod(name, "node-a", name, {})
    obj["metadata"]["ownerReferences"][0]["kind"] = kind
    obj["spec"].update(spec)
    w.h.cluster.add_pod(obj)
    w.reports.rows.setdefault("node-a", {})[f"shop/{name}"] = NOISY


@pytest.mark.parametrize(
    ("kind", "spec", "reason"),
    [
        ("Job", {}, JOB_POD),
        ("ReplicaSet", {"volumes": [{"name": "scratch", "emptyDir": {}}]}, LOCAL_STORAGE),
        ("ReplicaSet", {"priorityClassName": "system-cluster-critical"}, "system_critical"),
    ],
)
def test_a_victim_an_eviction_would_not_move_whole_is_held_and_recorded(
    world: World, kind: str, spec: dict[str, object], reason: str
) -> None:
    w = world
    owned_by(w, "batch-1", kind, **spec)
    w.step()
    (held,) = actions(w, 30)
    assert held.outcome == HELD and held.reason.startswith(f"{reason}: its run-queue p99")
    assert w.evictions.calls == []
    assert w.metric("interference_scheduler_rebalance_holds_total", reason=reason) == 1
    (record,) = w.rebalancing_records.for_pod("batch-1", "shop")
    assert (record.result, record.message.split(":")[0]) == (HELD, reason)
    actions(w, 5)  # once per streak: no second record, no second count
    assert len(w.rebalancing_records.for_pod("batch-1", "shop")) == 1
    assert w.metric("interference_scheduler_rebalance_holds_total", reason=reason) == 1


def test_the_worst_breach_on_a_node_moves_first_and_alone(world: World) -> None:
    w = world
    w.run_pod("first-1", "node-a", owner="first")  # placed first, 16× its tolerance
    w.run_pod("worst-1", "node-a", owner="worst", **{TOLERANCE: "200"})  # 40×
    w.step()
    done = actions(w, 30)
    assert [(a.pod, a.outcome) for a in done] == [
        ("shop/worst-1", EVICTED),
        ("shop/first-1", HELD),
    ], done
    assert "a worse victim left node-a at this look" in done[1].reason
    assert len(w.evictions.calls) == 1


def transform(w: World, change: Callable[[NodeReport], list[NodeReport]]) -> None:
    """The agents' reports as ``change`` turns each of them."""
    recent = w.reports.recent

    def changed(nodes: Sequence[str]) -> dict[str, list[NodeReport]]:
        return {n: [c for r in rs for c in change(r)] for n, rs in recent(nodes).items()}

    w.reports.recent = changed  # type: ignore[method-assign]


def test_a_report_stamped_ahead_is_refused_not_kept(world: World) -> None:
    w = world
    w.run_pod("web-1", "node-a")
    w.reports.rows["node-a"]["shop/web-1"] = QUIET

    def one_ahead(report: NodeReport) -> list[NodeReport]:
        if report.ts != w.reports.now:
            return [report]
        noisy = [dataclasses.replace(p, runq_us=NOISY) for p in report.pods]
        return [report, dataclasses.replace(report, ts=report.ts + 600, pods=noisy)]

    transform(w, one_ahead)
    for after in (0, 5, 5, 5, 5, 5, 5, 5):
        assert actions(w, after) == []
        assert w.metric("interference_scheduler_rebalance_over_tolerance_pods") == 0
    refused = w.metric("interference_scheduler_rebalance_refused_reports_total", reason=CLOCK_AHEAD)
    assert refused == 8  # each once, though each stays in the stream for several looks
    # the on-time rows after it still count: the pod is judged on them
    history = w.rebalancer._histories["uid-shop-web-1"]
    assert max(at for at, _ in history.rows) == w.h.clock.now


def test_rows_of_reports_that_did_not_measure_the_run_queue_are_no_evidence(world: World) -> None:
    w = world
    w.run_pod("web-1", "node-a")
    transform(w, lambda r: [dataclasses.replace(r, measured=("psi",))])
    w.step()
    assert actions(w, 30) == []
    assert w.metric("interference_scheduler_rebalance_refused_reports_total", reason=UNMEASURED) > 0
    assert w.metric("interference_scheduler_rebalance_over_tolerance_pods") == 0


def test_rows_of_a_node_whose_record_expired_are_no_evidence(world: World) -> None:
    w = world
    w.run_pod("web-1", "node-a")
    w.step()
    w.h.clock.advance(30)
    w.h.signals.report("node-b", w.h.clock.now, runq_p99_us=100.0)  # node-a's record: 30 s old
    w.reports.now = w.h.clock.now  # its stream still has rows of the last 10 s
    assert w.rebalancer.step() == []
    assert w.metric("interference_scheduler_rebalance_over_tolerance_pods") == 0
    assert w.evictions.calls == []
