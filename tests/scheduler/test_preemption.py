"""DefaultPreemption: kube-scheduler v1.36's own unit cases, ported.

Each case carries the name of its upstream case in
``pkg/scheduler/framework/plugins/defaultpreemption/default_preemption_test.go``
(``TestPostFilter``, ``TestDryRunPreemption``, ``TestSelectBestCandidate``,
``TestPodEligibleToPreemptOthers``, ``TestPreempt``) with the same pods, nodes, budgets
and expectations. Upstream hands the PostFilter a node → status map and runs a fake
framework; here the real cycle's filters produce the statuses (a full node: ``Too many
pods`` or ``Insufficient cpu``, ``Unschedulable``; a taint: ``UnschedulableAndUnresolvable``),
and the dry run runs every filter of the profile on the table with the victims removed.

Cases not ported, and why:

- extenders (``preemption result filtered out by extenders``, ``Scheduler extenders …``):
  standalone mode has no extenders; extender mode keeps kube-scheduler's preemption;
- ``TestPlugin`` errors from PreFilter extensions (``only one node but failed with
  TestPlugin``, ``one failed with TestPlugin and the other pass``): our filters have no
  AddPod/RemovePod extension that can fail: the table itself is changed and put back;
- pod groups (``pod with SchedulingGroup …``): workload-aware scheduling is not
  implemented (such pods are refused before any filter);
- the fake ``FalseFilter``/``TrueFilter``/``MatchFilter``/``FakeFilter`` plugins of
  ``TestDryRunPreemption`` and its filter-call counts: they test the framework's
  plumbing; ``a pod that does not fit on any node`` is ported with a real filter;
- ``TestCustomSelection`` and ``TestCustomOrdering``: the Go plugin's replaceable
  ``IsEligiblePod``/``MoreImportantPod`` hooks have no configuration equivalent here.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduler.api.budgets import DisruptionBudgetInfo
from scheduler.api.objects import PodInfo
from scheduler.api.pods import parse_pod
from scheduler.api.selectors import LabelSelector, Requirement
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.nominated import RoomHolds
from scheduler.cycle.outcome import CycleResult
from scheduler.cycle.preemption import (
    NEVER,
    TERMINATING,
    PreemptionArgs,
    PreemptionInputs,
    PreemptionOutcome,
    candidate_count,
    eligible,
    preempt,
)
from scheduler.cycle.settings import CycleSettings
from scheduler.signals.table import NodeTable
from tests.builders import node_obj, pod_obj, table_of

NOW = 1000.0
NEG, LOW, MID, HIGH, VERY_HIGH = -100, 0, 100, 1000, 10000
SMALL = {"cpu": "100m", "memory": "100"}
MEDIUM = {"cpu": "200m", "memory": "200"}
LARGE = {"cpu": "300m", "memory": "300"}
VERY_LARGE = {"cpu": "500m", "memory": "500"}
ONE_POD = {"cpu": "1", "memory": "1Gi", "pods": "1"}
"""Upstream's ``onePodRes`` node: room for one pod (resources are not what blocks)."""
NODE_RES = {"cpu": "200m", "memory": "400", "pods": "110"}


