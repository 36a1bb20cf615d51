"""The rebalancer's steps over the real cache, table, scheduling cycle and loop (in-memory
cluster): who is moved, to where, what it says, and each guard rail. The Eviction API
itself is exercised on a real apiserver in tests/e2e/test_rebalancer.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from interference.decision import Decision
from interference.signals import NodeMetrics, NodeReport, PodMetrics
from scheduler.cycle.ports import ClusterError, DecisionTracer, K8sObject, PodRef
from scheduler.cycle.settings import CycleSettings
from scheduler.cycle.stage_trace import SELECTION
from scheduler.entry.cli import prepare
from scheduler.entry.config import ConfigError, parse_config
from scheduler.plugins.rebalanced_away import LEFT_NODE, Departure
from scheduler.rebalancing.metrics import (
    BLOCKED,
    EVICTED,
    FAILED,
    WOULD_EVICT,
    RebalanceMetrics,
)
from scheduler.rebalancing.mover import HELD
from scheduler.rebalancing.ports import EvictionAnswer, EvictionStatus
from scheduler.rebalancing.rebalance import Moved, RebalanceMode, RebalancerSettings
from scheduler.rebalancing.rebalancer import Rebalancer
from tests.builders import node_obj, pod_obj
from tests.scheduler.runtime_helpers import KeptTraces, LoopHarness, MemoryDecisions

NOISY = (0,) * 12 + (50,)  # 50 waits of 4–8 ms
QUIET = (200,)


@dataclass
class Evictions:
    """The Eviction API's answers, in order (EVICTED when none is left), and the calls."""

    answers: list[EvictionAnswer | ClusterError] = field(default_factory=list)
    calls: list[tuple[PodRef, bool]] = field(default_factory=list)

    def evict(self, pod: PodRef, dry_run: bool) -> EvictionAnswer:
        self.calls.append((pod, dry_run))
        answer = self.answers.pop(0) if self.answers else EvictionAnswer(EvictionStatus.EVICTED)
        if isinstance(answer, ClusterError):
            raise answer
        return answer


@dataclass
class Reports:
    """Each node's agent: every second a report with its pods' rows."""

    rows: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    """node → pod key → its run-queue histogram each second."""
    throttled: dict[str, float] = field(default_factory=dict)
    now: float = 0.0

    def recent(self, nodes: Sequence[str]) -> dict[str, list[NodeReport]]:
        found: dict[str, list[NodeReport]] = {}
        for node in nodes:
            pods = self.rows.get(node, {})
            found[node] = [
                NodeReport(
                    node,
                    self.now - age,
                    1.0,
                    NodeMetrics(),
                    pods=[
                        PodMetrics(
                            key.split("/")[0],
                            key.split("/")[1],
                            uid=f"uid-{key.replace('/', '-')}",
                            runq_us=hist,
                            cpu_ms_per_s=200.0,
                            runq_wait_ms_per_s=400.0,
                            throttled_ms_per_s=self.throttled.get(key, 0.0),
                        )
                        for key, hist in pods.items()
                    ],
                    measured=("runq",),
                )
                for age in range(10)
            ]
        return found


@dataclass
class Journal:
    """The moves a leader journals (Redis in production: tests/scheduler/
    test_rebalancer_redis.py), and whether it can be read now."""

    moves: list[tuple[Moved, Departure | None]] = field(default_factory=list)
    readable: bool = True

    def add(self, moved: Moved, departure: Departure | None, keep_s: float) -> None:
        self.moves = [m for m in self.moves if m[0].at >= moved.at - keep_s]
        self.moves.append((moved, departure))

    def since(self, at: float) -> list[tuple[Moved, Departure | None]]:
        if not self.readable:
            raise ConnectionError("Redis is away")
        return [m for m in self.moves if m[0].at >= at]


