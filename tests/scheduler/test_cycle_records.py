"""Decision-record content of cycle results, and the interference-blind switch."""

from __future__ import annotations

import time
from typing import Any

import pytest

from interference.decision import CandidateVerdict, Decision, decision_hash, parse_decision_hash
from interference.signals import SIGNAL_FAMILIES
from scheduler.api.objects import ANNOTATION_MAX_RUNQ_P99_US
from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.ports import NodeSignals
from scheduler.cycle.settings import CycleSettings, Profile
from scheduler.entry.config import ConfigError, parse_config
from scheduler.plugins.interference import RUNQ_EXCEEDED, STALE_SIGNALS
from scheduler.plugins.node_resources_fit import insufficient_reason
from scheduler.plugins.taint_toleration import UNTOLERATED_TAINT
from scheduler.signals.table import NodeTable
from tests.builders import node_obj, pod_obj, table_of
from tests.indexed_signals import metrics_with_index
from tests.scheduler.profiles import interference_settings

NOW = 1000.0
NOT_READY = "node(s) were not ready"


def _runq(table: NodeTable, **runq_p99_us: float) -> None:
    table.set_signals(
        {
            # the index rises with the p99 so the quieter node ranks first (an index is
            # at most 100, what a p99 past the saturation point gives)
            name: NodeSignals(
                metrics_with_index(min(value / 100, 100.0), runq_p99_us=value),
                updated_at=NOW,
                measured=SIGNAL_FAMILIES,
            )
            for name, value in runq_p99_us.items()
        }
    )


def _latency_pod(max_runq_us: str = "500", **kwargs: Any) -> dict[str, Any]:
    return pod_obj(annotations={ANNOTATION_MAX_RUNQ_P99_US: max_runq_us}, **kwargs)


def _cluster() -> NodeTable:
    """quiet-a/quiet-b fit; noisy-1/noisy-2 exceed 500 µs; small lacks CPU; down is not ready;
    tainted carries an untolerated taint."""
    table = table_of(
        [
            node_obj("quiet-a"),
            node_obj("quiet-b"),
            node_obj("noisy-1"),
            node_obj("noisy-2"),
            node_obj("small", cpu="100m"),
            node_obj("down", ready=False),
            node_obj("tainted", taints=[("dedicated", "db", "NoSchedule")]),
        ]
    )
    _runq(table, **{"quiet-a": 50, "quiet-b": 80, "noisy-1": 4000, "noisy-2": 3000, "small": 50})
    return table


def test_scheduled_pod_records_rejected_nodes_interference_first_and_counts() -> None:
    pod = parse_pod(_latency_pod(requests={"cpu": "1"}))
    result = SchedulingCycle(CycleSettings(record_top_k=3)).schedule(pod, _cluster(), NOW)
    assert result.node == "quiet-a"
    feasible = [c for c in result.candidates if c.passed]
    rejected = [c for c in result.candidates if not c.passed]
    assert [c.node for c in feasible] == ["quiet-a", "quiet-b"]
    assert all(c.scores and c.total > 0 for c in feasible)
    # The record carries the weights: its total is the sum of the weighted parts.
    assert all(
        c.weights == {"Interference": 2.0, "NodeResourcesFit": 1.0, "GpuPacking": 1.0}
        for c in feasible
    )
    for c in feasible:
        assert c.total == pytest.approx(sum(c.weights[p] * s for p, s in c.scores.items()))
    # The noisy nodes come first, with the reason the pod's tolerance rejected them.
    # Each interference reason carries what was measured against the tolerance.
    assert [(c.node, c.reasons) for c in rejected[:2]] == [
        ("noisy-1", [f"{RUNQ_EXCEEDED} (measured 4000 µs > tolerance 500 µs)"]),
        ("noisy-2", [f"{RUNQ_EXCEEDED} (measured 3000 µs > tolerance 500 µs)"]),
    ]
    assert (rejected[2].node, rejected[2].reasons) == ("small", [insufficient_reason("cpu")])
    assert result.reason_counts == {
        RUNQ_EXCEEDED: 2,
        insufficient_reason("cpu"): 1,
        NOT_READY: 1,
        UNTOLERATED_TAINT: 1,
    }
    assert result.feasible == 2


