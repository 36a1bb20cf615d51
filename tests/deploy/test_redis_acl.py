"""The deployed Redis: its entrypoint, its ACL users, and that each program's ACL user can do
exactly what the program does — tested with the real publisher and signal cache against a
redis-server started by the rendered entrypoint script."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from interference import keys
from interference.decision import Decision
from interference.signals import GpuDevice, NodeMetrics, NodeReport, PodMetrics
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.redis_signals import (
    ACL_COMMANDS,
    RedisDecisionSink,
    RedisSettings,
    RedisSignalCache,
    SignalMetrics,
    connect,
)
from tests.deploy.conftest import DeployedRedis, container_env, example_secret, redis_manifests
from tests.deploy.manifests import DEPLOY, container, find, render

pytestmark = pytest.mark.redis

AGENT = ("DaemonSet", "interference-agent", "agent")
AUTHENTICATION = {"auth", "hello"}
"""How redis-py logs in (``HELLO 3 AUTH …``); Redis runs them for any user, before the ACL."""


def report(node: str, ts: float, pods: list[PodMetrics], score: float = 10.0) -> NodeReport:
    gpus = [GpuDevice(0, "GPU-0", "NVIDIA H100 80GB HBM3", 81559, 1200, 35.0, 1)]
    return NodeReport(
        node=node,
        ts=ts,
        interval_s=1.0,
        metrics=NodeMetrics(runq_p99_us=850.0, score=score),
        histograms={"runq_us": [0, 3, 9, 4, 1]},
        pods=pods,
        gpus=gpus,
    )


@contextmanager
def agent_publisher(server: DeployedRedis) -> Iterator[RedisPublisher]:
    """The real publisher logged in as the DaemonSet's ACL user; closed on exit."""
    username, password = server.credentials(*AGENT)
    publisher = RedisPublisher(PublisherSettings(server.url, username=username, password=password))
    try:
        yield publisher
    finally:
        publisher.close()


def publish_two_reports(server: DeployedRedis, node: str) -> None:
    """Every branch of the publisher: pods present, then one departed; GPUs; the stream."""
    first = [PodMetrics("shop", "api-0", uid="u0"), PodMetrics("shop", "api-1", uid="u1")]
    with agent_publisher(server) as publisher:
        assert publisher.publish(report(node, 1000.0, first))
        assert publisher.publish(report(node, 1001.0, first[:1]))


def test_example_passwords_make_the_entrypoint_warn(tmp_path: Path) -> None:
    server = DeployedRedis(workdir=tmp_path, secret=example_secret())
    server.start()
    server.stop()
    assert "still holds the example passwords" in server.stderr


