"""The plugin contract and the one scheduling cycle: a plugin added in the test tree only
(one file's worth of code plus one registry line), its own placed-pod lookup, args,
statuses and events, and standalone and extender modes agreeing through the cycle."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from interference.decision import FunnelStage
from scheduler.api.events import Action, ClusterEvent, EventInterest
from scheduler.api.nodes import parse_node
from scheduler.api.objects import PodInfo
from scheduler.api.pods import parse_pod
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.dry_run import unresolvable
from scheduler.cycle.queue import QueueState, SchedulingQueue
from scheduler.cycle.settings import CycleSettings, Profile
from scheduler.cycle.stages import filter_funnel
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.entry.config import parse_config
from scheduler.plugins.base import Code, CycleState, Filter, FilterResult
from scheduler.plugins.interference import INDEX_EXCEEDED, RUNQ_EXCEEDED
from scheduler.plugins.node_resources_fit import insufficient_reason
from scheduler.plugins.registry import REGISTRY
from scheduler.plugins.taint_toleration import UNTOLERATED_TAINT
from scheduler.signals.table import NodeTable
from tests.builders import node_obj, pod_obj, table_of

NOW = 1000.0
RACK = "RackBudget"
OVER_BUDGET = "node(s) had no pod slot left in the rack budget"
SHORT_OF_POWER = "node(s) were on a rack short of power"


@dataclass(frozen=True, slots=True)
class RackBudgetArgs:
    max_pods_per_node: int = 2


class PodsPerNode:
    """The test plugin's placed-pod lookup: pods per node name."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}

    def add(self, pod: PodInfo, node: str) -> None:
        self.count[node] = self.count.get(node, 0) + 1

    def remove(self, pod: PodInfo, node: str) -> None:
        self.count[node] -= 1


def _rack_budget(state: CycleState) -> FilterResult:
    table = state.table
    budget = state.args_of(RACK, RackBudgetArgs).max_pods_per_node
    placed = table.lookup(RACK, PodsPerNode).count
    full = np.array([placed.get(name, 0) >= budget for name in table.names], dtype=np.bool_)
    power = table.label_column("power")
    low = power.values.index("low") if "low" in power.values else -2
    weak = power.codes == low
    columns = (full, weak & ~full)
    return FilterResult(RACK, ~(full | weak), (OVER_BUDGET, SHORT_OF_POWER), lambda: columns)


RACK_BUDGET = Filter(
    name=RACK,
    explain="the node's rack has a pod slot and power left",
    filter=_rack_budget,
    events=(
        EventInterest("Pod", Action.DELETE),
        EventInterest("Node", Action.UPDATE_NODE_LABEL),
    ),
    status=Code.UNSCHEDULABLE,
    statuses={SHORT_OF_POWER: Code.UNSCHEDULABLE_AND_UNRESOLVABLE},
    args=RackBudgetArgs,
)
WITH_RACK = REGISTRY.with_filter(RACK_BUDGET, after="NodeResourcesFit")
"""The one registry line a new plugin needs, here in the test tree only."""
LISTED = (
    "NodeReady",
    "NodeUnschedulable",
    "TaintToleration",
    "NodeAffinity",
    "NodePorts",
    "NodeResourcesFit",
    "VolumeBinding",
    "PodTopologySpread",
    "InterPodAffinity",
    "Interference",
)
"""A config's filter list written before the plugin existed."""


