"""Interference score: formula, recent load, stale policies."""

from __future__ import annotations

import pytest

from interference.signals import NodeMetrics
from scheduler.model import parse_node, parse_pod
from scheduler.ports import NodeSignals
from scheduler.scores.interference import interference_score
from scheduler.settings import EngineSettings, StalePolicy
from tests.scheduler.test_model import node_obj, pod_obj, table_of

NOW = 1000.0


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        (NodeMetrics(), 100.0),
        (NodeMetrics(score=30), 70.0),
        (NodeMetrics(score=10, runq_p99_us=500), 50.0),  # runq 500/1000 → pressure 50
        (NodeMetrics(score=10, runq_p99_us=4000), 0.0),  # saturates at the reference
        (NodeMetrics(score=10, reclaim_stall_ms_per_s=4), 20.0),  # 4/5 → pressure 80
        (NodeMetrics(score=90, runq_p99_us=100), 10.0),  # the index dominates
        (NodeMetrics(score=100), 0.0),
    ],
    ids=[
        "quiet",
        "index",
        "runq-dominates",
        "runq-saturates",
        "reclaim-dominates",
        "index-dominates",
        "saturated",
    ],
)
def test_formula(metrics: NodeMetrics, expected: float) -> None:
    table = table_of([node_obj("n")])
    table.set_signals({"n": NodeSignals(metrics, updated_at=NOW)})
    assert interference_score(table, EngineSettings(), NOW)[0] == pytest.approx(expected)


def test_recent_load_lowers_score_until_next_report() -> None:
    table = table_of([node_obj("n", cpu="8")])
    table.set_signals({"n": NodeSignals(NodeMetrics(score=20), updated_at=NOW - 1)})
    settings = EngineSettings(recent_load_weight=100.0)
    table.add_pod(parse_pod(pod_obj("a", requests={"cpu": "2"})), "n", NOW)
    assert interference_score(table, settings, NOW)[0] == pytest.approx(100 - 20 - 25)
    table.add_pod(parse_pod(pod_obj("b", requests={"cpu": "2"})), "n", NOW)
    assert interference_score(table, settings, NOW)[0] == pytest.approx(100 - 20 - 50)
    table.remove_pod(parse_pod(pod_obj("b")))  # a failed bind is forgotten
    assert interference_score(table, settings, NOW)[0] == pytest.approx(100 - 20 - 25)
    table.set_signals({"n": NodeSignals(NodeMetrics(score=30), updated_at=NOW + 1)})
    assert interference_score(table, settings, NOW + 1)[0] == pytest.approx(70)


def test_pods_placed_before_the_report_do_not_count() -> None:
    table = table_of([node_obj("n", cpu="8")])
    table.add_pod(parse_pod(pod_obj("old", requests={"cpu": "4"})), "n", NOW - 10)
    table.set_signals({"n": NodeSignals(NodeMetrics(score=20), updated_at=NOW - 5)})
    assert interference_score(table, EngineSettings(), NOW)[0] == pytest.approx(80)


def test_confirming_an_assumed_pod_keeps_its_stamp() -> None:
    table = table_of([node_obj("n", cpu="8")])
    table.set_signals({"n": NodeSignals(NodeMetrics(), updated_at=NOW - 1)})
    pod = parse_pod(pod_obj("a", requests={"cpu": "4"}))
    table.add_pod(pod, "n", NOW)
    table.set_signals({"n": NodeSignals(NodeMetrics(score=10), updated_at=NOW + 1)})
    table.add_pod(pod, "n", NOW + 2)  # the watch confirms the binding later
    assert interference_score(table, EngineSettings(), NOW + 2)[0] == pytest.approx(90)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("neutral", 50.0), ("avoid", 0.0), ("reject", 0.0)],
    ids=["neutral", "avoid", "reject"],
)
def test_stale_and_missing_signals(policy: StalePolicy, expected: float) -> None:
    table = table_of([node_obj("stale"), node_obj("missing"), node_obj("fresh")])
    table.set_signals(
        {
            "stale": NodeSignals(NodeMetrics(), updated_at=NOW - 11),
            "fresh": NodeSignals(NodeMetrics(score=25), updated_at=NOW - 9),
        }
    )
    scores = interference_score(table, EngineSettings(stale_policy=policy, stale_after_s=10), NOW)
    assert scores.tolist() == [expected, expected, 75.0]


def test_signals_arriving_before_the_node_apply_when_it_joins() -> None:
    table = table_of([node_obj("a")])
    table.set_signals(
        {
            "a": NodeSignals(NodeMetrics(score=10), updated_at=NOW),
            "b": NodeSignals(NodeMetrics(score=60), updated_at=NOW),
        }
    )
    table.upsert_node(parse_node(node_obj("b")))
    assert interference_score(table, EngineSettings(), NOW).tolist() == [90.0, 40.0]


def test_node_absent_from_a_new_snapshot_loses_its_signals() -> None:
    table = table_of([node_obj("a"), node_obj("b")])
    both = {
        "a": NodeSignals(NodeMetrics(score=10), updated_at=NOW),
        "b": NodeSignals(NodeMetrics(score=20), updated_at=NOW),
    }
    table.set_signals(both)
    generation = table.signals_generation
    table.set_signals(dict(both))  # same content, new mapping: nothing changes
    assert table.signals_generation == generation
    table.set_signals({"a": both["a"]})
    assert table.signals("b") is None
    assert interference_score(table, EngineSettings(), NOW).tolist() == [90.0, 50.0]


def test_signals_turn_stale_as_time_passes() -> None:
    table = table_of([node_obj("a"), node_obj("b")])
    table.set_signals(
        {
            "a": NodeSignals(NodeMetrics(score=20), updated_at=NOW),
            "b": NodeSignals(NodeMetrics(score=40), updated_at=NOW + 5),
        }
    )
    settings = EngineSettings(stale_after_s=10.0)
    assert interference_score(table, settings, NOW + 1).tolist() == [80.0, 60.0]
    assert interference_score(table, settings, NOW + 10).tolist() == [80.0, 60.0]
    assert interference_score(table, settings, NOW + 10.5).tolist() == [50.0, 60.0]
    assert interference_score(table, settings, NOW + 16).tolist() == [50.0, 50.0]
    assert interference_score(table, settings, NOW + 2).tolist() == [80.0, 60.0]  # clock skew
