"""The scheduler's signal cache and decision sink against a real Redis Sentinel and a real
Redis Cluster, fed by the agents' real publisher through the same topology with reports
shaped as agents write them (pod rows with histograms, windows, ``runq`` measured).

On the three-shard Cluster, the signal keys of many nodes spread over every shard, each
shard takes a share of the agents' writes (counted from its own ``INFO commandstats``
and printed, ``pytest -s``), and the scheduler follows every node and writes the
ranking there."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry
from redis.cluster import RedisCluster

from interference import keys
from interference.decision import Decision, parse_decision_hash
from interference.signals import NodeReport
from interference_infra.redis_client import RedisConnection
from interference_infra.strict import SettingsError
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.redis_settings import (
    ACL_COMMANDS,
    CLUSTER_ACL_COMMANDS,
    RedisSettings,
    connect,
)
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.entry.cli import build_parser, overrides
from scheduler.entry.config import ConfigError, SchedulerConfig, parse_config, with_overrides
from scheduler.signals.frame import SignalFrame
from tests.conftest import RedisServer, free_port
from tests.redis_topologies import redis_cluster, replica_of, sentinel, sentinel_publisher
from tests.scheduler.frames import stale_nodes
from tests.shaped_reports import shaped_report

pytestmark = pytest.mark.redis

SETTINGS = RedisSettings(
    poll_interval_s=0.1, retry_initial_s=0.05, retry_max_s=0.2, ranking_interval_s=0.5
)

WRITE_COMMANDS = ("set", "hset", "expire", "sadd", "srem", "xadd", "del", "zadd", "zrem")
"""Commands counted as writes in a shard's ``INFO commandstats``."""


def report(node: str, pods: int = 30) -> NodeReport:
    """``node``'s report of the interval that ends now, as its agent writes it."""
    return shaped_report(node, time.time(), pods=pods)


def decision(pod: str, node: str) -> Decision:
    return Decision("ml", pod, "scheduled", node, "assigned", time.time())


def signals_at(frame: SignalFrame, node: str) -> float:
    """The time of ``node``'s record in the frame (-inf: none; NaN: not followed)."""
    row = frame.row(node)
    return float(frame.columns["signals_at"][row]) if row is not None else math.nan