def test_a_config_that_lists_filters_keeps_working_when_a_plugin_is_added() -> None:
    config = parse_config({"cycle": {"profile": {"filters": list(LISTED)}}})
    cycle = SchedulingCycle(config.cycle, registry=WITH_RACK)
    names = [plugin.name for plugin in cycle.profile.filters]
    # each at its default place (RebalancedAway, too, came after the list was written)
    assert names == [*LISTED[:6], RACK, *LISTED[6:], "RebalancedAway"]
    table = table_of(
        [node_obj("full"), node_obj("weak", labels={"power": "low"}), node_obj("ok")],
        [(pod_obj(f"p{i}"), "full") for i in range(2)],
    )
    result = cycle.schedule(parse_pod(pod_obj("new")), table, NOW)
    assert result.node == "ok"
    assert result.reason_counts == {OVER_BUDGET: 1, SHORT_OF_POWER: 1}
    assert RACK in result.rejected_by
    without = SchedulingCycle(config.cycle).schedule(parse_pod(pod_obj("new")), table, NOW)
    assert without.feasible == 3  # the default registry does not have it


def test_a_plugins_args_come_from_the_profile() -> None:
    table = table_of([node_obj("a")], [(pod_obj("p0"), "a"), (pod_obj("p1"), "a")])
    profile = Profile(filters=LISTED)
    roomy = Profile(
        filters=LISTED, plugin_config=(("Interference", REGISTRY.args_types()["Interference"]()),)
    )
    default = SchedulingCycle(CycleSettings(profile=profile), registry=WITH_RACK)
    assert default.schedule(parse_pod(pod_obj("new")), table, NOW).node is None
    resolved = WITH_RACK.resolve(roomy)
    state = CycleState(parse_pod(pod_obj("new")), table, NOW, {**resolved.args})
    assert state.args_of(RACK, RackBudgetArgs).max_pods_per_node == 2  # its default
    state = CycleState(parse_pod(pod_obj("new")), table, NOW, {RACK: RackBudgetArgs(3)})
    assert bool(_rack_budget(state).passed[0])


def test_a_placed_pod_index_is_filled_when_first_asked_for_then_kept_by_the_hooks() -> None:
    table = table_of([node_obj("a"), node_obj("b")], [(pod_obj("p0"), "a"), (pod_obj("p1"), "b")])
    lookup = table.lookup(RACK, PodsPerNode)  # registered late: filled from the placed pods
    assert lookup.count == {"a": 1, "b": 1}
    table.add_pod(parse_pod(pod_obj("p2")), "a", NOW)
    table.remove_pod(parse_pod(pod_obj("p1")))
    assert lookup.count == {"a": 2, "b": 0}
    assert table.lookup(RACK, PodsPerNode) is lookup  # one lookup per name


@pytest.mark.parametrize(
    ("plugin", "reasons", "expected"),
    [
        (RACK_BUDGET, [OVER_BUDGET], False),  # evicting a pod frees a slot
        (RACK_BUDGET, [SHORT_OF_POWER], True),
        (RACK_BUDGET, [OVER_BUDGET, SHORT_OF_POWER], True),  # any unresolvable reason
        (REGISTRY.filter_named("NodeResourcesFit"), [insufficient_reason("cpu")], False),
        (REGISTRY.filter_named("TaintToleration"), [UNTOLERATED_TAINT], True),
        (REGISTRY.filter_named("Interference"), [RUNQ_EXCEEDED, INDEX_EXCEEDED], True),
    ],
)
def test_statuses_per_reason(plugin: Filter | None, reasons: list[str], expected: bool) -> None:
    assert plugin is not None
    assert unresolvable(plugin, reasons) is expected


def test_every_filter_declares_the_events_that_can_make_its_rejections_go_away() -> None:
    for plugin in REGISTRY.filters:
        assert plugin.events, plugin.name
        assert all(interest.actions for interest in plugin.events), plugin.name


