"""The scheduler's signal cache and decision sink against a real Redis Sentinel and a real
Redis Cluster, fed by the agent's real publisher through the same topology."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry
from redis.cluster import RedisCluster

from interference import keys
from interference.decision import Decision, parse_decision_hash
from interference.signals import NodeMetrics, NodeReport
from interference.strict import SettingError
from interference_infra.redis_client import RedisConnection
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.redis_signals import (
    RedisDecisionSink,
    RedisSettings,
    RedisSignalCache,
    SignalMetrics,
    connect,
)
from scheduler.cli import build_parser, overrides
from scheduler.config import ConfigError, SchedulerConfig, parse_config, with_overrides
from tests.conftest import RedisServer, free_port
from tests.redis_topologies import redis_cluster, replica_of, sentinel, sentinel_publisher

pytestmark = pytest.mark.redis

SETTINGS = RedisSettings(block_ms=100, retry_initial_s=0.05, retry_max_s=0.2, snapshot_interval_s=0)
NODES = ("node-a", "node-b", "node-d", "gpu-node-1")
"""The first three's hashes sit on three different shards of a three-shard cluster."""


def report(node: str, score: float) -> NodeReport:
    metrics = NodeMetrics(runq_p99_us=100 * score, interference_index=score)
    return NodeReport(
        node=node, ts=time.time(), interval_s=1.0, metrics=metrics, measured=("psi", "runq")
    )


def decision(pod: str, node: str) -> Decision:
    return Decision("ml", pod, "scheduled", node, "assigned", time.time())


def scores(cache: RedisSignalCache) -> dict[str, float]:
    return {node: s.metrics.interference_index for node, s in cache.snapshot().items()}


@contextmanager
def through_sentinel(
    port: int,
) -> Iterator[tuple[RedisPublisher, RedisSettings, RedisConnection]]:
    """The agent's publisher, and the scheduler's settings and connection, each finding
    ``intf-master`` through the Sentinel on ``port``; closed on exit."""
    publisher = sentinel_publisher(port, "intf-master")
    settings = dataclasses.replace(
        SETTINGS,
        url="redis://127.0.0.1/0",
        sentinels=(f"127.0.0.1:{port}",),
        sentinel_master="intf-master",
    )
    connection = connect(settings, {})
    try:
        yield publisher, settings, connection
    finally:
        publisher.close()
        connection.close()


