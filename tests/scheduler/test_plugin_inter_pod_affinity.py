"""InterPodAffinity as kube-scheduler v1.36 runs it: required affinity and anti-affinity
(the pod's own terms and placed pods' anti-affinity against it), preferred terms and
placed pods' terms in the score, any topology key, namespaces, namespace selectors,
matchLabelKeys / mismatchLabelKeys."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry

from scheduler.adapters.memory import InMemoryCluster
from scheduler.adapters.object_builders import namespace_object
from scheduler.api.objects import NamespaceInfo, PodInfo
from scheduler.api.pods import parse_pod
from scheduler.api.reader import ObjectError
from scheduler.api.selectors import LabelSelector, Requirement
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.queue import SchedulingQueue
from scheduler.cycle.settings import CycleSettings
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.plugins.inter_pod_affinity import (
    AFFINITY_RULES,
    ANTI_AFFINITY_RULES,
    EXISTING_ANTI_AFFINITY,
    NAME,
    inter_pod_affinity_filter,
    inter_pod_affinity_score,
)
from scheduler.signals.table import NodeTable
from tests.builders import node_obj, pod_obj, table_of

HOSTNAME = "kubernetes.io/hostname"
ZONED = [
    node_obj("a1", labels={"zone": "za"}),
    node_obj("a2", labels={"zone": "za"}),
    node_obj("b1", labels={"zone": "zb"}),
    node_obj("bare"),
]
ALL = ["a1", "a2", "b1", "bare"]
NAMESPACES = (
    NamespaceInfo("default", {"kubernetes.io/metadata.name": "default"}),
    NamespaceInfo("team-a", {"kubernetes.io/metadata.name": "team-a", "team": "a"}),
    NamespaceInfo("team-b", {"kubernetes.io/metadata.name": "team-b", "team": "b"}),
)
DB = {"matchLabels": {"app": "db"}}
CACHE = {"matchLabels": {"tier": "cache"}}
TEAM_A = {"matchLabels": {"team": "a"}}
AFFINITY = "podAffinity"
ANTI = "podAntiAffinity"

Obj = dict[str, Any]
Placed = list[tuple[Obj, str]]


def _term(selector: Obj | None = None, key: str = "zone", **extra: Any) -> Obj:
    term: Obj = {"topologyKey": key, **extra}
    if selector is not None:
        term["labelSelector"] = selector
    return term


def _required(kind: str, *terms: Obj) -> Obj:
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}


def _preferred(kind: str, *weighted: tuple[int, Obj]) -> Obj:
    items = [{"weight": w, "podAffinityTerm": t} for w, t in weighted]
    return {kind: {"preferredDuringSchedulingIgnoredDuringExecution": items}}


def _pod(name: str, namespace: str = "default", affinity: Obj | None = None, **labels: str) -> Obj:
    obj = pod_obj(name, namespace, labels=labels)
    if affinity is not None:
        obj["spec"]["affinity"] = affinity
    return obj


def _db(node: str, namespace: str = "default", **labels: str) -> tuple[Obj, str]:
    name = f"db-{node}-{namespace}-{'-'.join(labels.values())}"
    return pod_obj(name, namespace, labels={"app": "db", **labels}), node


def _table(placed: Placed) -> NodeTable:
    table = table_of(ZONED, placed)
    for namespace in NAMESPACES:
        table.namespaces.upsert(namespace)
    return table


def _names(table: NodeTable, mask: NDArray[np.bool_]) -> list[str]:
    return [table.names[i] for i in np.flatnonzero(mask)]


def _filter(table: NodeTable, pod: PodInfo) -> NDArray[np.bool_]:
    result = inter_pod_affinity_filter(table, pod)
    assert result is not None
    return result.passed


def _passing(placed: Placed, pod: Obj) -> list[str]:
    """The nodes passing (all of them when the plugin has nothing to check)."""
    table = _table(placed)
    result = inter_pod_affinity_filter(table, parse_pod(pod))
    return table.names if result is None else _names(table, result.passed)


@pytest.mark.parametrize(
    ("placed", "pod", "passing"),
    [
        ([_db("a1")], _pod("web", affinity=_required(AFFINITY, _term(DB))), ["a1", "a2"]),
        ([_db("a1")], _pod("web", affinity=_required(AFFINITY, _term(DB, HOSTNAME))), ["a1"]),
        ([_db("b1")], _pod("web", affinity=_required(AFFINITY, _term(DB))), ["b1"]),
        ([], _pod("web", affinity=_required(AFFINITY, _term(DB))), []),
        ([], _pod("db", affinity=_required(AFFINITY, _term(DB)), app="db"), ["a1", "a2", "b1"]),
        (
            [_db("bare")],  # counted nowhere, so the first-pod exception still applies
            _pod("db", affinity=_required(AFFINITY, _term(DB)), app="db"),
            ["a1", "a2", "b1"],
        ),
        (
            [_db("a1")],
            _pod("db", affinity=_required(AFFINITY, _term(DB)), app="db"),
            ["a1", "a2"],
        ),
        ([_db("a1", "team-a")], _pod("web", affinity=_required(AFFINITY, _term(DB))), []),
        (
            [_db("a1", "team-a")],
            _pod("web", affinity=_required(AFFINITY, _term(DB, namespaces=["team-a"]))),
            ["a1", "a2"],
        ),
        (
            [_db("a1", "team-a")],
            _pod("web", affinity=_required(AFFINITY, _term(DB, namespaceSelector={}))),
            ["a1", "a2"],
        ),
        (
            [_db("a1", "team-a"), _db("b1", "team-b")],
            _pod("web", affinity=_required(AFFINITY, _term(DB, namespaceSelector=TEAM_A))),
            ["a1", "a2"],
        ),
        (
            [_db("a1", "team-a"), _db("b1", "team-b")],
            _pod(
                "web",
                affinity=_required(
                    AFFINITY, _term(DB, namespaceSelector=TEAM_A, namespaces=["team-b"])
                ),
            ),
            ["a1", "a2", "b1"],
        ),
        ([_db("a1")], _pod("web", affinity=_required(AFFINITY, _term(None))), []),
        (
            [_db("a1"), _db("bare")],
            _pod("web", affinity=_required(AFFINITY, _term(DB))),
            ["a1", "a2"],
        ),
        (
            [(_pod("db", app="db"), "a1"), (_pod("cache", tier="cache"), "a2")],
            _pod("web", affinity=_required(AFFINITY, _term(DB), _term(CACHE))),
            [],
        ),
        (
            [(_pod("both", app="db", tier="cache"), "b1")],
            _pod("web", affinity=_required(AFFINITY, _term(DB), _term(CACHE, HOSTNAME))),
            ["b1"],
        ),
        (
            [_db("a1", rev="1"), _db("b1", rev="2")],
            _pod("web", affinity=_required(AFFINITY, _term(DB, matchLabelKeys=["rev"])), rev="2"),
            ["b1"],
        ),
        (
            [_db("a1", rev="1"), _db("b1", rev="2")],
            _pod(
                "web", affinity=_required(AFFINITY, _term(DB, mismatchLabelKeys=["rev"])), rev="2"
            ),
            ["a1", "a2"],
        ),
        (
            [_db("a1", rev="1"), _db("b1", rev="2")],
            _pod(  # the API server merged rev In (1) when the pod was created with rev=1
                "web",
                affinity=_required(
                    AFFINITY,
                    _term({"matchLabels": {"app": "db", "rev": "1"}}, matchLabelKeys=["rev"]),
                ),
                rev="2",
            ),
            ["a1", "a2"],
        ),
    ],
    ids=[
        "same-zone-as-a-matching-pod",
        "hostname-key-the-matching-pods-node",
        "other-zone",
        "no-matching-pod-anywhere",
        "first-pod-of-a-self-affine-group-passes-where-keys-exist",
        "first-pod-exception-when-matches-are-on-nodes-without-the-key",
        "no-exception-once-a-matching-pod-is-counted",
        "term-defaults-to-the-pods-namespace",
        "term-namespaces",
        "empty-namespace-selector-means-all-namespaces",
        "namespace-selector-picks-namespaces-by-label",
        "namespace-selector-ored-with-namespaces",
        "nil-label-selector-matches-no-pod",
        "pods-on-nodes-without-the-key-not-counted",
        "a-pod-counts-only-when-it-matches-every-term",
        "one-pod-matching-every-term-satisfies-each-key",
        "match-label-keys-merge-the-pods-value-into-the-selector",
        "mismatch-label-keys-exclude-the-pods-value",
        "match-label-keys-already-merged-by-the-api-server-are-not-merged-again",
    ],
)
def test_required_pod_affinity(placed: Placed, pod: Obj, passing: list[str]) -> None:
    assert _passing(placed, pod) == passing


def _anti_holder(name: str, namespace: str, term: Obj) -> Obj:
    """A db pod with one required anti-affinity term."""
    return _pod(name, namespace, affinity=_required(ANTI, term), app="db")


@pytest.mark.parametrize(
    ("placed", "pod", "passing"),
    [
        ([_db("a1")], _pod("db", affinity=_required(ANTI, _term(DB)), app="db"), ["b1", "bare"]),
        (
            [_db("a1")],
            _pod("db", affinity=_required(ANTI, _term(DB, HOSTNAME)), app="db"),
            ["a2", "b1", "bare"],
        ),
        ([_db("bare")], _pod("db", affinity=_required(ANTI, _term(DB)), app="db"), ALL),
        (
            [(_anti_holder("db-0", "default", _term(DB)), "a1")],
            _pod("db-1", app="db"),
            ["b1", "bare"],
        ),
        ([(_anti_holder("db-0", "default", _term(DB)), "bare")], _pod("db-1", app="db"), ALL),
        ([_db("a1", "team-a")], _pod("db", affinity=_required(ANTI, _term(DB)), app="db"), ALL),
        (
            [_db("a1", "team-a"), _db("b1", "team-b")],
            _pod("db", affinity=_required(ANTI, _term(DB, namespaceSelector=TEAM_A)), app="db"),
            ["b1", "bare"],
        ),
        (
            [(_anti_holder("db-0", "team-b", _term(DB, namespaceSelector=TEAM_A)), "a1")],
            _pod("db-1", "team-a", app="db"),
            ["b1", "bare"],
        ),
        (
            [(_anti_holder("db-0", "team-b", _term(DB, namespaceSelector=TEAM_A)), "a1")],
            _pod("db-1", "default", app="db"),
            ALL,
        ),
        (
            [(_pod("x", tenant="a"), "a1"), (_pod("y", tenant="b"), "b1")],
            _pod(
                "z",
                affinity=_required(ANTI, _term({}, HOSTNAME, mismatchLabelKeys=["tenant"])),
                tenant="b",
            ),
            ["a2", "b1", "bare"],
        ),
        (
            [(_pod("x", tier="a"), "a1")],
            _pod("y", affinity=_required(ANTI, _term({}, HOSTNAME))),
            ["a2", "b1", "bare"],
        ),
        ([(_pod("x", tier="a"), "a1")], _pod("y", affinity=_required(ANTI, _term(None))), ALL),
    ],
    ids=[
        "own-term-rejects-the-matching-pods-whole-zone",
        "hostname-key-rejects-the-node-only",
        "pod-on-a-node-without-the-key-counts-nowhere",
        "existing-pods-term-rejects-its-whole-zone-symmetrically",
        "existing-term-on-a-node-without-the-key-rejects-nothing",
        "own-term-defaults-to-the-pods-namespace",
        "own-namespace-selector-picks-namespaces-by-label",
        "existing-namespace-selector-matches-the-incoming-pods-namespace-labels",
        "existing-namespace-selector-ignores-other-namespaces",
        "mismatch-label-keys-keep-other-tenants-apart",
        "empty-selector-matches-every-pod",
        "null-selector-matches-no-pod",
    ],
)
def test_required_pod_anti_affinity(placed: Placed, pod: Obj, passing: list[str]) -> None:
    assert _passing(placed, pod) == passing


HOLDER = _anti_holder("db-0", "default", _term(DB, HOSTNAME))


@pytest.mark.parametrize(
    ("pod", "reasons"),
    [
        (
            _pod("db-1", affinity=_required(ANTI, _term(DB, HOSTNAME)), app="db"),
            [ANTI_AFFINITY_RULES],
        ),
        (_pod("db-1", app="db"), [EXISTING_ANTI_AFFINITY]),
        (
            _pod(
                "db-1",
                affinity={
                    **_required(AFFINITY, _term({"matchLabels": {"app": "web"}}, HOSTNAME)),
                    **_required(ANTI, _term(DB, HOSTNAME)),
                },
                app="db",
            ),
            [AFFINITY_RULES],
        ),
    ],
    ids=[
        "own-anti-affinity-reported-before-existing-pods-anti-affinity",
        "existing-pods-anti-affinity",
        "affinity-reported-before-anti-affinity",
    ],
)
def test_a_node_failing_several_rules_reports_the_first_in_kube_schedulers_order(
    pod: Obj, reasons: list[str]
) -> None:
    table = _table([(HOLDER, "a1")])
    result = inter_pod_affinity_filter(table, parse_pod(pod))
    assert result is not None and not result.passed[0]
    assert result.reasons_for(0) == reasons


def test_affinity_failure_reason_in_the_cycle_message() -> None:
    table = _table([_db("b1")])
    cycle = SchedulingCycle(CycleSettings())
    web = parse_pod(_pod("web", affinity=_required(AFFINITY, _term(DB))))
    assert cycle.schedule(web, table, 0.0).node == "b1"
    lonely = parse_pod(_pod("web2", affinity=_required(AFFINITY, _term(CACHE))))
    result = cycle.schedule(lonely, table, 0.0)
    assert result.node is None
    assert result.message == f"0/4 nodes are available: 4 {AFFINITY_RULES}."


def test_no_terms_anywhere_leaves_the_pod_to_other_plugins() -> None:
    table = _table([_db("a1")])
    assert inter_pod_affinity_filter(table, parse_pod(_pod("web", app="web"))) is None
    assert inter_pod_affinity_score(table, parse_pod(_pod("web")), table.everyone()) is None


def test_namespace_label_change_moves_a_namespace_in_and_out_of_a_selector() -> None:
    table = _table([_db("a1", "team-b")])
    pod = parse_pod(_pod("web", affinity=_required(AFFINITY, _term(DB, namespaceSelector=TEAM_A))))
    assert _names(table, _filter(table, pod)) == []
    table.namespaces.upsert(NamespaceInfo("team-b", {"team": "a"}))
    assert _names(table, _filter(table, pod)) == ["a1", "a2"]
    table.namespaces.remove("team-b")
    assert _names(table, _filter(table, pod)) == []


def test_conflict_clears_when_the_matching_pod_goes() -> None:
    placed = _pod("db-0", app="db")
    table = _table([(placed, "a1")])
    incoming = parse_pod(_pod("db-1", affinity=_required(ANTI, _term(DB, HOSTNAME)), app="db"))
    assert _names(table, _filter(table, incoming)) == ["a2", "b1", "bare"]
    table.remove_pod(parse_pod(placed))
    assert _names(table, _filter(table, incoming)) == ALL


# ---- score ----------------------------------------------------------------------------


def _scores(placed: Placed, pod: Obj, feasible: list[str] | None = None) -> list[float]:
    table = _table(placed)
    mask = np.array([feasible is None or name in feasible for name in table.names])
    score = inter_pod_affinity_score(table, parse_pod(pod), mask)
    return [0.0] * len(table) if score is None else [float(x) for x in score]


def _preferring(*sections: Obj, namespace: str = "default", **labels: str) -> Obj:
    affinity: Obj = {}
    for section in sections:
        affinity.update(section)
    return _pod("new", namespace, affinity=affinity, **labels)


def _placed_with(affinity: Obj, node: str, namespace: str = "default") -> tuple[Obj, str]:
    return _pod(f"web-{node}", namespace, affinity=affinity, app="web"), node


@pytest.mark.parametrize(
    ("placed", "pod", "scores"),
    [
        ([_db("a1")], _preferring(_preferred(AFFINITY, (5, _term(DB)))), [100, 100, 0, 0]),
        ([_db("a1")], _preferring(_preferred(ANTI, (5, _term(DB)))), [0, 0, 100, 100]),
        (
            [_db("a1")],
            _preferring(_preferred(AFFINITY, (5, _term(DB, HOSTNAME)))),
            [100, 0, 0, 0],
        ),
        (
            [_db("a1"), _db("b1", rev="x"), _db("b1", rev="y")],
            _preferring(_preferred(AFFINITY, (10, _term(DB, HOSTNAME)), (1, _term(DB)))),
            [50, 4, 100, 0],  # raw a1 10 + 1, a2 1, b1 2·10 + 2, bare 0
        ),
        (
            [_db("a1")],
            _preferring(
                _preferred(AFFINITY, (10, _term(DB))), _preferred(ANTI, (5, _term(DB, HOSTNAME)))
            ),
            [50, 100, 0, 0],
        ),
        (
            [_db("a1"), _db("a2"), _db("b1")],
            _preferring(_preferred(AFFINITY, (1, _term(DB)))),
            [100, 100, 50, 0],
        ),
        (
            [(_pod("web", affinity=_required(AFFINITY, _term(DB)), app="web"), "a1")],
            _pod("new", app="db"),
            [100, 100, 0, 0],
        ),
        (
            [_placed_with(_preferred(AFFINITY, (7, _term(DB))), "b1")],
            _pod("new", app="db"),
            [0, 0, 100, 0],
        ),
        (
            [_placed_with(_preferred(ANTI, (7, _term(DB))), "b1")],
            _pod("new", app="db"),
            [100, 100, 0, 100],
        ),
        (
            [
                _placed_with(
                    _preferred(AFFINITY, (7, _term(DB, namespaceSelector=TEAM_A))), "b1", "team-b"
                )
            ],
            _pod("new", "team-a", app="db"),
            [0, 0, 100, 0],
        ),
        (
            [
                _placed_with(
                    _preferred(AFFINITY, (7, _term(DB, namespaceSelector=TEAM_A))), "b1", "team-b"
                )
            ],
            _pod("new", "default", app="db"),
            [0, 0, 0, 0],
        ),
        (
            [_db("a1", "team-a"), _db("b1", "team-b")],
            _preferring(_preferred(AFFINITY, (4, _term(DB, namespaceSelector=TEAM_A)))),
            [100, 100, 0, 0],
        ),
        (
            [_db("a1", rev="1"), _db("b1", rev="2")],
            _preferring(_preferred(AFFINITY, (4, _term(DB, matchLabelKeys=["rev"]))), rev="2"),
            [0, 0, 100, 0],
        ),
    ],
    ids=[
        "preferred-affinity-scores-domains-with-matching-pods-higher",
        "preferred-anti-affinity-scores-domains-with-matching-pods-lower",
        "preferred-affinity-on-hostname-scores-the-node-only",
        "term-weights-times-matching-pods-add-up-per-domain",
        "affinity-and-anti-affinity-weights-net-out",
        "per-domain-counts-normalised-from-min-to-max",
        "existing-pods-required-affinity-counts-with-hard-pod-affinity-weight",
        "existing-pods-preferred-affinity-scores-the-incoming-pod",
        "existing-pods-preferred-anti-affinity-scores-the-incoming-pod",
        "existing-pods-namespace-selector-reads-the-incoming-pods-namespace-labels",
        "existing-pods-namespace-selector-other-namespace-scores-nothing",
        "own-namespace-selector",
        "match-label-keys-in-preferred-terms",
    ],
)
def test_inter_pod_affinity_score(placed: Placed, pod: Obj, scores: list[float]) -> None:
    assert _scores(placed, pod) == scores


def test_score_normalises_over_feasible_nodes_and_truncates() -> None:
    on = ["a1", "a1", "a1", "b1", "b1", "a2"]
    placed = [(_pod(f"db-{i}", app="db"), node) for i, node in enumerate(on)]
    pod = _preferring(_preferred(AFFINITY, (1, _term(DB, HOSTNAME))))
    # raw a1 3, a2 1, b1 2, bare 0: ⌊100·1/3⌋ = 33, ⌊100·2/3⌋ = 66
    assert _scores(placed, pod) == [100, 33, 66, 0]
    assert _scores(placed, pod, feasible=["a2", "b1"]) == [0, 0, 100, 0]  # min 1, max 2


def test_cycle_places_a_pod_by_its_preferred_affinity() -> None:
    table = _table([_db("b1")])
    pod = parse_pod(_preferring(_preferred(AFFINITY, (100, _term(DB, HOSTNAME)))))
    result = SchedulingCycle(CycleSettings(), seed=1).schedule(pod, table, 0.0)
    assert result.node == "b1"
    assert result.candidates[0].scores[NAME] == 100


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
namespace_scopes = st.sampled_from([{}, {"namespaceSelector": {}}, {"namespaceSelector": TEAM_A}])
placements = st.lists(
    st.tuples(
        st.sampled_from(["team-a", "team-b"]),
        label_sets,
        st.one_of(st.none(), st.tuples(selectors, namespace_scopes)),  # own anti-affinity
        st.sampled_from(["a1", "a2", "b1"]),
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(
    placements,
    st.sampled_from(["team-a", "team-b"]),
    label_sets,
    st.one_of(st.none(), st.tuples(selectors, namespace_scopes)),
)
def test_indexed_anti_affinity_matches_a_plain_scan(
    placed: list[tuple[str, dict[str, str], tuple[Obj, Obj] | None, str]],
    namespace: str,
    labels: dict[str, str],
    own: tuple[Obj, Obj] | None,
) -> None:
    def anti(term: tuple[Obj, Obj] | None) -> Obj | None:
        return None if term is None else _required(ANTI, _term(term[0], HOSTNAME, **term[1]))

    table = _table([])
    placed_pods = []
    for i, (ns, pod_labels, term, node) in enumerate(placed):
        placed_pods.append((parse_pod(_pod(f"p{i}", ns, affinity=anti(term), **pod_labels)), node))
        table.add_pod(placed_pods[-1][0], node, 0.0)
    if placed_pods:  # remove and re-add one, to exercise the bookkeeping
        table.remove_pod(placed_pods[0][0])
        table.add_pod(*placed_pods[0], 0.0)
    incoming = parse_pod(_pod("new", namespace, affinity=anti(own), **labels))
    namespace_labels = {n.name: n.labels for n in NAMESPACES}
    blocked = set()
    for pod, node in placed_pods:
        if any(
            t.matches(incoming.namespace, incoming.labels, namespace_labels[namespace])
            for t in pod.anti_affinity
        ):
            blocked.add(node)
        if any(
            t.matches(pod.namespace, pod.labels, namespace_labels[pod.namespace])
            for t in incoming.anti_affinity
        ):
            blocked.add(node)
    assert [n for n in ALL if n not in _passing_in(table, incoming)] == sorted(blocked)


def _passing_in(table: NodeTable, pod: PodInfo) -> list[str]:
    result = inter_pod_affinity_filter(table, pod)
    return table.names if result is None else _names(table, result.passed)


# ---- parsing and the namespace informer -----------------------------------------------


def test_preferred_terms_keep_weights_and_drop_what_cannot_score() -> None:
    pod = parse_pod(
        _preferring(
            _preferred(AFFINITY, (3, _term(DB)), (0, _term(CACHE)), (5, _term(None))),
            _preferred(ANTI, (100, _term(DB, HOSTNAME, namespaceSelector=TEAM_A))),
        )
    )
    assert [(w.weight, w.term.topology_key) for w in pod.preferred_affinity] == [(3, "zone")]
    (anti,) = pod.preferred_anti_affinity
    assert anti.weight == 100 and anti.term.namespaces == frozenset()
    assert anti.term.namespace_selector is not None
    assert anti.term.matches("x", {"app": "db"}, {"team": "a"})
    assert not anti.term.matches("x", {"app": "db"}, {"team": "b"})
    assert pod.unsupported == ()


@pytest.mark.parametrize(
    ("weight", "problem"),
    [(101, "101 is not an integer from 0 to 100"), ("5", "'5' is not an integer")],
    ids=["above-100", "a-string"],
)
def test_malformed_preferred_weight_is_one_line_naming_the_field(
    weight: object, problem: str
) -> None:
    obj = _preferring({ANTI: {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": weight, "podAffinityTerm": _term(DB)}
    ]}})  # fmt: skip
    with pytest.raises(ObjectError) as info:
        parse_pod(obj)
    message = str(info.value)
    assert "podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight" in message
    assert problem in message and "\n" not in message


def test_namespace_objects_reach_the_table_through_the_informer() -> None:
    cluster = InMemoryCluster()
    cluster.add_node(node_obj("n1"))
    cluster.add_namespace(namespace_object("team-a", {"team": "a"}))
    table = NodeTable()
    queue = SchedulingQueue()
    cache = ClusterCache(
        table, queue, SchedulerMetrics(CollectorRegistry()), "interference-scheduler"
    )
    informer = cluster.informer(cache)
    informer.sync()
    assert cache.synced()
    assert table.namespaces.matching(LabelSelector((Requirement("team", "In", ("a",)),))) == {
        "team-a"
    }
    assert table.namespaces.labels("team-a")["kubernetes.io/metadata.name"] == "team-a"
    cluster.add_namespace(namespace_object("team-a", {"team": "b"}))
    cluster.add_namespace(namespace_object("team-c", {"team": "a"}))
    informer.sync()
    assert table.namespaces.matching(LabelSelector((Requirement("team", "In", ("a",)),))) == {
        "team-c"
    }
    cluster.delete_namespace("team-c")
    informer.sync()
    assert table.namespaces.labels("team-c") == {}
    assert table.namespaces.names() == ["team-a"]


kinds = st.sampled_from(["affinity-required", "affinity-preferred", "anti-preferred"])
scored_terms = st.lists(
    st.tuples(kinds, st.integers(1, 100), selectors, st.sampled_from(["zone", HOSTNAME]),
              namespace_scopes),
    max_size=2,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["team-a", "team-b"]), label_sets, scored_terms,
                  st.sampled_from(ALL)),
        max_size=8,
    ),
    st.sampled_from(["team-a", "team-b"]),
    label_sets,
    scored_terms,
)  # fmt: skip
def test_score_matches_kube_schedulers_formula_by_plain_scan(
    placed: list[tuple[str, dict[str, str], list[Any], str]],
    namespace: str,
    labels: dict[str, str],
    own: list[Any],
) -> None:
    def affinity_of(terms: list[Any]) -> Obj:
        sections: dict[str, dict[str, list[Obj]]] = {}
        for kind, weight, selector, key, scope in terms:
            term = _term(selector, key, **scope)
            side = AFFINITY if kind.startswith("affinity") else ANTI
            if kind.endswith("required"):
                sections.setdefault(side, {}).setdefault(
                    "requiredDuringSchedulingIgnoredDuringExecution", []
                ).append(term)
            else:
                sections.setdefault(side, {}).setdefault(
                    "preferredDuringSchedulingIgnoredDuringExecution", []
                ).append({"weight": weight, "podAffinityTerm": term})
        return sections

    pods = [
        (parse_pod(_pod(f"p{i}", ns, affinity=affinity_of(terms), **pod_labels)), node)
        for i, (ns, pod_labels, terms, node) in enumerate(placed)
    ]
    table = _table([])
    for pod, node in pods:
        table.add_pod(pod, node, 0.0)
    incoming = parse_pod(
        _pod(
            "new",
            namespace,
            affinity=affinity_of([t for t in own if t[0] != "affinity-required"]),
            **labels,
        )
    )
    ns_labels = {n.name: n.labels for n in NAMESPACES}
    node_labels = {row: table.node(row).labels for row in range(len(table))}
    raw = [0] * len(table)

    def add(key: str, node: str, weight: int) -> None:
        value = node_labels[table.row_of(node) or 0].get(key)
        for row in range(len(table)):
            if value is not None and node_labels[row].get(key) == value:
                raw[row] += weight

    for pod, node in pods:
        for sign, preferred in (
            (1, incoming.preferred_affinity),
            (-1, incoming.preferred_anti_affinity),
        ):
            for w in preferred:
                if w.term.matches(pod.namespace, pod.labels, ns_labels[pod.namespace]):
                    add(w.term.topology_key, node, sign * w.weight)
        for required in pod.pod_affinity:
            if required.matches(incoming.namespace, incoming.labels, ns_labels[namespace]):
                add(required.topology_key, node, 1)
        for sign, preferred in ((1, pod.preferred_affinity), (-1, pod.preferred_anti_affinity)):
            for w in preferred:
                if w.term.matches(incoming.namespace, incoming.labels, ns_labels[namespace]):
                    add(w.term.topology_key, node, sign * w.weight)
    low, high = min(raw), max(raw)
    expected = [int(100 * ((r - low) / (high - low))) if high > low else 0 for r in raw]
    score = inter_pod_affinity_score(table, incoming, table.everyone())
    assert ([0] * len(table) if score is None else [int(x) for x in score]) == expected
