"""NodeAffinity score (preferred terms): summed weights, kube-scheduler's
DefaultNormalizeScore over the feasible nodes, terms kube-scheduler skips or rejects."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scheduler.api.pods import parse_pod
from scheduler.api.reader import ObjectError
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.settings import CycleSettings, Profile
from scheduler.plugins.node_affinity import node_affinity_score
from tests.builders import node_obj, pod_obj, table_of

NODES = [
    node_obj("ssd-a", labels={"disk": "ssd", "zone": "a"}),
    node_obj("ssd-b", labels={"disk": "ssd", "zone": "b"}),
    node_obj("hdd-a", labels={"disk": "hdd", "zone": "a"}),
]


def _preferred(*terms: tuple[int, str, str, list[str]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": weight,
                    "preference": {
                        "matchExpressions": [{"key": key, "operator": op, "values": values}]
                    },
                }
                for weight, key, op, values in terms
            ]
        }
    }


@pytest.mark.parametrize(
    ("terms", "feasible", "expected"),
    [
        ([(10, "disk", "In", ["ssd"])], [True, True, True], [100, 100, 0]),
        (
            [(10, "disk", "In", ["ssd"]), (30, "zone", "In", ["a"])],
            [True, True, True],
            [100, 25, 75],  # raw 40, 10, 30: 100 · raw / 40
        ),
        ([(10, "disk", "In", ["ssd"])], [False, False, True], [0, 0, 0]),  # max 0: all 0
        (
            [(10, "disk", "In", ["ssd"]), (30, "zone", "In", ["a"])],
            [False, True, True],
            [133, 33, 100],  # max over feasible: 30 (ssd-a's 133 is never used)
        ),
        ([(0, "disk", "In", ["ssd"])], [True, True, True], [0, 0, 0]),
    ],
    ids=[
        "one-term",
        "weights-summed-normalized-to-max",
        "no-feasible-node-matches",
        "max-over-feasible-nodes-only",
        "weight-zero-term-skipped",
    ],
)
def test_node_affinity_score_like_default_normalize_score(
    terms: list[tuple[int, str, str, list[str]]], feasible: list[bool], expected: list[int]
) -> None:
    table = table_of(NODES)
    pod = parse_pod(pod_obj(affinity=_preferred(*terms)))
    assert pod.unsupported == ()
    scores = node_affinity_score(table, pod, np.array(feasible))
    assert (np.zeros(len(NODES)) if scores is None else scores).tolist() == expected


def test_unparseable_preferred_term_makes_the_pod_unparseable() -> None:
    with pytest.raises(ObjectError, match="preference"):
        parse_pod(pod_obj(affinity=_preferred((10, "disk", "In", ["bad value!"]))))


def test_cycle_prefers_the_preferred_nodes() -> None:
    only = Profile(scores=(("Interference", 0), ("NodeResourcesFit", 0), ("GpuPacking", 0)))
    pod = parse_pod(pod_obj(affinity=_preferred((10, "disk", "In", ["hdd"]))))
    result = SchedulingCycle(CycleSettings(profile=only)).schedule(pod, table_of(NODES), 0.0)
    assert result.node == "hdd-a"
    assert result.candidates[0].scores == {"NodeAffinity": 100.0}
