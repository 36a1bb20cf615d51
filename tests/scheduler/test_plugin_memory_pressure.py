"""MemoryPressure score: the kernel's PSI memory avg10, through the scheduling record, to a
decision (a node under memory pressure loses to a quiet one; a quiet cluster decides as
before)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from interference import sched_record
from interference.signals import SIGNAL_FAMILIES, NodeMetrics, NodeReport
from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.ports import NodeSignals
from scheduler.cycle.settings import CycleSettings, Profile
from scheduler.plugins.memory_pressure import (
    NAME,
    MemoryPressureArgs,
    memory_pressure_score,
)
from scheduler.signals.frame import UNKNOWN
from scheduler.signals.records import frame_of_records
from scheduler.signals.table import NodeTable
from tests.builders import node_obj, pod_obj, table_of

NOW = 1000.0
ARGS = MemoryPressureArgs()


def _signals(avg10: float, measured: tuple[str, ...] = SIGNAL_FAMILIES) -> NodeSignals:
    return NodeSignals(NodeMetrics(psi_mem_some_avg10=avg10), updated_at=NOW, measured=measured)


def _table(**signals: NodeSignals) -> NodeTable:
    table = table_of([node_obj(name) for name in signals])
    table.set_signals(signals)
    return table


def _log_score(pressure: float, quiet: float = 1.0, saturated: float = 20.0) -> float:
    return 100.0 * (1.0 - math.log(pressure / quiet) / math.log(saturated / quiet))


@pytest.mark.parametrize(
    ("case", "pressure", "args", "expected"),
    [
        ("no pressure", 0.0, ARGS, 100.0),
        ("at the quiet point", 1.0, ARGS, 100.0),
        ("between: falls with the logarithm", 4.0, ARGS, _log_score(4.0)),
        ("the geometric middle scores 50", math.sqrt(20.0), ARGS, 50.0),
        ("saturated", 20.0, ARGS, 0.0),
        ("beyond saturation", 85.5, ARGS, 0.0),
        (
            "other references",
            10.0,
            MemoryPressureArgs(quiet_pct=5.0, saturated_pct=40.0),
            _log_score(10.0, 5.0, 40.0),
        ),
    ],
)
def test_formula(case: str, pressure: float, args: MemoryPressureArgs, expected: float) -> None:
    # a second node under pressure makes the plugin express a preference
    table = _table(n=_signals(pressure), loaded=_signals(50.0))
    scores = memory_pressure_score(table, table.everyone(), NOW, args)
    assert scores is not None
    assert scores[0] == pytest.approx(expected), case


@pytest.mark.parametrize(
    ("case", "node", "expected"),
    [
        ("stale record", NodeSignals(NodeMetrics(psi_mem_some_avg10=0.0), NOW - 60, 1.0,
                                     SIGNAL_FAMILIES), 50.0),
        ("psi family not measured: its 0 means unknown", _signals(0.0, ("runq",)), 50.0),
        ("degraded (no core family)", _signals(0.0, ("psi",)), 50.0),
    ],
)  # fmt: skip
def test_unknown_pressure_is_neutral(case: str, node: NodeSignals, expected: float) -> None:
    table = _table(n=node, loaded=_signals(50.0))
    scores = memory_pressure_score(table, table.everyone(), NOW, ARGS)
    assert scores is not None
    assert scores.tolist() == [expected, 0.0], case


def test_a_node_without_a_record_is_neutral() -> None:
    table = table_of([node_obj("silent"), node_obj("loaded")])
    table.set_signals({"loaded": _signals(50.0)})
    scores = memory_pressure_score(table, table.everyone(), NOW, ARGS)
    assert scores is not None and scores.tolist() == [50.0, 0.0]


@pytest.mark.parametrize(
    ("case", "pressures", "feasible"),
    [
        ("every node quiet", (0.0, 0.5, 1.0), (True, True, True)),
        ("pressure only on a node already filtered out", (0.0, 0.0, 30.0), (True, True, False)),
    ],
)
def test_no_preference_without_pressure_among_feasible_nodes(
    case: str, pressures: tuple[float, ...], feasible: tuple[bool, ...]
) -> None:
    table = _table(**{f"n{i}": _signals(p) for i, p in enumerate(pressures)})
    assert memory_pressure_score(table, np.array(feasible), NOW, ARGS) is None, case


@pytest.mark.parametrize(
    ("quiet", "saturated"), [(0.0, 20.0), (5.0, 5.0), (10.0, 1.0), (-1.0, 20.0)]
)
def test_args_refuse_references_out_of_order(quiet: float, saturated: float) -> None:
    with pytest.raises(ValueError, match="0 < quiet_pct < saturated_pct"):
        MemoryPressureArgs(quiet_pct=quiet, saturated_pct=saturated)


def _record(node: str, avg10: float, measured: tuple[str, ...] = SIGNAL_FAMILIES) -> bytes:
    report = NodeReport(
        node=node,
        ts=NOW,
        interval_s=1.0,
        metrics=NodeMetrics(psi_mem_some_avg10=avg10),
        measured=measured,
    )
    return sched_record.encode(report)


def test_the_record_carries_avg10_into_its_column() -> None:
    frame = frame_of_records(
        ["noisy", "quiet", "unmeasured", "silent"],
        [
            _record("noisy", 42.5),
            _record("quiet", 0.0),
            _record("unmeasured", 7.0, ("runq",)),
            None,
        ],
        now=NOW,
    )
    assert frame.columns["psi_mem_some_avg10"].tolist() == [42.5, 0.0, UNKNOWN, UNKNOWN]


def _decide(
    table: NodeTable, settings: CycleSettings | None = None
) -> tuple[str | None, dict[str, dict[str, float]]]:
    """The chosen node, and each feasible candidate's scores by node."""
    pod = parse_pod(pod_obj("web", requests={"cpu": "1"}))
    result = SchedulingCycle(settings or CycleSettings()).schedule(pod, table, NOW)
    return result.node, {c.node: c.scores for c in result.candidates if c.passed}


def test_a_node_under_memory_pressure_loses_to_a_quiet_one() -> None:
    # everything else equal, the noisy node first: only this score tells them apart
    table = table_of([node_obj("psi-noisy"), node_obj("quiet")])
    frame = frame_of_records(
        ["psi-noisy", "quiet"], [_record("psi-noisy", 35.0), _record("quiet", 0.2)], now=NOW
    )
    table.set_signals(frame)
    for _ in range(5):  # ties would be broken at random: a tie would show within 5 draws
        node, scores = _decide(table)
        assert node == "quiet"
    assert scores["quiet"][NAME] == 100.0
    assert scores["psi-noisy"][NAME] == 0.0
    others = {plugin: score for plugin, score in scores["quiet"].items() if plugin != NAME}
    assert others == {p: s for p, s in scores["psi-noisy"].items() if p != NAME}


def test_a_quiet_cluster_decides_as_without_the_plugin() -> None:
    table = table_of([node_obj("a"), node_obj("b", cpu="16")])
    table.set_signals({"a": _signals(0.0), "b": _signals(0.9)})
    with_plugin = _decide(table)
    without = _decide(table, CycleSettings(profile=Profile(scores=((NAME, 0.0),))))
    assert with_plugin == without
    assert all(NAME not in scores for scores in with_plugin[1].values())
