"""Redis key names (interference.keys), table-driven."""

from __future__ import annotations

import pytest

from interference import keys


def test_key_names() -> None:
    assert keys.node_key("gpu-1") == "intf:node:gpu-1"
    assert keys.node_pods_key("gpu-1") == "intf:node:gpu-1:pods"
    assert keys.pod_key("ml", "trainer-0") == "intf:pod:ml/trainer-0"
    assert keys.gpu_key("gpu-1") == "intf:gpu:gpu-1"
    assert keys.decision_key("ml", "trainer-0") == "intf:decision:ml/trainer-0"
    for name in (keys.NODES_BY_SCORE, keys.NODES_UPDATED, keys.STREAM):
        assert name.startswith(keys.PREFIX)


@pytest.mark.parametrize("node", ["gpu-1", "ip-10-0-0-1.ec2.internal", "a:b"])
def test_node_from_key_inverts_node_key(node: str) -> None:
    assert keys.node_from_key(keys.node_key(node)) == node


@pytest.mark.parametrize(
    "key", ["intf:node:gpu-1:pods", "intf:pod:ml/x", "intf:gpu:gpu-1", "node:gpu-1", ""]
)
def test_node_from_key_rejects_other_keys(key: str) -> None:
    with pytest.raises(ValueError, match="not a node key"):
        keys.node_from_key(key)


@pytest.mark.parametrize(
    ("interval_s", "ttl"),
    [(0.1, 5), (1.0, 5), (1.5, 5), (2.0, 6), (2.5, 8), (10.0, 30), (60.0, 180)],
)
def test_ttl_is_three_intervals_and_at_least_five_seconds(interval_s: float, ttl: int) -> None:
    assert keys.ttl_seconds(interval_s) == ttl