def _pod(
    name: str,
    priority: int | None = None,
    req: Mapping[str, str] | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    if priority is not None:
        spec["priority"] = priority
    return pod_obj(name, requests=dict(req or {}), labels=labels, **spec)


def _node(name: str, res: Mapping[str, str] = VERY_LARGE, **extra: Any) -> dict[str, Any]:
    """A node: ``name`` may be ``host/zone`` (labels ``hostname`` and ``zone``, as
    upstream's ``node-a/zone1``)."""
    host, _, zone = name.partition("/")
    labels = {"hostname": host, **({"zone": zone} if zone else {}), **extra.pop("labels", {})}
    return node_obj(
        host,
        cpu=res.get("cpu", "0"),
        memory=res.get("memory", "0"),
        pods=res.get("pods", "110"),
        labels=labels,
        **extra,
    )


def _budget(
    allowed: int, disrupted: Sequence[str] = (), labels: Mapping[str, str] | None = None
) -> DisruptionBudgetInfo:
    requirements = tuple(Requirement(k, "In", (v,)) for k, v in (labels or {"app": "foo"}).items())
    return DisruptionBudgetInfo(
        "default", "pdb", LabelSelector(requirements), allowed, frozenset(disrupted)
    )


class _Offsets(random.Random):
    """Hands out the dry run's start offsets upstream's seeded source gives its cases."""

    def __init__(self, offsets: Sequence[int]) -> None:
        super().__init__(0)
        self._offsets = list(offsets)

    def randrange(self, *args: Any, **kwargs: Any) -> int:
        return self._offsets.pop(0) if self._offsets else 0


def _start_times(starts: Mapping[str, float]) -> PreemptionInputs:
    return PreemptionInputs(start_time=lambda p: starts.get(p.name, math.inf))


def _table(nodes: Sequence[dict[str, Any]], placed: Sequence[dict[str, Any]]) -> NodeTable:
    placed = copy.deepcopy(placed)  # a case's pods serve more than one test
    return table_of(nodes, [(p, p["spec"].pop("nodeName")) for p in placed])


def _on(node: str, pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["nodeName"] = node
    return pod


# ---- TestPostFilter: the whole cycle, then the PostFilter ------------------------------


@dataclass(frozen=True)
class PostFilterCase:
    name: str
    pod: dict[str, Any]
    placed: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    nominated: str | None
    tail: str
    """What the FailedScheduling message ends with (the PostFilter's part)."""
    budgets: list[DisruptionBudgetInfo] = field(default_factory=list)
    deviation: str = ""
    """Why we differ from upstream here, when we do."""


UNRESOLVABLE = {"taints": [("k", "v", "NoSchedule")]}
POST_FILTER = [
    PostFilterCase(
        "pod with higher priority can be made schedulable",
        _pod("p", HIGH),
        [_on("node1", _pod("p1"))],
        [_node("node1", ONE_POD)],
        "node1",
        "",
    ),
    PostFilterCase(
        "pod with tied priority is still unschedulable",
        _pod("p"),
        [_on("node1", _pod("p1"))],
        [_node("node1", ONE_POD)],
        None,
        "1 Too many pods.",
        deviation="no placed pod has a lower priority, so no dry run runs and the message "
        "leaves out kube's 'preemption: 0/1 nodes are available: 1 No preemption victims "
        "found for incoming pod.'",
    ),
    PostFilterCase(
        "preemption should respect filteredNodesStatuses",
        _pod("p", HIGH),
        [_on("node1", _pod("p1"))],
        [_node("node1", ONE_POD, **UNRESOLVABLE)],
        None,
        " preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.",
    ),
    PostFilterCase(
        "pod can be made schedulable on one node",
        _pod("p", MID),
        [_on("node1", _pod("p1", HIGH)), _on("node2", _pod("p2", LOW))],
        [_node("node1", ONE_POD), _node("node2", ONE_POD)],
        "node2",
        "",
    ),
    PostFilterCase(
        "pod can be made schedulable on minHighestPriority node",
        _pod("p", VERY_HIGH),
        [
            _on("node1", _pod("p1", HIGH, labels={"pdb": "non-violating"})),
            _on("node1", _pod("p2", LOW, labels={"pdb": "violating"})),
            _on("node2", _pod("p3", MID, labels={"pdb": "violating"})),
        ],
        [_node("node1", ONE_POD), _node("node2", ONE_POD)],
        "node2",
        "",
        budgets=[
            _budget(0, labels={"pdb": "violating"}),
            _budget(2**31 - 1, labels={"pdb": "non-violating"}),
        ],
    ),
    PostFilterCase(
        "no candidate nodes found, no enough resource after removing low priority pods",
        _pod("p", HIGH, LARGE),
        [_on("node1", _pod("p1")), _on("node2", _pod("p2"))],
        [_node("node1", NODE_RES), _node("node2", NODE_RES)],
        None,
        " preemption: 0/2 nodes are available: 2 Insufficient cpu.",
    ),
    PostFilterCase(
        "no candidate nodes found with mixed reasons, no lower priority pod and no enough "
        "CPU resource",
        _pod("p", HIGH, LARGE),
        [
            _on("node1", _pod("p1", HIGH)),
            _on("node2", _pod("p2")),
            _on("node3", _pod("p3", HIGH)),
        ],
        [_node("node1", ONE_POD), _node("node2", NODE_RES), _node("node3", ONE_POD)],
        None,
        " preemption: 0/3 nodes are available: 1 Insufficient cpu, "
        "2 No preemption victims found for incoming pod.",
    ),
    PostFilterCase(
        "no candidate nodes found with mixed reason, 2 UnschedulableAndUnresolvable nodes "
        "and 2 nodes don't have enough CPU resource",
        _pod("p", HIGH, LARGE),
        [_on("node1", _pod("p1")), _on("node2", _pod("p2"))],
        [
            _node("node1", NODE_RES),
            _node("node2", NODE_RES),
            _node("node3", NODE_RES, **UNRESOLVABLE),
            _node("node4", NODE_RES, **UNRESOLVABLE),
        ],
        None,
        " preemption: 0/4 nodes are available: 2 Insufficient cpu, "
        "2 Preemption is not helpful for scheduling.",
    ),
]


@pytest.mark.parametrize("case", POST_FILTER, ids=[c.name for c in POST_FILTER])
def test_post_filter(case: PostFilterCase) -> None:
    table = _table(case.nodes, case.placed)
    inputs = PreemptionInputs(budgets=case.budgets)
    result = SchedulingCycle(CycleSettings(), seed=1).schedule(
        parse_pod(case.pod), table, NOW, preemption=inputs
    )
    assert result.node is None
    assert result.message.endswith(case.tail), result.message
    outcome = result.preemption
    assert outcome is not None
    assert outcome.node == case.nominated
    if case.nominated is None:
        assert outcome.clear_nomination  # kube's NominatedNodeName("") result
    else:
        assert outcome.victims and "preemption:" not in result.message


# ---- TestDryRunPreemption: candidates and their victims --------------------------------


@dataclass(frozen=True)
class DryRunCase:
    name: str
    nodes: list[str]
    pods: list[dict[str, Any]]
    """The preemptors, one per scheduling cycle."""
    placed: list[dict[str, Any]]
    expected: list[dict[str, tuple[list[str], int]]]
    """Per cycle: node → (victim names, PDB violations)."""
    args: PreemptionArgs = field(default_factory=PreemptionArgs)
    budgets: list[DisruptionBudgetInfo] = field(default_factory=list)
    starts: dict[str, float] = field(default_factory=dict)
    offsets: list[int] = field(default_factory=list)
    """The offsets upstream's source seeded with 4 gives (``getOffsetRand``)."""


def _two(p1: dict[str, Any], p2: dict[str, Any]) -> list[dict[str, Any]]:
    return [_on("node1", p1), _on("node2", p2)]


FOO = {"app": "foo"}
SPREAD = [
    {
        "maxSkew": 1,
        "topologyKey": key,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchExpressions": [{"key": "foo", "operator": "Exists"}]},
    }
    for key in ("zone", "hostname")
]
ANTI_FOO = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchExpressions": [{"key": "foo", "operator": "Exists"}]},
                "topologyKey": "hostname",
            }
        ]
    }
}
FIVE = ["node1", "node2", "node3", "node4", "node5"]
DRY_RUN = [
    DryRunCase(
        "a pod that does not fit on any node",
        ["node1", "node2"],
        [_pod("p", HIGH, {"cpu": "1"})],
        _two(_pod("p1", MID), _pod("p2", MID)),
        [{}],
    ),
    DryRunCase(
        "a pod that fits on both nodes when lower priority pods are preempted",
        ["node1", "node2"],
        [_pod("p", HIGH, LARGE)],
        _two(_pod("p1", MID, LARGE), _pod("p2", MID, LARGE)),
        [{"node1": (["p1"], 0), "node2": (["p2"], 0)}],
    ),
    DryRunCase(
        "a pod that would fit on the nodes, but other pods running are higher priority, "
        "no preemption would happen",
        ["node1", "node2"],
        [_pod("p", LOW, LARGE)],
        _two(_pod("p1", MID, LARGE), _pod("p2", MID, LARGE)),
        [{}],
    ),
    DryRunCase(
        "medium priority pod is preempted, but lower priority one stays as it is small",
        ["node1", "node2"],
        [_pod("p", HIGH, LARGE)],
        [
            _on("node1", _pod("p1.1", LOW, SMALL)),
            _on("node1", _pod("p1.2", MID, LARGE)),
            _on("node2", _pod("p2", MID, LARGE)),
        ],
        [{"node1": (["p1.2"], 0), "node2": (["p2"], 0)}],
    ),
    DryRunCase(
        "mixed priority pods are preempted",
        ["node1", "node2"],
        [_pod("p", HIGH, LARGE)],
        [
            _on("node1", _pod("p1.1", MID, SMALL)),
            _on("node1", _pod("p1.2", LOW, SMALL)),
            _on("node1", _pod("p1.3", MID, MEDIUM)),
            _on("node1", _pod("p1.4", HIGH, SMALL)),
            _on("node2", _pod("p2", HIGH, LARGE)),
        ],
        [{"node1": (["p1.2", "p1.3"], 0)}],
    ),
    DryRunCase(
        "mixed priority pods are preempted, pick later StartTime one when priorities are equal",
        ["node1", "node2"],
        [_pod("p", HIGH, LARGE)],
        [
            _on("node1", _pod("p1.1", LOW, SMALL)),
            _on("node1", _pod("p1.2", LOW, SMALL)),
            _on("node1", _pod("p1.3", MID, MEDIUM)),
            _on("node1", _pod("p1.4", HIGH, SMALL)),
            _on("node2", _pod("p2", HIGH, LARGE)),
        ],
        [{"node1": (["p1.1", "p1.3"], 0)}],
        starts={"p1.1": 5, "p1.2": 4, "p1.3": 3, "p1.4": 2, "p2": 1},
    ),
    DryRunCase(
        "pod with anti-affinity is preempted",
        ["node1", "node2"],
        [_pod("p", HIGH, SMALL, labels={"foo": ""})],
        [
            _on("node1", _pod("p1.1", LOW, SMALL, labels={"foo": ""}, affinity=ANTI_FOO)),
            _on("node1", _pod("p1.2", MID, SMALL)),
            _on("node1", _pod("p1.3", HIGH, SMALL)),
            _on("node2", _pod("p2", HIGH, SMALL)),
        ],
        [{"node1": (["p1.1"], 0)}],
    ),
    DryRunCase(
        "preemption to resolve pod topology spread filter failure",
        ["node-a/zone1", "node-b/zone1", "node-x/zone2"],
        [_pod("p", HIGH, labels={"foo": ""}, topologySpreadConstraints=SPREAD)],
        [
            _on("node-a", _pod("pod-a1", MID, labels={"foo": ""})),
            _on("node-a", _pod("pod-a2", LOW, labels={"foo": ""})),
            _on("node-b", _pod("pod-b1", LOW, labels={"foo": ""})),
            _on("node-x", _pod("pod-x1", HIGH, labels={"foo": ""})),
            _on("node-x", _pod("pod-x2", HIGH, labels={"foo": ""})),
        ],
        [{"node-a": (["pod-a2"], 0), "node-b": (["pod-b1"], 0)}],
    ),
    DryRunCase(
        "preemption with violation of same pdb",
        ["node1"],
        [_pod("p", HIGH, VERY_LARGE)],
        [
            _on("node1", _pod("p1.1", MID, MEDIUM, labels=FOO)),
            _on("node1", _pod("p1.2", MID, MEDIUM, labels=FOO)),
        ],
        [{"node1": (["p1.1", "p1.2"], 1)}],
        budgets=[_budget(1)],
    ),
    DryRunCase(
        "preemption with violation of the pdb with pod whose eviction was processed, the "
        "victim doesn't belong to DisruptedPods",
        ["node1"],
        [_pod("p", HIGH, VERY_LARGE)],
        [
            _on("node1", _pod("p1.1", MID, MEDIUM, labels=FOO)),
            _on("node1", _pod("p1.2", MID, MEDIUM, labels=FOO)),
        ],
        [{"node1": (["p1.1", "p1.2"], 1)}],
        budgets=[_budget(1, ["p2"])],
    ),
    DryRunCase(
        "preemption with violation of the pdb with pod whose eviction was processed, the "
        "victim belongs to DisruptedPods",
        ["node1"],
        [_pod("p", HIGH, VERY_LARGE)],
        [
            _on("node1", _pod("p1.1", MID, MEDIUM, labels=FOO)),
            _on("node1", _pod("p1.2", MID, MEDIUM, labels=FOO)),
        ],
        [{"node1": (["p1.1", "p1.2"], 0)}],
        budgets=[_budget(1, ["p1.2"])],
    ),
    DryRunCase(
        "preemption with violation of the pdb with pod whose eviction was processed, the "
        "victim which belongs to DisruptedPods is treated as 'nonViolating'",
        ["node1"],
        [_pod("p", HIGH, VERY_LARGE)],
        [
            _on("node1", _pod("p1.1", MID, MEDIUM, labels=FOO)),
            _on("node1", _pod("p1.2", MID, MEDIUM, labels=FOO)),
            _on("node1", _pod("p1.3", MID, MEDIUM, labels=FOO)),
        ],
        [{"node1": (["p1.1", "p1.2", "p1.3"], 1)}],
        budgets=[_budget(1, ["p1.3"])],
    ),
    DryRunCase(
        "all nodes are possible candidates, but DefaultPreemptionArgs limits to 2",
        FIVE,
        [_pod("p", HIGH, LARGE)],
        [_on(f"node{i}", _pod(f"p{i}", MID, LARGE)) for i in range(1, 6)],
        [{"node1": (["p1"], 0), "node5": (["p5"], 0)}],
        args=PreemptionArgs(min_candidate_nodes_percentage=40, min_candidate_nodes_absolute=1),
        offsets=[4],
    ),
    DryRunCase(
        "some nodes are not possible candidates, DefaultPreemptionArgs limits to 2",
        FIVE,
        [_pod("p", HIGH, LARGE)],
        [
            _on(f"node{i}", _pod(f"p{i}", VERY_HIGH if i in (2, 5) else MID, LARGE))
            for i in range(1, 6)
        ],
        [{"node1": (["p1"], 0), "node3": (["p3"], 0)}],
        args=PreemptionArgs(min_candidate_nodes_percentage=40, min_candidate_nodes_absolute=1),
        offsets=[4],
    ),
    DryRunCase(
        "preemption offset across multiple scheduling cycles and wrap around",
        FIVE,
        [_pod("tp1", HIGH, LARGE), _pod("tp2", HIGH, LARGE), _pod("tp3", HIGH, LARGE)],
        [_on(f"node{i}", _pod(f"p{i}", MID, LARGE)) for i in range(1, 6)],
        [
            {"node1": (["p1"], 0), "node5": (["p5"], 0)},
            {"node2": (["p2"], 0), "node3": (["p3"], 0)},
            {"node4": (["p4"], 0), "node5": (["p5"], 0)},
        ],
        args=PreemptionArgs(min_candidate_nodes_percentage=40, min_candidate_nodes_absolute=1),
        offsets=[4, 1, 3],
    ),
    DryRunCase(
        "preemption looks past numCandidates until a non-PDB violating node is found",
        FIVE,
        [_pod("p", HIGH, LARGE)],
        [
            _on(f"node{i}", _pod(f"p{i}", MID, LARGE, labels=FOO if i in (1, 2, 5) else None))
            for i in range(1, 6)
        ],
        [{"node1": (["p1"], 1), "node3": (["p3"], 0), "node5": (["p5"], 1)}],
        args=PreemptionArgs(min_candidate_nodes_percentage=40, min_candidate_nodes_absolute=2),
        budgets=[_budget(0)],
        offsets=[4],
    ),
]


