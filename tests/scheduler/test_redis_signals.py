"""RedisSignalCache and RedisDecisionSink against a real redis-server, the records written
by the agent's own publisher."""

from __future__ import annotations

import dataclasses
import logging
import math
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pytest
import redis
from prometheus_client import CollectorRegistry

from interference import keys, sched_record
from interference.decision import CandidateVerdict, Decision, decision_hash, parse_decision_hash
from interference.index import IndexReferences
from interference.signals import NodeMetrics, NodeReport
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.queued_decision_sink import QueuedDecisionSink
from scheduler.adapters.redis_settings import ACL_COMMANDS, RedisSettings, connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import BulkHistogram, SignalMetrics
from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.settings import CycleSettings
from tests.builders import node_obj, pod_obj, table_of
from tests.conftest import RedisServer, free_port
from tests.scheduler.frames import stale_nodes
from tests.shaped_reports import shaped_report

pytestmark = pytest.mark.redis

NODES = ("a", "b", "c")
SETTINGS = RedisSettings(
    poll_interval_s=0.05, retry_initial_s=0.05, retry_max_s=0.2, log_interval_s=3600
)


def report(
    node: str, ts: float, p99_us: float = 1000.0, measured: tuple[str, ...] = ("psi", "runq")
) -> NodeReport:
    metrics = NodeMetrics(runq_p99_us=p99_us)
    return NodeReport(
        node=node, ts=ts, interval_s=1.0, metrics=metrics, measured=measured,
        histograms={"runq_us": [5, 3, 1]},
    )  # fmt: skip


