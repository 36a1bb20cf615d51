"""The Redis publisher against a real redis-server: layout, TTLs, round trips, outages, ACLs."""

from __future__ import annotations

import fnmatch
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

from interference import acl, codec, keys, sched_record
from interference.signals import GpuDevice, NodeMetrics, NodeReport, PodMetrics, WindowMetrics
from node_agent.publisher import ACL_COMMANDS, PublisherSettings, RedisPublisher
from tests.conftest import RedisServer, free_port
from tests.redis_topologies import redis_cluster, sentinel, sentinel_publisher

pytestmark = pytest.mark.redis

TRAINER = PodMetrics(
    namespace="ml", name="trainer-0", uid="u-1", qos="guaranteed", cpu_ms_per_s=900.0
)
UID_ONLY = PodMetrics(namespace="", name="u-2", uid="u-2", qos="besteffort", cpu_ms_per_s=5.0)
SYSTEM_ROW = PodMetrics(namespace="", name="system", cpu_ms_per_s=40.0)
WINDOW_10S = WindowMetrics(
    span_s=10.0,
    covered_s=10.0,
    intervals=10,
    runq_p99_us=2047.0,
    runq_wait_ratio_mean=0.15,
    runq_wait_ratio_stddev=0.05,
    reclaim_stall_ms_per_s_mean=1.5,
    reclaim_stall_ms_per_s_stddev=0.5,
    throttled_ms_per_s_mean=9.0,
    throttled_ms_per_s_stddev=3.0,
    psi_cpu_some_mean=4.0,
    psi_cpu_some_stddev=1.0,
    psi_mem_some_mean=0.5,
    psi_mem_some_stddev=0.25,
    net_drops_per_s_mean=2.0,
    net_drops_per_s_stddev=0.75,
    index_mean=40.0,
)
REPORT = NodeReport(
    node="gpu-node-1",
    ts=1_700_000_000.5,
    interval_s=1.0,
    metrics=NodeMetrics(
        runq_p99_us=1500.0,
        runq_wait_ratio=0.2,
        reclaim_stall_ms_per_s=2.0,
        throttled_ms_per_s=10.0,
        psi_cpu_some=5.0,
        psi_mem_some=0.75,
        net_drops_per_s=3.0,
        interference_index=42.25,
    ),
    histograms={"runq_us": [0, 1, 2], "reclaim_us": []},
    pods=[SYSTEM_ROW, TRAINER, UID_ONLY],
    gpus=[GpuDevice(0, "GPU-1", "NVIDIA H100 80GB HBM3", 81559.0, 100.0, 3.0, 1)],
    measured=("reclaim", "runq", "throttle"),
    windows={"10s": WINDOW_10S, "60s": replace(WINDOW_10S, span_s=60.0, covered_s=12.0)},
)


@pytest.fixture
def publisher(redis_server: RedisServer) -> Iterator[RedisPublisher]:
    pub = RedisPublisher(PublisherSettings(redis_url=redis_server.url, ttl_s=7))
    yield pub
    pub.close()


def node_keys_in(r: redis.Redis[str], node: str) -> list[str]:
    """Every key of the database, each checked to be one of ``node``'s."""
    patterns = keys.node_key_patterns(node)
    found = sorted(r.scan_iter(count=1000))
    strays = [k for k in found if not any(fnmatch.fnmatchcase(k, p) for p in patterns)]
    assert strays == [], f"keys outside {patterns}"
    return found


def test_one_flush_writes_the_whole_layout_under_the_node_prefix(
    publisher: RedisPublisher, redis_server: RedisServer
) -> None:
    assert publisher.publish(REPORT) is True
    r = redis_server.client()

    # Every key written is one of the node's own (what its ACL user may write), and the
    # agent writes no ranking: the scheduler computes it from the records.
    assert node_keys_in(r, "gpu-node-1") == sorted(
        [
            keys.node_key("gpu-node-1"),
            keys.sched_key("gpu-node-1"),
            keys.reports_key("gpu-node-1"),
            keys.node_pods_key("gpu-node-1"),
            keys.pod_key("gpu-node-1", "ml", "trainer-0"),
            keys.pod_key("gpu-node-1", "", "u-2"),
            keys.gpu_key("gpu-node-1"),
        ]
    )
    for key in node_keys_in(r, "gpu-node-1"):
        assert 0 < r.ttl(key) <= 7, key

    node = r.hgetall(keys.node_key("gpu-node-1"))
    assert node["interference_index"] == "42.25"
    assert node["runq_p99_us"] == "1500"
    assert node["updated_at"] == "1700000000.5"
    assert node["pods"] == "3"
    assert node["10s.throttled_ms_per_s_mean"] == "9"

    trainer = r.hgetall(keys.pod_key("gpu-node-1", "ml", "trainer-0"))
    assert codec.parse_pod_hash(trainer) == (TRAINER, "gpu-node-1", REPORT.ts)
    assert r.hgetall(keys.pod_key("gpu-node-1", "", "u-2"))["uid"] == "u-2"
    # The per-node system bucket has no pod key; it stays in the report stream.
    assert r.exists(keys.pod_key("gpu-node-1", "", "system")) == 0
    assert r.smembers(keys.node_pods_key("gpu-node-1")) == {"ml/trainer-0", "u-2"}

    assert codec.parse_gpu_hash(r.hgetall(keys.gpu_key("gpu-node-1"))) == REPORT.gpus

    raw = redis.Redis(port=redis_server.port)
    [(_id, entry)] = raw.xrange(keys.reports_key("gpu-node-1"))
    assert codec.decode_report(entry[keys.REPORTS_FIELD.encode()]) == REPORT


