"""Redis key names: the only place they are spelled out (docs/design.md §4).

Every key an agent writes starts with its node's prefix, ``intf:node:{node}``, so one
Redis ACL user per node can be limited to exactly that node's keys
(:func:`node_key_patterns`): a node speaks only for itself. Kubernetes node names are
DNS-1123 subdomains (:func:`valid_node_name`), which hold no ``:`` and no glob
character, so ``intf:node:a:*`` never matches a key of node ``a.b`` or ``a:b``.

Every per-node key carries a TTL (the freshness window), so a dead agent's data
disappears instead of lying. The ranking sorted sets are written by the scheduler from
the signals it validated, never by agents.
"""

from __future__ import annotations

import re

from interference import sched_record

PREFIX = "intf:"

NODES_BY_INDEX = "intf:nodes"
"""Sorted set: member = node name, ranked by the interference index (0–100, stored as the
member's sorted-set value) the scheduler computed from the node's latest usable record.
Written by the scheduler's signal follower; nodes without a fresh record are removed."""

NODES_UPDATED = "intf:nodes:updated"
"""Sorted set: member = node name, ranked by the unix time of the node's latest record."""

REPORTS_FIELD = "r"
"""Field of a per-node report stream entry holding the msgpack NodeReport."""
NODE_REPORTS_MAXLEN = 10
"""Exact cap (``MAXLEN``) of each node's report stream: ten seconds at 1 s, room for
``interference record`` to read every node between two entries (a report with 30 pods is
~7.5 KB, so a longer stream would be most of Redis' memory: docs/operations.md, Sizing
Redis). Exact, since ``MAXLEN ~`` trims only whole stream nodes (100 entries)."""

DECISION_TTL_S = 24 * 3600
"""How long a decision record (placement or rebalancing record) stays readable."""

_NODE_PREFIX = "intf:node:"
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NODE_NAME_MAX = 253


def valid_node_name(name: str) -> bool:
    """True for a Kubernetes node name (a DNS-1123 subdomain of at most 253 characters)."""
    return 0 < len(name) <= NODE_NAME_MAX and _DNS_SUBDOMAIN.fullmatch(name) is not None


def node_key(node: str) -> str:
    """Hash of one node's summary metrics, decimal strings (``HGETALL intf:node:NODE``)."""
    return f"{_NODE_PREFIX}{node}"


SCHED_KEY_GROUPS = 64
"""Hash-tag groups of the scheduling records. On a Redis Cluster ``MGET`` takes keys of
one slot only; a record key per slot would cost the scheduler one command per node (measured
on a 3-shard cluster: 100–150 ms a poll at 5,000 nodes), 64 groups cost 64 (11–20 ms),
and 64 slots still spread over every shard."""
SCHED_KEY_PATTERN = f"{_NODE_PREFIX}*:sched:*"
"""``SCAN MATCH`` pattern of every scheduling record key."""
_SCHED_KEY = re.compile(rf"{_NODE_PREFIX}([^:{{}}]+):sched:\{{g(\d+)\}}")


def sched_key_group(node: str) -> int:
    """The hash-tag group of ``node``'s record (its :func:`~interference.sched_record.node_id`
    modulo :data:`SCHED_KEY_GROUPS`)."""
    return sched_record.node_id(node) % SCHED_KEY_GROUPS


def sched_key(node: str) -> str:
    """String: the node's scheduling record (:mod:`interference.sched_record`), the only
    key the scheduler reads per node: ``intf:node:NODE:sched:{gNN}``, ``{gNN}`` its group's
    hash tag (:data:`SCHED_KEY_GROUPS`)."""
    return f"{_NODE_PREFIX}{node}:sched:{{g{sched_key_group(node):02d}}}"


def reports_key(node: str) -> str:
    """Stream of the node's whole msgpack NodeReports (field :data:`REPORTS_FIELD`), capped
    at :data:`NODE_REPORTS_MAXLEN`: what ``interference record`` and ``node`` read."""
    return f"{_NODE_PREFIX}{node}:reports"


def node_pods_key(node: str) -> str:
    """Set of ``ns/name`` pod keys reported by a node in its latest report."""
    return f"{_NODE_PREFIX}{node}:pods"


def pod_key(node: str, namespace: str, name: str) -> str:
    """Hash of one pod's metrics on its node (``ns/name``; just the name without one)."""
    pod = f"{namespace}/{name}" if namespace else name
    return f"{_NODE_PREFIX}{node}:pod:{pod}"


def gpu_key(node: str) -> str:
    """Hash of a node's GPU inventory: ``count`` and ``{index}.{field}`` entries."""
    return f"{_NODE_PREFIX}{node}:gpu"


def node_key_patterns(node: str) -> tuple[str, str]:
    """The Redis ACL key patterns of every key :func:`node_key` … :func:`gpu_key` names for
    ``node`` and no other node's; ``ValueError`` for a name that is not a node name."""
    if not valid_node_name(node):
        raise ValueError(f"not a Kubernetes node name: {node[:80]!r}")
    return (node_key(node), f"{node_key(node)}:*")


def node_from_key(key: str) -> str:
    """The node of a :func:`node_key` (``ValueError`` for any other key)."""
    node = key[len(_NODE_PREFIX) :]
    if not key.startswith(_NODE_PREFIX) or not node or ":" in node:
        raise ValueError(f"not a node key: {key!r}")
    return node


def node_from_sched_key(key: str) -> str:
    """The node of a :func:`sched_key` (``ValueError`` for any other key, a group that is
    not the node's included)."""
    match = _SCHED_KEY.fullmatch(key)
    if match is None or int(match.group(2)) != sched_key_group(match.group(1)):
        raise ValueError(f"not a scheduling record key: {key!r}")
    return match.group(1)


def decision_key(namespace: str, pod: str) -> str:
    """Hash of the scheduler's latest decision for one pod: its placement record."""
    return f"intf:decision:{namespace}/{pod}"


def rebalance_decision_key(namespace: str, pod: str) -> str:
    """Hash of the rebalancer's latest look at one running pod, its rebalancing record
    (result ``would_evict``, ``evicted``, ``eviction_blocked``): the fields of a decision
    record, kept apart so that a look never overwrites why the pod was placed
    (:func:`decision_key`)."""
    return f"intf:rebalance:decision:{namespace}/{pod}"
