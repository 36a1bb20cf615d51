"""The deployed Redis: its entrypoint, its ACL users, and that each program's ACL user can do
exactly what the program does — tested with the real credential issuer's Redis code, the
agent's publisher, the scheduler's signal cache and decision writer and the CLI's store
against a redis-server started by the rendered entrypoint script.

The agents have no user in the ACL file: the credential issuer, logged in as its own user,
creates ``agent:NODE`` per node (``interference/acl.py``) after reviewing the agent's token;
here the issuer's own Redis code (``credential_issuer.redis_users.AgentUsers``) creates it,
as the issuer does once the API server named the node (the review itself needs an API
server: ``make e2e-cluster`` runs the whole path)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from credential_issuer.redis_users import ISSUER_COMMANDS, AgentUsers
from credential_issuer.settings import redis_target
from credential_issuer.warden import WARDEN_COMMANDS
from interference import acl, keys, sched_record
from interference.decision import Decision
from interference.signals import GpuDevice, NodeMetrics, NodeReport, PodMetrics
from interference_cli.errors import CliError
from interference_cli.store import Store
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.node_reports import RedisNodeReportSource
from scheduler.adapters.redis_settings import ACL_COMMANDS, RedisSettings, connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from tests.conftest import free_port
from tests.deploy.conftest import DeployedRedis, container_env, redis_manifests
from tests.deploy.manifests import DEPLOY, container, find, render

pytestmark = pytest.mark.redis

AGENT = ("DaemonSet", "interference-agent", "agent")
ISSUER = ("Deployment", "interference-credentials", "issuer")
SCHEDULER = ("Deployment", "interference-scheduler", "scheduler")
VIEWER = "interference-viewer"
AUTHENTICATION = {"auth", "hello"}
"""How redis-py logs in (``HELLO 3 AUTH …``); Redis runs them for any user, before the ACL."""
NOW = 1_700_000_000.0
"""The clock of these tests: reports are stamped just before it, so the scheduler takes them."""


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
def issuer_users(server: DeployedRedis) -> Iterator[AgentUsers]:
    """The credential issuer's Redis code logged in as the Deployment's Redis user."""
    username, password = server.credentials(*ISSUER)
    users = AgentUsers(redis_target(server.url, username=username, password=password), 5.0)
    try:
        yield users
    finally:
        users.close()


def enrol(server: DeployedRedis, node: str) -> tuple[str, str]:
    """What the issuer does for a token the API server says belongs to ``node``'s agent:
    ``agent:NODE`` with a fresh random password. Returns (username, password)."""
    password = secrets.token_hex(24)
    with issuer_users(server) as users:
        users.set_user(node, password)
    return acl.agent_username(node), password


@contextmanager
def agent_publisher(server: DeployedRedis, node: str) -> Iterator[RedisPublisher]:
    """The real publisher logged in as ``node``'s own user; closed on exit."""
    username, password = enrol(server, node)
    publisher = RedisPublisher(
        PublisherSettings(server.url, username=username, password=password, ttl_s=600)
    )
    try:
        yield publisher
    finally:
        publisher.close()


def publish_two_reports(server: DeployedRedis, node: str, *, withdraw: bool = False) -> None:
    """Every branch of the publisher: pods present, then one departed; GPUs; the node's
    report stream; with ``withdraw``, the clean-shutdown removal of the node's keys."""
    first = [PodMetrics("shop", "api-0", uid="u0"), PodMetrics("shop", "api-1", uid="u1")]
    with agent_publisher(server, node) as publisher:
        assert publisher.publish(report(node, NOW - 2, first))
        assert publisher.publish(report(node, NOW - 1, first[:1]))
        if withdraw:
            assert publisher.withdraw(node)


def client_as(server: DeployedRedis, username: str, password: str) -> redis.Redis[str]:
    return redis.Redis(
        port=server.port, username=username, password=password, decode_responses=True
    )


