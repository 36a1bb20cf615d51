"""`interference node NODE` names the culprits and tells a pod's own limit from
neighbours, from what the agent's publisher wrote to a real redis-server."""

from __future__ import annotations

import time

import pytest

from interference.signals import NodeMetrics, NodeReport, PodMetrics
from interference_cli.main import main
from tests.cli.test_query import publish
from tests.conftest import RedisServer

pytestmark = pytest.mark.redis


def contended_node(now: float) -> NodeReport:
    victim = PodMetrics(
        "web",
        "api-0",
        uid="u1",
        qos="burstable",
        cpu_ms_per_s=180.0,
        runq_wait_ms_per_s=820.0,
        runq_p99_us=57_000.0,
        neighbour_wait_ms_per_s=820.0,
        culprits=(("batch/stress-1", 600.0), ("system", 170.0), ("web/limited", 50.0)),
    )
    # Throttled by its own quota: long waits, named neighbours, yet its own doing.
    limited = PodMetrics(
        "web",
        "limited",
        uid="u2",
        qos="burstable",
        cpu_ms_per_s=50.0,
        runq_wait_ms_per_s=918.0,
        runq_p99_us=130_000.0,
        throttled_ms_per_s=892.0,
        neighbour_wait_ms_per_s=918.0,
        culprits=(("batch/stress-1", 500.0), ("web/api-0", 418.0)),
    )
    antagonist = PodMetrics(
        "batch", "stress-1", uid="u3", qos="besteffort", cpu_ms_per_s=1600.0, own_wait_ms_per_s=5.0
    )
    return NodeReport(
        node="busy-node",
        ts=now,
        interval_s=1.0,
        metrics=NodeMetrics(runq_p99_us=60_000.0, runq_wait_ratio=0.9, interference_index=90.0),
        histograms={"runq_us": [0, 3, 10, 40]},
        pods=[victim, limited, antagonist],
        measured=("runq", "throttle"),
    )


def row_of(table: str, first_cell: str) -> str:
    """The table line whose first cell is ``first_cell``."""
    return next(
        line
        for line in table.splitlines()
        if line.count("│") > 2 and line.split("│")[1].strip() == first_cell
    )


def test_node_names_culprits_and_own_limit(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    publish(redis_server.client(), contended_node(time.time()))
    assert main(["--redis-url", redis_server.url, "node", "busy-node"]) == 0
    out = capsys.readouterr().out
    victims = out[out.index("victims") : out.index("culprits (whose")]
    culprits = out[out.index("culprits (whose") : out.index("antagonists")]
    api_line, limited_line = (row_of(victims, pod) for pod in ("web/api-0", "web/limited"))
    assert "neighbours" in api_line and "batch/stress-1 600.0" in api_line
    assert "own_limit" in limited_line
    # batch/stress-1 kept two pods waiting, 1100 ms/s in all; listed first.
    first = next(line for line in culprits.splitlines() if line.startswith("│"))
    assert first == row_of(culprits, "batch/stress-1")
    assert "1100.0" in first and "web/api-0 (600.0)" in first
    assert "170.0" in row_of(culprits, "system")


def test_node_without_culprits_says_so(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    report = contended_node(time.time())
    quiet = NodeReport(
        node="quiet-node",
        ts=report.ts,
        interval_s=1.0,
        metrics=NodeMetrics(),
        histograms={"runq_us": [5]},
        pods=[PodMetrics("web", "api-1", uid="u4", cpu_ms_per_s=10.0)],
        measured=("runq",),
    )
    publish(redis_server.client(), quiet)
    assert main(["--redis-url", redis_server.url, "node", "quiet-node"]) == 0
    assert "no pod waited behind another" in capsys.readouterr().out
