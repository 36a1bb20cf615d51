"""The plugin framework: the default profile, profile order, extender subset, cycle state
and the table's cache scopes (kube-scheduler's framework behaviour where it has one)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from interference.signals import SIGNAL_FAMILIES
from scheduler.api.nodes import parse_node
from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.ports import NodeSignals
from scheduler.cycle.settings import CycleSettings, Profile
from scheduler.plugins import gpu_packing
from scheduler.plugins.base import CandidateDetails, CycleState, Evidence, FilterResult, Score
from scheduler.plugins.node_resources_fit import insufficient_reason
from scheduler.plugins.registry import REGISTRY, Registry
from scheduler.signals.table import NodeTable
from scheduler.signals.table_caches import CacheScope
from tests.builders import container, node_obj, pod_obj, table_of
from tests.indexed_signals import metrics_with_index

NOW = 1000.0
PORTS_TAKEN = "node(s) didn't have free ports for the requested pod ports"
NODE_FILTERS = (
    "NodeReady",
    "NodeUnschedulable",
    "TaintToleration",
    "NodeAffinity",
    "NodePorts",
    "NodeResourcesFit",
)
"""kube-scheduler's filters that read only the node and the pod, in its order: the
extender profile runs them too."""


def _with_port(name: str, port: int = 8080, cpu: str = "100m") -> dict[str, Any]:
    spec = {"containerPort": port, "hostPort": port, "protocol": "TCP"}
    return pod_obj(name, containers=[container({"cpu": cpu}, ports=[spec])])


def test_default_profile_runs_kube_schedulers_filter_order_then_ours() -> None:
    assert [p.name for p in REGISTRY.filters] == [
        *NODE_FILTERS,
        "VolumeBinding",
        "PodTopologySpread",
        "InterPodAffinity",
        "Interference",
        "RebalancedAway",
    ]
    assert {p.name: p.default_weight for p in REGISTRY.scores} == {
        "Interference": 2.0,
        "NodeResourcesFit": 1.0,
        "GpuPacking": 1.0,
        "PodTopologySpread": 2.0,
        "NodeAffinity": 2.0,
        "InterPodAffinity": 2.0,
        "MemoryPressure": 1.0,
    }
    assert all(p.explain for p in (*REGISTRY.filters, *REGISTRY.scores))


@pytest.mark.parametrize(
    ("filters", "reason"),
    [
        (None, PORTS_TAKEN),  # default: NodePorts before NodeResourcesFit, as kube-scheduler
        (
            (
                "NodeReady",
                "NodeUnschedulable",
                "TaintToleration",
                "NodeAffinity",
                "NodeResourcesFit",
                "NodePorts",
                "VolumeBinding",
                "PodTopologySpread",
                "InterPodAffinity",
                "Interference",
            ),
            insufficient_reason("cpu"),
        ),
    ],
    ids=["default-order-ports-first", "reordered-resources-first"],
)
def test_a_node_counts_only_its_first_failing_filter_in_profile_order(
    filters: tuple[str, ...] | None, reason: str
) -> None:
    table = table_of([node_obj("busy", cpu="1")], [(_with_port("holder", cpu="900m"), "busy")])
    cycle = SchedulingCycle(CycleSettings(profile=Profile(filters=filters)))
    result = cycle.schedule(parse_pod(_with_port("new", cpu="500m")), table, NOW)
    assert result.node is None
    assert result.reason_counts == {reason: 1}
    assert result.candidates[0].reasons == [reason]


def test_a_static_filter_after_a_dynamic_one_filters_alike() -> None:
    nodes = [node_obj(f"n{i}", labels={"zone": "a" if i % 2 else "b"}) for i in range(6)]
    nodes.append(node_obj("tainted", labels={"zone": "a"}, taints=[("k", "v", "NoSchedule")]))
    later = (
        "NodeReady",
        "NodePorts",
        "NodeResourcesFit",
        "NodeUnschedulable",
        "TaintToleration",
        "NodeAffinity",
        "VolumeBinding",
        "PodTopologySpread",
        "InterPodAffinity",
        "Interference",
    )
    pods = [
        parse_pod(pod_obj("plain")),
        parse_pod(pod_obj("zoned", nodeSelector={"zone": "a"})),
        parse_pod(pod_obj("nowhere", nodeSelector={"zone": "c"})),
    ]
    for pod in pods:
        default = SchedulingCycle(CycleSettings(), seed=1).schedule(pod, table_of(nodes), NOW)
        reordered = SchedulingCycle(CycleSettings(profile=Profile(filters=later)), seed=1).schedule(
            pod, table_of(nodes), NOW
        )
        assert (reordered.node, reordered.feasible) == (default.node, default.feasible)
        assert reordered.reason_counts == default.reason_counts


def test_extender_profile_leaves_kube_schedulers_own_plugins_to_it() -> None:
    extender = REGISTRY.resolve(Profile(), extender=True)
    assert [p.name for p in extender.filters] == [*NODE_FILTERS, "Interference"]
    assert [p.name for p, _ in extender.scores] == [
        "Interference",
        "NodeResourcesFit",
        "GpuPacking",
        "MemoryPressure",
    ]
    assert not extender.prefilters  # kube-scheduler has run its own PreFilters


def test_a_zero_weight_leaves_the_score_out_of_the_total_and_the_record() -> None:
    settings = CycleSettings(profile=Profile(scores=(("GpuPacking", 0.0),)))
    result = SchedulingCycle(settings).schedule(
        parse_pod(pod_obj()), table_of([node_obj("a")]), NOW
    )
    chosen = result.candidates[0]
    assert "GpuPacking" not in chosen.scores and "GpuPacking" not in chosen.weights
    assert set(chosen.scores) == {"Interference", "NodeResourcesFit"}


@pytest.mark.parametrize(
    ("profile", "extender", "fields"),
    [
        (Profile(), False, ("runq", "index_read", "candidate_details")),
        (Profile(), True, ("runq", "index_read", "candidate_details")),
        (Profile(scores=(("GpuPacking", 0.0),)), False, ("runq", "index_read")),
        (Profile(filters=NODE_FILTERS), False, ("runq", "index_read", "candidate_details")),
    ],
    ids=["default", "extender", "no-gpu-packing", "filters-listed"],
)
def test_a_profile_records_the_evidence_its_plugins_supply(
    profile: Profile, extender: bool, fields: tuple[str, ...]
) -> None:
    assert REGISTRY.resolve(profile, extender=extender).evidence.fields() == fields


def test_an_interference_blind_profile_records_no_signal_evidence() -> None:
    blind = REGISTRY.resolve(Profile()).without_signals()
    assert blind.evidence.fields() == ("candidate_details",)


def _tagging_score(name: str = "RackTag") -> Score:
    """A score plugin whose record evidence names each candidate's rack (its row)."""

    def rack(state: CycleState) -> CandidateDetails:
        return lambda row: {"rack": f"r{row}"}

    return dataclasses.replace(
        gpu_packing.SCORE, name=name, evidence=Evidence(candidate_details=rack)
    )