def _event_cases() -> list[Any]:
    fits = parse_node(node_obj("big", cpu="64"))
    small = parse_node(node_obj("small", cpu="1"))
    return [
        ("NodeResourcesFit", ClusterEvent("Pod", Action.DELETE), True),
        ("NodeResourcesFit", ClusterEvent("Node", Action.UPDATE_NODE_LABEL, fits), False),
        ("NodeResourcesFit", ClusterEvent("Node", Action.ADD, fits), True),
        ("NodeResourcesFit", ClusterEvent("Node", Action.ADD, small), False),  # its hint
        ("NodeAffinity", ClusterEvent("Node", Action.UPDATE_NODE_LABEL, fits), True),
        ("NodeAffinity", ClusterEvent("Pod", Action.DELETE), False),
        ("TaintToleration", ClusterEvent("Node", Action.UPDATE_NODE_TAINT, fits), True),
        ("Interference", ClusterEvent("Pod", Action.ADD), False),
        ("Interference", ClusterEvent("Node", Action.ADD, fits), True),
    ]


@pytest.mark.parametrize(("rejector", "event", "retried"), _event_cases())
def test_a_rejected_pod_is_retried_only_on_its_rejectors_events(
    rejector: str, event: ClusterEvent, retried: bool
) -> None:
    pod = parse_pod(pod_obj(requests={"cpu": "8"}))
    retry_on = REGISTRY.resolve(Profile()).retry_on(pod, frozenset({rejector}))
    assert retry_on is not None
    assert retry_on(event) is retried


def test_a_pod_no_plugin_rejected_is_retried_on_any_event() -> None:
    assert REGISTRY.resolve(Profile()).retry_on(parse_pod(pod_obj()), frozenset()) is None


def test_the_cache_classifies_events_and_the_queue_retries_only_the_pods_they_may_help() -> None:
    now = [NOW]
    queue = SchedulingQueue(clock=lambda: now[0])
    cache = ClusterCache(
        NodeTable(), queue, SchedulerMetrics(CollectorRegistry()), "interference-scheduler"
    )
    cache.apply("Node", "ADDED", node_obj("a", cpu="1"))
    cycle = SchedulingCycle(CycleSettings())
    for name, requests, labels in (
        ("big", {"cpu": "2"}, None),
        ("picky", {"cpu": "100m"}, {"disk": "ssd"}),
    ):
        obj = pod_obj(name, requests=requests)
        if labels:
            obj["spec"]["nodeSelector"] = labels
        cache.apply("Pod", "ADDED", obj)
        pod = cache.pending_pod(f"default/{name}")
        assert pod is not None
        result = cycle.schedule(pod, cache.table, NOW)
        assert result.node is None
        assert queue.pop() == pod.key
        for _ in range(5):  # the fifth failed attempt backs off the most (10 s)
            queue.backoff(pod.key, cycle.profile.retry_on(pod, result.rejected_by))
    now[0] += 5  # past the initial backoff, well before the backed-off retry
    cache.apply("Node", "MODIFIED", node_obj("a", cpu="1", labels={"disk": "ssd"}))
    assert queue.state("default/picky") is QueueState.ACTIVE  # NodeAffinity's event
    assert queue.state("default/big") is QueueState.BACKOFF  # a label frees no CPU
    cache.apply("Node", "MODIFIED", node_obj("a", cpu="4", labels={"disk": "ssd"}))
    assert queue.state("default/big") is QueueState.ACTIVE  # allocatable grew past 2 CPUs


