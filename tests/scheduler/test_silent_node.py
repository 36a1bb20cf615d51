"""A node whose agent stops falls back to "no signals" within the agents' own interval
bound, whatever its last record claimed (issue 28, item 6; docs/design.md §7).

Before: a record dated 29 s ahead (inside the clock skew allowed) with ``interval_s`` 60
stayed fresh for 29 + 180 s after its agent stopped, so a node lying "quiet" kept its lie
~210 s; an honest node went stale after 5 s. Real redis-server; the scheduler's follower
with its clock held by the test.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import redis
from prometheus_client import CollectorRegistry

from interference import freshness, keys, sched_record
from interference.signals import NodeMetrics, NodeReport
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from tests.conftest import RedisServer
from tests.scheduler.frames import stale_nodes

pytestmark = pytest.mark.redis

SETTINGS = RedisSettings(poll_interval_s=0.05, log_interval_s=3600)
BOUND_S = freshness.stale_after_s(SETTINGS.max_agent_interval_s)


def quiet(node: str, ts: float, interval_s: float) -> NodeReport:
    """The quietest record there is: nothing waits, nothing stalls."""
    return NodeReport(
        node=node, ts=ts, interval_s=interval_s, metrics=NodeMetrics(runq_p99_us=1.0),
        measured=("psi", "runq"), histograms={"runq_us": [1]},
    )  # fmt: skip


# (case, ts ahead of the clock, claimed interval, rejected for, seconds fresh after the read)
CASES = [
    ("honest, 1 s interval", 0.0, 1.0, None, freshness.stale_after_s(1.0)),
    ("dated 29 s ahead", 29.0, 1.0, None, freshness.stale_after_s(1.0)),
    ("dated ahead, longest allowed interval", 29.0, SETTINGS.max_agent_interval_s, None, BOUND_S),
    ("claims a 60 s interval", 29.0, 60.0, "interval", None),
    ("claims a 10 s interval", 0.0, 10.0, "interval", None),
]


@pytest.mark.parametrize(
    ("case", "ahead_s", "interval_s", "reason", "fresh_for_s"), CASES, ids=[c[0] for c in CASES]
)
def test_a_stopped_agents_last_record_stops_counting_within_the_interval_bound(
    redis_server: RedisServer,
    case: str,
    ahead_s: float,
    interval_s: float,
    reason: str | None,
    fresh_for_s: float | None,
) -> None:
    now = [time.time()]
    registry = CollectorRegistry()
    settings = dataclasses.replace(SETTINGS, url=redis_server.url)
    cache = RedisSignalCache(
        connect(settings, env={}),
        settings,
        SignalMetrics(registry),
        known_nodes=lambda: ("liar", "honest"),
        clock=lambda: now[0],
    )
    publisher = RedisPublisher(PublisherSettings(redis_url=redis_server.url, ttl_s=3600))
    raw = redis.Redis(port=redis_server.port)
    try:
        read_at = now[0]
        # The lie is a plain SET without expiry, as a subverted agent may write it.
        raw.set(
            keys.sched_key("liar"),
            sched_record.encode(quiet("liar", read_at + ahead_s, interval_s)),
        )
        assert publisher.publish(quiet("honest", read_at, 1.0))
        cache.poll_once()
        # The agents stop; their records stay in Redis (no TTL), read every poll.
        frame = cache.snapshot()
        row = frame.row("liar")
        assert row is not None
        if reason is not None:
            assert (
                registry.get_sample_value(
                    "interference_scheduler_signal_records_rejected_total", {"reason": reason}
                )
                == 1
            )
            assert frame.columns["fresh_until"][row] == float("-inf")  # never counted
            return
        assert fresh_for_s is not None
        assert frame.columns["fresh_until"][row] == pytest.approx(read_at + fresh_for_s)
        for step in (1.0, fresh_for_s - 0.1, fresh_for_s + 0.1, fresh_for_s + 5):
            now[0] = read_at + step
            cache.poll_once()  # the same record again: nothing renews it
            stale = stale_nodes(cache.snapshot(), now[0])
            assert ("liar" in stale) == (step > fresh_for_s), (case, step)
            assert ("honest" in stale) == (step > freshness.stale_after_s(1.0)), (case, step)
        assert fresh_for_s <= BOUND_S
    finally:
        publisher.close()
        raw.close()


def test_the_agents_interval_bound_is_a_setting_within_the_layouts_range() -> None:
    assert RedisSettings(max_agent_interval_s=5.0).max_agent_interval_s == 5.0
    for bad in (0.0, 0.05, 61.0, float("nan")):
        with pytest.raises(ValueError, match="max_agent_interval_s"):
            RedisSettings(max_agent_interval_s=bad)