def test_a_new_plugins_evidence_reaches_the_record_without_the_cycle_naming_it() -> None:
    scores = (*(s for s in REGISTRY.scores if s.name != "GpuPacking"), _tagging_score())
    registry = Registry(REGISTRY.filters, scores)
    result = SchedulingCycle(CycleSettings(record_top_k=5), registry=registry).schedule(
        parse_pod(pod_obj()), table_of([node_obj("a"), node_obj("b")]), NOW
    )
    assert {c.node: c.details for c in result.candidates} == {
        "a": {"rack": "r0"},
        "b": {"rack": "r1"},
    }


def test_a_record_field_has_one_source() -> None:
    with pytest.raises(ValueError, match="candidate_details: supplied by GpuPacking and RackTag"):
        Registry(REGISTRY.filters, (*REGISTRY.scores, _tagging_score()))


def test_runq_evidence_comes_with_its_refusal_test() -> None:
    with pytest.raises(ValueError, match="runq and refused_for_runq come together"):
        Evidence(runq=lambda state, nodes, nearest: None)


def test_cycle_state_reads_an_earlier_filters_mask() -> None:
    table = table_of([node_obj("a"), node_obj("b")])
    state = CycleState(parse_pod(pod_obj()), table, NOW)
    state.filtered["NodeAffinity"] = None  # nothing to check: every node passes
    assert state.passed("NodeAffinity").tolist() == [True, True]
    only_b = np.array([False, True])
    state.filtered["NodeAffinity"] = FilterResult("NodeAffinity", only_b, ("why",))
    assert state.passed("NodeAffinity").tolist() == [False, True]


def test_cache_scopes_empty_on_what_they_are_named_for() -> None:
    table = NodeTable()
    table.upsert_node(parse_node(node_obj("a", cpu="4")))
    built: list[str] = []

    def value(scope: str) -> object:
        built.append(scope)
        return object()

    def touch_all() -> None:
        scopes: tuple[CacheScope, ...] = ("constraints", "allocatable", "signals")
        for scope in scopes:
            table.cached(scope, ("test", scope), value, scope)

    touch_all()
    assert built == ["constraints", "allocatable", "signals"]
    touch_all()  # cached: nothing rebuilt
    assert len(built) == 3
    table.upsert_node(parse_node(node_obj("a", cpu="8")))  # allocatable only
    touch_all()
    assert built[3:] == ["allocatable"]
    table.set_signals(
        {"a": NodeSignals(metrics_with_index(10.0), updated_at=NOW, measured=SIGNAL_FAMILIES)}
    )
    touch_all()
    assert built[4:] == ["signals"]
    table.upsert_node(parse_node(node_obj("a", cpu="8", labels={"zone": "x"})))  # a label
    touch_all()
    assert built[5:] == ["constraints", "allocatable", "signals"]


def test_a_still_valid_check_rebuilds_an_expired_value() -> None:
    table = table_of([node_obj("a")])
    first = table.cached("signals", ("test",), lambda: 1)
    kept = table.cached("signals", ("test",), lambda: 2, still_valid=lambda v: True)
    rebuilt = table.cached("signals", ("test",), lambda: 3, still_valid=lambda v: v != 1)
    assert (first, kept, rebuilt) == (1, 1, 3)