class World:
    """The loop harness plus a rebalancer over its cache."""

    def __init__(
        self,
        settings: RebalancerSettings,
        journal: Journal | None = None,
        tracer: DecisionTracer | None = None,
    ) -> None:
        self.h = LoopHarness()
        # node-b is smaller: LeastAllocated prefers node-a for a new pod
        self.h.cluster.add_node(node_obj("node-a", cpu="8", memory="32Gi"))
        self.h.cluster.add_node(node_obj("node-b", cpu="2", memory="8Gi"))
        self.evictions = Evictions()
        self.reports = Reports()
        self.registry = CollectorRegistry()
        self.rebalancing_records = MemoryDecisions()
        """The rebalancer's sink; ``self.h.decisions`` holds the loop's placement records."""
        self.rebalancer = Rebalancer(
            self.h.loop.cache,
            self.h.signals,
            self.reports,
            self.evictions,
            self.h.cluster,
            rebalancing_records=self.rebalancing_records,
            cycle_settings=CycleSettings(),
            settings=settings,
            scheduler_name="interference-scheduler",
            metrics=RebalanceMetrics(self.registry),
            journal=journal,
            clock=self.h.clock,
            tracer=tracer,
        )

    def run_pod(self, name: str, node: str, owner: str = "web", **annotations: str) -> None:
        self.h.cluster.add_pod(self._pod(name, node, owner, annotations))
        self.reports.rows.setdefault(node, {})[f"shop/{name}"] = NOISY

    def place_pod(self, name: str) -> Decision:
        """A pending pod the loop places (on node-a, the roomier); its placement record."""
        for node in self.h.loop.cache.node_names():
            self.h.signals.report(node, self.h.clock.now, runq_p99_us=100.0)
        self.h.cluster.add_pod(self._pod(name, None, "web", {}))
        self.h.step()
        assert self.h.cluster.node_of("shop", name) == "node-a"
        self.reports.rows.setdefault("node-a", {})[f"shop/{name}"] = NOISY
        return self.h.decisions.last(name, "shop")

    @staticmethod
    def _pod(name: str, node: str | None, owner: str, annotations: dict[str, str]) -> K8sObject:
        obj = pod_obj(
            name,
            "shop",
            nodeName=node,
            annotations={"interference.io/max-runq-p99-us": "500", **annotations},
        )
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
             "uid": f"rs-{owner}", "controller": True}
        ]  # fmt: skip
        return obj

    def step(self, after_s: float = 0.0) -> list[object]:
        self.h.clock.advance(after_s)
        self.h.informer.sync()  # first, so that every node reports (fresh nodes only count)
        for name in self.h.loop.cache.node_names():
            self.h.signals.report(name, self.h.clock.now, runq_p99_us=100.0)
        self.reports.now = self.h.clock.now
        return list(self.rebalancer.step())

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def events(self, pod: str) -> list[tuple[str, str, str]]:
        return [(e.type, e.reason, e.message) for e in self.h.cluster.events_for("shop", pod)]


@pytest.fixture
def enforcing() -> Iterator[World]:
    world = World(RebalancerSettings(mode="enforce"))
    yield world
    world.h.close()


def test_a_sustained_victim_is_evicted_and_its_replacement_avoids_the_node(
    enforcing: World,
) -> None:
    w = enforcing
    w.run_pod("web-1", "node-a")
    assert w.step() == []  # over its tolerance, not yet for sustained_for_s
    assert w.metric("interference_scheduler_rebalance_over_tolerance_pods") == 1
    assert w.step(15) == []
    (action,) = w.step(15)
    assert (action.outcome, action.node, action.target) == (EVICTED, "node-a", "node-b")  # type: ignore[attr-defined]
    assert w.evictions.calls == [(PodRef("shop", "web-1", "uid-shop-web-1"), False)]
    ((kind, reason, message),) = w.events("web-1")
    assert (kind, reason) == ("Warning", "InterferenceEvicted")
    assert "its run-queue p99" in message and "> tolerance 500 µs for 30 s" in message
    assert "node-b passes every filter" in message
    assert w.rebalancing_records.last("web-1", "shop").result == EVICTED
    assert w.metric("interference_scheduler_rebalance_evictions_total", result=EVICTED) == 1
    # the ReplicaSet's replacement: node-a has more room (LeastAllocated prefers it), but
    # the workload just left it
    w.h.cluster.delete_pod("shop", "web-1")
    replacement = pod_obj("web-2", "shop")
    replacement["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs-web",
         "controller": True}
    ]  # fmt: skip
    w.h.cluster.add_pod(replacement)
    w.h.step()
    assert w.h.cluster.node_of("shop", "web-2") == "node-b"
    record = w.h.decisions.last("web-2", "shop")
    (left,) = [c for c in record.candidates if c.node == "node-a"]
    assert not left.passed
    assert left.reasons[0].startswith(f"{LEFT_NODE} (ReplicaSet/web left node-a 0 s ago: its")
    assert record.funnel[-1].name == "RebalancedAway"


def test_a_pod_of_another_workload_may_still_go_to_the_node(enforcing: World) -> None:
    w = enforcing
    w.run_pod("web-1", "node-a")
    w.step()
    w.step(30)
    w.h.cluster.delete_pod("shop", "web-1")
    w.h.cluster.add_pod(pod_obj("other", "shop"))
    w.h.step()
    assert w.h.cluster.node_of("shop", "other") == "node-a"