def follower(
    connection: RedisConnection,
    settings: RedisSettings,
    known: Sequence[str],
    registry: CollectorRegistry | None = None,
) -> RedisSignalCache:
    """The scheduler's signal cache following the Nodes in ``known`` (read at each poll)."""
    metrics = SignalMetrics(registry or CollectorRegistry())
    return RedisSignalCache(connection, settings, metrics, known_nodes=lambda: tuple(known))


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
    """The master is found by asking the Sentinel: the records the agent's publisher wrote
    there are read for the known Nodes (a new Node's once the informer knows it), the
    scheduler's ranking and decision records land on it."""
    with (
        sentinel(tmp_path, "intf-master", redis_server.port) as port,
        through_sentinel(port) as (publisher, settings, connection),
    ):
        known = ["gpu-node-1"]
        cache = follower(connection, settings, known)
        first = report("gpu-node-1")
        assert publisher.publish(first)
        assert cache.poll_once() == 1
        assert signals_at(cache.snapshot(), "gpu-node-1") == first.ts
        second = report("gpu-node-2")
        assert publisher.publish(second)
        assert cache.poll_once() == 0  # not a Node the scheduler knows yet
        known.append("gpu-node-2")
        assert cache.poll_once() == 1
        frame = cache.snapshot()
        assert frame.names == ("gpu-node-1", "gpu-node-2")
        assert [signals_at(frame, n) for n in frame.names] == [first.ts, second.ts]
        assert stale_nodes(frame, second.ts) == []
        assert cache.write_ranking(second.ts)
        RedisDecisionSink(connection, settings, SignalMetrics(CollectorRegistry())).write(
            decision("train-0", "gpu-node-1")
        )
    master = redis.Redis(port=redis_server.port)
    ranked = dict(master.zrange(keys.NODES_BY_INDEX, 0, -1, withscores=True))
    index = frame.columns["index_mean@latest"]
    assert ranked == {b"gpu-node-1": index[0], b"gpu-node-2": index[1]}
    written = master.hgetall(keys.decision_key("ml", "train-0"))
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
        cache = follower(connection, settings, ["gpu-node-1", "gpu-node-2"])
        stop = threading.Event()
        thread = threading.Thread(target=cache.run, args=(stop,), daemon=True)
        watcher = redis.Redis(port=port, decode_responses=True)
        try:
            first = report("gpu-node-1")
            assert publisher.publish(first)
            thread.start()
            wait_for(
                lambda: signals_at(cache.snapshot(), "gpu-node-1") == first.ts, "the first record"
            )
            # the Sentinel learns of the replica from the master's INFO before it can fail over
            wait_for(
                lambda: watcher.sentinel_slaves("intf-master") != [],  # type: ignore[no-untyped-call]
                "a known replica",
            )
            watcher.execute_command("SENTINEL", "FAILOVER", "intf-master")
            wait_for(
                lambda: (
                    watcher.sentinel_get_master_addr_by_name("intf-master")[1]  # type: ignore[no-untyped-call]
                    == replica_port
                ),
                "the replica's promotion",
            )
            published: list[NodeReport] = []

            def publish_second() -> bool:
                published.append(report("gpu-node-2"))
                return publisher.publish(published[-1])

            wait_for(publish_second, "a publish to the new master")
            wait_for(
                lambda: signals_at(cache.snapshot(), "gpu-node-2") == published[-1].ts,
                "the new master's record",
            )
            metrics = SignalMetrics(CollectorRegistry())
            wait_for(
                lambda: _written(connection, settings, metrics, replica_port),
                "a decision on the new master",
            )
        finally:
            stop.set()
            thread.join(30)
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
        connection = connect(settings, {})
        cache = follower(connection, settings, ["gpu-node-1"])
        with pytest.raises(redis.RedisError, match="mymaster"):
            cache.poll_once()
        connection.close()
    assert cache.healthy() is False


# --- Redis Cluster ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """A real three-shard Redis Cluster for this module's tests."""
    with redis_cluster(tmp_path_factory.mktemp("cluster")) as ports:
        yield ports


@pytest.fixture
def cluster(cluster_ports: list[int]) -> Iterator[Cluster]:
    """The cluster, every shard empty and its command statistics reset."""
    for port in cluster_ports:
        shard = redis.Redis(port=port)
        shard.flushall()
        shard.config_resetstat()
        shard.close()
    cluster = Cluster(cluster_ports)
    try:
        yield cluster
    finally:
        cluster.close()


class Cluster:
    """A three-shard cluster seen by a test: its URL, a cluster client, each shard."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.url = f"redis://127.0.0.1:{ports[0]}/0"
        self.client: RedisCluster[bytes] = RedisCluster.from_url(self.url)
        self.shards = {port: redis.Redis(port=port) for port in ports}
        self.publishers: dict[str, RedisPublisher] = {}

    def shard_of(self, key: str) -> int:
        """Port of the primary that owns ``key``'s slot."""
        node = self.client.get_node_from_key(key)
        assert node is not None, key
        return int(node.port)

    def nodes_one_per_shard(self, prefix: str) -> list[str]:
        """One node name per shard, each one's scheduling record on that shard."""
        found: dict[int, str] = {}
        for i in range(1000):
            found.setdefault(self.shard_of(keys.sched_key(f"{prefix}-{i}")), f"{prefix}-{i}")
            if len(found) == len(self.ports):
                return [found[port] for port in self.ports]
        raise AssertionError("no node names found whose records land on every shard")

    def publish(self, node: str, pods: int = 30) -> NodeReport:
        """Publish ``node``'s report of now with its agent's own publisher."""
        publisher = self.publishers.get(node)
        if publisher is None:
            settings = PublisherSettings(redis_url=self.url, cluster=True, ttl_s=30)
            publisher = self.publishers[node] = RedisPublisher(settings)
        sent = report(node, pods)
        assert publisher.publish(sent), f"the publish of {node} failed"
        return sent

    def scheduler(
        self, known: Sequence[str], registry: CollectorRegistry | None = None
    ) -> tuple[RedisSignalCache, RedisSettings, RedisConnection]:
        settings = dataclasses.replace(SETTINGS, url=self.url, cluster=True)
        connection = connect(settings, {})
        return follower(connection, settings, known, registry), settings, connection

    def commands(self, port: int) -> dict[str, int]:
        """Calls per command on the shard at ``port`` since the statistics were reset."""
        stats = self.shards[port].info("commandstats")
        return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}

    def key_count(self, port: int) -> int:
        return int(self.shards[port].info("keyspace").get("db0", {}).get("keys", 0))

    def close(self) -> None:
        for publisher in self.publishers.values():
            publisher.close()
        for shard in self.shards.values():
            shard.close()
        self.client.close()


