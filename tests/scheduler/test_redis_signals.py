"""RedisSignalCache and RedisDecisionSink against a real redis-server."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from interference import keys
from interference.codec import encode_report, gpu_hash, node_hash
from interference.decision import CandidateVerdict, Decision, parse_decision_hash
from interference.signals import GpuDevice, NodeMetrics, NodeReport
from scheduler.adapters.redis_signals import (
    ACL_COMMANDS,
    QueuedDecisionSink,
    RedisDecisionSink,
    RedisSettings,
    RedisSignalCache,
    SignalMetrics,
    connect,
)
from tests.conftest import RedisServer, free_port

pytestmark = pytest.mark.redis

GPU = GpuDevice(0, "GPU-1", "NVIDIA H100", 81559, 1024, 37.5, 2)


def report(node: str, ts: float, score: float = 10.0, interval_s: float = 1.0) -> NodeReport:
    metrics = NodeMetrics(runq_p99_us=100 * score, interference_index=score)
    return NodeReport(
        node=node, ts=ts, interval_s=interval_s, metrics=metrics, measured=("psi", "runq")
    )


def as_mapping(fields: dict[str, str]) -> dict[str | bytes, bytes | float | int | str]:
    """A hash for redis-py's ``hset(mapping=...)`` (whose stub wants the wider key type)."""
    wide: dict[str | bytes, bytes | float | int | str] = {}
    wide.update(fields)
    return wide


def publish_hash(r: redis.Redis[bytes], rep: NodeReport) -> None:
    r.hset(keys.node_key(rep.node), mapping=as_mapping(node_hash(rep)))


def publish_stream(r: redis.Redis[bytes], rep: NodeReport) -> None:
    r.xadd(keys.STREAM, {keys.STREAM_FIELD: encode_report(rep)})