def test_dry_run_asks_the_api_with_dry_run_and_writes_an_event_only() -> None:
    w = World(RebalancerSettings())
    w.run_pod("web-1", "node-a")
    w.step()
    (action,) = w.step(30)
    assert action.outcome == WOULD_EVICT  # type: ignore[attr-defined]
    assert w.evictions.calls == [(PodRef("shop", "web-1", "uid-shop-web-1"), True)]
    ((kind, reason, message),) = w.events("web-1")
    assert (kind, reason) == ("Normal", "InterferenceWouldEvict")
    assert message.startswith("would evict (dry run): its run-queue p99")
    record = w.rebalancing_records.last("web-1", "shop")
    assert (record.result, record.node, record.dry_run) == (WOULD_EVICT, "node-b", True)
    assert w.rebalancer.departures.all() == []  # nothing moved: nothing to avoid
    # dry runs count towards the dry run's guard rails: not flagged again at once (the
    # streak goes on, so that switching to enforce acts at the next look)
    (held,) = w.step(30)
    assert held.outcome == HELD and held.reason.startswith("cooldown")  # type: ignore[attr-defined]
    assert len(w.evictions.calls) == 1
    w.h.close()


@pytest.mark.parametrize(
    ("mode", "records_only", "answer", "result", "dry_run"),
    [
        ("dry_run", False, EvictionStatus.EVICTED, WOULD_EVICT, True),
        ("enforce", False, EvictionStatus.EVICTED, EVICTED, False),
        ("enforce", False, EvictionStatus.BLOCKED, BLOCKED, False),
        ("enforce", True, EvictionStatus.EVICTED, WOULD_EVICT, True),  # loop.dry_run
    ],
)
def test_a_look_writes_a_rebalancing_record_and_keeps_the_placement_record(
    mode: RebalanceMode,
    records_only: bool,
    answer: EvictionStatus,
    result: str,
    dry_run: bool,
) -> None:
    w = World(RebalancerSettings(mode=mode))
    try:
        w.rebalancer.update_settings(
            CycleSettings(), w.rebalancer.settings, "interference-scheduler", records_only
        )
        w.evictions.answers.append(EvictionAnswer(answer, "blocked by a budget"))
        placement = w.place_pod("web-1")
        assert (placement.result, placement.node) == ("scheduled", "node-a")
        w.step()
        (action,) = w.step(30)
        assert action.outcome == result  # type: ignore[attr-defined]
        record = w.rebalancing_records.last("web-1", "shop")
        assert (record.result, record.node, record.dry_run) == (result, "node-b", dry_run)
        assert w.h.decisions.for_pod("web-1", "shop") == [placement]  # why it is where it is
    finally:
        w.h.close()