def test_reads_signals_and_writes_decisions_through_sentinel(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The master is found by asking the Sentinel: the agent's reports written there are
    bootstrapped and then followed from the stream, and decision records land on it."""
    with (
        sentinel(tmp_path, "intf-master", redis_server.port) as port,
        through_sentinel(port) as (publisher, settings, connection),
    ):
        cache = RedisSignalCache(connection, settings, SignalMetrics(CollectorRegistry()))
        assert publisher.publish(report("gpu-node-1", 10.0))
        cache.bootstrap()
        assert scores(cache) == {"gpu-node-1": 10.0}
        assert publisher.publish(report("gpu-node-2", 20.0))
        assert cache.follow_once() == 1
        assert scores(cache) == {"gpu-node-1": 10.0, "gpu-node-2": 20.0}
        RedisDecisionSink(connection, settings, SignalMetrics(CollectorRegistry())).write(
            decision("train-0", "gpu-node-1")
        )
    written = redis.Redis(port=redis_server.port).hgetall(keys.decision_key("ml", "train-0"))
    assert parse_decision_hash(written).node == "gpu-node-1"


@pytest.mark.slow
def test_after_a_failover_the_scheduler_follows_the_new_master(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The Sentinel promotes the replica: the cache's next reads fail once on the old
    master (now read-only or gone), are retried, and reach the new one without a restart;
    decision records land on the new master."""
    with (
        replica_of(tmp_path, redis_server.port) as replica_port,
        sentinel(tmp_path, "intf-master", redis_server.port) as port,
        through_sentinel(port) as (publisher, settings, connection),
    ):
        cache = RedisSignalCache(connection, settings, SignalMetrics(CollectorRegistry()))
        stop = threading.Event()
        follower = threading.Thread(target=cache.run, args=(stop,), daemon=True)
        watcher = redis.Redis(port=port, decode_responses=True)
        try:
            assert publisher.publish(report("gpu-node-1", 10.0))
            follower.start()
            wait_for(lambda: scores(cache) == {"gpu-node-1": 10.0}, "the first report")
            # the Sentinel learns of the replica from the master's INFO before it can fail over
            wait_for(lambda: watcher.sentinel_slaves("intf-master") != [], "a known replica")
            watcher.execute_command("SENTINEL", "FAILOVER", "intf-master")
            wait_for(
                lambda: watcher.sentinel_get_master_addr_by_name("intf-master")[1] == replica_port,
                "the replica's promotion",
            )
            wait_for(lambda: publisher.publish(report("gpu-node-2", 20.0)), "a publish")
            wait_for(lambda: scores(cache).get("gpu-node-2") == 20.0, "the new master's report")
            metrics = SignalMetrics(CollectorRegistry())
            wait_for(
                lambda: _written(connection, settings, metrics, replica_port),
                "a decision on the new master",
            )
        finally:
            stop.set()
            follower.join(30)
            watcher.close()


def _written(
    connection: RedisConnection, settings: RedisSettings, metrics: SignalMetrics, port: int
) -> bool:
    RedisDecisionSink(connection, settings, metrics).write(decision("train-1", "gpu-node-2"))
    return redis.Redis(port=port).exists(keys.decision_key("ml", "train-1")) == 1


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_sentinel_that_knows_no_such_master_is_an_outage(tmp_path: Path) -> None:
    """Asking for a master the Sentinel does not monitor is a Redis error the cache
    retries (interference-blind meanwhile), not a crash."""
    with sentinel(tmp_path, "intf-master", None) as port:
        settings = dataclasses.replace(
            SETTINGS, url="redis://127.0.0.1/0", sentinels=(f"127.0.0.1:{port}",)
        )
        registry = CollectorRegistry()
        connection = connect(settings, {})
        cache = RedisSignalCache(connection, settings, SignalMetrics(registry))
        with pytest.raises(redis.RedisError, match="mymaster"):
            cache.bootstrap()
        connection.close()
    assert cache.healthy() is False


@pytest.mark.slow
def test_reads_signals_and_writes_decisions_on_a_redis_cluster(tmp_path: Path) -> None:
    """Node hashes spread over three shards are all bootstrapped (SCAN on every primary),
    the stream is followed, and one pipelined batch of decisions lands on whichever shard
    owns each key."""
    with redis_cluster(tmp_path) as ports:
        url = f"redis://127.0.0.1:{ports[0]}/0"
        publisher = RedisPublisher(PublisherSettings(redis_url=url, cluster=True))
        settings = dataclasses.replace(SETTINGS, url=url, cluster=True)
        connection = connect(settings, {})
        cache = RedisSignalCache(connection, settings, SignalMetrics(CollectorRegistry()))
        reader = RedisCluster.from_url(url)
        try:
            for score, node in enumerate(NODES[:3]):
                assert publisher.publish(report(node, float(score)))
            owners = {reader.get_node_from_key(keys.node_key(node)).port for node in NODES[:3]}
            assert owners == set(ports)
            cache.bootstrap()
            assert scores(cache) == {"node-a": 0.0, "node-b": 1.0, "node-d": 2.0}
            assert publisher.publish(report(NODES[3], 30.0))
            assert cache.follow_once() == 1
            assert scores(cache)[NODES[3]] == 30.0

            metrics = SignalMetrics(CollectorRegistry())
            pods = [f"train-{i}" for i in range(8)]
            RedisDecisionSink(connection, settings, metrics).write_many(
                decision(pod, NODES[i % 4]) for i, pod in enumerate(pods)
            )
            assert metrics.decision_write_errors._value.get() == 0
            written = [reader.hgetall(keys.decision_key("ml", pod)) for pod in pods]
            assert [parse_decision_hash(w).node for w in written] == [
                NODES[i % 4] for i in range(8)
            ]
        finally:
            reader.close()
            publisher.close()
            connection.close()


def test_an_unreachable_cluster_is_an_outage_not_a_crash() -> None:
    """Building a Cluster client needs a node to answer: the connection defers it, so the
    scheduler starts, and the cache reports the outage and retries."""
    settings = dataclasses.replace(SETTINGS, url=f"redis://127.0.0.1:{free_port()}/0", cluster=True)
    connection = connect(settings, {})
    registry = CollectorRegistry()
    cache = RedisSignalCache(connection, settings, SignalMetrics(registry))
    stop_after_two = iter([False, False, True])

    class Stop:
        def is_set(self) -> bool:
            return next(stop_after_two)

        def wait(self, _timeout: float) -> bool:
            return False

    cache.run(Stop())  # type: ignore[arg-type]
    assert cache.healthy() is False
    assert registry.get_sample_value("interference_scheduler_redis_errors_total") == 2


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(
            {
                "REDIS_SENTINELS": "sentinel-0:26379, 10.0.0.7:26380",
                "REDIS_SENTINEL_MASTER": "intf",
            },
            {"sentinels": ("sentinel-0:26379", "10.0.0.7:26380"), "sentinel_master": "intf"},
            id="sentinels",
        ),
        pytest.param({"REDIS_CLUSTER": "true"}, {"cluster": True}, id="cluster"),
        pytest.param({"REDIS_CLUSTER": "no"}, {"cluster": False}, id="not-cluster"),
    ],
)
def test_the_agents_topology_variables_configure_the_scheduler(
    env: dict[str, str], expected: dict[str, object]
) -> None:
    config = with_overrides(SchedulerConfig(), **overrides(build_parser().parse_args([]), env))
    assert {name: getattr(config.redis, name) for name in expected} == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REDIS_SENTINELS": "sentinel-0"}, "REDIS_SENTINELS: entry 'sentinel-0' is not HOST:PORT"),
        ({"REDIS_CLUSTER": "maybe"}, "REDIS_CLUSTER"),
    ],
)
def test_a_malformed_topology_variable_is_one_clear_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingError, match=message):
        overrides(build_parser().parse_args([]), env)


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        (
            {"sentinels": ["s:26379"], "cluster": True},
            "redis.cluster: use either Redis Sentinel (sentinels) or Redis Cluster",
        ),
        ({"sentinels": ["s-0"]}, "redis.sentinels: entry 's-0' is not HOST:PORT"),
        ({"url": "unix:///run/redis.sock", "cluster": True}, "redis.url: Redis Sentinel and"),
    ],
)
def test_the_config_file_names_the_redis_key_that_cannot_work(
    section: dict[str, object], problem: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"redis": section}, "scheduler.yaml")
    assert [p for p in raised.value.problems if p.startswith(problem)], raised.value.problems