def test_the_scheduling_record_written_decodes_to_the_reports_values(
    publisher: RedisPublisher, redis_server: RedisServer
) -> None:
    assert publisher.publish(REPORT) is True
    payload = redis.Redis(port=redis_server.port).get(keys.sched_key("gpu-node-1"))
    assert payload is not None
    record = sched_record.decode(payload)
    expected: dict[str, float | int] = {
        "version": sched_record.VERSION,
        "node_id": sched_record.node_id("gpu-node-1"),
        "ts": REPORT.ts,
        "interval_s": REPORT.interval_s,
        "gpu_count": 1,
        "gpu_memory_min_mib": 81559.0,
        "gpu_memory_used_mib": 100.0,
        "gpu_utilization_pct": 3.0,
        "latest.covered_s": 1.0,
        "latest.intervals": 1,
        "latest.runq_p99_us": 1500.0,
        "latest.runq_wait_ratio_mean": 0.2,
        "latest.reclaim_stall_ms_per_s_mean": 2.0,
        "latest.throttled_ms_per_s_mean": 10.0,
        "latest.psi_cpu_some_mean": 5.0,
        "latest.psi_mem_some_mean": 0.75,
        "latest.net_drops_per_s_mean": 3.0,
        "latest.net_drops_per_s_stddev": 0.0,
        "60s.covered_s": 12.0,
    }
    for window in ("10s", "60s"):
        expected[f"{window}.intervals"] = 10
        expected[f"{window}.runq_p99_us"] = 2047.0
        for signal in sched_record.MEAN_SIGNALS:
            for moment in ("mean", "stddev"):
                name = f"{signal}_{moment}"
                expected[f"{window}.{name}"] = getattr(WINDOW_10S, name)
    expected.setdefault("10s.covered_s", 10.0)
    assert {name: record[name] for name in expected} == pytest.approx(expected)
    assert sched_record.families_of(int(record["measured"])) == ("runq", "reclaim", "throttle")
    assert record == sched_record.decode(sched_record.encode(REPORT))


def test_a_later_flush_replaces_the_record(
    publisher: RedisPublisher, redis_server: RedisServer
) -> None:
    assert publisher.publish(REPORT)
    assert publisher.publish(replace(REPORT, ts=REPORT.ts + 1, measured=()))
    payload = redis.Redis(port=redis_server.port).get(keys.sched_key("gpu-node-1"))
    assert payload is not None
    record = sched_record.decode(payload)
    assert (record["ts"], record["measured"]) == (REPORT.ts + 1, 0)
    assert redis_server.client().xlen(keys.reports_key("gpu-node-1")) == 2


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
    assert 10 <= redis_server.client().xlen(keys.reports_key("gpu-node-1")) <= 110


def test_each_node_has_its_own_report_stream(
    publisher: RedisPublisher, redis_server: RedisServer
) -> None:
    for node in ("a", "b"):
        assert publisher.publish(replace(REPORT, node=node))
    assert publisher.publish(replace(REPORT, node="a", ts=REPORT.ts + 1))
    raw = redis.Redis(port=redis_server.port)
    for node, count in (("a", 2), ("b", 1)):
        entries = raw.xrange(keys.reports_key(node))
        assert len(entries) == count
        assert {codec.decode_report(e[keys.REPORTS_FIELD.encode()]).node for _, e in entries} == {
            node
        }


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


def add_agent_user(r: redis.Redis[str], node: str, password: str = "s3cret") -> str:
    """The ACL user the credential issuer gives ``node``'s agent (its rules exactly)."""
    username = acl.agent_username(node)
    r.execute_command("ACL", "SETUSER", username, *acl.agent_acl_rules(node, password))
    return username


def test_publishes_and_withdraws_as_the_nodes_own_acl_user(redis_server: RedisServer) -> None:
    """The node's own user (its keys only, only the publisher's commands) can do all the
    publisher does: Redis itself checks every key the publisher writes."""
    assert set(ACL_COMMANDS) == set(acl.AGENT_COMMANDS)
    username = add_agent_user(redis_server.client(), "gpu-node-1")
    pub = RedisPublisher(
        PublisherSettings(redis_url=redis_server.url, username=username, password="s3cret")
    )
    try:
        assert pub.publish(replace(REPORT, ts=REPORT.ts - 1, pods=[TRAINER])) is True
        assert pub.publish(REPORT) is True
        assert pub.dropped == 0
        assert node_keys_in(redis_server.client(), "gpu-node-1")
        assert pub.withdraw("gpu-node-1") is True
    finally:
        pub.close()
    assert redis_server.client().dbsize() == 0
    assert redis_server.client().acl_log() == []


