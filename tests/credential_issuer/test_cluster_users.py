"""Agent users on a real Redis Cluster with replicas: the issuer creates the user on every
node, the agent's real publisher writes its node through the cluster client with nothing
more than its own rules, and every shard refuses another node's keys."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from credential_issuer.redis_users import ISSUER_CLUSTER_COMMANDS, ISSUER_COMMANDS, AgentUsers
from credential_issuer.settings import redis_target
from interference import keys
from interference.signals import NodeMetrics, NodeReport
from node_agent.publisher import PublisherSettings, RedisPublisher
from tests.conftest import free_port
from tests.redis_topologies import redis_process

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@contextmanager
def cluster_with_replicas(workdir: Path, shards: int = 3) -> Iterator[list[int]]:
    """``shards`` primaries each with one replica; yields every node's port."""
    ports = [free_port() for _ in range(2 * shards)]
    with ExitStack() as nodes:
        for port in ports:
            args = ["--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                    "--cluster-port", str(free_port()), "--cluster-config-file",
                    f"nodes-{port}.conf", "--dir", str(workdir), "--save", "",
                    "--appendonly", "no"]  # fmt: skip
            nodes.enter_context(redis_process(args, port))
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "1", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        for port in ports:
            node = redis.Redis(port=port)
            while b"cluster_state:ok" not in node.execute_command("CLUSTER", "INFO"):
                assert time.monotonic() < deadline, "the test cluster never became ready"
                time.sleep(0.2)
        # Replicas must be known to every node's slot map before the issuer reads it.
        while len(RedisCluster(host="127.0.0.1", port=ports[0]).get_nodes()) < len(ports):
            assert time.monotonic() < deadline, "replicas never showed up in CLUSTER SLOTS"
            time.sleep(0.2)
        yield ports


def test_agent_user_on_every_node_of_a_cluster(tmp_path: Path) -> None:
    with cluster_with_replicas(tmp_path) as ports:
        # The issuer logs in as a user allowed exactly what redis_users says it needs.
        allowed = [f"+{c}" for c in (*ISSUER_COMMANDS, *ISSUER_CLUSTER_COMMANDS)]
        for port in ports:
            redis.Redis(port=port).execute_command(
                "ACL", "SETUSER", "issuer", "on", ">issuer-pw", "-@all", *allowed
            )
        target = redis_target(
            f"redis://127.0.0.1:{ports[0]}/0", cluster=True, username="issuer", password="issuer-pw"
        )
        users = AgentUsers(target, 2.0)
        try:
            applied = users.set_user("node-a", "pw-a")
        finally:
            users.close()
        assert applied.nodes == len(ports) and applied.failed_replicas == ()
        for port in ports:
            assert b"agent:node-a" in redis.Redis(port=port).execute_command("ACL", "USERS")

        publisher = RedisPublisher(
            PublisherSettings(
                redis_url=f"redis://127.0.0.1:{ports[1]}/0",
                cluster=True,
                username="agent:node-a",
                password="pw-a",
            )
        )
        try:
            for _ in range(2):
                report = NodeReport(
                    node="node-a", ts=time.time(), interval_s=1.0, metrics=NodeMetrics(),
                    measured=("runq",),
                )  # fmt: skip
                assert publisher.publish(report), "the agent could not publish its own node"
        finally:
            publisher.close()
        admin = RedisCluster(host="127.0.0.1", port=ports[0])
        assert admin.exists(keys.sched_key("node-a"), keys.reports_key("node-a")) == 2

        agent = RedisCluster(
            host="127.0.0.1", port=ports[2], username="agent:node-a", password="pw-a"
        )
        # Keys of node-b on every shard: the user exists everywhere and refuses them all.
        probes = [f"intf:node:node-b:pod:ns/p{i}" for i in range(40)]
        shards = {admin.get_node_from_key(k).name for k in probes}
        assert len(shards) == 3
        for key in probes:
            with pytest.raises(redis.exceptions.NoPermissionError):
                agent.hset(key, "x", "1")
        agent.close()
        admin.close()