def _dry_run(
    cycle: SchedulingCycle,
    table: NodeTable,
    pod: PodInfo,
    inputs: PreemptionInputs,
    args: PreemptionArgs,
    arithmetic: bool = True,
) -> PreemptionOutcome:
    """Upstream's test calls ``DryRunPreemption`` on every node, whether or not the pod
    fits there; so does this, with the cycle's real filters (putting pods back by
    NodeResourcesFit's arithmetic where the cycle would, with ``arithmetic``; else by
    moving them on the table and running every filter again)."""
    every = table.everyone().copy()
    fits, batch, light = cycle.fits_for(pod, table, NOW)
    light = light and arithmetic
    return preempt(
        pod, table, every, fits, inputs, args, cycle._random, len(table), batch=batch, light=light
    )


@pytest.mark.parametrize("arithmetic", [True, False], ids=["arithmetic", "filters"])
@pytest.mark.parametrize("case", DRY_RUN, ids=[c.name for c in DRY_RUN])
def test_dry_run_preemption(case: DryRunCase, arithmetic: bool) -> None:
    table = _table([_node(n) for n in case.nodes], case.placed)
    before = {name: dict(table.pods_on_node(name)) for name in table.names}
    free_before = table.free.copy()
    cycle = SchedulingCycle(CycleSettings(preemption=case.args))
    cycle._random = _Offsets(case.offsets)
    inputs = PreemptionInputs(
        budgets=case.budgets, start_time=lambda p: case.starts.get(p.name, math.inf)
    )
    for pod, expected in zip(case.pods, case.expected, strict=True):
        outcome = _dry_run(cycle, table, parse_pod(pod), inputs, case.args, arithmetic)
        got = {c.node: (sorted(p.name for p in c.pods), c.pdb_violations) for c in outcome.found}
        assert got == expected
    # the table is put back exactly as it was
    assert {name: dict(table.pods_on_node(name)) for name in table.names} == before
    assert (table.free == free_before).all()