def test_another_nodes_user_is_refused_and_writes_nothing(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Node A's credentials cannot write node B's report: Redis refuses with NOPERM (the
    publisher logs it once, names the keys its user may write), nothing of B is written."""
    r = redis_server.client()
    username = add_agent_user(r, "node-a")
    pub = RedisPublisher(
        PublisherSettings(redis_url=redis_server.url, username=username, password="s3cret")
    )
    caplog.set_level(logging.ERROR, logger="node_agent.publisher")
    try:
        assert pub.publish(replace(REPORT, node="node-b")) is False
        assert pub.publish(replace(REPORT, node="node-b", ts=REPORT.ts + 1)) is False
        assert pub.dropped == 2
        assert pub.publish(replace(REPORT, node="node-a")) is True
    finally:
        pub.close()
    assert [r.getMessage() for r in caplog.records if "refused" in r.getMessage()] != []
    assert "intf:node:node-b intf:node:node-b:*" in caplog.text
    node_keys_in(r, "node-a")  # nothing else exists
    assert any(entry["reason"] == "key" for entry in r.acl_log())


@pytest.mark.parametrize(
    ("commands", "password", "message"),
    [
        (acl.AGENT_COMMANDS, "wrong", "check REDIS_USERNAME/REDIS_PASSWORD"),
        (
            tuple(c for c in acl.AGENT_COMMANDS if c != "xadd"),
            "s3cret",
            "needs SET, HSET, EXPIRE, SADD, SREM, XADD, DEL on the keys of its node"
            " (intf:node:gpu-node-1 intf:node:gpu-node-1:*)",
        ),
    ],
)
def test_refused_credentials_or_permissions_are_reported_not_raised(
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    commands: tuple[str, ...],
    password: str,
    message: str,
) -> None:
    rules = [*keys.node_key_patterns("gpu-node-1")]
    redis_server.client().execute_command(
        "ACL", "SETUSER", "agent", "on", ">s3cret", *(f"~{p}" for p in rules), "-@all",
        *(f"+{c}" for c in commands),
    )  # fmt: skip
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
    assert redis_server.client().hget(keys.node_key("gpu-node-1"), "interference_index") == "42.25"


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

        reader: RedisCluster[str] = RedisCluster.from_url(url, decode_responses=True)
        assert reader.hget(keys.node_key("gpu-node-1"), "interference_index") == "42.25"
        assert reader.smembers(keys.node_pods_key("gpu-node-1")) == {"ml/trainer-0"}
        pod_hash = reader.hgetall(keys.pod_key("gpu-node-1", "ml", "trainer-0"))
        assert codec.parse_pod_hash(pod_hash)[0] == TRAINER
        assert reader.xlen(keys.reports_key("gpu-node-1")) == 2
        reader.close()
        raw: RedisCluster[bytes] = RedisCluster.from_url(url)
        record = raw.get(keys.sched_key("gpu-node-1"))
        raw.close()
        assert record == sched_record.encode(replace(REPORT, pods=[TRAINER]))


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
    """A clean shutdown leaves nothing of the node behind (readers see it gone at once);
    another node's keys stay."""
    leaving = RedisPublisher(PublisherSettings(redis_url=redis_server.url, ttl_s=7))
    try:
        assert leaving.publish(replace(REPORT, node="leaving", ts=time.time()))
        assert publisher.publish(report_at("staying", time.time()))
        assert leaving.withdraw("leaving") is True
    finally:
        leaving.close()
    r = redis_server.client()
    assert node_keys_in(r, "staying")  # nothing of "leaving" is left
    assert r.exists(keys.node_key("staying"), keys.sched_key("staying")) == 2


def test_withdraw_without_redis_is_reported_not_raised(redis_server: RedisServer) -> None:
    pub = RedisPublisher(PublisherSettings(redis_url=redis_server.url))
    redis_server.stop()
    assert pub.withdraw("gpu-node-1") is False
    pub.close()


def test_a_dead_agents_keys_all_expire_with_their_ttl(redis_server: RedisServer) -> None:
    """An agent killed without a clean shutdown: every key of its node, the record and
    the report stream included, is gone once its TTL has passed; no other agent sweeps."""
    dying = RedisPublisher(PublisherSettings(redis_url=redis_server.url, ttl_s=1))
    try:
        assert dying.publish(report_at("dead", time.time()))
    finally:
        dying.close()  # killed: no withdraw
    r = redis_server.client()
    assert len(node_keys_in(r, "dead")) == 6  # the node's hash, record, stream, pods, pod, gpu
    deadline = time.monotonic() + 5
    while r.dbsize() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.dbsize() == 0
