"""The security review's finding on a real redis-server: 200 ``/filter`` calls naming pods
of the caller's choosing, on a Redis full to its ``maxmemory`` with ``volatile-ttl``,
evicted 13 of 50 live node hashes (each call wrote a 24 h decision record). Now such calls
are answered and write nothing, so every node hash stays. Beside it, on an identical
Redis, the same 200 calls about pods the informers know (each writes its record) do evict
node hashes: the calibration that the store is as full as in the review."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from interference import keys
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.queued_decision_sink import QueuedDecisionSink
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.extender.decision_records import RECORD_CONFIRM_S
from tests.builders import pod_obj
from tests.conftest import running_redis_server
from tests.scheduler.test_extender import Harness

pytestmark = [pytest.mark.redis]

NODE_HASHES = 50
CALLS = 200
HEADROOM = 256 * 1024
"""Free memory under ``maxmemory`` when the calls begin: more than the writer's own
connection takes (~140 KB), less than 200 records (~2.2 KB each, names of 253 characters)."""


def calls_on_a_full_redis(informed: bool) -> tuple[int, int]:
    """(node hashes left of 50, decision records written) after ``CALLS`` filter calls,
    each about a different pod, the informer knowing them or not."""
    with running_redis_server() as server:
        store = server.client()
        for i in range(NODE_HASHES):
            node = keys.node_key(f"node-{i:02d}")
            store.hset(node, mapping={"ts": "1", "runq_p99_us": "40", "pad": "x" * 2000})
            store.expire(node, 30)  # the agents' short TTL: the first to go on volatile-ttl
        store.config_set("maxmemory-policy", "volatile-ttl")
        store.config_set("maxmemory", str(int(store.info("memory")["used_memory"]) + HEADROOM))
        settings = RedisSettings(url=server.url, decision_memory_limit=1.0)
        sink = QueuedDecisionSink(
            RedisDecisionSink(
                connect(settings, env={}), settings, SignalMetrics(CollectorRegistry())
            ),
            settings,
        )
        harness = Harness(decisions=sink)  # the real writer in place of the in-memory one
        try:
            for i in range(CALLS):
                pod = pod_obj(f"{i:03d}-" + "p" * 249)
                code, answer = harness.filter(pod, ["quiet", "noisy", "small"], informed=informed)
                assert code == 200 and answer["NodeNames"]
            harness.clock.advance(RECORD_CONFIRM_S + 1)
            harness.extender.confirm_records()
        finally:
            sink.close()  # writes what was queued
        left = sum(store.exists(keys.node_key(f"node-{i:02d}")) for i in range(NODE_HASHES))
        records = len(list(store.scan_iter(keys.decision_key("default", "*"))))
        return left, records


def test_forged_filter_calls_on_a_full_redis_evict_no_node_hash() -> None:
    assert calls_on_a_full_redis(informed=False) == (NODE_HASHES, 0)
    left, records = calls_on_a_full_redis(informed=True)
    assert records > 0 and left < NODE_HASHES  # the same store does evict for real records
