"""The Redis publisher against a real redis-server: layout, TTLs, round trips, outages, ACLs."""

from __future__ import annotations

import gc
import logging
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from interference import codec, keys
from interference.signals import GpuDevice, NodeMetrics, NodeReport, PodMetrics
from node_agent.publisher import PublisherSettings, RedisPublisher
from tests.conftest import RedisServer, free_port
from tests.redis_topologies import redis_cluster, sentinel, sentinel_publisher

pytestmark = pytest.mark.redis

TRAINER = PodMetrics(
    namespace="ml", name="trainer-0", uid="u-1", qos="guaranteed", cpu_ms_per_s=900.0
)
UID_ONLY = PodMetrics(namespace="", name="u-2", uid="u-2", qos="besteffort", cpu_ms_per_s=5.0)
SYSTEM_ROW = PodMetrics(namespace="", name="system", cpu_ms_per_s=40.0)
REPORT = NodeReport(
    node="gpu-node-1",
    ts=1_700_000_000.5,
    interval_s=1.0,
    metrics=NodeMetrics(runq_p99_us=1500.0, runq_wait_ratio=0.2, interference_index=42.25),
    histograms={"runq_us": [0, 1, 2], "reclaim_us": []},
    pods=[SYSTEM_ROW, TRAINER, UID_ONLY],
    gpus=[GpuDevice(0, "GPU-1", "NVIDIA H100 80GB HBM3", 81559.0, 100.0, 3.0, 1)],
)


@pytest.fixture
def publisher(redis_server: RedisServer) -> Iterator[RedisPublisher]:
    pub = RedisPublisher(PublisherSettings(redis_url=redis_server.url, ttl_s=7))
    yield pub
    pub.close()


def test_one_flush_writes_the_whole_layout(
    publisher: RedisPublisher, redis_server: RedisServer
) -> None:
    assert publisher.publish(REPORT) is True
    r = redis_server.client()

    node = r.hgetall(keys.node_key("gpu-node-1"))
    assert node["score"] == "42.25"
    assert node["runq_p99_us"] == "1500"
    assert node["updated_at"] == "1700000000.5"
    assert node["pods"] == "3"
    assert 0 < r.ttl(keys.node_key("gpu-node-1")) <= 7
    assert r.zrevrange(keys.NODES_BY_SCORE, 0, -1, withscores=True) == [("gpu-node-1", 42.25)]
    assert r.zscore(keys.NODES_UPDATED, "gpu-node-1") == 1_700_000_000.5

    trainer = r.hgetall(keys.pod_key("ml", "trainer-0"))
    assert codec.parse_pod_hash(trainer) == (TRAINER, "gpu-node-1", REPORT.ts)
    assert 0 < r.ttl(keys.pod_key("ml", "trainer-0")) <= 7
    assert r.hgetall(keys.pod_key("", "u-2"))["uid"] == "u-2"
    # The per-node system bucket has no pod key: it would collide between nodes.
    assert r.exists(keys.pod_key("", "system")) == 0
    assert r.smembers(keys.node_pods_key("gpu-node-1")) == {"ml/trainer-0", "u-2"}
    assert 0 < r.ttl(keys.node_pods_key("gpu-node-1")) <= 7

    assert codec.parse_gpu_hash(r.hgetall(keys.gpu_key("gpu-node-1"))) == REPORT.gpus
    assert 0 < r.ttl(keys.gpu_key("gpu-node-1")) <= 7

    raw = redis.Redis(port=redis_server.port)
    [(_id, entry)] = raw.xrange(keys.STREAM)
    assert codec.decode_report(entry[keys.STREAM_FIELD.encode()]) == REPORT


def test_each_flush_is_one_round_trip(
    publisher: RedisPublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert publisher.publish(REPORT)  # connects (the handshake has round trips of its own)
    sends: list[int] = []
    original = redis.connection.Connection.send_packed_command

    def counting(
        self: redis.connection.Connection, command: Any, check_health: bool = True
    ) -> None:
        sends.append(1)
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counting)
    for i in range(1, 4):
        assert publisher.publish(replace(REPORT, ts=REPORT.ts + i))
    assert len(sends) == 3


def test_departed_pods_leave_the_node_pod_set(
    publisher: RedisPublisher, redis_server: RedisServer
) -> None:
    publisher.publish(REPORT)
    publisher.publish(replace(REPORT, pods=[SYSTEM_ROW, TRAINER]))
    r = redis_server.client()
    assert r.smembers(keys.node_pods_key("gpu-node-1")) == {"ml/trainer-0"}


def test_stream_is_capped(redis_server: RedisServer) -> None:
    pub = RedisPublisher(PublisherSettings(redis_url=redis_server.url, stream_maxlen=10))
    for i in range(400):
        pub.publish(replace(REPORT, ts=REPORT.ts + i))
    pub.close()
    # MAXLEN ~ trims whole stream nodes (100 entries by default), never keeps all 400.
    assert 10 <= redis_server.client().xlen(keys.STREAM) <= 110