def test_a_missing_password_stops_the_entrypoint_naming_the_secret_key(tmp_path: Path) -> None:
    config, env = redis_manifests()
    (tmp_path / "entrypoint.sh").write_text(config["entrypoint.sh"])
    environment = {"PATH": "/usr/bin:/bin", "REDIS_ADMIN_PASSWORD": "x", "REDIS_AGENT_PASSWORD": ""}
    done = subprocess.run(
        ["sh", str(tmp_path / "entrypoint.sh")],
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert "set agent-password in the redis-credentials Secret" in done.stderr
    assert {"REDIS_ADMIN_PASSWORD", "REDIS_AGENT_PASSWORD"} <= {str(v["name"]) for v in env}


def test_passwords_are_stored_hashed(deployed_redis: DeployedRedis) -> None:
    acl = (deployed_redis.workdir / "users.acl").read_text()
    assert acl.count("#") >= 3
    for password in deployed_redis.secret.values():
        assert password not in acl


def test_the_agent_user_publishes_with_the_real_publisher(deployed_redis: DeployedRedis) -> None:
    publish_two_reports(deployed_redis, "gpu-node-1")
    admin = deployed_redis.admin()
    assert admin.hget(keys.node_key("gpu-node-1"), "score") == "10"
    assert admin.smembers(keys.node_pods_key("gpu-node-1")) == {"shop/api-0"}
    assert admin.xlen(keys.STREAM) == 2
    assert admin.acl_log() == []


def test_the_agent_user_is_confined_to_its_keys_and_commands(
    deployed_redis: DeployedRedis,
) -> None:
    username, password = deployed_redis.credentials(*AGENT)
    agent = redis.Redis(port=deployed_redis.port, username=username, password=password)
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.hset("other:key", "a", "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.flushall()
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.hgetall(keys.node_key("gpu-node-1"))
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(port=deployed_redis.port, username=username, password="wrong").ping()


def test_the_agent_user_may_run_exactly_the_commands_the_publisher_sends(
    deployed_redis: DeployedRedis,
) -> None:
    """Both ways: every command the publisher sends is granted, nothing else is."""
    admin = deployed_redis.admin()
    admin.config_resetstat()
    publish_two_reports(deployed_redis, "gpu-node-1")
    used = commands_called(admin) - AUTHENTICATION
    username, _ = deployed_redis.credentials(*AGENT)
    assert granted_commands(admin, username) == used


def commands_called(admin: redis.Redis[str]) -> set[str]:
    """Commands run since the last CONFIG RESETSTAT, minus the INFO that asks."""
    stats = admin.info("commandstats")
    return {name.removeprefix("cmdstat_") for name in stats} - {"info", "config|resetstat"}


def granted_commands(admin: redis.Redis[str], username: str) -> set[str]:
    """The ``+command`` grants of an ACL user, which must grant no category."""
    user = admin.acl_getuser(username)
    assert user is not None, f"no ACL user {username}"
    assert user["categories"] == ["-@all"], f"{username} must grant commands one by one"
    assert all(c.startswith("+") for c in user["commands"]), user["commands"]
    return {c[1:] for c in user["commands"]}


SCHEDULER = ("Deployment", "interference-scheduler", "scheduler")


def exercise_scheduler_store(server: DeployedRedis) -> tuple[RedisSignalCache, set[str]]:
    """The scheduler's Redis adapters as deployed: bootstrap from the hashes, follow the
    stream, write a decision record — logged in with the Deployment's credentials.

    Returns the cache and the commands the adapters sent (the agent's publish in between,
    which gives the stream something to follow, is left out)."""
    admin = server.admin()
    username, password = server.credentials(*SCHEDULER)
    settings = RedisSettings(url=server.url, block_ms=200)
    metrics = SignalMetrics(CollectorRegistry())
    client = connect(settings, {"REDIS_USERNAME": username, "REDIS_PASSWORD": password})
    cache = RedisSignalCache(client, settings, metrics, clock=lambda: 1002.0)
    admin.config_resetstat()
    cache.bootstrap()
    used = commands_called(admin)
    with agent_publisher(server) as publisher:
        assert publisher.publish(report("cpu-node-2", 1001.5, [], score=55.0))
    admin.config_resetstat()
    cache.follow_once()
    RedisDecisionSink(client, settings, metrics).write(
        Decision("shop", "api-2", "scheduled", "cpu-node-2", "assigned", 1002.0)
    )
    return cache, (used | commands_called(admin)) - AUTHENTICATION


def test_the_scheduler_user_reads_signals_and_writes_decisions(
    deployed_redis: DeployedRedis,
) -> None:
    publish_two_reports(deployed_redis, "gpu-node-1")
    cache, _ = exercise_scheduler_store(deployed_redis)
    assert cache.healthy()
    assert set(cache.snapshot()) == {"gpu-node-1", "cpu-node-2"}
    admin = deployed_redis.admin()
    assert admin.hget(keys.decision_key("shop", "api-2"), "node") == "cpu-node-2"
    assert admin.acl_log() == []


def test_the_scheduler_user_cannot_write_signals(deployed_redis: DeployedRedis) -> None:
    username, password = deployed_redis.credentials(*SCHEDULER)
    scheduler = redis.Redis(port=deployed_redis.port, username=username, password=password)
    with pytest.raises(redis.exceptions.NoPermissionError):
        scheduler.hset(keys.node_key("gpu-node-1"), "score", "0")
    with pytest.raises(redis.exceptions.NoPermissionError):
        scheduler.xadd(keys.STREAM, {"r": b"x"})


def test_the_scheduler_user_may_run_exactly_the_commands_its_adapters_send(
    deployed_redis: DeployedRedis,
) -> None:
    """Both ways, and the adapters' own ACL_COMMANDS (quoted in their error messages) agree."""
    publish_two_reports(deployed_redis, "gpu-node-1")
    _, used = exercise_scheduler_store(deployed_redis)
    username, _ = deployed_redis.credentials(*SCHEDULER)
    assert granted_commands(deployed_redis.admin(), username) == used == set(ACL_COMMANDS)


@pytest.mark.slow
def test_the_real_agent_publishes_with_the_daemonset_env(deployed_redis: DeployedRedis) -> None:
    """``interference-agent`` started with the DaemonSet's environment (only the Redis
    address pointed here) logs in as its ACL user and publishes its node."""
    workload = find(render(DEPLOY), AGENT[0], AGENT[1])
    env = container_env(container(workload, AGENT[2])["env"], deployed_redis.secret)
    env = {**env, "REDIS_URL": deployed_redis.url, "PATH": os.environ["PATH"]}
    agent = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "interference-agent"),
            "--no-kubernetes",
            "--probes",
            "psi,network",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    admin = deployed_redis.admin()
    try:
        deadline = time.monotonic() + 60
        while not admin.exists(keys.node_key(env["NODE_NAME"])):
            assert agent.poll() is None, agent.communicate()[1]
            assert time.monotonic() < deadline, "the agent published nothing within 60 s"
            time.sleep(0.2)
    finally:
        agent.terminate()
        _, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 0, stderr
    assert "ERROR node_agent.publisher" not in stderr, stderr
    assert admin.acl_log() == []
    assert admin.zscore(keys.NODES_UPDATED, env["NODE_NAME"]) is not None