def viewer_store(server: DeployedRedis, password: str | None = None) -> Store:
    """The `interference` CLI's store logged in as the viewer user."""
    return Store(
        server.url,
        username=VIEWER,
        password=password if password is not None else server.secret["viewer"],
    )


def run_entrypoint(tmp_path: Path, **passwords: str) -> subprocess.CompletedProcess[str]:
    """The rendered entrypoint with only ``passwords`` (user → value; empty: no file)
    mounted."""
    config, _ = redis_manifests()
    (tmp_path / "entrypoint.sh").write_text(config["entrypoint.sh"])
    directory = tmp_path / "passwords"
    directory.mkdir()
    for user, password in passwords.items():
        if password:
            (directory / user).write_text(password)
    return subprocess.run(
        ["sh", str(tmp_path / "entrypoint.sh")],
        env={"PATH": "/usr/bin:/bin", "PASSWORD_DIR": str(directory)},
        capture_output=True,
        text=True,
        timeout=30,
    )


GOOD = "0123456789abcdef0123"
ALL_SET = {
    "admin": GOOD + "a",
    "issuer": GOOD + "b",
    "scheduler": GOOD + "c",
    "viewer": GOOD + "d",
}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"issuer": ""},
            "the password of issuer is empty or missing in the Secret redis-issuer",
        ),
        ({"viewer": "short"}, "the password of viewer in the Secret redis-viewer"),
        (
            {"admin": "REPLACE-ME-admin-example-password"},
            "redis: the password of admin in the Secret redis-admin (key password; create it "
            "with scripts/create-redis-secret.sh) is a placeholder",
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


def test_the_agents_read_no_password() -> None:
    """The agents' Redis users come from the credential issuer: no password in their env,
    no Secret mounted (which Secret each component mounts: tests/deploy/test_redis_secrets.py)."""
    agent = find(render(DEPLOY), *AGENT[:2])
    agent_env = {var["name"]: var for var in container(agent, AGENT[2])["env"]}
    assert not {"REDIS_USERNAME", "REDIS_PASSWORD", "REDIS_PASSWORD_FILE"} & set(agent_env)
    assert not any("secret" in v for v in agent["spec"]["template"]["spec"]["volumes"])


def test_passwords_are_stored_hashed(deployed_redis: DeployedRedis) -> None:
    acl_text = (deployed_redis.workdir / "users.acl").read_text()
    assert acl_text.count("#") >= 4
    passwords = list(deployed_redis.secret.values())
    assert len(passwords) == 4
    for password in passwords:
        assert password not in acl_text


def test_the_default_user_is_off(deployed_redis: DeployedRedis) -> None:
    anonymous = redis.Redis(port=deployed_redis.port)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()
    as_default = redis.Redis(port=deployed_redis.port, password=deployed_redis.secret["admin"])
    with pytest.raises(redis.exceptions.AuthenticationError):
        as_default.ping()
    assert "off" in deployed_redis.admin().acl_getuser("default")["flags"]


def test_no_shared_agent_user_exists(deployed_redis: DeployedRedis) -> None:
    """Only the issuer's users speak for nodes: the file holds no agent user at all."""
    users = set(deployed_redis.admin().acl_users())
    assert users == {
        "default",
        "admin",
        "interference-credentials",
        "interference-scheduler",
        "interference-viewer",
    }


# --- the credential issuer's user ------------------------------------------------------


def test_the_issuer_user_creates_agent_users_with_exactly_its_commands(
    deployed_redis: DeployedRedis,
) -> None:
    """The issuer's real Redis code creates ``agent:NODE``; the commands it sends are
    exactly the ones it declares (``ISSUER_COMMANDS``); its user is granted those and the
    warden's (``WARDEN_COMMANDS``, tests/deploy/test_warden.py) and no other."""
    admin = deployed_redis.admin()
    admin.config_resetstat()
    with issuer_users(deployed_redis) as users:
        assert users.ping() == ""
        users.set_user("gpu-node-1", secrets.token_hex(24))
        users.set_user("cpu-node-2", secrets.token_hex(24))
    used = commands_called(admin) - AUTHENTICATION
    username, _ = deployed_redis.credentials(*ISSUER)
    assert used == set(ISSUER_COMMANDS)
    assert granted_commands(admin, username) == set(ISSUER_COMMANDS) | set(WARDEN_COMMANDS)
    created = admin.acl_getuser("agent:gpu-node-1")
    assert created is not None and "on" in created["flags"]
    assert sorted(created["keys"]) == sorted(f"~{p}" for p in keys.node_key_patterns("gpu-node-1"))
    assert {"agent:gpu-node-1", "agent:cpu-node-2"} <= set(admin.acl_users())
    assert admin.acl_log() == []


def test_the_issuer_user_reads_no_value_writes_no_shared_key_and_no_other_admin_command(
    deployed_redis: DeployedRedis,
) -> None:
    """The warden may delete a node's keys and write its cool-down keys; it reads no value
    and touches no key the scheduler writes."""
    username, password = deployed_redis.credentials(*ISSUER)
    issuer = client_as(deployed_redis, username, password)
    deployed_redis.admin().set(keys.sched_key("gpu-node-1"), "x")
    for forbidden in (
        lambda: issuer.get(keys.sched_key("gpu-node-1")),
        lambda: issuer.hgetall(keys.node_key("gpu-node-1")),
        lambda: issuer.xrange(keys.reports_key("gpu-node-1")),
        lambda: issuer.set(keys.NODES_BY_INDEX, "forged"),
        lambda: issuer.delete(keys.NODES_BY_INDEX),
        lambda: issuer.set("intf:decision:ns/pod", "forged"),
        lambda: issuer.keys("*"),
        lambda: issuer.flushall(),
        lambda: issuer.config_set("maxmemory-policy", "allkeys-lru"),
        lambda: issuer.acl_list(),
        lambda: issuer.acl_getuser("admin"),
        lambda: issuer.acl_deluser("admin"),
        lambda: issuer.execute_command("ACL", "SAVE"),
        lambda: issuer.execute_command("ACL", "LOAD"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()
    with pytest.raises(redis.exceptions.AuthenticationError):
        client_as(deployed_redis, username, "wrong-password").ping()


# --- the agents' own users -------------------------------------------------------------


def test_an_agent_user_publishes_with_the_real_publisher(deployed_redis: DeployedRedis) -> None:
    publish_two_reports(deployed_redis, "gpu-node-1")
    admin = deployed_redis.admin()
    assert admin.hget(keys.node_key("gpu-node-1"), "interference_index") == "10"
    assert admin.smembers(keys.node_pods_key("gpu-node-1")) == {"shop/api-0"}
    assert admin.xlen(keys.reports_key("gpu-node-1")) == 2
    assert admin.exists(keys.sched_key("gpu-node-1"), keys.gpu_key("gpu-node-1")) == 2
    assert admin.acl_log() == []


def test_an_agent_user_may_run_exactly_the_commands_the_publisher_sends(
    deployed_redis: DeployedRedis,
) -> None:
    """Both ways: every command the publisher sends (clean shutdown included) is granted,
    nothing else is, and the list the issuer grants is the one the publisher declares."""
    publish_two_reports(deployed_redis, "gpu-node-2")  # enrols: ACL SETUSER is not counted
    admin = deployed_redis.admin()
    username, password = enrol(deployed_redis, "gpu-node-1")
    admin.config_resetstat()
    publisher = RedisPublisher(
        PublisherSettings(deployed_redis.url, username=username, password=password)
    )
    try:
        first = [PodMetrics("shop", "api-0", uid="u0"), PodMetrics("shop", "api-1", uid="u1")]
        assert publisher.publish(report("gpu-node-1", NOW - 2, first))
        assert publisher.publish(report("gpu-node-1", NOW - 1, first[:1]))
        assert publisher.withdraw("gpu-node-1")
    finally:
        publisher.close()
    used = commands_called(admin) - AUTHENTICATION
    assert granted_commands(admin, username) == used == set(acl.AGENT_COMMANDS)
    assert admin.acl_log() == []


OTHER = "cpu-node-2"
"""The node whose data the agent of ``gpu-node-1`` tries to change."""


def forged_writes(agent: redis.Redis[str]) -> dict[str, Callable[[], Any]]:
    """What an agent with node ``gpu-node-1``'s user could try against ``OTHER``'s data and
    the data nobody but the scheduler writes."""
    forged_record = sched_record.encode(report(OTHER, NOW + 365 * 86400, []))
    return {
        "overwrite the record": lambda: agent.set(keys.sched_key(OTHER), forged_record, ex=600),
        "overwrite the hash": lambda: agent.hset(keys.node_key(OTHER), "interference_index", "0"),
        "delete the record": lambda: agent.delete(keys.sched_key(OTHER)),
        "delete the stream": lambda: agent.delete(keys.reports_key(OTHER)),
        "trim the stream": lambda: agent.xadd(keys.reports_key(OTHER), {"r": b"x"}, maxlen=0),
        "XTRIM the stream": lambda: agent.xtrim(keys.reports_key(OTHER), maxlen=0),
        "expire the record": lambda: agent.expire(keys.sched_key(OTHER), 0),
        "drop a pod": lambda: agent.srem(keys.node_pods_key(OTHER), "shop/api-0"),
        "forge a GPU": lambda: agent.hset(keys.gpu_key(OTHER), "0.name", "H200"),
        "a longer name": lambda: agent.set(keys.sched_key("gpu-node-10"), forged_record),
        "a subdomain": lambda: agent.set(keys.sched_key("gpu-node-1.example"), forged_record),
        "rank itself": lambda: agent.zadd(keys.NODES_BY_INDEX, {"gpu-node-1": 0.0}),
        "a decision": lambda: agent.hset(keys.decision_key("shop", "api-0"), "node", "n"),
        "read its record back": lambda: agent.get(keys.sched_key("gpu-node-1")),
        "read another node": lambda: agent.hgetall(keys.node_key(OTHER)),
        "list keys": lambda: agent.keys("*"),
        "rename into place": lambda: agent.rename(
            keys.sched_key("gpu-node-1"), keys.sched_key(OTHER)
        ),
        "give itself more": lambda: agent.acl_setuser("agent:gpu-node-1", keys=["~*"]),
        "reconfigure": lambda: agent.config_set("maxmemory-policy", "allkeys-random"),
        "flush": lambda: agent.flushall(),
    }


def test_an_agent_cannot_change_another_nodes_data_and_each_try_is_logged(
    deployed_redis: DeployedRedis,
) -> None:
    """Node A's user, as the issuer grants it, against node B: every write, delete, trim or
    expiry is refused with NOPERM, counted in Redis' ACL LOG under A's user, and B's data
    are exactly as B published them."""
    publish_two_reports(deployed_redis, OTHER)
    admin = deployed_redis.admin()
    before = {key: admin.dump(key) for key in admin.scan_iter(match=f"{keys.node_key(OTHER)}*")}
    assert keys.sched_key(OTHER) in before and keys.reports_key(OTHER) in before
    username, password = enrol(deployed_redis, "gpu-node-1")
    agent = client_as(deployed_redis, username, password)
    admin.acl_log_reset()
    attempts = forged_writes(agent)
    for what, attempt in attempts.items():
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
        assert what  # named in the failure's traceback
    after = {key: admin.dump(key) for key in admin.scan_iter(match=f"{keys.node_key(OTHER)}*")}
    assert after == before
    assert not admin.exists(keys.sched_key("gpu-node-10"), keys.sched_key("gpu-node-1.example"))
    log = admin.acl_log(count=100)
    assert {entry["username"] for entry in log} == {username}
    assert sum(int(entry["count"]) for entry in log) == len(attempts)


def test_enrolling_again_replaces_the_password(deployed_redis: DeployedRedis) -> None:
    """A second issue for the same node (a new agent pod, Redis restarted) leaves only the
    newest password working."""
    username, first = enrol(deployed_redis, "gpu-node-1")
    client_as(deployed_redis, username, first).set(keys.sched_key("gpu-node-1"), "1")
    _, second = enrol(deployed_redis, "gpu-node-1")
    with pytest.raises(redis.exceptions.AuthenticationError):
        client_as(deployed_redis, username, first).ping()
    client_as(deployed_redis, username, second).set(keys.sched_key("gpu-node-1"), "2")


# --- the scheduler's user ----------------------------------------------------------------


def exercise_scheduler_store(
    server: DeployedRedis, nodes: list[str]
) -> tuple[RedisSignalCache, set[str]]:
    """The scheduler's Redis adapters as deployed, logged in with the Deployment's
    credentials: read every known node's record, write the ranking, count strays, write a
    placement and a rebalancing record. Returns the cache and the commands the adapters
    sent."""
    admin = server.admin()
    username, password = server.credentials(*SCHEDULER)
    settings = RedisSettings(url=server.url)
    metrics = SignalMetrics(CollectorRegistry())
    client = connect(settings, {"REDIS_USERNAME": username, "REDIS_PASSWORD": password})
    cache = RedisSignalCache(
        client, settings, metrics, known_nodes=lambda: nodes, clock=lambda: NOW
    )
    # A node the ranking still lists but the scheduler no longer knows: it is removed.
    admin.zadd(keys.NODES_BY_INDEX, {"departed-node": 50.0})
    admin.zadd(keys.NODES_UPDATED, {"departed-node": NOW - 60})
    admin.config_resetstat()
    assert cache.poll_once() == len(nodes)
    assert cache.write_ranking()
    cache.count_strays()
    assert set(RedisNodeReportSource(client).recent(nodes)) <= set(nodes)  # the rebalancer's read
    RedisDecisionSink(client, settings, metrics).write(
        Decision("shop", "api-2", "scheduled", nodes[-1], "assigned", NOW)
    )
    RedisDecisionSink(  # … and its rebalancing records, under the rebalancer's own key
        client, settings, metrics, record_key=keys.rebalance_decision_key
    ).write(Decision("shop", "api-2", "would_evict", nodes[0], "would evict", NOW, dry_run=True))
    assert metrics.decision_write_errors._value.get() == 0
    assert metrics.ranking_errors._value.get() == 0
    return cache, commands_called(admin) - AUTHENTICATION


def test_the_scheduler_user_reads_records_writes_ranking_and_decisions(
    deployed_redis: DeployedRedis,
) -> None:
    publish_two_reports(deployed_redis, "gpu-node-1")
    publish_two_reports(deployed_redis, "cpu-node-2")
    cache, _ = exercise_scheduler_store(deployed_redis, ["gpu-node-1", "cpu-node-2"])
    assert cache.healthy() or cache.polls == 1
    admin = deployed_redis.admin()
    assert set(admin.zrange(keys.NODES_BY_INDEX, 0, -1)) == {"gpu-node-1", "cpu-node-2"}
    assert set(admin.zrange(keys.NODES_UPDATED, 0, -1)) == {"gpu-node-1", "cpu-node-2"}
    assert admin.hget(keys.decision_key("shop", "api-2"), "node") == "cpu-node-2"
    assert admin.hget(keys.rebalance_decision_key("shop", "api-2"), "result") == "would_evict"
    assert admin.acl_log() == []


def test_the_scheduler_user_may_run_exactly_the_commands_its_adapters_send(
    deployed_redis: DeployedRedis,
) -> None:
    """Both ways, and the adapters' own ACL_COMMANDS (quoted in their error messages) agree."""
    publish_two_reports(deployed_redis, "gpu-node-1")
    # A record under a name that is no Node the scheduler knows: the stray count's SCAN.
    publish_two_reports(deployed_redis, "not-a-known-node")
    _, used = exercise_scheduler_store(deployed_redis, ["gpu-node-1"])
    username, _ = deployed_redis.credentials(*SCHEDULER)
    assert granted_commands(deployed_redis.admin(), username) == used == set(ACL_COMMANDS)


def test_the_scheduler_user_cannot_write_signals(deployed_redis: DeployedRedis) -> None:
    publish_two_reports(deployed_redis, "gpu-node-1")
    username, password = deployed_redis.credentials(*SCHEDULER)
    scheduler = client_as(deployed_redis, username, password)
    deployed_redis.admin().set("other:key", "1")
    for forbidden in (
        lambda: scheduler.hset(keys.node_key("gpu-node-1"), "interference_index", "0"),
        lambda: scheduler.mset({keys.sched_key("gpu-node-1"): "forged"}),
        lambda: scheduler.delete(keys.sched_key("gpu-node-1")),
        lambda: scheduler.xadd(keys.reports_key("gpu-node-1"), {"r": b"x"}),
        lambda: scheduler.expire(keys.sched_key("gpu-node-1"), 0),
        lambda: scheduler.delete(keys.NODES_BY_INDEX),
        lambda: scheduler.hset("other:key", "a", "1"),
        lambda: scheduler.mget(["other:key"]),
        lambda: scheduler.hgetall(keys.decision_key("shop", "api-0")),  # writes records only
        lambda: scheduler.acl_setuser("agent:gpu-node-1", keys=["~*"]),
        lambda: scheduler.flushall(),
        lambda: scheduler.config_get("*"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()


# --- the viewer's user -------------------------------------------------------------------


def test_the_viewer_reads_every_kind_of_key(deployed_redis: DeployedRedis) -> None:
    """Everything people read: a node's record, hash, pod set, pod rows, GPU hash and report
    stream, the ranking and a decision record."""
    publish_two_reports(deployed_redis, "gpu-node-1")
    exercise_scheduler_store(deployed_redis, ["gpu-node-1"])
    viewer = redis.Redis(
        port=deployed_redis.port, username=VIEWER, password=deployed_redis.secret["viewer"]
    )
    node = "gpu-node-1"
    assert sched_record.decode(viewer.get(keys.sched_key(node)))["ts"] == NOW - 1
    assert viewer.hgetall(keys.node_key(node))[b"interference_index"] == b"10"
    assert viewer.smembers(keys.node_pods_key(node)) == {b"shop/api-0"}
    assert viewer.hgetall(keys.pod_key(node, "shop", "api-0"))
    assert viewer.hgetall(keys.gpu_key(node))
    assert len(viewer.xrevrange(keys.reports_key(node), count=1)) == 1
    assert viewer.xread({keys.reports_key(node): "0-0"}, count=10, block=10)
    assert viewer.zrange(keys.NODES_BY_INDEX, 0, -1) == [node.encode()]
    assert viewer.zscore(keys.NODES_UPDATED, node) is not None
    assert viewer.hgetall(keys.decision_key("shop", "api-2"))[b"node"] == node.encode()
    assert viewer.hgetall(keys.rebalance_decision_key("shop", "api-2"))[b"result"] == (
        b"would_evict"
    )
    assert deployed_redis.admin().acl_log() == []


def test_the_viewer_reads_with_the_real_cli_store(deployed_redis: DeployedRedis) -> None:
    """The `interference` CLI as the viewer: top, node and explain; every command it sends
    is granted."""
    publish_two_reports(deployed_redis, "gpu-node-1")
    exercise_scheduler_store(deployed_redis, ["gpu-node-1"])
    admin = deployed_redis.admin()
    admin.config_resetstat()
    store = viewer_store(deployed_redis)
    assert [row.node for row in store.node_rows(now=NOW)] == ["gpu-node-1"]
    assert [p.metrics.name for p in store.node_detail("gpu-node-1", now=NOW).pods] == ["api-0"]
    assert store.decision("shop", "api-2").node == "gpu-node-1"
    records = store.pod_records("shop", "api-2")
    assert records.rebalancing is not None and records.rebalancing.result == "would_evict"
    used = commands_called(admin) - AUTHENTICATION
    assert used <= granted_commands(admin, VIEWER)
    assert admin.acl_log() == []


def test_the_viewer_cannot_write_or_read_elsewhere(deployed_redis: DeployedRedis) -> None:
    viewer = client_as(deployed_redis, VIEWER, deployed_redis.secret["viewer"])
    deployed_redis.admin().set("other:key", "1")
    for forbidden in (
        lambda: viewer.hset(keys.node_key("gpu-node-1"), "interference_index", "0"),
        lambda: viewer.set(keys.sched_key("gpu-node-1"), "x"),
        lambda: viewer.xadd(keys.reports_key("gpu-node-1"), {"r": b"x"}),
        lambda: viewer.hset(keys.decision_key("shop", "x"), "node", "n"),
        lambda: viewer.hset(keys.rebalance_decision_key("shop", "x"), "node", "n"),
        lambda: viewer.delete(keys.NODES_BY_INDEX),
        lambda: viewer.get("other:key"),
        lambda: viewer.hgetall("other:key"),
        lambda: viewer.flushall(),
        lambda: viewer.config_get("*"),
        lambda: viewer.acl_list(),
        lambda: viewer.keys("*"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()
    with pytest.raises(CliError, match="refused the credentials"):
        viewer_store(deployed_redis, password="wrong-password").node_rows()


def commands_called(admin: redis.Redis[str]) -> set[str]:
    """Commands run since the last CONFIG RESETSTAT (Redis counts a command once it has
    run, so the INFO that asks is not among them; the scheduler's own INFO is)."""
    stats = admin.info("commandstats")
    return {name.removeprefix("cmdstat_") for name in stats} - {"config|resetstat"}


def granted_commands(admin: redis.Redis[str], username: str) -> set[str]:
    """The ``+command`` grants of an ACL user, which must grant no category."""
    user = admin.acl_getuser(username)
    assert user is not None, f"no ACL user {username}"
    assert user["categories"] == ["-@all"], f"{username} must grant commands one by one"
    assert all(c.startswith("+") for c in user["commands"]), user["commands"]
    return {c[1:] for c in user["commands"]}


@pytest.mark.slow
def test_the_real_agent_publishes_with_the_daemonset_env(deployed_redis: DeployedRedis) -> None:
    """``interference-agent`` started with the DaemonSet's environment (only the Redis
    address pointed here) logs in as its node's own ACL user and publishes its node. The
    user and password are the ones the issuer hands out (here given directly: the issuer's
    TokenReview needs an API server, ``make e2e-cluster`` runs that path)."""
    workload = find(render(DEPLOY), AGENT[0], AGENT[1])
    env = container_env(container(workload, AGENT[2])["env"], {})
    assert {"CREDENTIALS_URL", "TOKEN_FILE"} <= set(env)
    del env["CREDENTIALS_URL"], env["TOKEN_FILE"]
    username, password = enrol(deployed_redis, env["NODE_NAME"])
    # Served here on loopback: the pod IP of the manifest's fieldRef is not this host's.
    env = {
        **env,
        "REDIS_USERNAME": username,
        "REDIS_PASSWORD": password,
        # Redis' TLS port and its CA as the DaemonSet mounts it (ConfigMap redis-ca).
        "REDIS_URL": deployed_redis.tls_url,
        "REDIS_CA_FILE": str(deployed_redis.ca_file),
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
        while not admin.exists(keys.sched_key(env["NODE_NAME"])):
            assert agent.poll() is None, agent.communicate()[1]
            assert time.monotonic() < deadline, "the agent published nothing within 60 s"
            time.sleep(0.2)
        assert admin.exists(keys.node_key(env["NODE_NAME"]))
    finally:
        agent.terminate()
        _, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 0, stderr
    # The DaemonSet asks for JSON log lines: one object per line, none an ERROR.
    entries = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert entries and not [e for e in entries if e["level"] == "ERROR"], stderr
    assert admin.acl_log() == []
