"""Creating the agents' ACL users in Redis: on the one server, on the master a Sentinel
names, or on every node of a Redis Cluster, primaries and replicas.

ACL users live in each server's memory (they are not replicated, and not in the cluster
bus): a Cluster's agent writes to every primary, and a replica promoted by a failover must
know the user too. A node that did not take it (down, or restarted since) answers the agent
``WRONGPASS`` on its next connection, and the agent enrols again, which reaches every node
the cluster has then.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import redis
from redis.cluster import ClusterNode, RedisCluster

from interference import acl
from interference_infra.redis_client import REDIS_ERRORS, RedisConnection, RedisTarget

log = logging.getLogger(__name__)

ISSUER_COMMANDS = ("acl|setuser", "client|kill", "ping")
"""What the issuer's own Redis user must be allowed (plus :data:`ISSUER_CLUSTER_COMMANDS`
on a Cluster): creating users is an administrator's right, so the issuer is as trusted as
Redis' admin. ``CLIENT KILL USER`` closes the sessions of a re-issued user's old password
(``ACL SETUSER`` changes the password, not who is logged in)."""
ISSUER_CLUSTER_COMMANDS = (*acl.CLUSTER_CLIENT_COMMANDS, "cluster|nodes")
"""On a Cluster the issuer also reads the slot map and the node list."""


class RedisUnavailable(Exception):
    """The user could not be created where agents write (a primary, or the server)."""


@dataclass(frozen=True)
class Applied:
    """Where one ``ACL SETUSER`` went."""

    nodes: int
    """Servers that took it."""
    failed_replicas: tuple[str, ...] = ()
    """Cluster replicas that did not (``host:port``); agents still write, to primaries."""
    sessions_closed: int = 0
    """Connections logged in as the user before (with the old password), now closed."""


class AgentUsers:
    """Sets agent users on the issuer's Redis target; threads may share it."""

    def __init__(self, target: RedisTarget, socket_timeout_s: float) -> None:
        self._redis = RedisConnection(target, socket_timeout_s)
        self._cluster = target.cluster
        self._where = target.describe()
        self._lock = threading.Lock()
        self._extra: dict[str, ClusterNode] = {}
        """Cluster nodes outside the client's slot map (replicas still syncing)."""

    @property
    def where(self) -> str:
        return self._where

    def set_user(self, node: str, password: str) -> Applied:
        """Create or reset ``agent:NODE`` with ``password`` as its only password and close
        the connections logged in as it before; :class:`RedisUnavailable` when a server
        agents write to did not take it."""
        username = acl.agent_username(node)
        rules = acl.agent_acl_rules(node, password, cluster=self._cluster)
        try:
            client = self._redis.client()
            if isinstance(client, RedisCluster):
                return self._set_on_cluster(client, username, rules)
            client.execute_command("ACL", "SETUSER", username, *rules)
            closed = int(client.execute_command("CLIENT", "KILL", "USER", username))
        except REDIS_ERRORS as exc:
            self._redis.reset()
            raise RedisUnavailable(f"Redis at {self._where}: {_describe(exc)}") from exc
        return Applied(nodes=1, sessions_closed=closed)

    def _set_on_cluster(
        self, client: RedisCluster[bytes], username: str, rules: list[str]
    ) -> Applied:
        failed_replicas: list[str] = []
        done = closed = 0
        for name, node, primary in self._cluster_nodes(client):
            try:
                connection = client.get_redis_connection(node)
                connection.execute_command("ACL", "SETUSER", username, *rules)
                closed += int(connection.execute_command("CLIENT", "KILL", "USER", username))
            except REDIS_ERRORS as exc:
                if primary:
                    raise RedisUnavailable(
                        f"cluster primary {name} did not take {username}: {_describe(exc)}"
                    ) from exc
                log.warning("cluster replica %s did not take %s: %s", name, username, exc)
                failed_replicas.append(name)
            else:
                done += 1
        return Applied(nodes=done, failed_replicas=tuple(failed_replicas), sessions_closed=closed)

    def _cluster_nodes(self, client: RedisCluster[bytes]) -> list[tuple[str, ClusterNode, bool]]:
        """Every node of the cluster as ``(host:port, node, is primary)``, as a primary's
        ``CLUSTER NODES`` lists them now: a node added, a replica still syncing (which
        ``CLUSTER SLOTS`` leaves out) or one promoted since the last issue is included.
        Nodes flagged failed, in handshake or without an address are left out (they
        get the user when their agent enrols again)."""
        with self._lock:
            client.nodes_manager.initialize()
            seed = client.get_default_node() or client.get_random_node()
            table = client.get_redis_connection(seed).execute_command("CLUSTER NODES")
            out: list[tuple[str, ClusterNode, bool]] = []
            for address, info in table.items():
                flags = set(str(info.get("flags", "")).split(","))
                host, _, port = str(address).rpartition(":")
                if flags & {"fail", "handshake", "noaddr"} or not host or port in ("", "0"):
                    continue
                name = f"{host}:{port}"
                known = client.get_node(host=host, port=int(port))
                # not in the slot map (yet): a node of our own
                node = known or self._extra.setdefault(name, ClusterNode(host, int(port)))
                out.append((name, node, "master" in flags))
            return out

    def ping(self) -> str:
        """ "" when the target answers, else why not (for ``/readyz``)."""
        try:
            self._redis.client().ping()
        except REDIS_ERRORS as exc:
            self._redis.reset()
            return f"Redis at {self._where} does not answer: {_describe(exc)}"
        return ""

    def close(self) -> None:
        self._redis.close()
        with self._lock:
            extra, self._extra = list(self._extra.values()), {}
        for node in extra:
            if node.redis_connection is not None:
                node.redis_connection.close()


def _describe(exc: Exception) -> str:
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return f"{exc} (the issuer's Redis user needs {' '.join('+' + c for c in ISSUER_COMMANDS)})"
    return str(exc) or type(exc).__name__