# ---- TestSelectBestCandidate -------------------------------------------------------------


SELECT_BEST = [
    (
        "a pod that fits on both nodes when lower priority pods are preempted",
        ["node1", "node2"],
        _pod("p", HIGH, LARGE),
        [("node1", "p1", MID, LARGE), ("node2", "p2", MID, LARGE)],
        {"node1", "node2"},
        {},
    ),
    (
        "node with min highest priority pod is picked",
        ["node1", "node2", "node3"],
        _pod("p", HIGH, VERY_LARGE),
        [
            ("node1", "p1.1", MID, MEDIUM),
            ("node1", "p1.2", MID, LARGE),
            ("node2", "p2.1", MID, MEDIUM),
            ("node2", "p2.2", LOW, MEDIUM),
            ("node3", "p3.1", LOW, MEDIUM),
            ("node3", "p3.2", LOW, MEDIUM),
        ],
        {"node3"},
        {},
    ),
    (
        "when highest priorities are the same, minimum sum of priorities is picked",
        ["node1", "node2", "node3"],
        _pod("p", HIGH, VERY_LARGE),
        [
            ("node1", "p1.1", MID, MEDIUM),
            ("node1", "p1.2", MID, LARGE),
            ("node2", "p2.1", MID, LARGE),
            ("node2", "p2.2", LOW, MEDIUM),
            ("node3", "p3.1", MID, MEDIUM),
            ("node3", "p3.2", MID, MEDIUM),
        ],
        {"node2"},
        {},
    ),
    (
        "when highest priority and sum are the same, minimum number of pods is picked",
        ["node1", "node2", "node3"],
        _pod("p", HIGH, VERY_LARGE),
        [
            ("node1", "p1.1", MID, SMALL),
            ("node1", "p1.2", NEG, SMALL),
            ("node1", "p1.3", MID, SMALL),
            ("node1", "p1.4", NEG, SMALL),
            ("node2", "p2.1", MID, LARGE),
            ("node2", "p2.2", NEG, MEDIUM),
            ("node3", "p3.1", MID, MEDIUM),
            ("node3", "p3.2", NEG, SMALL),
            ("node3", "p3.3", LOW, SMALL),
        ],
        {"node2"},
        {},
    ),
    (
        "sum of adjusted priorities is considered",
        ["node1", "node2", "node3"],
        _pod("p", HIGH, VERY_LARGE),
        [
            ("node1", "p1.1", MID, SMALL),
            ("node1", "p1.2", NEG, SMALL),
            ("node1", "p1.3", NEG, SMALL),
            ("node2", "p2.1", MID, LARGE),
            ("node2", "p2.2", NEG, MEDIUM),
            ("node3", "p3.1", MID, MEDIUM),
            ("node3", "p3.2", NEG, SMALL),
            ("node3", "p3.3", LOW, SMALL),
        ],
        {"node2"},
        {},
    ),
    (
        "non-overlapping lowest high priority, sum priorities, and number of pods",
        ["node1", "node2", "node3", "node4"],
        _pod("p", VERY_HIGH, VERY_LARGE),
        [
            ("node1", "p1.1", MID, SMALL),
            ("node1", "p1.2", LOW, SMALL),
            ("node1", "p1.3", LOW, SMALL),
            ("node2", "p2.1", HIGH, LARGE),
            ("node3", "p3.1", MID, MEDIUM),
            ("node3", "p3.2", LOW, SMALL),
            ("node3", "p3.3", LOW, SMALL),
            ("node3", "p3.4", LOW, MEDIUM),
            ("node4", "p4.1", MID, MEDIUM),
            ("node4", "p4.2", MID, SMALL),
            ("node4", "p4.3", MID, SMALL),
            ("node4", "p4.4", NEG, SMALL),
        ],
        {"node1"},
        {},
    ),
    (
        "same priority, same number of victims, different start time for each node's pod",
        ["node1", "node2", "node3"],
        _pod("p", HIGH, VERY_LARGE),
        [
            ("node1", "p1.1", MID, MEDIUM),
            ("node1", "p1.2", MID, MEDIUM),
            ("node2", "p2.1", MID, MEDIUM),
            ("node2", "p2.2", MID, MEDIUM),
            ("node3", "p3.1", MID, MEDIUM),
            ("node3", "p3.2", MID, MEDIUM),
        ],
        {"node2"},
        {"p1.1": 2, "p1.2": 2, "p2.1": 3, "p2.2": 3, "p3.1": 1, "p3.2": 1},
    ),
    (
        "same priority, same number of victims, different start time for all pods",
        ["node1", "node2", "node3"],
        _pod("p", HIGH, VERY_LARGE),
        [
            ("node1", "p1.1", MID, MEDIUM),
            ("node1", "p1.2", MID, MEDIUM),
            ("node2", "p2.1", MID, MEDIUM),
            ("node2", "p2.2", MID, MEDIUM),
            ("node3", "p3.1", MID, MEDIUM),
            ("node3", "p3.2", MID, MEDIUM),
        ],
        {"node3"},
        {"p1.1": 4, "p1.2": 2, "p2.1": 5, "p2.2": 1, "p3.1": 3, "p3.2": 6},
    ),
    (
        "different priority, same number of victims, different start time for all pods",
        ["node1", "node2", "node3"],
        _pod("p", HIGH, VERY_LARGE),
        [
            ("node1", "p1.1", LOW, MEDIUM),
            ("node1", "p1.2", MID, MEDIUM),
            ("node2", "p2.1", MID, MEDIUM),
            ("node2", "p2.2", LOW, MEDIUM),
            ("node3", "p3.1", LOW, MEDIUM),
            ("node3", "p3.2", MID, MEDIUM),
        ],
        {"node2"},
        {"p1.1": 4, "p1.2": 2, "p2.1": 6, "p2.2": 1, "p3.1": 3, "p3.2": 5},
    ),
]