def test_outage_drops_reports_logs_once_and_the_next_flush_after_restart_succeeds(
    publisher: RedisPublisher, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    assert publisher.publish(REPORT)
    redis_server.stop()
    caplog.set_level(logging.WARNING, logger="node_agent.publisher")
    results = [publisher.publish(replace(REPORT, ts=REPORT.ts + i)) for i in range(1, 6)]
    assert results == [False] * 5
    assert publisher.dropped == 5
    outage_logs = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(outage_logs) == 1
    assert str(redis_server.port) in outage_logs[0].getMessage()

    redis_server.start()
    assert publisher.publish(replace(REPORT, ts=REPORT.ts + 6)) is True
    assert any(
        "is back" in r.getMessage() and "5 report(s)" in r.getMessage() for r in caplog.records
    )
    updated_at = redis_server.client().hget(keys.node_key("gpu-node-1"), "updated_at")
    assert updated_at == "1700000006.5"


@pytest.mark.slow
def test_reports_dropped_during_an_outage_are_not_kept(redis_server: RedisServer) -> None:
    """A queue of unsent reports would grow by 270 × the report size here; nothing may."""
    big = replace(
        REPORT,
        pods=[replace(TRAINER, name=f"trainer-{i}", uid=f"u-{i}") for i in range(100)],
    )
    pub = RedisPublisher(PublisherSettings(redis_url=redis_server.url))
    redis_server.stop()
    for _ in range(20):  # warm up: first failure, logging, connection objects
        pub.publish(big)
    tracemalloc.start()
    try:
        for _ in range(30):
            assert pub.publish(big) is False
        gc.collect()
        early = tracemalloc.take_snapshot()
        for _ in range(270):
            assert pub.publish(big) is False
        gc.collect()
        late = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    pub.close()
    # Log records kept by the test harness's log capture are not the publisher's memory.
    harness = [
        tracemalloc.Filter(False, logging.__file__),
        tracemalloc.Filter(False, "*/_pytest/*"),
        tracemalloc.Filter(False, tracemalloc.__file__),
    ]
    growth = sum(
        stat.size_diff
        for stat in late.filter_traces(harness).compare_to(early.filter_traces(harness), "filename")
    )
    assert len(codec.encode_report(big)) * 270 > 3_000_000  # what a queue would hold
    assert growth < 100_000


AGENT_ACL = (
    "~intf:* -@all +hset +expire +zadd +sadd +srem +xadd +zrangebyscore +exists +zrem +del +ping"
)


def test_publishes_as_a_restricted_acl_user(redis_server: RedisServer) -> None:
    redis_server.client().execute_command(
        "ACL", "SETUSER", "agent", "on", ">s3cret", *AGENT_ACL.split()
    )
    pub = RedisPublisher(
        PublisherSettings(redis_url=redis_server.url, username="agent", password="s3cret")
    )
    assert pub.publish(REPORT) is True
    assert pub.sweep(REPORT.ts + 60) == []
    assert pub.withdraw("gpu-node-1") is True
    pub.close()
    assert redis_server.client().zscore(keys.NODES_BY_SCORE, "gpu-node-1") is None


@pytest.mark.parametrize(
    ("acl", "password", "message"),
    [
        (AGENT_ACL, "wrong", "check REDIS_USERNAME/REDIS_PASSWORD"),
        (AGENT_ACL.replace(" +xadd", ""), "s3cret", "needs HSET, EXPIRE, ZADD"),
    ],
)
def test_refused_credentials_or_permissions_are_reported_not_raised(
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    acl: str,
    password: str,
    message: str,
) -> None:
    redis_server.client().execute_command("ACL", "SETUSER", "agent", "on", ">s3cret", *acl.split())
    pub = RedisPublisher(
        PublisherSettings(redis_url=redis_server.url, username="agent", password=password)
    )
    caplog.set_level(logging.ERROR, logger="node_agent.publisher")
    assert pub.publish(REPORT) is False
    assert pub.publish(REPORT) is False
    pub.close()
    assert [message in r.getMessage() for r in caplog.records] == [True]


def test_unparseable_url_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="redis://"):
        RedisPublisher(PublisherSettings(redis_url="localhost:6379"))


