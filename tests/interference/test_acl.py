"""The agent's per-node ACL user: its name, its rules, and what a real redis-server lets it
do with them."""

from __future__ import annotations

import pytest
import redis

from interference import acl, keys
from tests.conftest import RedisServer


@pytest.mark.parametrize(
    ("node", "username"),
    [
        ("node-a", "agent:node-a"),
        ("ip-10-0-0-1.ec2.internal", "agent:ip-10-0-0-1.ec2.internal"),
        ("a", "agent:a"),
        ("x" * 253, "agent:" + "x" * 253),
    ],
)
def test_agent_username(node: str, username: str) -> None:
    assert acl.agent_username(node) == username


@pytest.mark.parametrize(
    "node",
    [
        "",
        "*",
        "node-*",
        "node?",
        "node[ab]",
        "Node-A",
        "a:b",
        "a b",
        "-a",
        "a-",
        "a..b",
        "x" * 254,
        "node\x00",
        "node\\*",
    ],
)
def test_names_that_are_not_node_names_are_refused(node: str) -> None:
    """A glob character or ``:`` would make the key pattern cover other nodes' keys."""
    with pytest.raises(ValueError, match="node name"):
        acl.agent_username(node)
    with pytest.raises(ValueError, match="node name"):
        acl.agent_acl_rules(node, "secret")


@pytest.mark.parametrize(
    ("node", "cluster", "expected"),
    [
        (
            "node-a",
            False,
            [
                "reset", "on", ">pw", "resetchannels",
                "~intf:node:node-a", "~intf:node:node-a:*",
                "-@all", "+set", "+hset", "+expire", "+sadd", "+srem", "+xadd", "+del",
            ],
        ),
        (
            "gpu-1.example.com",
            True,
            [
                "reset", "on", ">pw", "resetchannels",
                "~intf:node:gpu-1.example.com", "~intf:node:gpu-1.example.com:*",
                "-@all", "+set", "+hset", "+expire", "+sadd", "+srem", "+xadd", "+del",
                "+cluster|slots", "+command",
            ],
        ),
    ],
)  # fmt: skip
def test_rules(node: str, cluster: bool, expected: list[str]) -> None:
    assert acl.agent_acl_rules(node, "pw", cluster=cluster) == expected


def test_rules_cover_every_key_the_agent_writes() -> None:
    """Each of the node's keys matches one of its patterns (glob as Redis reads it)."""
    import fnmatch

    node = "node-a"
    patterns = keys.node_key_patterns(node)
    own = [
        keys.node_key(node),
        keys.sched_key(node),
        keys.reports_key(node),
        keys.node_pods_key(node),
        keys.pod_key(node, "shop", "api-0"),
        keys.gpu_key(node),
    ]
    for key in own:
        assert any(fnmatch.fnmatchcase(key, p) for p in patterns), key
    others = [
        keys.node_key("node-a.b"),
        keys.sched_key("node-ab"),
        keys.node_key("node-"),
        keys.NODES_BY_INDEX,
        keys.NODES_UPDATED,
        keys.decision_key("shop", "api-0"),
        keys.rebalance_decision_key("shop", "api-0"),
    ]
    for key in others:
        assert not any(fnmatch.fnmatchcase(key, p) for p in patterns), key


@pytest.mark.parametrize("password", ["", "a b", "a\nb", "a\tb", "a\x00b"])
def test_passwords_that_would_break_the_rule_are_refused(password: str) -> None:
    with pytest.raises(ValueError, match="password"):
        acl.agent_acl_rules("node-a", password)


@pytest.mark.redis
def test_a_real_redis_holds_the_agent_to_its_node(redis_server: RedisServer) -> None:
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "agent:node-a", *acl.agent_acl_rules("node-a", "pw"))
    agent = redis.Redis(port=redis_server.port, username="agent:node-a", password="pw")
    agent.set(keys.sched_key("node-a"), b"x", ex=5)
    agent.hset(keys.pod_key("node-a", "shop", "api-0"), "cpu", "1")
    agent.xadd(keys.reports_key("node-a"), {"r": b"x"}, maxlen=10, approximate=True)
    agent.delete(keys.node_key("node-a"))
    for refused in (
        lambda: agent.set(keys.sched_key("node-b"), b"x"),
        lambda: agent.delete(keys.node_key("node-a.b")),
        lambda: agent.zadd(keys.NODES_BY_INDEX, {"node-a": 0}),
        lambda: agent.get(keys.sched_key("node-a")),  # GET is not a command it needs
        lambda: agent.publish("intf", "x"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            refused()
    # A second issue replaces the password: the old one no longer logs in.
    admin.execute_command("ACL", "SETUSER", "agent:node-a", *acl.agent_acl_rules("node-a", "p2"))
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=redis_server.port, username="agent:node-a", password="pw").ping()
