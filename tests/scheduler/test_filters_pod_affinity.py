"""Required pod affinity (InterPodAffinity's affinity half): any topology key, namespaces,
the first pod of a self-affine group, missing topology labels; the engine's message."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.engine import Engine
from scheduler.filters.pod_affinity import POD_AFFINITY, pod_affinity
from scheduler.model import parse_pod
from scheduler.settings import EngineSettings
from tests.scheduler.test_model import node_obj, pod_obj, table_of

NODES = [
    node_obj("a1", labels={"zone": "za"}),
    node_obj("a2", labels={"zone": "za"}),
    node_obj("b1", labels={"zone": "zb"}),
    node_obj("bare"),
]


def _affinity(key: str = "zone", app: str | None = "db", **extra: Any) -> dict[str, Any]:
    term: dict[str, Any] = {"topologyKey": key, **extra}
    if app is not None:
        term["labelSelector"] = {"matchLabels": {"app": app}}
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def _db(node: str, namespace: str = "default") -> tuple[dict[str, Any], str]:
    return pod_obj(f"db-{node}-{namespace}", namespace, labels={"app": "db"}, nodeName=node), node


def _passing(placed: list[tuple[dict[str, Any], str]], pod: dict[str, Any]) -> list[str]:
    table = table_of(NODES, placed)
    result = pod_affinity(table, parse_pod(pod))
    return [table.names[i] for i in result.passed.nonzero()[0]]


@pytest.mark.parametrize(
    ("placed", "pod", "passing"),
    [
        ([_db("a1")], pod_obj("web", affinity=_affinity()), ["a1", "a2"]),
        ([_db("a1")], pod_obj("web", affinity=_affinity("kubernetes.io/hostname")), ["a1"]),
        ([_db("b1")], pod_obj("web", affinity=_affinity()), ["b1"]),
        ([], pod_obj("web", affinity=_affinity()), []),
        ([], pod_obj("db", labels={"app": "db"}, affinity=_affinity()), ["a1", "a2", "b1"]),
        ([_db("a1", "other")], pod_obj("web", affinity=_affinity()), []),
        (
            [_db("a1", "other")],
            pod_obj("web", affinity=_affinity(namespaces=["other"])),
            ["a1", "a2"],
        ),
        (
            [_db("a1", "other")],
            pod_obj("web", affinity=_affinity(namespaceSelector={})),
            ["a1", "a2"],
        ),
        ([_db("a1")], pod_obj("web", affinity=_affinity(app=None)), []),
        (
            [_db("a1"), _db("bare")],  # a matching pod on a node without the key counts nowhere
            pod_obj("web", affinity=_affinity()),
            ["a1", "a2"],
        ),
    ],
    ids=[
        "same-zone-as-a-matching-pod",
        "hostname-key-the-matching-pods-node",
        "other-zone",
        "no-matching-pod-anywhere",
        "first-pod-of-a-self-affine-group-passes-where-keys-exist",
        "term-defaults-to-the-pods-namespace",
        "term-namespaces",
        "empty-namespace-selector-means-all-namespaces",
        "nil-label-selector-matches-no-pod",
        "pods-on-nodes-without-the-key-not-counted",
    ],
)
def test_inter_pod_affinity_required_terms(
    placed: list[tuple[dict[str, Any], str]], pod: dict[str, Any], passing: list[str]
) -> None:
    assert _passing(placed, pod) == passing


def test_affinity_failure_reason_in_the_engine_message() -> None:
    table = table_of(NODES, [_db("b1")])
    engine = Engine(EngineSettings())
    assert engine.schedule(parse_pod(pod_obj("web", affinity=_affinity())), table, 0.0).node == "b1"
    cordon = pod_obj("web2", affinity=_affinity(app="cache"))
    result = engine.schedule(parse_pod(cordon), table, 0.0)
    assert result.node is None
    assert result.message == f"0/4 nodes are available: 4 {POD_AFFINITY}."


def test_preferred_pod_affinity_and_match_label_keys_stay_refused() -> None:
    preferred = {
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "podAffinityTerm": {"topologyKey": "zone"}}
            ]
        }
    }
    assert parse_pod(pod_obj("p", affinity=preferred)).unsupported == (
        "spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution",
    )
    keyed = parse_pod(pod_obj("k", affinity=_affinity(matchLabelKeys=["rev"])))
    assert keyed.unsupported == (
        "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
        ".matchLabelKeys",
    )
