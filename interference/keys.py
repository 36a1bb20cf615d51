"""Redis key names: the only place they are spelled out (docs/design.md §4).

Every per-node and per-pod hash carries a TTL so a dead agent's data disappears
instead of lying; the sorted sets are pruned by readers using ``NODES_UPDATED``.
"""

from __future__ import annotations

from interference import freshness

PREFIX = "intf:"

NODES_BY_SCORE = "intf:nodes"
"""Sorted set: member = node name, score = the node's interference index (0–100). Members
whose ``intf:node:{node}`` hash expired are removed by the agents' sweep and by readers
(:mod:`interference.freshness`); an agent removes itself on clean shutdown."""

NODES_UPDATED = "intf:nodes:updated"
"""Sorted set: member = node name, score = unix time of the node's latest report."""

STREAM = "intf:stream"
"""Stream of msgpack NodeReports, field ``r``; capped with MAXLEN ~ ``STREAM_MAXLEN``."""

STREAM_FIELD = "r"
STREAM_MAXLEN = 10_000

DECISION_TTL_S = 24 * 3600
"""How long a scheduling decision record stays readable."""


def node_key(node: str) -> str:
    """Hash of one node's summary metrics, decimal strings (``HGETALL intf:node:NODE``)."""
    return f"intf:node:{node}"


def pod_key(namespace: str, name: str) -> str:
    """Hash of one pod's metrics on its node."""
    return f"intf:pod:{namespace}/{name}"


def node_pods_key(node: str) -> str:
    """Set of ``ns/name`` pod keys reported by a node in its latest report."""
    return f"intf:node:{node}:pods"


def gpu_key(node: str) -> str:
    """Hash of a node's GPU inventory: ``count`` and ``{index}.{field}`` entries."""
    return f"intf:gpu:{node}"


def decision_key(namespace: str, pod: str) -> str:
    """Hash of the scheduler's latest decision for one pod."""
    return f"intf:decision:{namespace}/{pod}"


def node_from_key(key: str) -> str:
    """Inverse of :func:`node_key`; raises ``ValueError`` for other keys."""
    prefix = "intf:node:"
    if not key.startswith(prefix) or key.endswith(":pods"):
        raise ValueError(f"not a node key: {key!r}")
    return key[len(prefix) :]


def ttl_seconds(interval_s: float) -> int:
    """TTL of every hash: :func:`interference.freshness.ttl_seconds` (3 × the report
    interval, at least 5 s — the same age after which a report is stale)."""
    return freshness.ttl_seconds(interval_s)
