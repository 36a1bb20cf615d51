"""NodeTable.matching_per_node: the incrementally kept per-node counts equal a recount
after any sequence of pod and node changes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.api.nodes import parse_node
from scheduler.api.objects import AntiAffinityTerm, PodInfo
from scheduler.api.pods import parse_pod
from scheduler.api.selectors import LabelSelector, Requirement
from scheduler.signals.table import NodeTable
from tests.builders import node_obj, pod_obj

NODES = ["a", "b", "c"]
TERMS = [
    AntiAffinityTerm(LabelSelector((Requirement("app", "In", ("web",)),)), frozenset({"x"})),
    AntiAffinityTerm(LabelSelector((Requirement("app", "In", ("web", "db")),)), None),
    AntiAffinityTerm(LabelSelector((Requirement("tier", "Exists", ()),)), None),
    AntiAffinityTerm(LabelSelector(()), frozenset({"y"})),
]
operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.integers(0, 6),
            st.sampled_from(NODES),
            st.sampled_from(["web", "db", "cache"]),
            st.just(""),
            st.booleans(),
        ),
        st.tuples(
            st.just("remove"),
            st.integers(0, 6),
            st.just(""),
            st.just(""),
            st.just(""),
            st.just(False),
        ),
        st.tuples(
            st.just("drop_node"),
            st.just(0),
            st.sampled_from(NODES),
            st.just(""),
            st.just(""),
            st.just(False),
        ),
        st.tuples(
            st.just("add_node"),
            st.just(0),
            st.sampled_from(NODES),
            st.just(""),
            st.just(""),
            st.just(False),
        ),
        st.tuples(
            st.just("query"),
            st.integers(0, len(TERMS) - 1),
            st.just(""),
            st.just(""),
            st.just(""),
            st.booleans(),
        ),
    ),
    max_size=50,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_match_counts_equal_a_recount(ops: list[tuple[str, int, str, str, str, bool]]) -> None:
    table = NodeTable(capacity=1)
    for name in NODES:
        table.upsert_node(parse_node(node_obj(name)))
    placed: dict[int, tuple[PodInfo, str]] = {}
    for op, i, node, app, _, flag in ops:
        if op == "add":
            namespace = ("x", "y")[i % 2]  # one namespace per name: one key per i
            obj = pod_obj(
                f"p{i}", namespace, labels={"app": app, **({"tier": "1"} if flag else {})}
            )
            if flag:
                obj["metadata"]["deletionTimestamp"] = "2024-05-01T12:01:00Z"
            pod = parse_pod(obj)
            table.add_pod(pod, node, 0.0)
            placed[i] = (pod, node)
        elif op == "remove" and i in placed:
            table.remove_pod(placed.pop(i)[0])
        elif op == "drop_node":
            table.remove_node(node)
        elif op == "add_node":
            table.upsert_node(parse_node(node_obj(node)))
        elif op == "query":
            term = TERMS[i]
            got = table.matching_per_node(term, skip_terminating=flag).tolist()
            want = np.zeros(len(table), dtype=np.int64)
            for pod, on in placed.values():
                row = table.row_of(on)
                matches = term.matches(pod.namespace, pod.labels)
                if row is not None and matches and not (flag and pod.terminating):
                    want[row] += 1
            assert got == want.tolist()
