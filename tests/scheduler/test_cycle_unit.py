"""The cycle over a hand-built node table: choice, tie-break, messages, caching, relax."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interference.signals import SIGNAL_FAMILIES, NodeMetrics
from scheduler.api.nodes import parse_node
from scheduler.api.objects import ANNOTATION_MAX_RUNQ_P99_US
from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.outcome import CycleResult
from scheduler.cycle.ports import NodeSignals
from scheduler.cycle.preemption import PreemptionInputs
from scheduler.cycle.settings import CycleSettings, Profile
from scheduler.plugins.interference import InterferenceArgs, quietness
from scheduler.plugins.node_affinity import node_affinity
from scheduler.plugins.node_resources_fit import least_allocated_score
from scheduler.signals.table import NodeTable
from scheduler.signals.table_caches import CACHE_LIMIT
from tests.builders import affinity_terms, node_obj, pod_obj, table_of
from tests.indexed_signals import metrics_with_index, window_with_index
from tests.scheduler.profiles import interference_settings

NOW = 1000.0
GPU = "nvidia.com/gpu"


def _signals(table: NodeTable, **scores: float) -> None:
    table.set_signals(
        {
            name: NodeSignals(metrics_with_index(s), updated_at=NOW, measured=SIGNAL_FAMILIES)
            for name, s in scores.items()
        }
    )


def test_issue_example_message_matches_kube_scheduler() -> None:
    nodes = [node_obj(f"cpu-{i}") for i in range(3)]
    nodes += [
        node_obj(f"gpu-{i}", extra={GPU: "8"}, taints=[("k", "v", "NoSchedule")]) for i in range(9)
    ]
    result = SchedulingCycle(CycleSettings()).schedule(
        parse_pod(pod_obj(requests={GPU: "1"})), table_of(nodes), NOW
    )
    assert result.node is None
    assert result.message == (
        "0/12 nodes are available: 3 Insufficient nvidia.com/gpu, "
        "9 node(s) had untolerated taint(s)."
    )
    assert not result.blocked_only_by_interference
    assert result.feasible == 0


def test_each_node_counts_its_first_failing_filter_only() -> None:
    nodes = [
        node_obj("down", ready=False, cpu="1"),  # also too small: counted as not ready only
        node_obj("cordoned", unschedulable=True),
        node_obj("small", cpu="1", memory="1Gi"),  # fails cpu and memory: both counted
        node_obj("elsewhere", labels={"zone": "b"}),
    ]
    pod = parse_pod(
        pod_obj(
            requests={"cpu": "2", "memory": "2Gi"},
            affinity=affinity_terms([("zone", "NotIn", ["b"])]),
        )
    )
    result = SchedulingCycle(CycleSettings()).schedule(pod, table_of(nodes), NOW)
    assert result.message == (
        "0/4 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, "
        "1 node(s) didn't match Pod's node affinity/selector, 1 node(s) were not ready, "
        "1 node(s) were unschedulable."
    )
    reasons = {c.node: c.reasons for c in result.candidates}
    assert reasons == {
        "down": ["node(s) were not ready"],
        "cordoned": ["node(s) were unschedulable"],
        "small": ["Insufficient cpu", "Insufficient memory"],
        "elsewhere": ["node(s) didn't match Pod's node affinity/selector"],
    }
    assert not any(c.passed for c in result.candidates)


def test_no_nodes() -> None:
    result = SchedulingCycle(CycleSettings()).schedule(parse_pod(pod_obj()), NodeTable(), NOW)
    assert (result.node, result.message) == (None, "no nodes available to schedule pods")


def test_highest_total_wins_and_breakdown_is_recorded() -> None:
    table = table_of([node_obj("noisy"), node_obj("quiet"), node_obj("medium")])
    _signals(table, noisy=90, quiet=5, medium=40)
    settings = CycleSettings(profile=Profile(scores=(("GpuPacking", 0.0),)))
    result = SchedulingCycle(settings, seed=1).schedule(
        parse_pod(pod_obj("p", requests={"cpu": "1"})), table, NOW
    )
    assert result.node == "quiet"
    assert result.message == "Successfully assigned default/p to quiet"
    assert [c.node for c in result.candidates] == ["quiet", "medium", "noisy"]
    best = result.candidates[0]
    assert best.passed and set(best.scores) == {"Interference", "NodeResourcesFit"}
    assert best.scores["Interference"] == pytest.approx(95.0)
    assert best.total == pytest.approx(
        2 * best.scores["Interference"] + best.scores["NodeResourcesFit"]
    )
    assert result.feasible == 3


def test_record_top_k_limits_candidates() -> None:
    table = table_of([node_obj(f"n{i}") for i in range(20)])
    result = SchedulingCycle(CycleSettings(record_top_k=3), seed=0).schedule(
        parse_pod(pod_obj()), table, NOW
    )
    assert len(result.candidates) == 3 and result.candidates[0].node == result.node
    totals = [c.total for c in result.candidates]
    assert totals == sorted(totals, reverse=True)


def test_ties_are_broken_randomly_and_reproducibly() -> None:
    table = table_of([node_obj(f"n{i}") for i in range(8)])
    pod = parse_pod(pod_obj())

    def choices(seed: int) -> list[str | None]:
        cycle = SchedulingCycle(CycleSettings(), seed=seed)
        return [cycle.schedule(pod, table, NOW).node for _ in range(200)]

    first = choices(7)
    assert len(Counter(first)) == 8  # every tied node gets picked
    assert max(Counter(first).values()) < 60
    assert choices(7) == first


def test_tolerance_blocks_then_relax_schedules() -> None:
    table = table_of([node_obj("a"), node_obj("b")])
    table.set_signals(
        {
            n: NodeSignals(NodeMetrics(runq_p99_us=2000), updated_at=NOW, measured=SIGNAL_FAMILIES)
            for n in ("a", "b")
        }
    )
    pod = parse_pod(pod_obj(annotations={ANNOTATION_MAX_RUNQ_P99_US: "500"}))
    cycle = SchedulingCycle(CycleSettings(), seed=0)
    blocked = cycle.schedule(pod, table, NOW)
    assert blocked.node is None and blocked.blocked_only_by_interference
    at = time.strftime("%H:%M:%S UTC", time.gmtime(NOW + 60))
    assert blocked.message == (
        "0/2 nodes are available: "
        "2 node(s) had run-queue p99 above the pod's interference tolerance. "
        "Nearest node: a, run-queue p99 2000 µs against the tolerance 500 µs (10s window). "
        f"Relaxed to interference-blind in 60 s (at {at}). "
        "Hint: raise interference.io/max-runq-p99-us to at least 2000 µs."
    )
    relaxed = cycle.schedule(pod, table, NOW, relax_interference=True)
    assert relaxed.node in ("a", "b")


def test_not_blocked_only_by_interference_when_resources_also_block() -> None:
    table = table_of([node_obj("a", cpu="1"), node_obj("b")])
    table.set_signals(
        {"b": NodeSignals(NodeMetrics(runq_p99_us=2000), updated_at=NOW, measured=SIGNAL_FAMILIES)}
    )
    pod = parse_pod(pod_obj(requests={"cpu": "2"}, annotations={ANNOTATION_MAX_RUNQ_P99_US: "500"}))
    result = SchedulingCycle(CycleSettings()).schedule(pod, table, NOW)
    assert result.node is None and result.blocked_only_by_interference  # b passes without it
    table.upsert_node(parse_node(node_obj("b", cpu="1")))
    result = SchedulingCycle(CycleSettings()).schedule(pod, table, NOW)
    assert result.node is None and not result.blocked_only_by_interference


def test_stale_reject_filters_nodes_without_reports() -> None:
    table = table_of([node_obj("reporting"), node_obj("silent")])
    _signals(table, reporting=80)
    result = SchedulingCycle(interference_settings(stale_policy="reject")).schedule(
        parse_pod(pod_obj()), table, NOW
    )
    assert result.node == "reporting"


def test_burst_spreads_off_the_quiet_node() -> None:
    table = table_of(
        [node_obj("quiet", cpu="8"), node_obj("busy-1", cpu="8"), node_obj("busy-2", cpu="8")]
    )
    table.set_signals(
        {
            "quiet": NodeSignals(
                metrics_with_index(0), updated_at=NOW - 1, measured=SIGNAL_FAMILIES
            ),
            "busy-1": NodeSignals(
                metrics_with_index(30), updated_at=NOW - 1, measured=SIGNAL_FAMILIES
            ),
            "busy-2": NodeSignals(
                metrics_with_index(30), updated_at=NOW - 1, measured=SIGNAL_FAMILIES
            ),
        }
    )
    cycle = SchedulingCycle(CycleSettings(), seed=3)
    placed: Counter[str] = Counter()
    for i in range(12):
        pod = parse_pod(pod_obj(f"p{i}", requests={"cpu": "500m"}))
        node = cycle.schedule(pod, table, NOW).node
        assert node is not None
        table.add_pod(pod, node, NOW)
        placed[node] += 1
    assert 0 < placed["quiet"] < 12
    assert placed["busy-1"] + placed["busy-2"] > 0


def test_signature_cache_follows_label_changes() -> None:
    table = table_of([node_obj("a", labels={"zone": "x"}), node_obj("b", labels={"zone": "y"})])
    pod = parse_pod(pod_obj(nodeSelector={"zone": "x"}))
    cycle = SchedulingCycle(CycleSettings())
    assert cycle.schedule(pod, table, NOW).node == "a"
    generation = table.generation
    table.upsert_node(parse_node(node_obj("a", labels={"zone": "y"})))
    table.upsert_node(parse_node(node_obj("b", labels={"zone": "x"})))
    assert table.generation > generation
    assert cycle.schedule(pod, table, NOW).node == "b"


def test_allocatable_heartbeat_keeps_cache_but_counts() -> None:
    table = table_of([node_obj("a", cpu="1")])
    pod = parse_pod(pod_obj(requests={"cpu": "2"}))
    cycle = SchedulingCycle(CycleSettings())
    assert cycle.schedule(pod, table, NOW).node is None
    generation = table.generation
    table.upsert_node(parse_node(node_obj("a", cpu="4")))
    assert table.generation == generation
    assert cycle.schedule(pod, table, NOW).node == "a"


def test_pod_with_unsupported_field_is_refused_on_every_node() -> None:
    obj: dict[str, Any] = pod_obj(resourceClaims=[{"name": "gpu"}])
    result = SchedulingCycle(CycleSettings()).schedule(
        parse_pod(obj), table_of([node_obj("a")]), NOW
    )
    assert result.node is None and result.feasible == 0
    field = "spec.resourceClaims"
    assert result.unsupported == (field,)
    assert f"does not implement {field}" in result.message
    assert not result.blocked_only_by_interference


def _preemption_case(
    pod_priority: int, victim_priority: int, policy: str | None = None
) -> CycleResult:
    """Two 4-CPU nodes, one holding a 3-CPU pod of ``victim_priority``, the other tainted;
    a 2-CPU pod of ``pod_priority`` fits nowhere without preemption."""
    nodes = [
        node_obj("busy", cpu="4"),
        node_obj("tainted", cpu="4", taints=[("k", "v", "NoSchedule")]),
    ]
    victim = pod_obj("victim", requests={"cpu": "3"}, priority=victim_priority)
    spec: dict[str, Any] = {"priority": pod_priority}
    if policy is not None:
        spec["preemptionPolicy"] = policy
    pod = parse_pod(pod_obj("urgent", requests={"cpu": "2"}, **spec))
    return SchedulingCycle(CycleSettings()).schedule(
        pod, table_of(nodes, [(victim, "busy")]), NOW, preemption=PreemptionInputs()
    )


@pytest.mark.parametrize(
    ("pod_priority", "victim_priority", "policy", "tail", "nominated"),
    [
        (1000, 0, None, "", "busy"),
        (1000, 0, "Never", " preemption: not eligible due to preemptionPolicy=Never.", None),
        (0, 0, None, "", None),
        (0, 1000, None, "", None),
    ],
    ids=["lower-priority-victim", "preemption-policy-never", "equal-priority", "higher-priority"],
)
def test_the_post_filter_preempts_only_lower_priority_pods(
    pod_priority: int, victim_priority: int, policy: str | None, tail: str, nominated: str | None
) -> None:
    result = _preemption_case(pod_priority, victim_priority, policy)
    assert result.node is None
    assert result.message == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint(s)." + tail
    )
    assert result.preemption is not None
    assert result.preemption.node == nominated
    victims = [p.name for p in result.preemption.victims]
    assert victims == (["victim"] if nominated else [])


def test_table_rows_stay_consistent_when_nodes_come_and_go() -> None:
    table = table_of([node_obj("a", cpu="4"), node_obj("b", cpu="4"), node_obj("c", cpu="4")])
    table.add_pod(parse_pod(pod_obj("on-c", requests={"cpu": "3"})), "c", NOW)
    table.add_pod(parse_pod(pod_obj("early", requests={"cpu": "3"})), "d", NOW)  # before its node
    table.remove_node("a")  # c moves into a's row
    assert sorted(table.names) == ["b", "c"] and len(table) == 2
    table.upsert_node(parse_node(node_obj("d", cpu="4")))
    cycle = SchedulingCycle(CycleSettings())
    pod = parse_pod(pod_obj("big", requests={"cpu": "2"}))
    assert cycle.schedule(pod, table, NOW).node == "b"
    table.remove_node("c")
    table.upsert_node(parse_node(node_obj("c", cpu="4")))  # back, with its pod still counted
    table.remove_node("b")
    result = cycle.schedule(pod, table, NOW)
    assert result.node is None
    assert result.message == "0/2 nodes are available: 2 Insufficient cpu."


def test_constraints_cache_is_bounded() -> None:
    table = table_of([node_obj("a", labels={"zone": "x"})])
    cycle = SchedulingCycle(CycleSettings())
    for i in range(CACHE_LIMIT + 50):
        pod = parse_pod(pod_obj(f"p{i}", nodeSelector={"zone": "x", "slot": str(i)}))
        assert cycle.schedule(pod, table, NOW).node is None
    assert 0 < table.caches.size("constraints") <= CACHE_LIMIT
    assert cycle.schedule(parse_pod(pod_obj(nodeSelector={"zone": "x"})), table, NOW).node == "a"


# ---- property tests: the incremental table against a from-scratch recount ------------------

NODE_NAMES = ["a", "b", "c", "d"]
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add_pod"), st.integers(0, 5), st.sampled_from(NODE_NAMES)),
        st.tuples(st.just("remove_pod"), st.integers(0, 5), st.just("")),
        st.tuples(st.just("add_node"), st.integers(1, 8), st.sampled_from(NODE_NAMES)),
        st.tuples(st.just("remove_node"), st.just(0), st.sampled_from(NODE_NAMES)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_table_accounting_matches_recount(ops: list[tuple[str, int, str]]) -> None:
    table = NodeTable(capacity=1)
    pods = [
        parse_pod(pod_obj(f"p{i}", requests={"cpu": f"{(i + 1) * 300}m", GPU: str(i % 2)}))
        for i in range(6)
    ]
    placed: dict[str, str] = {}
    nodes: dict[str, int] = {}
    for op, number, node in ops:
        if op == "add_pod":
            table.add_pod(pods[number], node, NOW)
            placed[pods[number].key] = node
        elif op == "remove_pod":
            table.remove_pod(pods[number])
            placed.pop(pods[number].key, None)
        elif op == "add_node":
            table.upsert_node(parse_node(node_obj(node, cpu=str(number), extra={GPU: "2"})))
            nodes[node] = number
        else:
            table.remove_node(node)
            nodes.pop(node, None)
    assert sorted(table.names) == sorted(nodes)
    for name, cpus in nodes.items():
        row = table.row_of(name)
        assert row is not None
        on_node = [p for p in pods if placed.get(p.key) == name]
        for resource, allocatable in (("cpu", cpus * 1000), (GPU, 2), ("pods", 110)):
            used = sum(1 if resource == "pods" else p.requests.get(resource, 0) for p in on_node)
            r = table.resource_row(resource)
            assert r is not None
            assert table.requested[r, row] == used
            assert table.free[r, row] == allocatable - used
        assert table.recent_cpu_m[row] == sum(p.requests.get("cpu", 0) for p in on_node)


label_values = st.sampled_from(["1", "2", "10", "x", "y"])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["k", "j"]), label_values, max_size=2),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]),
    st.sampled_from(["k", "j"]),
    st.lists(st.sampled_from(["1", "2", "10", "x"]), min_size=1, max_size=2),
)
def test_vectorised_affinity_matches_per_node_rule(
    labels: list[dict[str, str]], operator: str, key: str, values: list[str]
) -> None:
    if operator in ("Gt", "Lt"):
        values = [v for v in values if v.isdigit()][:1] or ["2"]
    if operator in ("Exists", "DoesNotExist"):  # with values, kube's term matches nothing
        values = []
    table = table_of([node_obj(f"n{i}", labels=lab) for i, lab in enumerate(labels)])
    pod = parse_pod(pod_obj(affinity=affinity_terms([(key, operator, values)])))
    mask = node_affinity(table, pod).passed.tolist()

    def holds(node_labels: dict[str, str]) -> bool:
        value = node_labels.get(key)
        if operator == "In":
            return value in values
        if operator == "NotIn":
            return value not in values
        if operator == "Exists":
            return value is not None
        if operator == "DoesNotExist":
            return value is None
        if value is None or not value.isdigit():
            return False
        return int(value) > int(values[0]) if operator == "Gt" else int(value) < int(values[0])

    assert mask == [holds(lab) for lab in labels]


score_operations = st.lists(
    st.one_of(
        st.tuples(st.just("add_pod"), st.integers(0, 5), st.sampled_from(NODE_NAMES)),
        st.tuples(st.just("remove_pod"), st.integers(0, 5), st.just("")),
        st.tuples(st.just("resize_node"), st.integers(0, 8), st.sampled_from(NODE_NAMES)),
        st.tuples(st.just("report"), st.integers(0, 100), st.sampled_from(NODE_NAMES)),
        st.tuples(st.just("remove_node"), st.just(0), st.sampled_from(NODE_NAMES)),
        st.tuples(st.just("score"), st.just(0), st.just("")),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(score_operations)
def test_row_by_row_scores_match_the_formulas(ops: list[tuple[str, int, str]]) -> None:
    table = table_of([node_obj(n, cpu="4", memory="8Gi") for n in NODE_NAMES])
    args = InterferenceArgs(signal_window="10s", risk_k=1.5)
    pods = [parse_pod(pod_obj(f"p{i}", requests={"cpu": f"{(i + 1) * 200}m"})) for i in range(6)]
    incoming = parse_pod(pod_obj("new", requests={"cpu": "300m", "memory": "1Gi"}))
    reports: dict[str, NodeSignals] = {}
    clock = NOW
    for op, number, node in ops:
        clock += 1.0
        if op == "add_pod":
            table.add_pod(pods[number], node, clock)
        elif op == "remove_pod":
            table.remove_pod(pods[number])
        elif op == "resize_node":
            table.upsert_node(parse_node(node_obj(node, cpu=str(number), memory="8Gi")))
        elif op == "report":
            metrics = metrics_with_index(number, runq_p99_us=number * 15)
            window = window_with_index(10.0, number, min(number / 7, 100 - number))
            reports[node] = NodeSignals(
                metrics, updated_at=clock, windows={"10s": window}, measured=SIGNAL_FAMILIES
            )
            table.set_signals(dict(reports))
        elif op == "remove_node":
            table.remove_node(node)
        # score after every step, so later steps update the cached columns row by row
        interference = quietness(table, args, clock)
        balance = least_allocated_score(table, incoming)
    if not len(table):
        return
    interference = quietness(table, args, clock)
    balance = least_allocated_score(table, incoming)
    cpu, memory = table.resource_row("cpu"), table.resource_row("memory")
    assert cpu is not None and memory is not None
    alloc_cpu = table.alloc[cpu].astype(float)
    load = np.divide(table.recent_cpu_m, alloc_cpu, out=np.zeros(len(table)), where=alloc_cpu > 0)
    window = table.windows["10s"]
    risk = np.minimum(100.0, window.index_mean + 1.5 * window.index_stddev)
    index = np.minimum(100.0, risk + 100.0 * load)
    expected = np.where(table.signals_at >= clock - 5.0, 100 - index, 50.0)
    assert interference == pytest.approx(expected)

    def part(alloc: np.ndarray, used: np.ndarray, request: float) -> np.ndarray:
        share = np.divide(used + request, alloc, out=np.ones(len(alloc)), where=alloc > 0)
        return np.where(alloc > 0, 100 * np.maximum(0, 1 - share), 0.0)

    expected_balance = (
        part(alloc_cpu, table.nonzero_cpu_m, incoming.nonzero_cpu_m)
        + part(table.alloc[memory].astype(float), table.nonzero_memory, incoming.nonzero_memory)
    ) / 2
    assert balance == pytest.approx(expected_balance)