@pytest.mark.parametrize(
    ("top_k", "feasible", "rejected"),
    [
        (0, [], []),  # nothing recorded, counts still kept
        (1, ["quiet-a"], ["noisy-1"]),
        (2, ["quiet-a", "quiet-b"], ["noisy-1", "noisy-2"]),
        # latest failing filter first: interference, resources, taints, readiness
        (9, ["quiet-a", "quiet-b"], ["noisy-1", "noisy-2", "small", "tainted", "down"]),
    ],
)
def test_record_top_k_bounds_both_kinds(
    top_k: int, feasible: list[str], rejected: list[str]
) -> None:
    pod = parse_pod(_latency_pod(requests={"cpu": "1"}))
    result = SchedulingCycle(CycleSettings(record_top_k=top_k)).schedule(pod, _cluster(), NOW)
    assert [c.node for c in result.candidates if c.passed] == feasible
    assert [c.node for c in result.candidates if not c.passed] == rejected
    assert sum(result.reason_counts.values()) == 5


def test_every_node_feasible_records_no_rejections() -> None:
    table = table_of([node_obj("a"), node_obj("b")])
    result = SchedulingCycle(CycleSettings()).schedule(parse_pod(pod_obj()), table, NOW)
    assert all(c.passed for c in result.candidates)
    assert result.reason_counts == {}


def test_unschedulable_pod_lists_interference_rejections_first() -> None:
    pod = parse_pod(_latency_pod("10", requests={"cpu": "1"}))  # every node too noisy
    result = SchedulingCycle(CycleSettings(record_top_k=2)).schedule(pod, _cluster(), NOW)
    assert result.node is None
    assert [c.node for c in result.candidates] == ["quiet-a", "quiet-b"]
    assert result.candidates[0].reasons == [f"{RUNQ_EXCEEDED} (measured 50 µs > tolerance 10 µs)"]
    assert result.reason_counts[RUNQ_EXCEEDED] == 4  # quiet-a, quiet-b, noisy-1, noisy-2
    assert result.message.startswith(
        "0/7 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint(s), "
        "1 node(s) were not ready, "
        f"4 {RUNQ_EXCEEDED}. Nearest node: quiet-a,"
    )


def test_a_record_keeps_the_runq_p99_the_filter_compared_on_each_candidate() -> None:
    """What decided, stored with the decision: the pod's tolerance, the window the filter
    read and each recorded candidate's run-queue p99 (not the unrecorded nodes')."""
    pod = parse_pod(_latency_pod(requests={"cpu": "1"}))
    settings = interference_settings(signal_window="60s", record_top_k=3)
    result = SchedulingCycle(settings).schedule(pod, _cluster(), NOW)
    assert result.node == "quiet-a" and result.runq is not None
    assert (result.runq.tolerance_us, result.runq.window) == (500.0, "60s")
    assert result.runq.measured_us == {
        "quiet-a": 50.0,
        "quiet-b": 80.0,
        "noisy-1": 4000.0,
        "noisy-2": 3000.0,
        "small": 50.0,
    }
    assert result.runq.nearest == "" and "Nearest" not in result.message
    plain = SchedulingCycle(CycleSettings()).schedule(parse_pod(pod_obj()), _cluster(), NOW)
    assert plain.runq is None  # no tolerance: nothing compared


def test_an_unschedulable_pod_is_told_the_nearest_node_even_when_the_record_omits_it() -> None:
    table = _cluster()
    _runq(table, **{"quiet-a": 80, "quiet-b": 50, "noisy-1": 4000, "noisy-2": 3000})
    pod = parse_pod(_latency_pod("10", requests={"cpu": "1"}))
    cycle = SchedulingCycle(CycleSettings(record_top_k=1, relax_after_s=45.0))
    cycle.schedule(pod, table, NOW - 3)  # it first waited 3 s before
    result = cycle.schedule(pod, table, NOW)
    assert [c.node for c in result.candidates] == ["quiet-a"]
    assert result.runq is not None and result.runq.nearest == "quiet-b"
    assert result.runq.measured_us == {"quiet-a": 80.0, "quiet-b": 50.0}
    assert result.runq.relax_at == NOW + 42
    at = time.strftime("%H:%M:%S UTC", time.gmtime(NOW + 42))
    assert result.message.endswith(
        f"4 {RUNQ_EXCEEDED}. Nearest node: quiet-b, run-queue p99 50 µs against the tolerance "
        f"10 µs (10s window). Relaxed to interference-blind in 42 s (at {at}). "
        "Hint: raise interference.io/max-runq-p99-us to at least 50 µs."
    )