def test_publishes_to_the_master_a_sentinel_names(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    with sentinel(tmp_path, "intf-master", redis_server.port) as port:
        pub = sentinel_publisher(port, "intf-master")
        assert pub.publish(REPORT) is True
        pub.close()
    assert redis_server.client().hget(keys.node_key("gpu-node-1"), "score") == "42.25"


def test_sentinel_without_the_master_is_an_outage_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with sentinel(tmp_path, "intf-master", None) as port:
        pub = sentinel_publisher(port, "nobody")
        caplog.set_level(logging.ERROR, logger="node_agent.publisher")
        assert pub.publish(REPORT) is False
        pub.close()
    assert "master 'nobody' via sentinels" in caplog.text


@pytest.mark.slow
def test_publishes_to_a_redis_cluster(tmp_path: Path) -> None:
    with redis_cluster(tmp_path) as ports:
        url = f"redis://127.0.0.1:{ports[0]}/0"
        pub = RedisPublisher(PublisherSettings(redis_url=url, cluster=True))
        assert pub.publish(REPORT) is True
        assert pub.publish(replace(REPORT, pods=[TRAINER])) is True
        pub.close()

        reader = RedisCluster.from_url(url, decode_responses=True)
        assert reader.hget(keys.node_key("gpu-node-1"), "score") == "42.25"
        assert reader.smembers(keys.node_pods_key("gpu-node-1")) == {"ml/trainer-0"}
        assert codec.parse_pod_hash(reader.hgetall(keys.pod_key("ml", "trainer-0")))[0] == TRAINER
        assert reader.xlen(keys.STREAM) == 2
        reader.close()


def test_unreachable_cluster_is_an_outage_not_a_crash() -> None:
    pub = RedisPublisher(
        PublisherSettings(redis_url=f"redis://127.0.0.1:{free_port()}/0", cluster=True)
    )
    assert pub.publish(REPORT) is False
    assert pub.publish(REPORT) is False
    assert pub.dropped == 2
    pub.close()


def report_at(node: str, ts: float, interval_s: float = 1.0) -> NodeReport:
    return replace(REPORT, node=node, ts=ts, interval_s=interval_s, pods=[TRAINER])


def test_withdraw_removes_the_node_and_its_keys(
    publisher: RedisPublisher, redis_server: RedisServer
) -> None:
    """A clean shutdown leaves nothing of the node behind (readers see it gone at once)."""
    assert publisher.publish(report_at("leaving", time.time()))
    assert publisher.publish(report_at("staying", time.time()))
    assert publisher.withdraw("leaving") is True
    r = redis_server.client()
    assert r.zrange(keys.NODES_BY_SCORE, 0, -1) == ["staying"]
    assert r.zrange(keys.NODES_UPDATED, 0, -1) == ["staying"]
    for key in (keys.node_key("leaving"), keys.node_pods_key("leaving"), keys.gpu_key("leaving")):
        assert not r.exists(key), key
    assert r.exists(keys.node_key("staying"))


def test_withdraw_without_redis_is_reported_not_raised(redis_server: RedisServer) -> None:
    pub = RedisPublisher(PublisherSettings(redis_url=redis_server.url))
    redis_server.stop()
    assert pub.withdraw("gpu-node-1") is False
    pub.close()


def test_sweep_removes_only_nodes_whose_hash_expired(
    publisher: RedisPublisher, redis_server: RedisServer
) -> None:
    """Quiet for longer than 5 s is only a candidate: a slow agent (10 s interval) whose
    hash lives on stays; a node whose hash is gone leaves both sorted sets."""
    now = time.time()
    assert publisher.publish(report_at("slow-agent", now - 8, interval_s=10.0))
    r = redis_server.client()
    r.zadd(keys.NODES_BY_SCORE, {"dead": 90.0})  # what a dead agent leaves: no hash
    r.zadd(keys.NODES_UPDATED, {"dead": now - 60})
    assert publisher.publish(report_at("fresh", now))
    assert publisher.sweep(now) == ["dead"]
    assert sorted(r.zrange(keys.NODES_BY_SCORE, 0, -1)) == ["fresh", "slow-agent"]
    assert sorted(r.zrange(keys.NODES_UPDATED, 0, -1)) == ["fresh", "slow-agent"]
    assert publisher.sweep(now) == []


def test_a_dead_node_leaves_the_ranking_within_ttl_plus_one_sweep(
    redis_server: RedisServer,
) -> None:
    """An agent killed without a clean shutdown: its hash expires after its TTL (5 s) and
    the next sweep of any live agent (every 1 s here) drops it from ``intf:nodes``."""
    ttl_s, sweep_s = 5, 1.0
    dying = RedisPublisher(PublisherSettings(redis_url=redis_server.url, ttl_s=ttl_s))
    live = RedisPublisher(
        PublisherSettings(redis_url=redis_server.url, ttl_s=ttl_s, sweep_interval_s=sweep_s)
    )
    r = redis_server.client()
    try:
        died_at = time.time()
        assert dying.publish(report_at("dead", died_at))
        dying.close()  # killed: no withdraw
        gone_at = None
        while time.time() < died_at + ttl_s + sweep_s + 3:
            assert live.publish(report_at("live", time.time()))
            members = r.zrange(keys.NODES_BY_SCORE, 0, -1)
            assert "live" in members
            if "dead" not in members:
                gone_at = time.time()
                break
            time.sleep(0.2)
        assert gone_at is not None, "the dead node is still ranked"
        assert gone_at - died_at >= ttl_s - 0.5  # not before its hash expired
        assert gone_at - died_at <= ttl_s + sweep_s + 1.0  # bound: TTL + sweep + 1 interval
        assert live.swept == 1
    finally:
        live.close()