@pytest.mark.slow
def test_reads_signals_and_writes_decisions_on_a_redis_cluster(cluster: Cluster) -> None:
    """Records on three different shards are all read (MGET split per slot), a Node the
    informer learns of later is followed from the next poll, the ranking is written, and
    one pipelined batch of decisions lands on whichever shard owns each key."""
    nodes = cluster.nodes_one_per_shard("node")
    sent = {node: cluster.publish(node) for node in nodes}
    known = list(nodes)
    cache, settings, connection = cluster.scheduler(known)
    try:
        assert cache.poll_once() == 3
        frame = cache.snapshot()
        assert {node: signals_at(frame, node) for node in nodes} == {
            node: r.ts for node, r in sent.items()
        }
        sent["gpu-node-1"] = cluster.publish("gpu-node-1")
        known.append("gpu-node-1")
        assert cache.poll_once() == 1
        frame = cache.snapshot()
        assert signals_at(frame, "gpu-node-1") == sent["gpu-node-1"].ts
        assert stale_nodes(frame, max(r.ts for r in sent.values())) == []
        assert cache.write_ranking()
        assert {m.decode() for m in cluster.client.zrange(keys.NODES_BY_INDEX, 0, -1)} == set(known)

        metrics = SignalMetrics(CollectorRegistry())
        pods = [f"train-{i}" for i in range(8)]
        RedisDecisionSink(connection, settings, metrics).write_many(
            decision(pod, known[i % 4]) for i, pod in enumerate(pods)
        )
        assert metrics.decision_write_errors._value.get() == 0
        written = [cluster.client.hgetall(keys.decision_key("ml", pod)) for pod in pods]
        assert [parse_decision_hash(w).node for w in written] == [known[i % 4] for i in range(8)]
    finally:
        connection.close()


SPREAD_NODES = 60
SPREAD_PODS = 30
SPREAD_ROUNDS = 2
MAX_SHARD_SHARE = 0.6