def test_no_eviction_when_no_other_node_would_take_it(
    enforcing: World, caplog: pytest.LogCaptureFixture
) -> None:
    w = enforcing
    w.h.cluster.add_node(node_obj("node-b", cpu="2", memory="8Gi", unschedulable=True))
    w.run_pod("web-1", "node-a")
    w.step()
    caplog.set_level(logging.INFO, logger="scheduler.rebalancing.rebalancer")
    (action,) = w.step(30)
    assert action.outcome == HELD and action.reason.startswith("no_better_node")  # type: ignore[attr-defined]
    assert w.evictions.calls == [] and w.events("web-1") == []
    assert w.metric("interference_scheduler_rebalance_holds_total", reason="no_better_node") == 1
    w.step(5)  # a long hold is counted and logged once
    assert w.metric("interference_scheduler_rebalance_holds_total", reason="no_better_node") == 1
    said = [r.getMessage() for r in caplog.records if "stays on" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("shop/web-1 stays on node-a: no_better_node: ")


def test_no_eviction_when_the_other_node_breaks_the_tolerance_too(enforcing: World) -> None:
    w = enforcing
    w.run_pod("web-1", "node-a")
    w.step()
    w.h.clock.advance(30)
    w.h.signals.report("node-a", w.h.clock.now, runq_p99_us=100.0)  # fresh: its rows count
    w.h.signals.report("node-b", w.h.clock.now, runq_p99_us=9000.0)
    w.reports.now = w.h.clock.now
    (action,) = w.rebalancer.step()
    assert action.outcome == HELD and action.reason.startswith("no_better_node")
    assert w.evictions.calls == []


def test_a_pod_throttled_by_its_own_limit_is_not_moved(enforcing: World) -> None:
    w = enforcing
    w.run_pod("web-1", "node-a")
    w.reports.throttled["shop/web-1"] = 400.0  # runs 200, waits 400 ms/s
    w.step()
    (action,) = w.step(30)
    assert action.outcome == HELD and action.reason.startswith("own_limit")  # type: ignore[attr-defined]
    assert "its own CPU limit caused most of the wait" in action.reason  # type: ignore[attr-defined]
    assert w.evictions.calls == []


def test_a_streak_needs_every_look_over_the_tolerance(enforcing: World) -> None:
    w = enforcing
    w.run_pod("web-1", "node-a")
    w.step()
    w.step(20)
    w.reports.rows["node-a"]["shop/web-1"] = QUIET
    w.step(61)  # the window has only quiet rows now
    w.reports.rows["node-a"]["shop/web-1"] = NOISY
    assert w.step(1) == []
    assert w.step(20) == []  # 20 s of a new streak
    assert w.evictions.calls == []


def test_at_most_one_eviction_per_node_per_window(enforcing: World) -> None:
    w = enforcing
    w.run_pod("web-1", "node-a", owner="web")
    w.run_pod("api-1", "node-a", owner="api")
    w.step()
    actions = w.step(30)
    outcomes = sorted((a.outcome, a.reason.split(":")[0]) for a in actions)  # type: ignore[attr-defined]
    assert outcomes == [(EVICTED, "evicted to leave node-a"), (HELD, "node_limit")]
    assert len(w.evictions.calls) == 1


def test_a_blocking_disruption_budget_means_wait_then_try_again(enforcing: World) -> None:
    w = enforcing
    budget = "Cannot evict pod as it would violate the pod's disruption budget."
    w.evictions.answers.append(EvictionAnswer(EvictionStatus.BLOCKED, budget))
    w.run_pod("web-1", "node-a")
    w.step()
    (blocked,) = w.step(30)
    assert blocked.outcome == BLOCKED  # type: ignore[attr-defined]
    ((kind, reason, message),) = w.events("web-1")
    assert (kind, reason) == ("Normal", "InterferenceEvictionBlocked")
    assert budget in message and "trying again in 30 s" in message
    (waiting,) = w.step(10)
    assert waiting.reason.startswith("retry_later")  # type: ignore[attr-defined]
    (evicted,) = w.step(25)
    assert evicted.outcome == EVICTED  # type: ignore[attr-defined]
    assert len(w.evictions.calls) == 2


def test_off_looks_at_nothing() -> None:
    w = World(RebalancerSettings(mode="off"))
    w.run_pod("web-1", "node-a")
    assert w.step() == [] and w.step(60) == []
    assert w.evictions.calls == []
    assert w.metric("interference_scheduler_rebalance_looks_total") == 0
    w.h.close()


def test_every_look_is_counted_with_or_without_a_pod_to_judge(enforcing: World) -> None:
    """The dashboards' look annotations: one per step, a step with nobody to judge too."""
    w = enforcing
    w.step()
    assert w.metric("interference_scheduler_rebalance_looks_total") == 1
    w.run_pod("web-1", "node-a")
    w.step(5)
    w.step(5)
    assert w.metric("interference_scheduler_rebalance_looks_total") == 3


def test_an_opted_out_pod_is_never_looked_at(enforcing: World) -> None:
    w = enforcing
    w.run_pod("web-1", "node-a", **{"interference.io/rebalance": "false"})
    w.step()
    assert w.step(60) == []
    assert w.metric("interference_scheduler_rebalance_over_tolerance_pods") == 0


def test_a_dry_run_scheduler_only_records() -> None:
    """``loop.dry_run`` (the dry-run overlay: no Events, no evictions in its RBAC)."""
    w = World(RebalancerSettings(mode="enforce"))
    w.rebalancer.update_settings(
        CycleSettings(), w.rebalancer.settings, "interference-scheduler", records_only=True
    )
    w.run_pod("web-1", "node-a")
    w.step()
    (action,) = w.step(30)
    assert action.outcome == WOULD_EVICT  # type: ignore[attr-defined]
    assert w.evictions.calls == [] and w.events("web-1") == []
    record = w.rebalancing_records.last("web-1", "shop")
    assert (record.result, record.node, record.dry_run) == (WOULD_EVICT, "node-b", True)
    assert w.rebalancer.departures.all() == []
    w.h.close()


def test_the_rebalance_flag_wins_over_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text("rebalancer: {mode: 'off', max_per_node: 3}\n")
    _, fixed, config = prepare(["--config", str(path), "--rebalance", "enforce"], {})
    assert (config.rebalancer.mode, config.rebalancer.max_per_node) == ("enforce", 3)
    assert fixed["rebalancer"] == {"mode": "enforce"}  # re-applied to every reload
    assert prepare(["--config", str(path)], {})[2].rebalancer.mode == "off"
    assert prepare([], {})[2].rebalancer.mode == "dry_run"  # the default


def test_a_bad_rebalancer_section_names_the_field() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"rebalancer": {"mode": "on", "max_per_cluster": "5"}})
    problems = caught.value.problems
    assert any(
        p.startswith("rebalancer.mode: must be one of off, dry_run, enforce") for p in problems
    )
    assert "rebalancer.max_per_cluster: must be a whole number, got '5'" in problems


