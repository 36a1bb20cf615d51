"""Redis key names (interference.keys), table-driven."""

from __future__ import annotations

import fnmatch

import pytest

from interference import keys

NODE = "gpu-1"


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (keys.node_key(NODE), "intf:node:gpu-1"),
        (keys.sched_key(NODE), "intf:node:gpu-1:sched:{g07}"),
        (keys.reports_key(NODE), "intf:node:gpu-1:reports"),
        (keys.node_pods_key(NODE), "intf:node:gpu-1:pods"),
        (keys.pod_key(NODE, "ml", "trainer-0"), "intf:node:gpu-1:pod:ml/trainer-0"),
        (keys.pod_key(NODE, "", "u-2"), "intf:node:gpu-1:pod:u-2"),
        (keys.gpu_key(NODE), "intf:node:gpu-1:gpu"),
        (keys.decision_key("ml", "trainer-0"), "intf:decision:ml/trainer-0"),
        (keys.rebalance_decision_key("ml", "trainer-0"), "intf:rebalance:decision:ml/trainer-0"),
        (keys.NODES_BY_INDEX, "intf:nodes"),
        (keys.NODES_UPDATED, "intf:nodes:updated"),
    ],
)
def test_key_names(key: str, expected: str) -> None:
    assert key == expected
    assert key.startswith(keys.PREFIX)


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("gpu-1", True),
        ("ip-10-0-0-1.ec2.internal", True),
        ("a", True),
        ("0", True),
        ("a" * 253, True),
        ("a" * 254, False),
        ("", False),
        ("a:b", False),
        ("a*", False),
        ("a?", False),
        ("a[b]", False),
        ("a\\b", False),
        ("Gpu-1", False),  # upper case
        ("-gpu", False),
        ("gpu-", False),
        ("a..b", False),
        (".a", False),
        ("a.", False),
        ("a b", False),
        ("a/b", False),
        ("a_b", False),
        ("gpu-1\n", False),
    ],
)
def test_valid_node_name(name: str, valid: bool) -> None:
    assert keys.valid_node_name(name) is valid


def _every_node_key(node: str) -> list[str]:
    return [
        keys.node_key(node),
        keys.sched_key(node),
        keys.reports_key(node),
        keys.node_pods_key(node),
        keys.pod_key(node, "ml", "trainer-0"),
        keys.pod_key(node, "", "u-2"),
        keys.gpu_key(node),
    ]


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    # Redis ACL key patterns are glob-style like fnmatch's (no glob character is used
    # for the names allowed here other than the trailing ``*``).
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


@pytest.mark.parametrize("node", ["gpu-1", "a", "ip-10-0-0-1.ec2.internal"])
def test_node_key_patterns_cover_every_key_of_the_node(node: str) -> None:
    patterns = keys.node_key_patterns(node)
    assert patterns == (f"intf:node:{node}", f"intf:node:{node}:*")
    for key in _every_node_key(node):
        assert _matches(key, patterns), key


@pytest.mark.parametrize(
    ("node", "other"),
    [
        ("a", "ab"),  # a prefix of another name
        ("a", "a.b"),  # a parent domain of another name
        ("a.b", "a"),
        ("node-1", "node-10"),
    ],
)
def test_node_key_patterns_match_no_key_of_another_node(node: str, other: str) -> None:
    patterns = keys.node_key_patterns(node)
    for key in _every_node_key(other):
        assert not _matches(key, patterns), key
    for key in (
        keys.NODES_BY_INDEX,
        keys.NODES_UPDATED,
        keys.decision_key("ml", "x"),
        keys.rebalance_decision_key("ml", "x"),
    ):
        assert not _matches(key, patterns), key


@pytest.mark.parametrize(
    "node", ["", "*", "a*", "a?", "a[b]", "a:b", "a:*", "a\\b", "A", "a b", "a" * 254]
)
def test_node_key_patterns_refuse_names_that_are_not_node_names(node: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes node name"):
        keys.node_key_patterns(node)


@pytest.mark.parametrize("node", ["gpu-1", "ip-10-0-0-1.ec2.internal", "a"])
def test_node_from_key_inverts_node_key(node: str) -> None:
    assert keys.node_from_key(keys.node_key(node)) == node


@pytest.mark.parametrize(
    "key",
    [
        "intf:node:gpu-1:pods",
        keys.sched_key("gpu-1"),
        "intf:node:gpu-1:pod:ml/x",
        "intf:node:gpu-1:gpu",
        "intf:node:gpu-1:reports",
        "intf:pod:ml/x",
        "intf:gpu:gpu-1",
        "node:gpu-1",
        "intf:nodes",
        "intf:node:",  # no node name
        "",
    ],
)
def test_node_from_key_rejects_other_keys(key: str) -> None:
    with pytest.raises(ValueError, match="not a node key"):
        keys.node_from_key(key)


@pytest.mark.parametrize("node", ["gpu-1", "ip-10-0-0-1.ec2.internal", "a"])
def test_node_from_sched_key_inverts_sched_key(node: str) -> None:
    assert keys.node_from_sched_key(keys.sched_key(node)) == node


@pytest.mark.parametrize(
    "key",
    [
        "intf:node:gpu-1",
        "intf:node:gpu-1:pods",
        "intf:node:gpu-1:sched",  # no group
        "intf:node:gpu-1:sched:{g00}",  # another node's group
        "intf:node:gpu-1:sched:{g15}x",
        "intf:node:a:b:sched:{g01}",  # a colon in the node part: not one node's record
        "intf:node:gpu-1:pod:x:sched",
        "intf:node::sched:{g00}",  # no node name
        "intf:node:sched",
        "intf:nodes:sched",
        "intf:sched",
        "node:gpu-1:sched",
        "",
    ],
)
def test_node_from_sched_key_rejects_other_keys(key: str) -> None:
    with pytest.raises(ValueError, match="not a scheduling record key"):
        keys.node_from_sched_key(key)


def test_scheduling_records_fall_into_a_few_hash_tag_groups_that_spread() -> None:
    groups = [keys.sched_key_group(f"node-{i:05d}") for i in range(5_000)]
    counts = [groups.count(g) for g in range(keys.SCHED_KEY_GROUPS)]
    assert min(counts) > 0.5 * 5_000 / keys.SCHED_KEY_GROUPS  # every group used, evenly
    assert fnmatch.fnmatchcase(keys.sched_key("gpu-1"), keys.SCHED_KEY_PATTERN)
    assert fnmatch.fnmatchcase(keys.sched_key("gpu-1"), keys.node_key_patterns("gpu-1")[1])
