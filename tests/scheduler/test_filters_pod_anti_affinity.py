"""Required pod anti-affinity on kubernetes.io/hostname, both directions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.filters.pod_anti_affinity import (
    EXISTING_ANTI_AFFINITY,
    POD_ANTI_AFFINITY,
    pod_anti_affinity,
)
from scheduler.model import parse_pod
from tests.scheduler.test_model import node_obj, pod_obj, table_of


def _anti(selector: dict[str, Any] | None, **term: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"topologyKey": "kubernetes.io/hostname", **term}
    if selector is not None:
        body["labelSelector"] = selector
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [body]}}


DB = {"matchLabels": {"app": "db"}}


@pytest.mark.parametrize(
    ("placed", "incoming", "reasons"),
    [
        (
            pod_obj("db-0", labels={"app": "db"}),
            pod_obj("db-1", labels={"app": "db"}, affinity=_anti(DB)),
            [POD_ANTI_AFFINITY],
        ),
        (
            pod_obj("web", labels={"app": "web"}),
            pod_obj("db-1", labels={"app": "db"}, affinity=_anti(DB)),
            [],
        ),
        (
            pod_obj("db-0", "other", labels={"app": "db"}),
            pod_obj("db-1", labels={"app": "db"}, affinity=_anti(DB)),
            [],
        ),
        (
            pod_obj("db-0", "other", labels={"app": "db"}),
            pod_obj("db-1", labels={"app": "db"}, affinity=_anti(DB, namespaces=["other"])),
            [POD_ANTI_AFFINITY],
        ),
        (
            pod_obj("db-0", "other", labels={"app": "db"}),
            pod_obj("db-1", labels={"app": "db"}, affinity=_anti(DB, namespaceSelector={})),
            [POD_ANTI_AFFINITY],
        ),
        (
            pod_obj("db-0", labels={"app": "db"}, affinity=_anti(DB)),
            pod_obj("db-1", labels={"app": "db"}),
            [EXISTING_ANTI_AFFINITY],
        ),
        (
            pod_obj("db-0", labels={"app": "db"}, affinity=_anti(DB)),
            pod_obj("web", labels={"app": "web"}),
            [],
        ),
        (
            pod_obj("db-0", labels={"app": "db"}, affinity=_anti(DB)),
            pod_obj("db-1", labels={"app": "db"}, affinity=_anti(DB)),
            [EXISTING_ANTI_AFFINITY],
        ),
        (
            pod_obj("db-0", "other", labels={"app": "db"}, affinity=_anti(DB)),
            pod_obj("db-1", labels={"app": "db"}),
            [],
        ),
        (
            pod_obj(
                "db-0", "other", labels={"app": "db"}, affinity=_anti(DB, namespaceSelector={})
            ),
            pod_obj("db-1", labels={"app": "db"}),
            [EXISTING_ANTI_AFFINITY],
        ),
        (
            pod_obj(
                "db-0", "other", labels={"app": "db"}, affinity=_anti(DB, namespaces=["default"])
            ),
            pod_obj("db-1", labels={"app": "db"}),
            [EXISTING_ANTI_AFFINITY],
        ),
        (
            pod_obj("x", labels={"tier": "a"}),
            pod_obj(
                "y", affinity=_anti({"matchExpressions": [{"key": "tier", "operator": "Exists"}]})
            ),
            [POD_ANTI_AFFINITY],
        ),
        (
            pod_obj("x", labels={"tier": "a"}),
            pod_obj(
                "y",
                affinity=_anti(
                    {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}
                ),
            ),
            [],
        ),
        (pod_obj("x", labels={"tier": "a"}), pod_obj("y", affinity=_anti({})), [POD_ANTI_AFFINITY]),
        (pod_obj("x", labels={"tier": "a"}), pod_obj("y", affinity=_anti(None)), []),
    ],
    ids=[
        "own-term-matches",
        "own-term-other-labels",
        "own-term-other-namespace",
        "own-term-listed-namespace",
        "own-term-all-namespaces",
        "existing-term-matches-incoming",
        "existing-term-not-matching",
        "both-fail-reports-existing-first",
        "existing-term-own-namespace-only",
        "existing-term-all-namespaces",
        "existing-term-listed-namespace",
        "exists-expression",
        "notin-expression",
        "empty-selector-matches-all",
        "null-selector-matches-none",
    ],
)
def test_pod_anti_affinity(
    placed: dict[str, Any], incoming: dict[str, Any], reasons: list[str]
) -> None:
    table = table_of([node_obj("taken"), node_obj("empty")], [(placed, "taken")])
    result = pod_anti_affinity(table, parse_pod(incoming))
    assert result.passed.tolist() == [not reasons, True]
    assert result.reasons_for(0) == reasons


def test_conflict_clears_when_pod_removed() -> None:
    placed = pod_obj("db-0", labels={"app": "db"})
    table = table_of([node_obj("n")], [(placed, "n")])
    incoming = parse_pod(pod_obj("db-1", labels={"app": "db"}, affinity=_anti(DB)))
    assert not pod_anti_affinity(table, incoming).passed[0]
    table.remove_pod(parse_pod(placed))
    assert pod_anti_affinity(table, incoming).passed[0]


def test_spreads_replicas_one_per_node() -> None:
    table = table_of([node_obj(f"n{i}") for i in range(3)])
    for i, node in enumerate(["n0", "n2"]):
        table.add_pod(
            parse_pod(pod_obj(f"db-{i}", labels={"app": "db"}, affinity=_anti(DB))), node, 0.0
        )
    result = pod_anti_affinity(
        table, parse_pod(pod_obj("db-2", labels={"app": "db"}, affinity=_anti(DB)))
    )
    assert result.passed.tolist() == [False, True, False]


label_sets = st.dictionaries(
    st.sampled_from(["app", "tier"]), st.sampled_from(["a", "b"]), max_size=2
)
selectors = st.one_of(
    st.builds(lambda labels: {"matchLabels": labels}, label_sets),
    st.builds(
        lambda key, op, values: {
            "matchExpressions": [{"key": key, "operator": op, "values": values}]
        },
        st.sampled_from(["app", "tier"]),
        st.sampled_from(["In", "NotIn"]),
        st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2),
    ),
)
placements = st.lists(
    st.tuples(
        st.sampled_from(["x", "y"]),  # namespace
        label_sets,
        st.one_of(st.none(), selectors),  # the placed pod's own anti-affinity selector
        st.sampled_from(["n0", "n1", "n2"]),
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(placements, st.sampled_from(["x", "y"]), label_sets, st.one_of(st.none(), selectors))
def test_indexed_terms_match_a_plain_scan(
    placed: list[tuple[str, dict[str, str], dict[str, Any] | None, str]],
    namespace: str,
    labels: dict[str, str],
    selector: dict[str, Any] | None,
) -> None:
    table = table_of([node_obj("n0"), node_obj("n1"), node_obj("n2")])
    placed_pods = []
    for i, (ns, pod_labels, own, node) in enumerate(placed):
        obj = pod_obj(f"p{i}", ns, labels=pod_labels, affinity=_anti(own) if own else None)
        placed_pods.append((parse_pod(obj), node))
        table.add_pod(placed_pods[-1][0], node, 0.0)
    if placed_pods:  # remove and re-add one, to exercise the bookkeeping
        table.remove_pod(placed_pods[0][0])
        table.add_pod(*placed_pods[0], 0.0)
    incoming = parse_pod(
        pod_obj("new", namespace, labels=labels, affinity=_anti(selector) if selector else None)
    )
    blocked = set()
    for pod, node in placed_pods:
        if any(t.matches(incoming.namespace, incoming.labels) for t in pod.anti_affinity):
            blocked.add(node)
        if any(t.matches(pod.namespace, pod.labels) for t in incoming.anti_affinity):
            blocked.add(node)
    result = pod_anti_affinity(table, incoming)
    assert [table.names[i] for i in np.flatnonzero(~result.passed)] == sorted(blocked)


ZONED = [
    node_obj("a1", labels={"zone": "za"}),
    node_obj("a2", labels={"zone": "za"}),
    node_obj("b1", labels={"zone": "zb"}),
    node_obj("bare"),
]


@pytest.mark.parametrize(
    ("placed_affinity", "placed_on", "incoming_affinity", "passing", "reason"),
    [
        (None, "a1", _anti(DB, topologyKey="zone"), ["b1", "bare"], "own"),
        (_anti(DB, topologyKey="zone"), "a1", None, ["b1", "bare"], "existing"),
        (None, "bare", _anti(DB, topologyKey="zone"), ["a1", "a2", "b1", "bare"], None),
        (_anti(DB, topologyKey="zone"), "bare", None, ["a1", "a2", "b1", "bare"], None),
        (None, "a1", _anti(DB), ["a2", "b1", "bare"], "own"),
    ],
    ids=[
        "own-term-rejects-the-matching-pods-whole-zone",
        "existing-pods-term-rejects-its-whole-zone-symmetrically",
        "pod-on-a-node-without-the-key-counts-nowhere",
        "existing-term-on-a-node-without-the-key-rejects-nothing",
        "hostname-key-rejects-the-node-only",
    ],
)
def test_inter_pod_anti_affinity_any_topology_key(
    placed_affinity: dict[str, Any] | None,
    placed_on: str,
    incoming_affinity: dict[str, Any] | None,
    passing: list[str],
    reason: str | None,
) -> None:
    placed = pod_obj("db-0", labels={"app": "db"}, affinity=placed_affinity or {})
    table = table_of(ZONED, [(placed, placed_on)])
    incoming = parse_pod(pod_obj("db-1", labels={"app": "db"}, affinity=incoming_affinity or {}))
    result = pod_anti_affinity(table, incoming)
    assert [table.names[i] for i in result.passed.nonzero()[0]] == passing
    expected = {"own": POD_ANTI_AFFINITY, "existing": EXISTING_ANTI_AFFINITY}
    if reason is not None:
        assert result.reasons_for(table.names.index(placed_on)) == [expected[reason]]
