"""Signals survive memory pressure: the deployed Redis (its shipped redis.conf, entrypoint
and ACL users) filled with decision records by the scheduler's real decision writer never
loses a live signal key — the decision writes fail instead, and the scheduler counts them.

The shipped ``maxmemory`` is 400 MB; to fill it in seconds these tests start the same
server with a smaller ``--maxmemory`` on top of the shipped file, which changes the size
only: the policy under test is the file's. The last test starts it with the policy used
before (``volatile-ttl``) and shows the signals evicted, so the check can fail."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from interference.decision import CandidateVerdict, Decision
from interference.signals import NodeMetrics, NodeReport, PodMetrics
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.signal_metrics import SignalMetrics
from tests.deploy.conftest import DeployedRedis, redis_manifests
from tests.deploy.test_redis_acl import SCHEDULER, enrol

pytestmark = pytest.mark.redis

NODES = [f"node-{i}" for i in range(12)]
NOW = 1_700_000_000.0
SMALL_MAXMEMORY = "24mb"


def shipped(directive: str) -> str:
    """A directive's value in the rendered redis.conf."""
    config, _ = redis_manifests()
    (value,) = re.findall(rf"^{directive}\s+(\S+)\s*$", config["redis.conf"], re.MULTILINE)
    return value


def test_the_shipped_config_never_evicts() -> None:
    assert shipped("maxmemory-policy") == "noeviction"
    assert shipped("maxmemory") == "400mb"


def start(tmp_path: Path, *extra: str) -> DeployedRedis:
    server = DeployedRedis(
        workdir=tmp_path,
        extra_args=("--maxmemory", SMALL_MAXMEMORY, *extra),
    )
    server.start()
    return server