def wait_until(predicate: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def payload_errors(registry: CollectorRegistry, source: str) -> float:
    value = registry.get_sample_value(
        "interference_scheduler_signal_payload_errors_total", {"source": source}
    )
    return value or 0.0


SETTINGS = RedisSettings(
    block_ms=100, retry_initial_s=0.05, retry_max_s=0.2, log_interval_s=3600, snapshot_interval_s=0
)


@pytest.fixture
def raw(redis_server: RedisServer) -> redis.Redis[bytes]:
    return redis.Redis(port=redis_server.port)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def cache(redis_server: RedisServer, registry: CollectorRegistry) -> RedisSignalCache:
    settings = _settings(redis_server)
    return RedisSignalCache(connect(settings), settings, SignalMetrics(registry))


def _settings(server: RedisServer) -> RedisSettings:
    return dataclasses.replace(SETTINGS, url=server.url)


@pytest.fixture
def running(cache: RedisSignalCache) -> Iterator[RedisSignalCache]:
    stop = threading.Event()
    thread = threading.Thread(target=cache.run, args=(stop,), daemon=True)
    thread.start()
    yield cache
    stop.set()
    thread.join(30)
    assert not thread.is_alive()


def test_bootstraps_from_node_and_gpu_hashes(
    raw: redis.Redis[bytes], cache: RedisSignalCache, registry: CollectorRegistry
) -> None:
    now = time.time()
    for i, node in enumerate(("a", "b", "c")):
        publish_hash(raw, report(node, now - i, score=10 * i))
    raw.hset(keys.gpu_key("b"), mapping=as_mapping(gpu_hash([GPU])))
    raw.sadd(keys.node_pods_key("a"), "default/p1")  # not a node hash
    raw.hset(keys.node_key("broken"), mapping={"score": "high", "updated_at": "1"})
    raw.hset(keys.gpu_key("c"), mapping={"count": "2"})  # devices missing

    cache.bootstrap()

    snapshot = cache.snapshot()
    assert set(snapshot) == {"a", "b", "c"}
    assert snapshot["c"].metrics.interference_index == 20.0
    assert snapshot["c"].metrics.runq_p99_us == 2000.0
    assert snapshot["a"].updated_at == pytest.approx(now, abs=0.01)
    assert snapshot["b"].gpus == (GPU,)
    assert snapshot["c"].gpus == ()
    assert cache.healthy()
    assert payload_errors(registry, "hash") == 1
    assert payload_errors(registry, "gpu") == 1


def test_follows_the_stream_with_xread_not_rescans(
    raw: redis.Redis[bytes], running: RedisSignalCache
) -> None:
    now = time.time()
    publish_hash(raw, report("a", now - 5, score=1))
    wait_until(running.healthy)
    # "a" was not in the bootstrap (published after it) unless the race let it in; either way
    # the stream is what must bring the newer report.
    scans_before = _calls(raw, "scan")
    for step in range(1, 6):
        publish_stream(raw, report("a", now + step, score=step * 10))
        publish_stream(raw, report("new", now + step, score=step))
    wait_until(
        lambda: (
            running.snapshot().get("a") is not None
            and running.snapshot()["a"].metrics.interference_index == 50
        )
    )
    wait_until(
        lambda: (
            "new" in running.snapshot()
            and running.snapshot()["new"].metrics.interference_index == 5
        )
    )
    assert running.snapshot()["a"].updated_at == pytest.approx(now + 5)
    assert _calls(raw, "scan") == scans_before  # O(updates): no rescans while following
    assert _calls(raw, "xread") >= 1


def test_streamed_reports_observe_their_age(
    raw: redis.Redis[bytes], redis_server: RedisServer, registry: CollectorRegistry
) -> None:
    """Age = the cache's clock minus the report's ts (the end of its kernel interval)."""
    settings = _settings(redis_server)
    clock = [1_000.0]
    cache = RedisSignalCache(
        connect(settings), settings, SignalMetrics(registry), clock=lambda: clock[0]
    )
    cache.bootstrap()
    for node, age in (("a", 0.3), ("b", 1.2), ("c", 4.0)):
        publish_stream(raw, report(node, clock[0] - age))
    cache.follow_once()
    name = "interference_scheduler_signal_age_seconds"
    assert registry.get_sample_value(f"{name}_count") == 3
    assert registry.get_sample_value(f"{name}_sum") == pytest.approx(0.3 + 1.2 + 4.0)
    assert registry.get_sample_value(f"{name}_bucket", {"le": "0.5"}) == 1
    assert registry.get_sample_value(f"{name}_bucket", {"le": "30.0"}) == 3


def test_snapshots_are_rebuilt_at_most_every_interval(
    raw: redis.Redis[bytes], redis_server: RedisServer, registry: CollectorRegistry
) -> None:
    """Reports arriving all the time do not make every scheduling attempt a new snapshot."""
    settings = dataclasses.replace(_settings(redis_server), snapshot_interval_s=0.5)
    cache = RedisSignalCache(connect(settings), settings, SignalMetrics(registry))
    cache.bootstrap()
    now = time.time()
    publish_stream(raw, report("a", now, score=1))
    cache.follow_once()
    first = cache.snapshot()
    assert first["a"].metrics.interference_index == 1
    publish_stream(raw, report("a", now + 1, score=2))
    cache.follow_once()
    assert cache.snapshot() is first  # within the interval: the same snapshot
    time.sleep(0.6)
    assert cache.snapshot()["a"].metrics.interference_index == 2


def test_an_older_report_never_replaces_a_newer_one(
    raw: redis.Redis[bytes], cache: RedisSignalCache
) -> None:
    now = time.time()
    publish_hash(raw, report("a", now, score=70))
    cache.bootstrap()
    raw.xadd(keys.STREAM, {keys.STREAM_FIELD: encode_report(report("a", now - 10, score=1))})
    assert cache.follow_once() == 0
    assert cache.snapshot()["a"].metrics.interference_index == 70


def test_counts_and_skips_malformed_stream_entries(
    raw: redis.Redis[bytes],
    running: RedisSignalCache,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    wait_until(running.healthy)
    caplog.set_level(logging.WARNING, logger="scheduler.adapters.redis_signals")
    raw.xadd(keys.STREAM, {keys.STREAM_FIELD: b"\xc1 not msgpack"})
    raw.xadd(keys.STREAM, {"other": b"x"})
    future = encode_report(report("a", time.time())).replace(b"\xa1v\x02", b"\xa1v\x63")
    raw.xadd(keys.STREAM, {keys.STREAM_FIELD: future})  # schema version 99
    publish_stream(raw, report("good", time.time(), score=42))

    wait_until(lambda: "good" in running.snapshot())
    assert running.snapshot()["good"].metrics.interference_index == 42
    assert "a" not in running.snapshot()
    assert payload_errors(registry, "stream") == 3
    malformed = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(malformed) == 1  # rate-limited: one line for three bad entries
    assert "same release" in malformed[0].getMessage()


def test_marks_nodes_stale_after_their_ttl(
    raw: redis.Redis[bytes], redis_server: RedisServer
) -> None:
    now = 1_000_000.0
    clock = [now]
    settings = _settings(redis_server)
    cache = RedisSignalCache(
        connect(settings), settings, SignalMetrics(CollectorRegistry()), clock=lambda: clock[0]
    )
    publish_hash(raw, report("fresh", now - 1, interval_s=1))  # TTL 5 s
    publish_hash(raw, report("old", now - 6, interval_s=1))  # 6 s > TTL 5 s
    publish_hash(raw, report("slow", now - 20, interval_s=10))  # TTL 30 s
    cache.bootstrap()
    assert cache.stale_nodes() == ["old"]
    clock[0] = now + 5
    assert cache.stale_nodes() == ["fresh", "old"]
    clock[0] = now + 11
    assert cache.stale_nodes() == ["fresh", "old", "slow"]
    assert set(cache.snapshot()) == {"fresh", "old", "slow"}  # kept, with their real age
    clock[0] = now - 1 + settings.forget_after_s + 1  # "fresh" silent for 10 min: its agent died
    assert cache.forget_silent() == ["fresh", "old", "slow"]
    assert dict(cache.snapshot()) == {} and cache.stale_nodes() == []


def test_redis_down_goes_blind_with_a_metric_and_one_log_then_recovers(
    raw: redis.Redis[bytes],
    redis_server: RedisServer,
    running: RedisSignalCache,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="scheduler.adapters.redis_signals")
    wait_until(running.healthy)
    publish_stream(raw, report("a", time.time(), score=33))
    wait_until(lambda: "a" in running.snapshot())
    redis_server.stop()
    wait_until(lambda: not running.healthy())
    wait_until(
        lambda: (registry.get_sample_value("interference_scheduler_redis_errors_total") or 0) >= 3
    )
    assert running.snapshot()["a"].metrics.interference_index == 33  # the last data stay, ageing
    outage_lines = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(outage_lines) == 1
    assert "interference-blind" in outage_lines[0].getMessage()

    redis_server.start()  # a fresh, empty Redis: its stream ids start over
    bootstraps = running.bootstraps
    wait_until(running.healthy)
    assert running.bootstraps == bootstraps + 1
    publish_stream(redis_server.client(), report("b", time.time(), score=7))
    publish_stream(redis.Redis(port=redis_server.port), report("b", time.time() + 1, score=8))
    wait_until(
        lambda: (
            "b" in running.snapshot() and running.snapshot()["b"].metrics.interference_index == 8
        )
    )


def test_unreachable_at_start_is_unhealthy_not_fatal(registry: CollectorRegistry) -> None:
    settings = dataclasses.replace(
        SETTINGS, url=f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=1
    )
    cache = RedisSignalCache(connect(settings), settings, SignalMetrics(registry))
    stop = threading.Event()
    thread = threading.Thread(target=cache.run, args=(stop,), daemon=True)
    thread.start()
    wait_until(
        lambda: (registry.get_sample_value("interference_scheduler_redis_errors_total") or 0) >= 2
    )
    assert not cache.healthy()
    assert cache.snapshot() == {}
    stop.set()
    thread.join(30)
    assert not thread.is_alive()


def decision() -> Decision:
    return Decision(
        namespace="ml",
        pod="train-0",
        result="scheduled",
        node="n1",
        message="Successfully assigned ml/train-0 to n1",
        ts=1_700_000_000.0,
        candidates=[CandidateVerdict("n1", True, [], {"Interference": 90.0}, 180.0)],
    )


def test_decision_sink_writes_the_record_with_a_ttl(
    raw: redis.Redis[bytes], redis_server: RedisServer
) -> None:
    settings = _settings(redis_server)
    sink = RedisDecisionSink(connect(settings), settings, SignalMetrics(CollectorRegistry()))
    earlier = dataclasses.replace(
        decision(), result="unschedulable", node="", message="0/1 nodes are available", dry_run=True
    )
    sink.write(earlier)
    sink.write(decision())  # the newer decision replaces the whole record
    key = keys.decision_key("ml", "train-0")
    assert parse_decision_hash(raw.hgetall(key)) == decision()
    assert 0 < raw.ttl(key) <= keys.DECISION_TTL_S


def test_decision_sink_never_raises(registry: CollectorRegistry) -> None:
    settings = dataclasses.replace(
        SETTINGS, url=f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=1
    )
    sink = RedisDecisionSink(connect(settings), settings, SignalMetrics(registry))
    sink.write(decision())
    sink.write(decision())
    assert registry.get_sample_value("interference_scheduler_decision_write_errors_total") == 2


class BatchRecordingSink(RedisDecisionSink):
    """The real sink, noting the size of every batch the queue hands it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.batches: list[int] = []

    def write_many(self, decisions: Iterable[Decision]) -> None:
        batch = list(decisions)
        self.batches.append(len(batch))
        super().write_many(batch)


def pod_decision(index: int) -> Decision:
    return dataclasses.replace(decision(), pod=f"train-{index}")


def test_queued_sink_writes_every_record_in_batches(
    raw: redis.Redis[bytes], redis_server: RedisServer, registry: CollectorRegistry
) -> None:
    # A long linger: only a full batch or flush() makes the writer write.
    settings = dataclasses.replace(_settings(redis_server), decision_batch=4, decision_linger_s=60)
    sink = BatchRecordingSink(connect(settings), settings, SignalMetrics(registry))
    queued = QueuedDecisionSink(sink, settings)
    try:
        for index in range(10):
            queued.write(pod_decision(index))
        assert queued.flush(30)
        for index in range(10):
            key = keys.decision_key("ml", f"train-{index}")
            assert parse_decision_hash(raw.hgetall(key)) == pod_decision(index)
            assert 0 < raw.ttl(key) <= keys.DECISION_TTL_S
        assert sum(sink.batches) == 10 and max(sink.batches) <= 4
        assert sink.batches[:2] == [4, 4]  # two full batches, then flush() wrote the rest
        assert registry.get_sample_value("interference_scheduler_decision_write_errors_total") == 0
    finally:
        queued.close()
    queued.write(pod_decision(10))  # after close: written at once, nothing lost
    assert raw.exists(keys.decision_key("ml", "train-10"))


def test_queued_sink_close_writes_what_is_still_queued(
    raw: redis.Redis[bytes], redis_server: RedisServer, registry: CollectorRegistry
) -> None:
    settings = dataclasses.replace(_settings(redis_server), decision_linger_s=60)
    queued = QueuedDecisionSink(
        RedisDecisionSink(connect(settings), settings, SignalMetrics(registry)), settings
    )
    for index in range(3):
        queued.write(pod_decision(index))
    queued.close()
    assert all(raw.exists(keys.decision_key("ml", f"train-{index}")) for index in range(3))


def test_queued_sink_with_redis_down_counts_every_record_and_never_raises(
    registry: CollectorRegistry,
) -> None:
    settings = dataclasses.replace(
        SETTINGS,
        url=f"redis://127.0.0.1:{free_port()}/0",
        socket_timeout_s=1,
        decision_queue_size=2,
        decision_batch=1,
        decision_linger_s=0.01,
    )
    queued = QueuedDecisionSink(
        RedisDecisionSink(connect(settings), settings, SignalMetrics(registry)), settings
    )
    try:
        for index in range(8):  # more than the queue holds: some wait, none raise
            queued.write(pod_decision(index))
        assert queued.flush(60)
    finally:
        queued.close()
    # Each record either failed in a pipeline or was skipped on a full queue: all counted.
    assert registry.get_sample_value("interference_scheduler_decision_write_errors_total") == 8


def test_works_as_the_scheduler_acl_user_from_the_environment(
    raw: redis.Redis[bytes], redis_server: RedisServer
) -> None:
    # The scheduler's ACL user as deploy/ defines it: read intf:*, write decisions only,
    # and no command beyond ACL_COMMANDS.
    rules = ["resetkeys", "%R~intf:*", "~intf:decision:*", "resetchannels", "-@all"]
    raw.execute_command(
        "ACL", "SETUSER", "scheduler", "on", ">s3cret", *rules, *(f"+{c}" for c in ACL_COMMANDS)
    )
    now = time.time()
    publish_hash(raw, report("a", now - 1))
    raw.hset(keys.gpu_key("a"), mapping=as_mapping(gpu_hash([GPU])))
    settings = _settings(redis_server)
    env = {"REDIS_USERNAME": "scheduler", "REDIS_PASSWORD": "s3cret"}
    registry = CollectorRegistry()
    metrics = SignalMetrics(registry)
    cache = RedisSignalCache(connect(settings, env=env), settings, metrics)
    cache.bootstrap()
    publish_stream(raw, report("a", now, score=64))
    assert cache.follow_once() == 1
    assert cache.snapshot()["a"].metrics.interference_index == 64
    RedisDecisionSink(connect(settings, env=env), settings, metrics).write(decision())
    assert registry.get_sample_value("interference_scheduler_decision_write_errors_total") == 0
    assert raw.exists(keys.decision_key("ml", "train-0"))

    wrong = connect(settings, env={"REDIS_USERNAME": "scheduler", "REDIS_PASSWORD": "nope"})
    with pytest.raises(redis.AuthenticationError):
        wrong.client().hgetall(keys.node_key("a"))


def _calls(raw: redis.Redis[bytes], command: str) -> int:
    stats = raw.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
