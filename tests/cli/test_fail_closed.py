"""Fail closed, end to end: an agent whose run-queue probes all failed, next to a healthy
one, both real ``interference-agent`` processes publishing to a real redis-server.

The broken agent publishes all zeros; it must not look like the quietest node: it is not
ready (``/readyz`` 503), ``interference top --all`` and ``node`` show it ``degraded``,
and the scheduler's signal cache and cycle treat it exactly like a stale node and leave
it out of the ranking the scheduler writes. On SIGTERM both agents delete their own
keys, and the scheduler's ranking drops the nodes once their last records are stale."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from interference import keys
from interference_cli.main import main
from scheduler.adapters.redis_settings import RedisSettings
from scheduler.adapters.redis_settings import connect as connect_signals
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.api.objects import ANNOTATION_MAX_RUNQ_P99_US
from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.plugins.interference import InterferenceArgs, quietness, stale_rows
from tests.builders import node_obj, pod_obj, table_of
from tests.conftest import RedisServer, free_port
from tests.node_agent.test_agent import wait_for
from tests.node_agent.test_health import get
from tests.scheduler.frames import stale_nodes
from tests.scheduler.profiles import interference_settings
from tests.scheduler.runtime_helpers import LoopHarness

pytestmark = [pytest.mark.redis, pytest.mark.slow]

AGENT = str(Path(sys.executable).with_name("interference-agent"))


@dataclass(frozen=True)
class Agent:
    port: int
    """Its /healthz, /readyz and /metrics port."""
    process: subprocess.Popen[bytes]


@pytest.fixture
def agents(redis_server: RedisServer, tmp_path: Path) -> Iterator[dict[str, Agent]]:
    """``broken`` (BPF probes that cannot load, no fallback) and ``healthy`` (taskstats);
    stopped with SIGTERM, each must exit 0."""
    argv = {
        "broken": ["--probes", "runqlat,reclaim", "--bpf-dir", str(tmp_path / "nonexistent")],
        "healthy": ["--probes", "taskstats"],
    }
    ports = {name: free_port() for name in argv}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: tmp_path / f"{name}.log" for name in argv}
    try:
        for name, extra in argv.items():
            env = {**os.environ, "HTTP_PORT": str(ports[name]), "HTTP_ADDRESS": "127.0.0.1"}
            command = [AGENT, "--no-kubernetes", "--node-name", f"{name}-node"]
            command += ["--interval", "0.5", "--redis-url", redis_server.url, *extra]
            with logs[name].open("wb") as log:
                procs[name] = subprocess.Popen(command, stderr=log, env=env)
        yield {name: Agent(ports[name], procs[name]) for name in argv}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in procs.items():
            assert proc.wait(timeout=30) == 0, logs[name].read_text(errors="replace")


NODES = ("broken-node", "healthy-node")


def follower(redis_server: RedisServer) -> RedisSignalCache:
    """The scheduler's signal cache following both Nodes."""
    settings = RedisSettings(url=redis_server.url, poll_interval_s=0.2)
    metrics = SignalMetrics(CollectorRegistry())
    return RedisSignalCache(
        connect_signals(settings, {}), settings, metrics, known_nodes=lambda: NODES
    )


def both_records(client: redis.Redis[str]) -> bool:
    return client.exists(*(keys.sched_key(node) for node in NODES)) == len(NODES)