@pytest.fixture
def small_redis(tmp_path: Path) -> Iterator[DeployedRedis]:
    server = start(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def node_report(node: str, ts: float) -> NodeReport:
    pods = [PodMetrics("shop", f"api-{i}", uid=f"{node}-{i}", cpu_ms_per_s=50.0) for i in range(30)]
    return NodeReport(
        node=node,
        ts=ts,
        interval_s=1.0,
        metrics=NodeMetrics(runq_p50_us=40, runq_p99_us=900, interference_index=20),
        measured=("psi", "runq"),
        histograms={"runq_us": [0, 12, 40, 22, 7, 1]},
        pods=pods,
    )


def publishers(server: DeployedRedis) -> dict[str, RedisPublisher]:
    """Each node's real publisher, logged in as its own issued user (the signals' TTL is
    long here, so nothing expires while the test runs)."""
    found = {}
    for node in NODES:
        username, password = enrol(server, node)
        found[node] = RedisPublisher(
            PublisherSettings(server.url, username=username, password=password, ttl_s=3600)
        )
    return found


def signal_keys(admin: redis.Redis[str]) -> dict[str, bytes | None]:
    """Every per-node key and its serialized value (DUMP)."""
    raw = redis.Redis(connection_pool=admin.connection_pool)
    names = sorted(admin.scan_iter(match="intf:node:*", count=1000))
    return {name: raw.dump(name) for name in names}  # type: ignore[misc]


def decision(i: int) -> Decision:
    """A decision record the size the cycle writes (record_top_k = 5 candidates scored, as
    many rejected, counts per reason): about 3 KiB in Redis."""
    scored = [
        CandidateVerdict(
            f"node-{j}",
            True,
            [],
            {"Interference": 85.0, "NodeResourcesFit": 60.0, "GpuPacking": 50.0},
            78.0,
            weights={"Interference": 2, "NodeResourcesFit": 1, "GpuPacking": 1},
        )
        for j in range(5)
    ]
    rejected = [
        CandidateVerdict(
            f"node-r{j}", False, ["node(s) exceeded the pod's run-queue p99 tolerance"]
        )
        for j in range(5)
    ]
    return Decision(
        "batch",
        f"job-{i:07d}-x7k2p",
        "scheduled",
        "node-1",
        f"Successfully assigned batch/job-{i:07d}-x7k2p to node-1",
        NOW,
        candidates=scored + rejected,
        rejected_by_reason={"Insufficient cpu": 4000, "node(s) had untolerated taint": 12},
    )


def fill_with_decisions(server: DeployedRedis) -> tuple[SignalMetrics, int]:
    """Write decision records as the deployed scheduler does (its user, its sink, batches of
    ``decision_batch``) until Redis refuses some; returns the metrics and how many were
    attempted."""
    username, password = server.credentials(*SCHEDULER)
    settings = RedisSettings(url=server.url)
    connection = connect(settings, {"REDIS_USERNAME": username, "REDIS_PASSWORD": password})
    metrics = SignalMetrics(CollectorRegistry())
    sink = RedisDecisionSink(connection, settings, metrics)
    written = 0
    try:
        while metrics.decision_write_errors._value.get() == 0:
            assert written < 200_000, "Redis took every decision record: no memory bound?"
            batch = [decision(written + i) for i in range(settings.decision_batch)]
            sink.write_many(batch)
            written += len(batch)
        # Redis keeps refusing once full: a few more batches, each counted whole.
        for _ in range(3):
            sink.write_many([decision(written + i) for i in range(settings.decision_batch)])
            written += settings.decision_batch
    finally:
        connection.close()
    return metrics, written


def test_decisions_filling_memory_never_evict_a_signal_and_are_counted(
    small_redis: DeployedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    admin = small_redis.admin()
    assert admin.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    agents = publishers(small_redis)
    for node, publisher in agents.items():
        assert publisher.publish(node_report(node, NOW - 2))
        assert publisher.publish(node_report(node, NOW - 1))
    before = signal_keys(admin)
    assert len(before) >= len(NODES) * 30
    with caplog.at_level(logging.WARNING, logger="scheduler.adapters.decision_sink"):
        metrics, attempted = fill_with_decisions(small_redis)
    memory = admin.info("memory")
    assert memory["used_memory"] >= 0.9 * memory["maxmemory"]
    # Nothing was evicted: every live signal key is there, byte for byte.
    assert admin.info("stats")["evicted_keys"] == 0
    assert signal_keys(admin) == before
    # The refused decisions are counted (each record of a failed batch) and logged, once.
    stored = sum(1 for _ in admin.scan_iter(match="intf:decision:*", count=1000))
    errors = metrics.decision_write_errors._value.get()
    assert 0 < stored < attempted
    assert errors >= attempted - stored
    refusals = [r for r in caplog.records if "used memory > 'maxmemory'" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in caplog.records]
    # Agents and scheduler keep writing at the limit: whatever arrives while used memory
    # is above maxmemory is refused and counted by its writer (mostly the scheduler's large
    # decision batches, whose own query buffers push it over); no key is ever deleted.
    username, password = small_redis.credentials(*SCHEDULER)
    settings = RedisSettings(url=small_redis.url)
    connection = connect(settings, {"REDIS_USERNAME": username, "REDIS_PASSWORD": password})
    sink = RedisDecisionSink(connection, settings, metrics)
    for round_ in range(5):
        for node, publisher in agents.items():
            publisher.publish(node_report(node, NOW + round_))
        sink.write_many([decision(attempted + i) for i in range(settings.decision_batch)])
        attempted += settings.decision_batch
    connection.close()
    assert admin.info("stats")["evicted_keys"] == 0
    assert set(signal_keys(admin)) == set(before)
    assert metrics.decision_write_errors._value.get() > errors
    # Once decisions go (their TTL; here deleted), every agent writes again.
    for name in list(admin.scan_iter(match="intf:decision:*", count=1000)):
        admin.delete(name)
    for node, publisher in agents.items():
        assert publisher.publish(node_report(node, NOW + 10))
        publisher.close()


def test_the_previous_policy_let_decisions_evict_the_signals(tmp_path: Path) -> None:
    """The check above can fail: with ``volatile-ttl`` the same decisions make Redis delete
    the keys nearest to expiry — the nodes' signals — and the decision writes succeed."""
    server = start(tmp_path, "--maxmemory-policy", "volatile-ttl")
    try:
        admin = server.admin()
        agents = publishers(server)
        for node, publisher in agents.items():
            # The agents' real TTL (3 intervals): shorter than a decision's 24 h.
            publisher._settings = PublisherSettings(
                server.url,
                username=publisher._settings.username,
                password=publisher._settings.password,
                ttl_s=60,
            )
            assert publisher.publish(node_report(node, NOW - 1))
        before = signal_keys(admin)
        username, password = server.credentials(*SCHEDULER)
        settings = RedisSettings(url=server.url)
        connection = connect(settings, {"REDIS_USERNAME": username, "REDIS_PASSWORD": password})
        metrics = SignalMetrics(CollectorRegistry())
        sink = RedisDecisionSink(connection, settings, metrics)
        written = 0
        while admin.info("stats")["evicted_keys"] == 0:
            assert written < 100_000, "nothing was evicted"
            sink.write_many([decision(written + i) for i in range(settings.decision_batch)])
            written += settings.decision_batch
        connection.close()
        assert metrics.decision_write_errors._value.get() == 0
        assert admin.info("stats")["evicted_keys"] > 0
        left = signal_keys(admin)
        assert len(left) < len(before)
        for p in agents.values():
            p.close()
    finally:
        server.stop()
