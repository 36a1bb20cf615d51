"""NodeAffinity filter: nodeSelector, every operator, matchFields, ORed terms."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from scheduler.api.nodes import parse_node
from scheduler.api.objects import GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL
from scheduler.api.pods import parse_pod
from scheduler.api.selectors import parse_int64
from scheduler.plugins.node_affinity import NODE_AFFINITY, node_affinity
from tests.builders import affinity_terms, node_obj, pod_obj, table_of
from tests.scheduler.filters import or_all_pass

NODES = [
    node_obj("a", labels={"zone": "z1", "gen": "5", "disk": "ssd"}),
    node_obj("b", labels={"zone": "z2", "gen": "3"}),
    node_obj("c", labels={"zone": "z3", "gen": "x"}),
    node_obj("d"),
]

Expr = tuple[str, str, Sequence[str]]


@pytest.mark.parametrize(
    ("terms", "passing"),
    [
        ([[("zone", "In", ["z1", "z2"])]], ["a", "b"]),
        ([[("zone", "NotIn", ["z1"])]], ["b", "c", "d"]),
        ([[("disk", "Exists", [])]], ["a"]),
        ([[("disk", "DoesNotExist", [])]], ["b", "c", "d"]),
        ([[("gen", "Gt", ["3"])]], ["a"]),
        ([[("gen", "Lt", ["5"])]], ["b"]),
        ([[("gen", "Gt", ["2"])]], ["a", "b"]),
        ([[("zone", "In", ["z1", "z2", "z3"]), ("gen", "Lt", ["4"])]], ["b"]),
        ([[("zone", "In", ["z1"])], [("zone", "In", ["z3"])]], ["a", "c"]),
        ([[("zone", "In", ["nowhere"])]], []),
        ([[]], []),
        ([[("missing", "NotIn", ["v"])]], ["a", "b", "c", "d"]),
    ],
    ids=[
        "in",
        "notin-includes-unlabelled",
        "exists",
        "doesnotexist",
        "gt",
        "lt",
        "gt-skips-non-integer-and-absent",
        "expressions-anded",
        "terms-ored",
        "in-no-match",
        "empty-term-matches-nothing",
        "notin-absent-key",
    ],
)
def test_required_node_affinity(terms: list[list[Expr]], passing: list[str]) -> None:
    table = table_of(NODES)
    result = or_all_pass(
        node_affinity(table, parse_pod(pod_obj(affinity=affinity_terms(*terms)))), table
    )
    assert [table.names[i] for i in result.passed.nonzero()[0]] == passing


@pytest.mark.parametrize(
    ("match_fields", "passing"),
    [
        ([{"key": "metadata.name", "operator": "In", "values": ["b"]}], ["b"]),
        ([{"key": "metadata.name", "operator": "NotIn", "values": ["a"]}], ["b", "c", "d"]),
        # kube's field selector takes exactly one value: a term with two matches nothing
        ([{"key": "metadata.name", "operator": "In", "values": ["b", "d"]}], []),
    ],
    ids=["fields-in", "fields-notin", "fields-in-two-values-term-matches-nothing"],
)
def test_match_fields_on_node_name(match_fields: list[dict[str, Any]], passing: list[str]) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": match_fields,
                        "matchExpressions": [{"key": "gen", "operator": "Exists"}],
                    }
                ]
            }
        }
    }
    table = table_of(NODES)
    result = or_all_pass(node_affinity(table, parse_pod(pod_obj(affinity=affinity))), table)
    assert [table.names[i] for i in result.passed.nonzero()[0]] == [n for n in passing if n != "d"]


@pytest.mark.parametrize(
    ("selector", "passing"),
    [
        ({}, ["a", "b", "c", "d"]),
        ({"zone": "z2"}, ["b"]),
        ({"zone": "z1", "disk": "ssd"}, ["a"]),
        ({"zone": "z2", "disk": "ssd"}, []),
        ({"kubernetes.io/hostname": "c"}, ["c"]),
    ],
    ids=["empty", "one-label", "all-labels-must-match", "partial-match-fails", "hostname"],
)
def test_node_selector(selector: dict[str, str], passing: list[str]) -> None:
    table = table_of(NODES)
    result = or_all_pass(node_affinity(table, parse_pod(pod_obj(nodeSelector=selector))), table)
    assert [table.names[i] for i in result.passed.nonzero()[0]] == passing


def test_selector_and_affinity_both_apply() -> None:
    table = table_of(NODES)
    pod = parse_pod(
        pod_obj(nodeSelector={"gen": "5"}, affinity=affinity_terms([("zone", "In", ["z2"])]))
    )
    result = or_all_pass(node_affinity(table, pod), table)
    assert not result.passed.any()
    assert result.reasons_for(0) == [NODE_AFFINITY]


def test_a_label_no_node_carries_matches_none_until_a_node_brings_it() -> None:
    """Such a key is answered without a column of its own (a pod may name thousands), and
    the table still sees a node that later carries it."""
    table = table_of(NODES)
    pod = parse_pod(pod_obj(nodeSelector={"rack": "r1"}))
    assert not or_all_pass(node_affinity(table, pod), table).passed.any()
    table.upsert_node(parse_node(node_obj("e", labels={"rack": "r1"})))
    passed = or_all_pass(node_affinity(table, pod), table).passed
    assert [table.names[i] for i in passed.nonzero()[0]] == ["e"]
    elsewhere = parse_pod(pod_obj(affinity=affinity_terms([("rack", "DoesNotExist", [])])))
    passed = or_all_pass(node_affinity(table, elsewhere), table).passed
    assert [table.names[i] for i in passed.nonzero()[0]] == ["a", "b", "c", "d"]


def test_gpu_product_label_selects_gpu_model() -> None:
    table = table_of(
        [
            node_obj(
                "a100",
                labels={
                    GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB",
                    GPU_MEMORY_LABEL: "81920",
                },
            ),
            node_obj(
                "t4",
                labels={GPU_PRODUCT_LABEL: "Tesla-T4", GPU_MEMORY_LABEL: "15360"},
            ),
        ]
    )
    by_model = parse_pod(pod_obj(nodeSelector={GPU_PRODUCT_LABEL: "Tesla-T4"}))
    by_memory = parse_pod(pod_obj(affinity=affinity_terms([(GPU_MEMORY_LABEL, "Gt", ["40000"])])))
    assert or_all_pass(node_affinity(table, by_model), table).passed.tolist() == [False, True]
    assert or_all_pass(node_affinity(table, by_memory), table).passed.tolist() == [True, False]


def test_fields_and_labels_named_alike_stay_apart() -> None:
    table = table_of([node_obj("real-name", labels={"metadata.name": "label-value"})])

    def passes(kind: str, value: str) -> bool:
        term = {kind: [{"key": "metadata.name", "operator": "In", "values": [value]}]}
        required = {"nodeSelectorTerms": [term]}
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
        return bool(
            or_all_pass(node_affinity(table, parse_pod(pod_obj(affinity=affinity))), table).passed[
                0
            ]
        )

    assert passes("matchExpressions", "label-value") and not passes("matchExpressions", "real-name")
    assert passes("matchFields", "real-name") and not passes("matchFields", "label-value")


# kube-scheduler builds each required term with ``nodeaffinity.NewLazyErrorNodeSelector``:
# a term whose requirements ``labels.NewRequirement`` rejects matches nothing, and the
# other (ORed) terms still count.
INVALID_TERM_NODES = [
    node_obj("z1", labels={"zone": "z1", "gen": "5"}),
    node_obj("z2", labels={"zone": "z2", "gen": "1_000"}),
    node_obj("big", labels={"zone": "z3", "gen": "99999999999999999999"}),
]


@pytest.mark.parametrize(
    ("terms", "passing"),
    [
        ([[("zone", "In", ["z1", "bad value!"])]], []),
        ([[("zone", "NotIn", ["bad value!"])]], []),
        ([[("zone", "In", ["z1", "bad value!"])], [("zone", "In", ["z2"])]], ["z2"]),
        ([[("gen", "Gt", ["x"])], [("zone", "In", ["z1"])]], ["z1"]),
        ([[("gen", "Gt", ["1_000"])]], []),
        ([[("gen", "Lt", ["99999999999999999999"])]], []),
        ([[("gen", "Gt", ["-1"])]], []),
        ([[("gen", "Lt", ["1", "2"])]], []),
        ([[("gen", "Gt", ["4"])]], ["z1"]),
        ([[("gen", "Lt", ["9223372036854775807"])]], ["z1"]),
        ([[("zone", "Exists", ["z1"])]], []),
        ([[("bad key!", "Exists", [])], [("zone", "In", ["z3"])]], ["big"]),
    ],
    ids=[
        "in-invalid-label-value-whole-term-matches-nothing",
        "notin-invalid-label-value-whole-term-matches-nothing",
        "invalid-term-ored-with-valid-term",
        "gt-non-integer-bound-term-matches-nothing-other-term-counts",
        "gt-bound-with-underscore-is-not-parseint",
        "lt-bound-beyond-int64-is-not-parseint",
        "gt-negative-bound-is-not-a-label-value",
        "lt-two-values",
        "gt-node-label-not-parseint-is-no-match",
        "lt-node-label-beyond-int64-is-no-match",
        "exists-with-values",
        "invalid-key",
    ],
)
def test_lazy_error_node_selector_invalid_term_matches_nothing(
    terms: list[list[Expr]], passing: list[str]
) -> None:
    table = table_of(INVALID_TERM_NODES)
    pod = parse_pod(pod_obj(affinity=affinity_terms(*terms)))  # parses: never unschedulable
    result = or_all_pass(node_affinity(table, pod), table)
    assert [table.names[i] for i in result.passed.nonzero()[0]] == passing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 42),
        ("-7", -7),
        ("+7", 7),
        ("007", 7),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
        ("9223372036854775808", None),
        ("1_000", None),
        (" 1", None),
        ("1.0", None),
        ("", None),
        ("\u0661", None),  # Arabic-Indic digit one: Python's int() takes it, Go's does not
    ],
)
def test_strconv_parseint_base10_int64(text: str, expected: int | None) -> None:
    assert parse_int64(text) == expected