def wait_until(predicate: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def rejected(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value(
        "interference_scheduler_signal_records_rejected_total", {"reason": reason}
    )
    return value or 0.0


@pytest.fixture
def raw(redis_server: RedisServer) -> redis.Redis[bytes]:
    return redis.Redis(port=redis_server.port)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def publisher(redis_server: RedisServer) -> Iterator[RedisPublisher]:
    pub = RedisPublisher(PublisherSettings(redis_url=redis_server.url))
    yield pub
    pub.close()


def _settings(server: RedisServer) -> RedisSettings:
    return dataclasses.replace(SETTINGS, url=server.url)


def make_cache(
    server: RedisServer,
    registry: CollectorRegistry,
    nodes: tuple[str, ...] = NODES,
    env: dict[str, str] | None = None,
) -> RedisSignalCache:
    settings = _settings(server)
    return RedisSignalCache(
        connect(settings, env=env or {}),
        settings,
        SignalMetrics(registry),
        known_nodes=lambda: nodes,
    )


@pytest.fixture
def cache(redis_server: RedisServer, registry: CollectorRegistry) -> RedisSignalCache:
    return make_cache(redis_server, registry)


@pytest.fixture
def running(cache: RedisSignalCache) -> Iterator[RedisSignalCache]:
    stop = threading.Event()
    thread = threading.Thread(target=cache.run, args=(stop,), daemon=True)
    thread.start()
    yield cache
    stop.set()
    thread.join(30)
    assert not thread.is_alive()


def signals_at(cache: RedisSignalCache, node: str) -> float:
    frame = cache.snapshot()
    row = frame.row(node)
    return -math.inf if row is None else float(frame.columns["signals_at"][row])


def column(cache: RedisSignalCache, node: str, name: str) -> float:
    frame = cache.snapshot()
    row = frame.row(node)
    assert row is not None
    return float(frame.columns[name][row])


def _calls(raw: redis.Redis[bytes], command: str) -> int:
    stats = raw.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_reads_every_known_node_in_one_round_trip_of_mget_and_nothing_else(
    raw: redis.Redis[bytes], publisher: RedisPublisher, cache: RedisSignalCache
) -> None:
    now = time.time()
    for i, node in enumerate(NODES):
        assert publisher.publish(shaped_report(node, now - i, pods=30))
    raw.config_resetstat()
    assert cache.poll_once() == 3
    assert _calls(raw, "mget") == 1  # one MGET for every node (batch 1000)
    assert sum(_calls(raw, c) for c in ("hgetall", "xread", "scan", "get")) == 0
    for i, node in enumerate(NODES):
        assert signals_at(cache, node) == pytest.approx(now - i)
    assert cache.poll_once() == 0  # nothing new: nothing re-applied
    assert stale_nodes(cache.snapshot(), now) == []


def test_the_index_is_computed_from_the_signals_with_the_schedulers_references(
    publisher: RedisPublisher, cache: RedisSignalCache
) -> None:
    now = time.time()
    # The agent's own index says quiet (0); the run-queue p99 says saturated.
    saturated = dataclasses.replace(
        report("a", now, p99_us=20_000.0),
        metrics=NodeMetrics(runq_p99_us=20_000.0, interference_index=0.0),
    )
    publisher.publish(saturated)
    publisher.publish(report("b", now, p99_us=100.0))
    cache.poll_once()
    assert column(cache, "a", "index_mean@latest") >= 90
    assert column(cache, "b", "index_mean@latest") == 0


def test_memory_pressure_travels_from_the_agents_record_to_a_decision(
    publisher: RedisPublisher, cache: RedisSignalCache
) -> None:
    now = time.time()
    for node, avg10 in (("a", 35.0), ("b", 0.0)):
        metrics = NodeMetrics(runq_p99_us=1000.0, psi_mem_some_avg10=avg10)
        assert publisher.publish(dataclasses.replace(report(node, now), metrics=metrics))
    cache.poll_once()
    assert column(cache, "a", "psi_mem_some_avg10") == 35.0
    table = table_of([node_obj("a"), node_obj("b")])  # alike but for the pressure on a
    table.set_signals(cache.snapshot())
    result = SchedulingCycle(CycleSettings()).schedule(
        parse_pod(pod_obj("web", requests={"cpu": "1"})), table, now
    )
    assert result.node == "b"
    scores = {c.node: c.scores.get("MemoryPressure") for c in result.candidates if c.passed}
    assert scores == {"a": 0.0, "b": 100.0}


def test_new_records_observe_their_age(
    publisher: RedisPublisher, cache: RedisSignalCache, registry: CollectorRegistry
) -> None:
    now = time.time()
    publisher.publish(report("a", now - 0.5))
    publisher.publish(report("b", now - 2.0))
    cache.poll_once()
    cache.poll_once()  # the same records again: not observed twice
    count = registry.get_sample_value("interference_scheduler_signal_age_seconds_count")
    assert count == 2
    age_sum = registry.get_sample_value("interference_scheduler_signal_age_seconds_sum") or 0
    assert 2.5 <= age_sum < 4.0


def test_an_older_record_never_replaces_a_newer_one(
    raw: redis.Redis[bytes], cache: RedisSignalCache
) -> None:
    now = time.time()
    raw.set(keys.sched_key("a"), sched_record.encode(report("a", now)))
    cache.poll_once()
    raw.set(keys.sched_key("a"), sched_record.encode(report("a", now - 5, p99_us=9e9)))
    assert cache.poll_once() == 0
    assert signals_at(cache, "a") == pytest.approx(now)


def test_degraded_and_old_records_are_stale(
    raw: redis.Redis[bytes], cache: RedisSignalCache
) -> None:
    now = time.time()
    raw.set(keys.sched_key("a"), sched_record.encode(report("a", now, measured=("psi",))))
    raw.set(keys.sched_key("b"), sched_record.encode(report("b", now - 20)))
    raw.set(keys.sched_key("c"), sched_record.encode(report("c", now)))
    cache.poll_once()
    assert column(cache, "a", "fresh_until") == -math.inf  # degraded: no run queue
    assert stale_nodes(cache.snapshot(), now) == ["a", "b"]


def _forged(node: str, ts: float, **fields: float) -> bytes:
    values = sched_record.decode(sched_record.encode(report(node, ts)))
    values.update(fields)
    layout = "<" + "".join(code for _, code in sched_record.FIELDS)
    return struct.pack(layout, *(values[name] for name, _ in sched_record.FIELDS))


YEAR_S = 365 * 24 * 3600.0
NAN, INF = math.nan, math.inf
REASONS = ("size", "version", "node", "clock", "interval", "value")
FORGED: list[tuple[str, Callable[[float], bytes], str]] = [
    ("dated a year ahead", lambda now: _forged("b", now + YEAR_S), "clock"),
    ("dated an hour ago", lambda now: _forged("b", now - 3600), "clock"),
    ("interval 1e308", lambda now: _forged("b", now + 1, interval_s=1e308), "interval"),
    ("interval 0.01 s", lambda now: _forged("b", now + 1, interval_s=0.01), "interval"),
    ("another node's record", lambda now: _forged("a", now + 1), "node"),
    (
        "with pod rows appended",
        lambda now: _forged("b", now + 1) + b"\x00" * 30 * 64,
        "size",
    ),
    ("truncated", lambda now: _forged("b", now + 1)[:100], "size"),
    ("another layout version", lambda now: _forged("b", now + 1, version=99), "version"),
    ("a negative count", lambda now: _forged("b", now + 1, **{"10s.intervals": -5}), "value"),
    (
        "a NaN signal",
        lambda now: _forged("b", now + 1, **{"latest.runq_p99_us": math.nan}),
        "value",
    ),
    ("a negative signal", lambda now: _forged("b", now + 1, **{"60s.runq_p99_us": -1.0}), "value"),
    (
        "an infinite signal",
        lambda now: _forged("b", now + 1, gpu_memory_used_mib=math.inf),
        "value",
    ),
    ("an unknown family bit", lambda now: _forged("b", now + 1, measured=1 << 15), "value"),
]


@pytest.mark.parametrize(("case", "payload", "reason"), FORGED, ids=[c[0] for c in FORGED])
def test_a_forged_or_malformed_record_is_ignored_counted_and_scheduling_goes_on(
    raw: redis.Redis[bytes],
    cache: RedisSignalCache,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
    case: str,
    payload: Callable[[float], bytes],
    reason: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="scheduler.adapters.redis_signals")
    now = time.time()
    raw.set(keys.sched_key("a"), sched_record.encode(report("a", now)))
    raw.set(keys.sched_key("b"), sched_record.encode(report("b", now - 1)))
    cache.poll_once()
    held = cache.snapshot()
    raw.set(keys.sched_key("b"), payload(now))
    for _ in range(2):
        cache.poll_once()
    # never cached: b keeps its last accepted record, which ages into staleness
    assert signals_at(cache, "b") == pytest.approx(now - 1)
    assert cache.snapshot() is held  # nothing new was published
    assert rejected(registry, reason) == 2
    assert (
        sum(
            rejected(registry, r) for r in ("size", "version", "node", "clock", "interval", "value")
        )
        == 2
    )
    lines = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(lines) == 1 and f"({reason})" in lines[0] and "node b" in lines[0]
    # scheduling goes on: the cycle decides over the frame
    table = table_of([node_obj(n) for n in NODES])
    table.set_signals(cache.snapshot())
    result = SchedulingCycle(CycleSettings()).schedule(parse_pod(pod_obj()), table, now)
    assert result.node in NODES


def test_a_forged_record_for_a_node_without_one_never_looks_quiet(
    raw: redis.Redis[bytes], cache: RedisSignalCache, registry: CollectorRegistry
) -> None:
    now = time.time()
    raw.set(keys.sched_key("b"), _forged("b", now + YEAR_S))
    cache.poll_once()
    assert signals_at(cache, "b") == -math.inf  # no signals: the stale policy applies
    table = table_of([node_obj(n) for n in NODES])
    table.set_signals(cache.snapshot())
    assert table.signals_at[table.row_of("b")] == -np.inf
    assert table.fresh_until[table.row_of("b")] == -math.inf


def test_records_of_names_that_are_no_node_are_never_read_but_counted(
    raw: redis.Redis[bytes],
    publisher: RedisPublisher,
    cache: RedisSignalCache,
    registry: CollectorRegistry,
) -> None:
    now = time.time()
    for i in range(50):
        publisher.publish(report(f"invented-{i}", now))
    publisher.publish(report("a", now))
    cache.poll_once()
    assert cache.snapshot().names == NODES
    assert cache.count_strays() == 50
    assert rejected(registry, "unknown_node") == 50


def test_follows_nodes_as_they_come_and_go(
    raw: redis.Redis[bytes], redis_server: RedisServer, registry: CollectorRegistry
) -> None:
    known = ["a"]
    settings = _settings(redis_server)
    cache = RedisSignalCache(
        connect(settings, env={}), settings, SignalMetrics(registry), known_nodes=lambda: known
    )
    now = time.time()
    for node in ("a", "b"):
        raw.set(keys.sched_key(node), sched_record.encode(report(node, now)))
    cache.poll_once()
    assert cache.snapshot().names == ("a",)
    known.append("b")
    cache.poll_once()
    assert signals_at(cache, "a") == pytest.approx(now) and signals_at(cache, "b") == pytest.approx(
        now
    )
    known.remove("a")
    cache.poll_once()
    assert cache.snapshot().names == ("b",)


def test_writes_the_ranking_with_its_own_index_and_drops_nodes_without_a_usable_record(
    raw: redis.Redis[bytes], cache: RedisSignalCache
) -> None:
    now = time.time()
    raw.zadd(keys.NODES_BY_INDEX, {"gone": 5.0, "b": 0.0})
    raw.set(keys.sched_key("a"), sched_record.encode(report("a", now, p99_us=20_000.0)))
    raw.set(keys.sched_key("b"), sched_record.encode(report("b", now, measured=("psi",))))
    cache.poll_once()
    assert cache.write_ranking(now)
    ranking = {m.decode(): s for m, s in raw.zrange(keys.NODES_BY_INDEX, 0, -1, withscores=True)}
    assert ranking.keys() == {"a"} and ranking["a"] >= 90
    assert raw.zscore(keys.NODES_UPDATED, "a") == pytest.approx(now)


def test_redis_down_goes_blind_with_a_metric_and_one_log_then_recovers(
    redis_server: RedisServer,
    running: RedisSignalCache,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="scheduler.adapters.redis_signals")
    wait_until(running.healthy)
    now = time.time()
    redis_server.client().set(keys.sched_key("a"), sched_record.encode(report("a", now)))
    wait_until(lambda: signals_at(running, "a") > 0)
    redis_server.stop()
    wait_until(lambda: not running.healthy())
    wait_until(
        lambda: (registry.get_sample_value("interference_scheduler_redis_errors_total") or 0) >= 3
    )
    assert signals_at(running, "a") == pytest.approx(now)  # the last data stay, ageing
    outage_lines = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(outage_lines) == 1
    assert "interference-blind" in outage_lines[0].getMessage()

    redis_server.start()
    wait_until(running.healthy)
    redis_server.client().set(keys.sched_key("b"), sched_record.encode(report("b", now + 1)))
    wait_until(lambda: signals_at(running, "b") == pytest.approx(now + 1))


def test_unreachable_at_start_is_unhealthy_not_fatal(registry: CollectorRegistry) -> None:
    settings = dataclasses.replace(
        SETTINGS, url=f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=1
    )
    cache = RedisSignalCache(
        connect(settings, env={}), settings, SignalMetrics(registry), known_nodes=lambda: NODES
    )
    stop = threading.Event()
    thread = threading.Thread(target=cache.run, args=(stop,), daemon=True)
    thread.start()
    wait_until(
        lambda: (registry.get_sample_value("interference_scheduler_redis_errors_total") or 0) >= 2
    )
    assert not cache.healthy()
    assert (cache.snapshot().columns["signals_at"] == -math.inf).all()  # no signals at all
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


@pytest.mark.parametrize(
    ("record_key", "other_key"),
    [
        (keys.decision_key, keys.rebalance_decision_key),
        (keys.rebalance_decision_key, keys.decision_key),
    ],
)
def test_decision_sink_writes_and_reads_under_its_key_function(
    raw: redis.Redis[bytes],
    redis_server: RedisServer,
    record_key: Callable[[str, str], str],
    other_key: Callable[[str, str], str],
) -> None:
    """The rebalancer's sink (``rebalance_decision_key``) and the loop's (the default)
    write the same fields and TTL, each under its own key only."""
    settings = dataclasses.replace(_settings(redis_server), decision_ttl_s=600)
    sink = RedisDecisionSink(
        connect(settings), settings, SignalMetrics(CollectorRegistry()), record_key=record_key
    )
    kept = dataclasses.replace(decision(), message="the other record")
    raw.hset(other_key("ml", "train-0"), mapping=decision_hash(kept))  # type: ignore[arg-type]
    looked = dataclasses.replace(decision(), result="would_evict", node="n2", dry_run=True)
    sink.write(looked)
    assert parse_decision_hash(raw.hgetall(record_key("ml", "train-0"))) == looked
    assert 0 < raw.ttl(record_key("ml", "train-0")) <= 600
    assert parse_decision_hash(raw.hgetall(other_key("ml", "train-0"))) == kept
    assert sink.read("ml", "train-0") == looked


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
    raw: redis.Redis[bytes], redis_server: RedisServer, publisher: RedisPublisher
) -> None:
    # The scheduler's ACL user as deploy/ defines it: read the nodes' keys, write the
    # ranking and decisions, and no command beyond ACL_COMMANDS.
    rules = ["resetkeys", "%R~intf:node:*", "~intf:nodes", "~intf:nodes:updated"]
    rules += ["%W~intf:decision:*", "resetchannels", "-@all"]
    raw.execute_command(
        "ACL", "SETUSER", "scheduler", "on", ">s3cret", *rules, *(f"+{c}" for c in ACL_COMMANDS)
    )
    now = time.time()
    publisher.publish(shaped_report("a", now))
    env = {"REDIS_USERNAME": "scheduler", "REDIS_PASSWORD": "s3cret"}
    registry = CollectorRegistry()
    settings = _settings(redis_server)
    metrics = SignalMetrics(registry)
    cache = RedisSignalCache(connect(settings, env=env), settings, metrics, lambda: ("a",))
    assert cache.poll_once() == 1
    assert cache.write_ranking(now)
    assert cache.count_strays() == 0
    RedisDecisionSink(connect(settings, env=env), settings, metrics).write(decision())
    assert registry.get_sample_value("interference_scheduler_decision_write_errors_total") == 0
    assert raw.exists(keys.decision_key("ml", "train-0"))

    wrong = connect(settings, env={"REDIS_USERNAME": "scheduler", "REDIS_PASSWORD": "nope"})
    with pytest.raises(redis.AuthenticationError):
        wrong.client().mget([keys.sched_key("a")])


def test_bulk_histogram_counts_like_prometheus_histograms() -> None:
    registry = CollectorRegistry()
    histogram = BulkHistogram("age_seconds", "ages", (0.5, 1.0), registry)
    histogram.observe_many(np.array([0.1, 0.5, 0.7, 1.0, 3.0]))
    histogram.observe_many(np.array([]))
    samples = {
        le: registry.get_sample_value("age_seconds_bucket", {"le": le})
        for le in ("0.5", "1.0", "+Inf")
    }
    assert samples == {"0.5": 2, "1.0": 4, "+Inf": 5}  # a value on a bound counts in it
    assert registry.get_sample_value("age_seconds_count") == 5
    assert registry.get_sample_value("age_seconds_sum") == pytest.approx(5.3)


def test_the_index_follows_the_configured_references(
    publisher: RedisPublisher, redis_server: RedisServer, registry: CollectorRegistry
) -> None:
    strict = IndexReferences(runq_p99_us_quiet=100.0, runq_p99_us=200.0)
    settings = dataclasses.replace(_settings(redis_server), index_references=strict)
    cache = RedisSignalCache(
        connect(settings, env={}), settings, SignalMetrics(registry), lambda: ("a",)
    )
    publisher.publish(report("a", time.time(), p99_us=1000.0))  # default references: quiet
    cache.poll_once()
    assert column(cache, "a", "index_mean@latest") == 100


def test_a_poll_with_no_known_node_still_finds_out_that_redis_is_down(
    redis_server: RedisServer, registry: CollectorRegistry
) -> None:
    cache = make_cache(redis_server, registry, nodes=())
    assert cache.poll_once() == 0
    redis_server.stop()
    with pytest.raises(redis.ConnectionError):
        cache.poll_once()


def test_decisions_wait_while_redis_is_fuller_than_their_share(
    raw: redis.Redis[bytes], redis_server: RedisServer, registry: CollectorRegistry
) -> None:
    used = int(raw.info("memory")["used_memory"])
    raw.config_set("maxmemory", str(int(used / 0.5)))  # now at about half of maxmemory
    clock = [0.0]
    settings = dataclasses.replace(_settings(redis_server), decision_memory_limit=0.4)
    sink = RedisDecisionSink(
        connect(settings, env={}), settings, SignalMetrics(registry), clock=lambda: clock[0]
    )
    sink.write(decision())
    assert not raw.exists(keys.decision_key("ml", "train-0"))
    assert registry.get_sample_value("interference_scheduler_decision_write_errors_total") == 1
    raw.config_set("maxmemory", "0")  # no limit: decisions are written again at the next look
    sink.write(decision())
    assert not raw.exists(keys.decision_key("ml", "train-0"))  # still the cached answer
    clock[0] += 5.0
    sink.write(decision())
    assert raw.exists(keys.decision_key("ml", "train-0"))