def test_a_pod_every_other_filter_refuses_as_well_is_told_it_is_never_relaxed() -> None:
    """Interference listed before NodeResourcesFit: each node is refused for its run-queue
    first, yet none has the CPU, so relaxing would not help and no node is nearest."""
    table = table_of([node_obj("a", cpu="1"), node_obj("b", cpu="1")])
    _runq(table, a=900, b=700)
    pod = parse_pod(_latency_pod(requests={"cpu": "4"}))
    profile = Profile(filters=("Interference", "NodeResourcesFit"))
    result = SchedulingCycle(CycleSettings(profile=profile)).schedule(pod, table, NOW)
    assert result.node is None and not result.blocked_only_by_interference
    assert result.runq is not None
    assert (result.runq.nearest, result.runq.relax_at) == ("", None)
    assert result.runq.measured_us == {"a": 900.0, "b": 700.0}
    assert result.message == (
        f"0/2 nodes are available: 2 {RUNQ_EXCEEDED}. Never relaxed to interference-blind: "
        "another filter refuses each node as well."
    )


def test_record_counts_and_details_round_trip_through_the_decision_hash() -> None:
    pod = parse_pod(_latency_pod(requests={"cpu": "1"}))
    result = SchedulingCycle(CycleSettings()).schedule(pod, _cluster(), NOW)
    decision = Decision(
        "default",
        "p",
        "scheduled",
        result.node or "",
        result.message,
        NOW,
        candidates=[*result.candidates, CandidateVerdict("g", True, details={"gpu_model": "X"})],
        rejected_by_reason=result.reason_counts,
    )
    parsed = parse_decision_hash(decision_hash(decision))
    assert parsed.rejected_by_reason == result.reason_counts
    assert parsed.runq is None  # the record above was written without it
    assert parsed.candidates[-1].details == {"gpu_model": "X"}
    assert [c.node for c in parsed.candidates] == [c.node for c in result.candidates] + ["g"]


# ---- interference_aware: false ---------------------------------------------------------------


def test_blind_cycle_ignores_tolerance_stale_reject_and_interference_weight() -> None:
    settings = interference_settings(
        Profile(scores=(("Interference", 50.0),)),
        interference_aware=False,
        stale_policy="reject",
    )
    table = table_of([node_obj("noisy"), node_obj("unreported")])
    _runq(table, noisy=50_000)
    pod = parse_pod(_latency_pod(requests={"cpu": "1"}))
    result = SchedulingCycle(settings, seed=0).schedule(pod, table, NOW)
    assert result.node in {"noisy", "unreported"}
    assert result.feasible == 2
    assert result.reason_counts == {}
    assert all(set(c.scores) == {"NodeResourcesFit", "GpuPacking"} for c in result.candidates)
    aware = SchedulingCycle(interference_settings(stale_policy="reject")).schedule(pod, table, NOW)
    assert aware.node is None
    assert aware.reason_counts == {RUNQ_EXCEEDED: 1, STALE_SIGNALS: 1}


def test_interference_weight_zero_alone_keeps_tolerance_filters() -> None:
    table = table_of([node_obj("noisy")])
    _runq(table, noisy=50_000)
    settings = CycleSettings(profile=Profile(scores=(("Interference", 0.0),)))
    result = SchedulingCycle(settings).schedule(parse_pod(_latency_pod()), table, NOW)
    assert result.node is None and result.blocked_only_by_interference


@pytest.mark.parametrize(
    ("cycle", "aware", "problem"),
    [
        ({}, True, None),
        ({"interference_aware": False}, False, None),
        ({"interference_aware": True}, True, None),
        ({"interference_aware": "no"}, False, None),  # the six boolean words, any case
        ({"interference_aware": "off"}, None, "cycle.interference_aware: must be true or false"),
        ({"interference_awre": False}, None, "did you mean 'interference_aware'?"),
    ],
)
def test_config_validates_interference_aware(
    cycle: dict[str, Any], aware: bool | None, problem: str | None
) -> None:
    if problem is None:
        assert parse_config({"cycle": cycle}).cycle.interference_aware is aware
    else:
        with pytest.raises(ConfigError, match=problem):
            parse_config({"cycle": cycle})


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_tied_candidates_are_recorded_in_table_order_after_the_chosen_node(seed: int) -> None:
    table = table_of([node_obj(f"n{i}") for i in range(8)])  # every node scores the same
    result = SchedulingCycle(CycleSettings(record_top_k=3), seed=seed).schedule(
        parse_pod(pod_obj()), table, NOW
    )
    recorded = [c.node for c in result.candidates]
    others = [name for name in ("n0", "n1", "n2", "n3") if name != result.node]
    assert recorded == [result.node, *others[:2]]
    assert len({c.total for c in result.candidates}) == 1
