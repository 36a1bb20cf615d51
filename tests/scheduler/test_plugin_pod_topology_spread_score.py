"""PodTopologySpread score (ScheduleAnyway): kube-scheduler's normalizing weight, maxSkew
offset, ignored nodes, per-node counts on the hostname key, normalization."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.settings import CycleSettings, Profile
from scheduler.plugins.node_affinity import node_affinity
from scheduler.plugins.pod_topology_spread import topology_spread_score
from scheduler.plugins.taint_toleration import taint_toleration
from tests.builders import node_obj, pod_obj, table_of
from tests.scheduler.filters import or_all_pass

HOSTNAME = "kubernetes.io/hostname"


def _soft(key: str = "zone", max_skew: int = 1) -> list[dict[str, Any]]:
    return [
        {
            "maxSkew": max_skew,
            "topologyKey": key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]


def _nodes(*zones: str | None) -> list[dict[str, Any]]:
    return [
        node_obj(
            name,
            labels={HOSTNAME: name, **({"zone": zone} if zone else {})},
        )
        for name, zone in zip("abcd", zones, strict=False)
    ]


def _web(node: str, i: int) -> tuple[dict[str, Any], str]:
    return pod_obj(f"w{node}{i}", labels={"app": "web"}, nodeName=node), node


def _scores(
    nodes: list[dict[str, Any]],
    placed: list[tuple[dict[str, Any], str]],
    constraints: list[dict[str, Any]],
    infeasible: tuple[str, ...] = (),
) -> dict[str, float]:
    table = table_of(nodes, placed)
    pod = parse_pod(pod_obj("new", labels={"app": "web"}, topologySpreadConstraints=constraints))
    feasible = np.array([name not in infeasible for name in table.names])
    scores = topology_spread_score(
        table,
        pod,
        feasible,
        or_all_pass(node_affinity(table, pod), table).passed,
        or_all_pass(taint_toleration(table, pod), table).passed,
    )
    return {name: scores[i] for i, name in enumerate(table.names) if name not in infeasible}


A2_B1 = [_web("a", 0), _web("a", 1), _web("b", 0)]


@pytest.mark.parametrize(
    ("zones", "placed", "constraints", "infeasible", "expected"),
    [
        # weight ln(3 + 2): raw a = round(2 · 1.609) = 3, b = 2, c = 0
        (("za", "zb", "zc"), A2_B1, _soft(), (), {"a": 0, "b": 33, "c": 100}),
        # maxSkew − 1 = 1 added: raw 4, 3, 1 → 100 · (4 + 1 − raw) / 4
        (("za", "zb", "zc"), A2_B1, _soft(max_skew=2), (), {"a": 25, "b": 50, "c": 100}),
        # a node without the key is ignored: 0, and not in min/max
        (("za", "zb", None), A2_B1, _soft(), (), {"a": 33, "b": 100, "c": 0}),
        # an infeasible node's zone is no domain: weight ln(2 + 2), raw 3, 1
        (("za", "zb", "zc"), A2_B1, _soft(), ("c",), {"a": 33, "b": 100}),
        # the hostname key counts each node's own pods
        (("za", "za", "za"), A2_B1, _soft(HOSTNAME), (), {"a": 0, "b": 33, "c": 100}),
        # no matching pods anywhere: every scored node gets 100
        (("za", "zb", "zc"), [], _soft(), (), {"a": 100, "b": 100, "c": 100}),
    ],
    ids=[
        "topology-normalizing-weight-ln-size-plus-2",
        "max-skew-minus-1-offset",
        "node-missing-topology-key-ignored",
        "domains-from-filtered-nodes-only",
        "hostname-key-counts-per-node",
        "max-score-zero-all-max",
    ],
)
def test_pod_topology_spread_score_like_kube_scheduler(
    zones: tuple[str | None, ...],
    placed: list[tuple[dict[str, Any], str]],
    constraints: list[dict[str, Any]],
    infeasible: tuple[str, ...],
    expected: dict[str, float],
) -> None:
    assert _scores(_nodes(*zones), placed, constraints, infeasible) == expected


def test_cycle_prefers_the_emptiest_zone_for_schedule_anyway() -> None:
    table = table_of(_nodes("za", "zb", "zc"), A2_B1)
    only = Profile(scores=(("Interference", 0), ("NodeResourcesFit", 0), ("GpuPacking", 0)))
    pod = parse_pod(pod_obj("new", labels={"app": "web"}, topologySpreadConstraints=_soft()))
    assert pod.unsupported == () and pod.soft_spread
    result = SchedulingCycle(CycleSettings(profile=only)).schedule(pod, table, 0.0)
    assert result.node == "c"
    assert result.candidates[0].scores == {"PodTopologySpread": 100.0}
