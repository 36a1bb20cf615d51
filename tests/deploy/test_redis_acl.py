"""The deployed Redis: its entrypoint, its ACL users, and that each program's ACL user can do
exactly what the program does — tested with the real publisher and signal cache against a
redis-server started by the rendered entrypoint script."""

from __future__ import annotations

import json
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
from interference_cli.store import CliError, Store
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.redis_signals import (
    ACL_COMMANDS,
    RedisDecisionSink,
    RedisSettings,
    RedisSignalCache,
    SignalMetrics,
    connect,
)
from tests.conftest import free_port
from tests.deploy.conftest import DeployedRedis, container_env, redis_manifests
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
        metrics=NodeMetrics(runq_p99_us=850.0, interference_index=score),
        measured=("runq",),
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
    """Every branch of the publisher: pods present, then one departed; GPUs; the stream;
    the sweep of dead nodes and a departing node's withdrawal."""
    first = [PodMetrics("shop", "api-0", uid="u0"), PodMetrics("shop", "api-1", uid="u1")]
    with agent_publisher(server) as publisher:
        assert publisher.publish(report(node, 1000.0, first))
        assert publisher.publish(report(node, 1001.0, first[:1]))
        assert publisher.sweep(2000.0) == []  # the node's hash is alive
        assert publisher.withdraw(f"{node}-departed")


VIEWER = "interference-viewer"


def viewer_store(server: DeployedRedis, password: str | None = None) -> Store:
    """The `interference` CLI's store logged in as the viewer user."""
    return Store(
        server.url,
        username=VIEWER,
        password=password if password is not None else server.secret["viewer-password"],
    )


def run_entrypoint(tmp_path: Path, **passwords: str) -> subprocess.CompletedProcess[str]:
    """The rendered entrypoint with only ``passwords`` (env name → value) set."""
    config, _ = redis_manifests()
    (tmp_path / "entrypoint.sh").write_text(config["entrypoint.sh"])
    return subprocess.run(
        ["sh", str(tmp_path / "entrypoint.sh")],
        env={"PATH": "/usr/bin:/bin", **passwords},
        capture_output=True,
        text=True,
        timeout=30,
    )


GOOD = "0123456789abcdef0123"
ALL_SET = {
    "REDIS_ADMIN_PASSWORD": GOOD + "a",
    "REDIS_AGENT_PASSWORD": GOOD + "b",
    "REDIS_SCHEDULER_PASSWORD": GOOD + "c",
    "REDIS_VIEWER_PASSWORD": GOOD + "d",
}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"REDIS_AGENT_PASSWORD": ""},
            "agent-password is empty or missing in the redis-credentials",
        ),
        ({"REDIS_VIEWER_PASSWORD": "short"}, "viewer-password in the redis-credentials Secret"),
        (
            {"REDIS_ADMIN_PASSWORD": "REPLACE-ME-admin-example-password"},
            "redis: password in the redis-credentials Secret (namespace interference-system; "
            "create it with scripts/create-redis-secret.sh) is a placeholder",
        ),
    ],
)
def test_a_missing_or_weak_password_stops_redis_naming_the_secret(
    tmp_path: Path, changes: dict[str, str], message: str
) -> None:
    done = run_entrypoint(tmp_path, **{**ALL_SET, **changes})
    assert done.returncode == 1
    assert message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_every_workload_needs_the_secret_no_default_exists() -> None:
    """No secretKeyRef is optional: without the Secret the kubelet refuses to start the
    container (``secret "redis-credentials" not found``) instead of running without it."""
    objects = render(DEPLOY)
    refs = [
        var["valueFrom"]["secretKeyRef"]
        for obj in objects
        if obj["kind"] in ("Deployment", "DaemonSet")
        for c in obj["spec"]["template"]["spec"]["containers"]
        for var in c.get("env", [])
        if "secretKeyRef" in var.get("valueFrom", {})
    ]
    assert len(refs) >= 6
    assert all(r["name"] == "redis-credentials" and not r.get("optional") for r in refs)
    # The render's Secret is a stub without data: it gives no pod a password.
    assert [o.get("data") for o in objects if o["kind"] == "Secret"] == [None]


def test_passwords_are_stored_hashed(deployed_redis: DeployedRedis) -> None:
    acl = (deployed_redis.workdir / "users.acl").read_text()
    assert acl.count("#") >= 4
    passwords = [v for k, v in deployed_redis.secret.items() if k != "username"]
    assert len(passwords) == 4
    for password in passwords:
        assert password not in acl


