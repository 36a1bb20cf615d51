"""PodTopologySpread filter (DoNotSchedule): kube-scheduler's skew rules, minDomains,
node inclusion policies, matchLabelKeys, namespaces, terminating pods; the cycle's
message; ScheduleAnyway is no filter."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.settings import CycleSettings
from scheduler.plugins.node_affinity import node_affinity
from scheduler.plugins.pod_topology_spread import MISSING_LABEL, SKEW, topology_spread
from scheduler.plugins.taint_toleration import taint_toleration
from tests.builders import affinity_terms, node_obj, pod_obj, table_of
from tests.scheduler.filters import or_all_pass

ZONES = {"a": "za", "b": "zb", "c": "zc"}


def _spread(**extra: Any) -> list[dict[str, Any]]:
    constraint: dict[str, Any] = {
        "maxSkew": 1,
        "topologyKey": "zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}},
    }
    constraint.update(extra)
    return [constraint]


def _placed(node: str, name: str, **kwargs: Any) -> tuple[dict[str, Any], str]:
    labels = kwargs.pop("labels", {"app": "web"})
    obj = pod_obj(name, labels=labels, nodeName=node, **kwargs)
    return obj, node


def _passing(
    placed: list[tuple[dict[str, Any], str]],
    pod: dict[str, Any],
    nodes: list[dict[str, Any]] | None = None,
) -> list[str]:
    if nodes is None:
        nodes = [node_obj(name, labels={"zone": zone}) for name, zone in ZONES.items()]
        nodes.append(node_obj("unlabelled"))
    table = table_of(nodes, placed)
    info = parse_pod(pod)
    affinity = or_all_pass(node_affinity(table, info), table).passed
    taints = or_all_pass(taint_toleration(table, info), table).passed
    result = or_all_pass(topology_spread(table, info, affinity, taints), table)
    return [table.names[i] for i in result.passed.nonzero()[0]]


def _web(**spread: Any) -> dict[str, Any]:
    return pod_obj("new", labels={"app": "web"}, topologySpreadConstraints=_spread(**spread))


A2_B1 = [_placed("a", "w1"), _placed("a", "w2"), _placed("b", "w3")]
A2_B1_C1 = [*A2_B1, _placed("c", "w4")]


@pytest.mark.parametrize(
    ("placed", "pod", "passing"),
    [
        (A2_B1, _web(), ["c"]),
        (A2_B1, _web(maxSkew=2), ["b", "c"]),
        (A2_B1_C1, _web(), ["b", "c"]),
        (A2_B1_C1, _web(minDomains=4), []),
        (
            A2_B1,
            pod_obj("other", labels={"app": "db"}, topologySpreadConstraints=_spread()),
            ["b", "c"],
        ),
        (
            A2_B1,
            pod_obj("new", topologySpreadConstraints=_spread(labelSelector=None)),
            ["a", "b", "c"],
        ),
        (
            [*A2_B1, _placed("c", "x1", namespace="other"), _placed("c", "x2", namespace="other")],
            _web(),
            ["c"],
        ),
        (
            [
                *A2_B1,
                _placed("b", "t1", labels={"app": "web"}),
                _placed("c", "db", labels={"app": "db"}),
            ],
            _web(),
            ["c"],
        ),
    ],
    ids=[
        "skew-counts-own-pod-against-global-minimum",
        "max-skew-2",
        "global-minimum-above-zero",
        "fewer-domains-than-min-domains-minimum-is-zero",
        "pod-not-matching-its-own-selector-adds-nothing",
        "nil-label-selector-matches-no-pod",
        "pods-in-other-namespaces-not-counted",
        "pods-not-matching-the-selector-not-counted",
    ],
)
def test_pod_topology_spread_filter_skew(
    placed: list[tuple[dict[str, Any], str]], pod: dict[str, Any], passing: list[str]
) -> None:
    assert _passing(placed, pod) == passing


def test_terminating_pods_are_not_counted() -> None:
    leaving = pod_obj("w2", labels={"app": "web"}, nodeName="a")
    leaving["metadata"]["deletionTimestamp"] = "2024-05-01T12:01:00Z"
    assert _passing([_placed("a", "w1"), (leaving, "a"), _placed("b", "w3")], _web()) == ["c"]
    assert _passing([_placed("a", "w1"), (leaving, "a")], _web()) == ["b", "c"]


def test_match_label_keys_narrow_the_selector_to_the_pods_own_values() -> None:
    old = {"app": "web", "pod-template-hash": "v1"}
    placed = [_placed("a", f"old{i}", labels=old) for i in range(3)]
    new = pod_obj(
        "new",
        labels={"app": "web", "pod-template-hash": "v2"},
        topologySpreadConstraints=_spread(matchLabelKeys=["pod-template-hash"]),
    )
    assert _passing(placed, new) == ["a", "b", "c"]  # the old revision's pods do not count
    without_keys = pod_obj(
        "new", labels={"app": "web", "pod-template-hash": "v2"}, topologySpreadConstraints=_spread()
    )
    assert _passing(placed, without_keys) == ["b", "c"]


@pytest.mark.parametrize(
    ("policy", "passing"),
    [({}, ["b", "c"]), ({"nodeAffinityPolicy": "Ignore"}, [])],
    ids=["node-affinity-policy-honor-excludes-unselected-domains", "node-affinity-policy-ignore"],
)
def test_node_affinity_policy(policy: dict[str, str], passing: list[str]) -> None:
    # zone a is empty but the pod's affinity excludes it: with Honor (the default) it is
    # not a domain, so the minimum is 1 (b, c), not 0
    placed = [_placed("b", "w1"), _placed("c", "w2")]
    pod = pod_obj(
        "new",
        labels={"app": "web"},
        affinity=affinity_terms([("zone", "NotIn", ["za"])]),
        topologySpreadConstraints=_spread(**policy),
    )
    # node a still passes the spread filter itself (count 0); NodeAffinity rejects it
    assert _passing(placed, pod) == ["a", *passing]


@pytest.mark.parametrize(
    ("policy", "passing"),
    [({}, []), ({"nodeTaintsPolicy": "Honor"}, ["b", "c"])],
    ids=["node-taints-policy-ignore-counts-tainted-domain", "node-taints-policy-honor"],
)
def test_node_taints_policy(policy: dict[str, str], passing: list[str]) -> None:
    nodes = [
        node_obj("a", labels={"zone": "za"}, taints=[("dedicated", "x", "NoSchedule")]),
        node_obj("b", labels={"zone": "zb"}),
        node_obj("c", labels={"zone": "zc"}),
    ]
    placed = [_placed("b", "w1"), _placed("c", "w2")]
    # a (empty, tainted) counts as a domain with 0 pods only when taints are ignored
    got = _passing(placed, _web(**policy), nodes)
    assert [n for n in got if n != "a"] == passing


def test_missing_topology_label_and_skew_reasons_in_the_cycle_message() -> None:
    nodes = [node_obj(name, labels={"zone": zone}) for name, zone in ZONES.items()]
    nodes.append(node_obj("unlabelled"))
    placed = [_placed("a", "w1"), _placed("b", "w2"), _placed("c", "w3"), _placed("a", "w4")]
    table = table_of(nodes, placed)
    cycle = SchedulingCycle(CycleSettings())
    pod = parse_pod(_web())
    result = cycle.schedule(pod, table, 0.0)
    assert result.node in ("b", "c")
    crowded = parse_pod(_web(maxSkew=1, minDomains=5))  # min is 0: every zone has a pod
    result = cycle.schedule(crowded, table, 0.0)
    assert result.node is None
    assert result.message == (f"0/4 nodes are available: 1 {MISSING_LABEL}, 3 {SKEW}.")


def test_schedule_anyway_is_a_score_not_a_filter() -> None:
    obj = pod_obj(
        "new",
        labels={"app": "web"},
        topologySpreadConstraints=_spread(whenUnsatisfiable="ScheduleAnyway"),
    )
    pod = parse_pod(obj)
    assert pod.unsupported == () and pod.spread == () and len(pod.soft_spread) == 1
    placed = [_placed("a", "w1"), _placed("a", "w2")]
    assert _passing(placed, obj) == ["a", "b", "c", "unlabelled"]