def test_a_new_leader_keeps_the_old_leaders_cool_down_and_departures() -> None:
    journal = Journal()
    old = World(RebalancerSettings(mode="enforce"), journal)
    old.run_pod("web-1", "node-a")
    old.step()
    (evicted,) = old.step(30)
    assert evicted.outcome == EVICTED  # type: ignore[attr-defined]
    old.h.close()
    new = World(RebalancerSettings(mode="enforce"), journal)
    new.h.clock.now = old.h.clock.now + 60
    new.run_pod("web-2", "node-a")  # the same workload, noisy again
    new.step()
    (held,) = new.step(30)
    assert held.outcome == HELD and held.reason.startswith("cooldown")  # type: ignore[attr-defined]
    (departure,) = new.rebalancer.departures.all()
    assert (departure.workload, departure.node) == ("ReplicaSet/web", "node-a")
    assert new.evictions.calls == []
    new.h.close()


def test_no_judging_before_the_journal_is_read() -> None:
    journal = Journal(readable=False)
    w = World(RebalancerSettings(mode="enforce"), journal)
    w.run_pod("web-1", "node-a")
    assert w.step() == [] and w.step(30) == []  # the old leader's moves are unknown
    assert w.evictions.calls == []
    assert w.metric("interference_scheduler_rebalance_looks_total") == 0  # none taken
    journal.readable = True
    w.step(1)
    (evicted,) = w.step(30)
    assert evicted.outcome == EVICTED  # type: ignore[attr-defined]
    ((moved, departure),) = journal.moves
    assert (moved.node, moved.workload_uid) == ("node-a", "rs-web")
    assert departure is not None and departure.reason.startswith("its run-queue p99")
    w.h.close()


def test_a_failed_eviction_is_an_event_and_is_tried_again_later(enforcing: World) -> None:
    w = enforcing
    w.evictions.answers.append(ClusterError("create pods/eviction failed with HTTP 403: no"))
    w.run_pod("web-1", "node-a")
    w.step()
    (failed,) = w.step(30)
    assert failed.outcome == FAILED  # type: ignore[attr-defined]
    ((kind, reason, message),) = w.events("web-1")
    assert (kind, reason) == ("Warning", "InterferenceEvictionFailed")
    assert "HTTP 403" in message and "trying again in 30 s" in message
    assert w.metric("interference_scheduler_rebalance_evictions_total", result=FAILED) == 1
    (waiting,) = w.step(10)
    assert waiting.reason.startswith("retry_later")  # type: ignore[attr-defined]
    (evicted,) = w.step(25)
    assert evicted.outcome == EVICTED  # type: ignore[attr-defined]


def test_each_search_for_a_better_node_is_a_trace_named_in_the_record() -> None:
    traces = KeptTraces()
    w = World(RebalancerSettings(mode="enforce"), tracer=traces)
    try:
        w.run_pod("web-1", "node-a")
        w.step()
        w.step(15)
        assert traces.finished == []  # not sustained yet: no search
        assert len(w.step(15)) == 1
        ((name, recorder, attributes, _),) = traces.finished
        assert name == "rebalance"
        assert attributes["pod"] == "shop/web-1" and attributes["node"] == "node-a"
        assert attributes["better_node"] == "node-b"
        assert "run-queue p99" in str(attributes["breach"])
        # the cycle's stages: node-b passed every filter (named on the root), then chosen
        assert "NodeResourcesFit" in recorder.passed_filters
        (selection,) = [s for s in recorder.stages if s.stage == SELECTION]
        assert selection.attributes["chosen"] == "node-b"
        assert w.rebalancing_records.last("web-1", "shop").trace_id == recorder.trace_hex
    finally:
        w.h.close()