@pytest.mark.parametrize(
    ("nodes", "pod", "placed", "expected", "starts"),
    [case[1:] for case in SELECT_BEST],
    ids=[case[0] for case in SELECT_BEST],
)
def test_select_best_candidate(
    nodes: list[str],
    pod: dict[str, Any],
    placed: list[tuple[str, str, int, dict[str, str]]],
    expected: set[str],
    starts: dict[str, float],
) -> None:
    table = _table(
        [_node(n) for n in nodes], [_on(n, _pod(name, prio, req)) for n, name, prio, req in placed]
    )
    cycle = SchedulingCycle(CycleSettings(), seed=4)
    outcome = _dry_run(cycle, table, parse_pod(pod), _start_times(starts), PreemptionArgs())
    assert outcome.node in expected


# ---- TestPodEligibleToPreemptOthers -----------------------------------------------------


@pytest.mark.parametrize(
    ("nominated_unresolvable", "policy", "nominated", "victim_preempted", "expected"),
    [
        (True, None, "node1", False, None),
        (False, None, None, False, None),
        (False, "Never", None, False, NEVER),
        (False, None, "node1", True, TERMINATING),
        (False, None, "node1", False, None),
    ],
    ids=[
        "Pod with nominated node",
        "Pod without nominated node",
        "Pod with 'PreemptNever' preemption policy",
        "preemption victim pod terminating, as indicated by the dedicated DisruptionTarget "
        "condition",
        "non-victim Pods terminating",
    ],
)
def test_pod_eligible_to_preempt_others(
    nominated_unresolvable: bool,
    policy: str | None,
    nominated: str | None,
    victim_preempted: bool,
    expected: str | None,
) -> None:
    spec: dict[str, Any] = {"preemptionPolicy": policy} if policy else {}
    pod = parse_pod(_pod("p_with_nominated_node", HIGH, **spec))
    victim = _on("node1", _pod("p1", LOW))
    victim["metadata"]["deletionTimestamp"] = "2024-05-01T12:00:00Z"
    table = _table([_node("node1")], [victim])
    holds = RoomHolds()
    if nominated:
        holds.hold(pod, nominated)
    inputs = PreemptionInputs(holds=holds, preempted=lambda p: victim_preempted)
    assert eligible(pod, table, inputs, lambda row: nominated_unresolvable) == expected


