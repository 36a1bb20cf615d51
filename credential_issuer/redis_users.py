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
from redis.cluster import RedisCluster

from interference import acl
from interference_infra.redis_client import REDIS_ERRORS, RedisConnection, RedisTarget

log = logging.getLogger(__name__)

ISSUER_COMMANDS = ("acl|setuser", "ping")
"""What the issuer's own Redis user must be allowed (plus :data:`interference.acl.
CLUSTER_CLIENT_COMMANDS` on a Cluster): creating users is an administrator's right, so the
issuer is as trusted as Redis' admin."""


class RedisUnavailable(Exception):
    """The user could not be created where agents write (a primary, or the server)."""


@dataclass(frozen=True)
class Applied:
    """Where one ``ACL SETUSER`` went."""

    nodes: int
    """Servers that took it."""
    failed_replicas: tuple[str, ...] = ()
    """Cluster replicas that did not (``host:port``); agents still write, to primaries."""


class AgentUsers:
    """Sets agent users on the issuer's Redis target; threads may share it."""

    def __init__(self, target: RedisTarget, socket_timeout_s: float) -> None:
        self._redis = RedisConnection(target, socket_timeout_s)
        self._cluster = target.cluster
        self._where = target.describe()
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return self._where

    def set_user(self, node: str, password: str) -> Applied:
        """Create or reset ``agent:NODE`` with ``password`` as its only password;
        :class:`RedisUnavailable` when a server agents write to did not take it."""
        username = acl.agent_username(node)
        rules = acl.agent_acl_rules(node, password, cluster=self._cluster)
        try:
            client = self._redis.client()
            if isinstance(client, RedisCluster):
                return self._set_on_cluster(client, username, rules)
            client.execute_command("ACL", "SETUSER", username, *rules)
        except REDIS_ERRORS as exc:
            self._redis.reset()
            raise RedisUnavailable(f"Redis at {self._where}: {_describe(exc)}") from exc
        return Applied(nodes=1)

    def _set_on_cluster(
        self, client: RedisCluster[bytes], username: str, rules: list[str]
    ) -> Applied:
        # Read the slot map afresh: a node added, or a replica promoted, since the last
        # issue must get the user too (the issuer writes no keys, so no MOVED tells it).
        with self._lock:
            client.nodes_manager.initialize()
            nodes = list(client.get_nodes())
        failed_replicas: list[str] = []
        done = 0
        for node in nodes:
            name = f"{node.host}:{node.port}"
            try:
                client.get_redis_connection(node).execute_command(
                    "ACL", "SETUSER", username, *rules
                )
            except REDIS_ERRORS as exc:
                if node.server_type == "primary":
                    raise RedisUnavailable(
                        f"cluster primary {name} did not take {username}: {_describe(exc)}"
                    ) from exc
                log.warning("cluster replica %s did not take %s: %s", name, username, exc)
                failed_replicas.append(name)
            else:
                done += 1
        return Applied(nodes=done, failed_replicas=tuple(failed_replicas))

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


def _describe(exc: Exception) -> str:
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return f"{exc} (the issuer's Redis user needs {' '.join('+' + c for c in ISSUER_COMMANDS)})"
    return str(exc) or type(exc).__name__