def test_the_default_user_is_off(deployed_redis: DeployedRedis) -> None:
    anonymous = redis.Redis(port=deployed_redis.port)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()
    as_default = redis.Redis(port=deployed_redis.port, password=deployed_redis.secret["password"])
    with pytest.raises(redis.exceptions.AuthenticationError):
        as_default.ping()
    assert (
        deployed_redis.admin().acl_getuser("default")["flags"] == ["off"]
        or "off" in (deployed_redis.admin().acl_getuser("default")["flags"])
    )


def test_the_viewer_reads_with_the_real_cli_store(deployed_redis: DeployedRedis) -> None:
    """The `interference` CLI as the viewer: top, node, explain, record's stream reads; and
    exactly the commands it sends are granted."""
    with agent_publisher(deployed_redis) as publisher:
        assert publisher.publish(report("gpu-node-1", 1001.0, [PodMetrics("shop", "api-0")]))
    admin = deployed_redis.admin()
    username, password = deployed_redis.credentials(*SCHEDULER)
    settings = RedisSettings(url=deployed_redis.url)
    scheduler = connect(settings, {"REDIS_USERNAME": username, "REDIS_PASSWORD": password})
    RedisDecisionSink(scheduler, settings, SignalMetrics(CollectorRegistry())).write(
        Decision("shop", "api-0", "scheduled", "gpu-node-1", "assigned", 1002.0)
    )
    admin.config_resetstat()
    store = viewer_store(deployed_redis)
    assert [row.node for row in store.node_rows(now=1001.5)] == ["gpu-node-1"]
    detail = store.node_detail("gpu-node-1", now=1001.5)
    assert [p.metrics.name for p in detail.pods] == ["api-0"]
    assert store.decision("shop", "api-0").node == "gpu-node-1"
    assert store.pod_row("shop", "api-0") is not None
    assert store.stream_after("0-0", block_ms=100)
    assert store.last_stream_id() != "0-0"
    used = commands_called(admin) - AUTHENTICATION
    assert granted_commands(admin, VIEWER) == used
    assert admin.acl_log() == []


def test_the_viewer_cannot_write_or_read_elsewhere(deployed_redis: DeployedRedis) -> None:
    viewer = redis.Redis(
        port=deployed_redis.port, username=VIEWER, password=deployed_redis.secret["viewer-password"]
    )
    deployed_redis.admin().set("other:key", "1")
    for forbidden in (
        lambda: viewer.hset(keys.node_key("gpu-node-1"), "score", "0"),
        lambda: viewer.xadd(keys.STREAM, {"r": b"x"}),
        lambda: viewer.hset(keys.decision_key("shop", "x"), "node", "n"),
        lambda: viewer.delete(keys.NODES_BY_SCORE),
        lambda: viewer.get("other:key"),
        lambda: viewer.hgetall("other:key"),
        lambda: viewer.flushall(),
        lambda: viewer.config_get("*"),
        lambda: viewer.keys("*"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()
    with pytest.raises(CliError, match="refused the credentials"):
        viewer_store(deployed_redis, password="wrong-password").node_rows()


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
    for forbidden in (
        lambda: agent.hset(keys.decision_key("shop", "api-0"), "node", "n"),  # the scheduler's
        lambda: agent.xread({keys.STREAM: "0-0"}),  # write-only: it reads nothing back
        lambda: agent.zrange(keys.NODES_BY_SCORE, 0, -1),
        lambda: agent.keys("*"),
        lambda: agent.config_set("appendonly", "yes"),
        lambda: agent.acl_setuser("x"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()
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
    deployed_redis.admin().set("other:key", "1")
    for forbidden in (
        lambda: scheduler.delete(keys.NODES_BY_SCORE),
        lambda: scheduler.zadd(keys.NODES_BY_SCORE, {"n": 1.0}),
        lambda: scheduler.hset("other:key", "a", "1"),
        lambda: scheduler.hgetall("other:key"),
        lambda: scheduler.hgetall(keys.decision_key("shop", "api-0")),  # writes records only
        lambda: scheduler.flushall(),
        lambda: scheduler.config_get("*"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()


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
    # Served here on loopback: the pod IP of the manifest's fieldRef is not this host's.
    env = {
        **env,
        "REDIS_URL": deployed_redis.url,
        "PATH": os.environ["PATH"],
        "HTTP_ADDRESS": "127.0.0.1",
        "HTTP_PORT": str(free_port()),
    }
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
        assert admin.zscore(keys.NODES_UPDATED, env["NODE_NAME"]) is not None
    finally:
        agent.terminate()
        _, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 0, stderr
    # The DaemonSet asks for JSON log lines: one object per line, none an ERROR.
    entries = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert entries and not [e for e in entries if e["level"] == "ERROR"], stderr
    assert admin.acl_log() == []