# ---- TestPreempt: the whole cycle picks the node and the victims ------------------------


PREEMPT = [
    (
        "basic preemption logic",
        ["node1", "node2", "node3"],
        _pod("p", HIGH, VERY_LARGE, preemptionPolicy="PreemptLowerPriority"),
        [
            ("node1", _pod("p1.1", LOW, SMALL)),
            ("node1", _pod("p1.2", LOW, SMALL)),
            ("node2", _pod("p2.1", HIGH, LARGE)),
            ("node3", _pod("p3.1", MID, MEDIUM)),
        ],
        "node1",
        ["p1.1", "p1.2"],
    ),
    (
        "preemption for topology spread constraints",
        ["node-a/zone1", "node-b/zone1", "node-x/zone2"],
        _pod("p", HIGH, labels={"foo": ""}, topologySpreadConstraints=SPREAD),
        [
            ("node-a", _pod("p-a1", HIGH, labels={"foo": ""})),
            ("node-a", _pod("p-a2", HIGH, labels={"foo": ""})),
            ("node-b", _pod("p-b1", LOW, labels={"foo": ""})),
            ("node-x", _pod("p-x1", HIGH, labels={"foo": ""})),
            ("node-x", _pod("p-x2", HIGH, labels={"foo": ""})),
        ],
        "node-b",
        ["p-b1"],
    ),
]


