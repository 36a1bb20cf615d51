"""The rebalancer's Redis adapter on a real redis-server: the pods' rows read back from
the report streams the agent's real publisher writes. (Its journal of moves is a
ConfigMap: tests/e2e/test_rebalancer_memory.py.)"""

from __future__ import annotations

import pytest

from interference import keys
from interference.signals import NodeMetrics, NodeReport, PodMetrics
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.node_reports import RedisNodeReportSource
from scheduler.adapters.redis_settings import RedisSettings, connect
from tests.conftest import RedisServer

pytestmark = [pytest.mark.redis]


def report(node: str, ts: float, *pods: PodMetrics) -> NodeReport:
    return NodeReport(node, ts, 1.0, NodeMetrics(), pods=list(pods), measured=("runq",))


def test_every_interval_of_a_nodes_stream_comes_back_with_its_pod_rows(
    redis_server: RedisServer,
) -> None:
    publisher = RedisPublisher(PublisherSettings(redis_url=redis_server.url))
    try:
        for second in range(12):  # more than the stream keeps
            row = PodMetrics("shop", "web-1", uid="u1", runq_us=(second,), cpu_ms_per_s=200)
            publisher.publish(report("node-a", 1000.0 + second, row))
        publisher.publish(report("node-b", 1011.0))
    finally:
        publisher.close()
    reports = RedisNodeReportSource(connect(RedisSettings(url=redis_server.url), {}))
    found = reports.recent(["node-a", "node-b", "node-gone"])
    assert set(found) == {"node-a", "node-b"}
    assert sorted(r.ts for r in found["node-a"]) == [1000.0 + s for s in range(2, 12)]
    rows = {r.ts: r.pods[0] for r in found["node-a"]}
    assert rows[1011.0].runq_us == (11,) and rows[1011.0].uid == "u1"
    assert found["node-b"][0].pods == []


def test_a_stream_entry_that_does_not_decode_is_left_out(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.xadd(keys.reports_key("node-a"), {keys.REPORTS_FIELD: "not msgpack"})
    reports = RedisNodeReportSource(connect(RedisSettings(url=redis_server.url), {}))
    assert reports.recent(["node-a"]) == {}
    assert reports.undecodable == 1