@pytest.mark.slow
def test_signal_keys_and_writes_spread_over_every_shard_and_the_scheduler_follows_all(
    cluster: Cluster,
) -> None:
    """60 agents × 30 pods each publish twice (one report per interval) with their own
    publisher: every shard holds a share of the keys (scheduling records included) and
    took a share of the writes — none more than 60 % — counted from each shard's own
    statistics; the scheduler's follower then reads all 60 records from the three shards,
    every node fresh, writes the ranking on the cluster, and its SCAN for records of
    unknown names covers every shard."""
    nodes = [f"node-{i:03d}" for i in range(SPREAD_NODES)]
    last: dict[str, NodeReport] = {}
    for _ in range(SPREAD_ROUNDS):
        for node in nodes:
            last[node] = cluster.publish(node, SPREAD_PODS)
    published_at = time.time()
    key_counts = {port: cluster.key_count(port) for port in cluster.ports}
    writes = {
        port: {c: n for c, n in cluster.commands(port).items() if c in WRITE_COMMANDS}
        for port in cluster.ports
    }

    registry = CollectorRegistry()
    cache, _, connection = cluster.scheduler(nodes, registry)
    try:
        assert cache.poll_once() == SPREAD_NODES
        reads = {port: cluster.commands(port).get("mget", 0) for port in cluster.ports}
        frame = cache.snapshot()
        assert frame.names == tuple(nodes)
        assert {node: signals_at(frame, node) for node in nodes} == {
            node: r.ts for node, r in last.items()
        }
        assert stale_nodes(frame, published_at) == []
        assert bool((frame.columns["fresh_until"] >= published_at).all())

        assert cache.write_ranking()
        ranked = dict(cluster.client.zrange(keys.NODES_BY_INDEX, 0, -1, withscores=True))
        index = frame.columns["index_mean@latest"]
        assert ranked == {node.encode(): index[row] for row, node in enumerate(nodes)}
        assert cluster.client.zcard(keys.NODES_UPDATED) == SPREAD_NODES

        strays = cluster.nodes_one_per_shard("stray")
        for stray in strays:
            cluster.publish(stray, pods=0)
        assert cache.count_strays() == len(strays)  # one on each shard
        rejected = "interference_scheduler_signal_records_rejected_total"
        assert registry.get_sample_value(rejected, {"reason": "unknown_node"}) == len(strays)
    finally:
        connection.close()

    records = {port: 0 for port in cluster.ports}
    for node in nodes:
        records[cluster.shard_of(keys.sched_key(node))] += 1
    total_writes = sum(sum(by_command.values()) for by_command in writes.values())
    print(
        f"\n{SPREAD_NODES} nodes x {SPREAD_PODS} pods x {SPREAD_ROUNDS} reports on a"
        f" {len(cluster.ports)}-shard Redis Cluster ({total_writes} writes):"
    )
    for port in cluster.ports:
        share = sum(writes[port].values()) / total_writes
        detail = ", ".join(f"{c} {n}" for c, n in sorted(writes[port].items()))
        print(
            f"  shard 127.0.0.1:{port}: {key_counts[port]} keys ({records[port]} scheduling"
            f" records), {sum(writes[port].values())} writes ({share:.1%}: {detail}),"
            f" {reads[port]} follower MGETs (one per slot) for its records"
        )
    for port in cluster.ports:
        assert key_counts[port] > 0 and records[port] > 0, port
        assert 0 < sum(writes[port].values()) <= MAX_SHARD_SHARE * total_writes, port
        assert reads[port] > 0, port


SCHEDULER_USER_RULES = (
    "on", ">scheduler-pw", "resetkeys", "%R~intf:node:*", "~intf:nodes", "~intf:nodes:updated",
    "%W~intf:decision:*", "resetchannels", "-@all",
    *(f"+{c}" for c in (*ACL_COMMANDS, *CLUSTER_ACL_COMMANDS)),
)  # fmt: skip
"""The scheduler's Redis user on a Cluster: exactly the adapter's :data:`ACL_COMMANDS` and
:data:`CLUSTER_ACL_COMMANDS`."""


def test_the_scheduler_follows_a_cluster_as_its_own_acl_user(cluster: Cluster) -> None:
    """With only the commands the adapter says it needs, on every shard, the scheduler
    reads the records and writes the ranking on the cluster."""
    node = "gpu-node-1"
    sent = cluster.publish(node, pods=2)
    for shard in cluster.shards.values():
        shard.execute_command("ACL", "SETUSER", "interference-scheduler", *SCHEDULER_USER_RULES)
    settings = dataclasses.replace(SETTINGS, url=cluster.url, cluster=True)
    env = {"REDIS_USERNAME": "interference-scheduler", "REDIS_PASSWORD": "scheduler-pw"}
    connection = connect(settings, env)
    try:
        cache = follower(connection, settings, [node])
        assert cache.poll_once() == 1
        assert signals_at(cache.snapshot(), node) == sent.ts
        assert cache.write_ranking()
    finally:
        connection.close()
        for shard in cluster.shards.values():
            shard.acl_deluser("interference-scheduler")


def test_an_unreachable_cluster_is_an_outage_not_a_crash() -> None:
    """Building a Cluster client needs a node to answer: the connection defers it, so the
    scheduler starts, and the cache reports the outage and retries."""
    settings = dataclasses.replace(SETTINGS, url=f"redis://127.0.0.1:{free_port()}/0", cluster=True)
    connection = connect(settings, {})
    registry = CollectorRegistry()
    cache = follower(connection, settings, ["gpu-node-1"], registry)
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
    with pytest.raises(SettingsError, match=message):
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