@pytest.mark.parametrize(
    ("nodes", "pod", "placed", "node", "victims"),
    [case[1:] for case in PREEMPT],
    ids=[case[0] for case in PREEMPT],
)
def test_preempt(
    nodes: list[str],
    pod: dict[str, Any],
    placed: list[tuple[str, dict[str, Any]]],
    node: str,
    victims: list[str],
) -> None:
    table = _table([_node(n) for n in nodes], [_on(n, p) for n, p in placed])
    result: CycleResult = SchedulingCycle(CycleSettings(), seed=1).schedule(
        parse_pod(pod), table, NOW, preemption=PreemptionInputs()
    )
    assert result.node is None and result.preemption is not None
    assert result.preemption.node == node
    assert sorted(p.name for p in result.preemption.victims) == victims


# ---- ours: the candidate count -------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "percentage", "absolute", "expected"),
    [(10, 10, 100, 10), (500, 10, 100, 100), (5000, 10, 100, 500), (5, 40, 1, 2), (5, 40, 2, 2)],
)
def test_candidate_count_is_kubes(
    nodes: int, percentage: int, absolute: int, expected: int
) -> None:
    args = PreemptionArgs(
        min_candidate_nodes_percentage=percentage, min_candidate_nodes_absolute=absolute
    )
    assert candidate_count(nodes, args) == expected