def test_a_broken_agent_is_not_ready_degraded_and_stale_to_the_scheduler(
    agents: dict[str, Agent], redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    client = redis_server.client()
    wait_for("both nodes' scheduling records", lambda: both_records(client))

    # The agent: alive, not ready, saying why.
    wait_for("the broken agent to answer", lambda: _answers(agents["broken"].port))
    status, reason = get(agents["broken"].port, "/readyz")
    assert status == 503
    assert "no probe measures the core signal family runq" in reason
    wait_for("the healthy agent to be ready", lambda: _answers(agents["healthy"].port, "/readyz"))
    assert client.hget(keys.node_key("broken-node"), "measured") == ""
    assert client.hget(keys.node_key("broken-node"), "interference_index") == "0"

    # The scheduler: the signal cache and the cycle treat it as stale.
    cache = follower(redis_server)
    assert cache.poll_once() == 2  # both records are well-formed and accepted
    now = time.time()
    frame = cache.snapshot()
    broken, healthy = frame.row("broken-node"), frame.row("healthy-node")
    assert broken is not None and healthy is not None
    assert frame.columns["signals_at"][broken] > now - 5  # a record of the last seconds...
    assert frame.columns["fresh_until"][broken] == -math.inf  # ...that is never usable
    assert frame.families("broken-node") == ()
    assert "runq" in frame.families("healthy-node")
    assert stale_nodes(cache.snapshot(), now) == ["broken-node"]
    table = table_of([node_obj("broken-node"), node_obj("healthy-node")])
    table.set_signals(frame)
    assert stale_rows(table, now).tolist() == [0]
    cycle = SchedulingCycle(interference_settings(stale_policy="reject"), seed=1)
    result = cycle.schedule(parse_pod(pod_obj("web-0")), table, now)
    assert result.node == "healthy-node", result.message
    for policy, score in (("neutral", 50.0), ("avoid", 0.0)):
        as_stale = quietness(table, InterferenceArgs(stale_policy=policy), now)  # type: ignore[arg-type]
        assert as_stale[0] == score, policy  # not the 100 of its all-zero signals

    # The ranking the scheduler writes holds only the usable node.
    assert cache.write_ranking(now)
    assert client.zrange(keys.NODES_BY_INDEX, 0, -1) == ["healthy-node"]

    # The CLI: `top` lists the ranked (usable) node ok; `top --all` also the broken one,
    # degraded and listed after it; `node` says so too.
    assert main(["--redis-url", redis_server.url, "top"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert " ok" in next(line for line in lines if "healthy-node" in line)
    assert main(["--redis-url", redis_server.url, "top", "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    broken_line = next(line for line in lines if "broken-node" in line)
    healthy_line = next(line for line in lines if "healthy-node" in line)
    assert "degraded" in broken_line and "ok" not in broken_line.split("│")[-2]
    assert " ok" in healthy_line
    assert lines.index(healthy_line) < lines.index(broken_line)
    assert main(["--redis-url", redis_server.url, "node", "broken-node"]) == 0
    assert "node broken-node — DEGRADED" in capsys.readouterr().out


def test_clean_shutdown_deletes_the_nodes_keys_and_they_leave_the_ranking(
    agents: dict[str, Agent], redis_server: RedisServer
) -> None:
    client = redis_server.client()
    wait_for("both nodes' scheduling records", lambda: both_records(client))
    cache = follower(redis_server)
    assert cache.poll_once() == 2
    assert cache.write_ranking()
    assert client.zrange(keys.NODES_BY_INDEX, 0, -1) == ["healthy-node"]
    for agent in agents.values():
        wait_for("the agent to answer", lambda agent=agent: _answers(agent.port))  # type: ignore[misc]
        agent.process.send_signal(signal.SIGTERM)
    for agent in agents.values():
        assert agent.process.wait(timeout=30) == 0
    assert client.keys("intf:node:*") == []  # every key of both nodes, pods included

    def ranking_empty() -> bool:
        cache.poll_once()
        cache.write_ranking()
        return client.zcard(keys.NODES_BY_INDEX) == client.zcard(keys.NODES_UPDATED) == 0

    # the last records age out of the freshness window (5 s), then leave the ranking
    wait_for("the ranking to drop the nodes", ranking_empty, timeout_s=20)
    assert stale_nodes(cache.snapshot(), time.time()) == list(NODES)  # its last records, now stale


def _answers(port: int, path: str = "/healthz") -> bool:
    try:
        return get(port, path)[0] == 200
    except OSError:
        return False


def test_a_redis_outage_keeps_tolerant_pods_pending_and_places_the_others(
    redis_server: RedisServer,
) -> None:
    """The real signal cache loses its real redis-server: a pod with a tolerance waits with
    the reason, a pod without one is placed (``stale_policy: neutral``)."""
    settings = RedisSettings(url=redis_server.url, poll_interval_s=0.2, retry_initial_s=0.1)
    signals = RedisSignalCache(
        connect_signals(settings, {}),
        settings,
        SignalMetrics(CollectorRegistry()),
        known_nodes=lambda: ("n1", "n2"),
    )
    stop = threading.Event()
    poller = threading.Thread(target=signals.run, args=(stop,), daemon=True)
    poller.start()
    harness = LoopHarness(signals=signals)
    try:
        wait_for("the first poll", signals.healthy, timeout_s=10)
        redis_server.stop()
        wait_for("the outage noticed", lambda: not signals.healthy(), timeout_s=10)
        for name in ("n1", "n2"):
            harness.cluster.add_node(node_obj(name, cpu="4"))
        tolerant = {ANNOTATION_MAX_RUNQ_P99_US: "500"}
        harness.cluster.add_pod(pod_obj("latency", requests={"cpu": "1"}, annotations=tolerant))
        harness.cluster.add_pod(pod_obj("batch", requests={"cpu": "1"}))
        assert harness.step() == 2
        assert harness.cluster.node_of("default", "batch") in ("n1", "n2")
        assert harness.cluster.node_of("default", "latency") is None
        message = harness.decisions.last("latency").message
        assert message == (
            "0/2 nodes are available: 2 node(s) had no readable interference signals"
            " (the signal store cannot be read)."
        )
        reasons = [e.reason for e in harness.cluster.events_for("default", "latency")]
        assert reasons == ["FailedScheduling"]
        assert harness.metric("interference_scheduler_signals_healthy") == 0
    finally:
        stop.set()
        poller.join(10)
        harness.close()