@settings(max_examples=40, deadline=None)
@given(
    cpus=st.lists(st.sampled_from(["500m", "1", "2", "4"]), min_size=1, max_size=8),
    tainted=st.lists(st.booleans(), min_size=8, max_size=8),
    want=st.sampled_from(["100m", "900m", "1500m", "3"]),
    offered=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_standalone_and_extender_modes_agree_through_the_one_cycle(
    cpus: list[str], tainted: list[bool], want: str, offered: list[bool]
) -> None:
    nodes = [
        node_obj(f"n{i}", cpu=cpu, taints=[("k", "v", "NoSchedule")] if tainted[i] else [])
        for i, cpu in enumerate(cpus)
    ]
    table = table_of(nodes)
    pod = parse_pod(pod_obj(requests={"cpu": want}))
    candidates = np.array(offered[: len(cpus)], dtype=np.bool_)
    standalone = SchedulingCycle(CycleSettings(), seed=1)
    extender = SchedulingCycle(CycleSettings(), extender=True)
    chosen = standalone.schedule(pod, table, NOW, candidates=candidates)
    filtered = extender.filter(pod, table, NOW, candidates)
    assert chosen.feasible == int(np.count_nonzero(filtered.passed))
    if chosen.node is not None:
        assert filtered.passed[table.row_of(chosen.node)]
    assert not (filtered.passed & ~candidates).any()  # never a node it was not offered
    rejected = sum(int(np.count_nonzero(mask)) for _, _, mask in filtered.rejections.failing)
    assert rejected + chosen.feasible == int(np.count_nonzero(candidates))
    assert sum(chosen.reason_counts.values()) >= rejected


@settings(max_examples=40, deadline=None)
@given(
    cpus=st.lists(st.sampled_from(["500m", "1", "2", "4"]), min_size=1, max_size=12),
    tainted=st.lists(st.booleans(), min_size=12, max_size=12),
    want=st.sampled_from(["100m", "900m", "1500m", "3"]),
    top_k=st.integers(0, 4),
)
def test_the_funnel_and_the_omitted_counts_account_for_every_node(
    cpus: list[str], tainted: list[bool], want: str, top_k: int
) -> None:
    nodes = [
        node_obj(f"n{i}", cpu=cpu, taints=[("k", "v", "NoSchedule")] if tainted[i] else [])
        for i, cpu in enumerate(cpus)
    ]
    table = table_of(nodes)
    pod = parse_pod(pod_obj(requests={"cpu": want}))
    result = SchedulingCycle(CycleSettings(record_top_k=top_k), seed=1).schedule(pod, table, NOW)
    funnel = result.funnel
    assert [stage.name for stage in funnel] == [p.name for p in REGISTRY.filters]
    assert funnel[0].nodes_in == len(cpus)
    assert all(a.nodes_out == b.nodes_in for a, b in itertools.pairwise(funnel))
    assert funnel[-1].nodes_out == result.feasible
    listed_feasible = sum(c.passed for c in result.candidates)
    listed_rejected = sum(not c.passed for c in result.candidates)
    assert result.omitted["feasible"] + listed_feasible == result.feasible
    assert result.omitted["rejected"] + listed_rejected == len(cpus) - result.feasible


@pytest.mark.parametrize(
    ("relax", "considered", "first_failures", "left"),
    [
        (False, 10, {}, [10] * 12),
        (False, 10, {"TaintToleration": 3}, [10, 10, 10, 7, 7, 7, 7, 7, 7, 7, 7, 7]),
        (False, 10, {"TaintToleration": 3, "Interference": 2}, [10, 10, 10, 7, *[7] * 6, 5, 5]),
        (False, 10, {"Interference": 2, "TaintToleration": 3}, [10, 10, 10, 7, *[7] * 6, 5, 5]),
        (False, 4, {"TaintToleration": 3}, [4, 4, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1]),
        (True, 10, {"TaintToleration": 3}, [10, 10, 10, 7, 7, 7, 7, 7, 7, 7, 7]),
    ],
)
def test_the_funnel_is_the_same_whether_built_or_remembered(
    relax: bool, considered: int, first_failures: dict[str, int], left: list[int]
) -> None:
    """Each filter's candidates in and out follow from the first failures alone, and a
    remembered funnel answers for equal counts only."""
    profile = REGISTRY.resolve(CycleSettings().profile)
    names = profile.relaxed_names if relax else profile.names
    expected = tuple(zip(names, left[:-1], left[1:], strict=True))
    for _ in range(2):  # built, then remembered
        funnel = filter_funnel(profile, relax, considered, dict(first_failures))
        assert [tuple(stage) for stage in funnel] == list(expected)
        assert all(isinstance(stage, FunnelStage) for stage in funnel)