# ---- ours: putting pods back by arithmetic agrees with running the filters --------------


def _random_cluster(seed: int) -> tuple[NodeTable, list[DisruptionBudgetInfo], dict[str, float]]:
    """Nodes of mixed size and pod limits, full of pods of mixed priority and size, some
    under budgets."""
    rng = random.Random(seed)
    nodes = [
        _node(f"node{i}", {"cpu": str(rng.choice([1, 2, 4])), "memory": "4Gi",
                           "pods": str(rng.randint(2, 6))})
        for i in range(30)
    ]  # fmt: skip
    placed = []
    for i in range(30):
        for j in range(rng.randint(1, 5)):
            req = {
                "cpu": f"{rng.choice([100, 300, 500, 900])}m",
                "memory": f"{rng.randint(1, 9)}00Mi",
            }
            labels = {"app": "foo"} if rng.random() < 0.3 else None
            placed.append(_on(f"node{i}", _pod(f"p{i}-{j}", rng.choice([NEG, LOW, MID, VERY_HIGH]),
                                               req, labels=labels)))  # fmt: skip
    starts = {p["metadata"]["name"]: rng.uniform(0, 100) for p in placed}
    return _table(nodes, placed), [_budget(rng.randint(0, 3))], starts


@pytest.mark.parametrize("seed", range(8))
def test_arithmetic_put_back_agrees_with_the_filters(seed: int) -> None:
    """The same candidates and victims (budget violations included) either way, on a table
    left as it was."""
    table, budgets, starts = _random_cluster(seed)
    before = table.free.copy()
    inputs = PreemptionInputs(budgets=budgets, start_time=lambda p: starts[p.name])
    pod = parse_pod(_pod("p", HIGH, {"cpu": "1500m", "memory": "1Gi"}))
    found = {}
    for arithmetic in (True, False):
        cycle = SchedulingCycle(CycleSettings())
        cycle._random = _Offsets([seed])
        outcome = _dry_run(cycle, table, pod, inputs, PreemptionArgs(), arithmetic)
        found[arithmetic] = [
            (c.node, [p.name for p in c.pods], c.pdb_violations) for c in outcome.found
        ]
        assert (table.free == before).all()
    assert found[True] == found[False]
    assert found[True], "the random cluster has candidates"
    kept = sum(len(table.pods_on_node(node)) - len(victims) for node, victims, _ in found[True])
    assert kept > 0, "some lower-priority pods are put back"
