"""The agent's /healthz, /readyz and /metrics: the liveness rule as a table, then real
HTTP requests against an agent running in a thread and against the real process."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from interference.signals import NodeReport
from node_agent.agent import Agent
from node_agent.health import AgentHttpServer, AgentMetrics, liveness_problem
from node_agent.pods import StaticPodDirectory
from node_agent.probes.base import CollectFailed, Sample
from node_agent.settings import AgentSettings
from tests.conftest import free_port
from tests.node_agent.test_agent import wait_for

AGENT = str(Path(sys.executable).with_name("interference-agent"))


@pytest.mark.parametrize(
    ("now", "loop_started", "last_measured", "interval_s", "problem"),
    [
        (10.0, None, None, 1.0, "starting"),
        (10.0, 9.0, None, 1.0, ""),
        (12.0, 9.0, None, 1.0, ""),  # exactly 3 intervals without a report yet: still fine
        (12.5, 9.0, None, 1.0, "no interval measured yet for 3.5 s"),
        (10.0, 1.0, 9.5, 1.0, ""),
        (10.0, 1.0, 6.0, 1.0, "no interval measured for 4.0 s (limit 3 × 1 s)"),
        (10.0, 1.0, 6.0, 2.0, ""),
        (100.0, 1.0, 40.0, 10.0, "no interval measured for 60.0 s (limit 3 × 10 s)"),
    ],
)
def test_liveness_rule(
    now: float,
    loop_started: float | None,
    last_measured: float | None,
    interval_s: float,
    problem: str,
) -> None:
    found = liveness_problem(now, loop_started, last_measured, interval_s)
    assert found.startswith(problem) if problem else found == ""


def get(port: int, path: str) -> tuple[int, str]:
    """Status and body of a GET to the agent on 127.0.0.1."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of a Prometheus text exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class GatedSink:
    """A report sink that accepts or drops reports (a Redis outage, ``accept`` False) and
    can be made to hang."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.accept = True
        self.calls = 0
        self.withdrawn: list[str] = []

    def publish(self, report: NodeReport) -> bool:
        self.calls += 1
        self.open.wait(timeout=60)
        return self.accept

    def withdraw(self, node: str) -> bool:
        self.withdrawn.append(node)
        return True

    def close(self) -> None:
        self.open.set()


def test_endpoints_follow_the_measure_loop() -> None:
    """Before the loop: not alive, not ready. Running: both 200 and the metrics count
    intervals, dropped reports and probes. Three publishes failing in a row: not ready until
    one succeeds. A loop stuck for > 3 intervals: 503 with why. Clean close: the node is
    withdrawn from the store."""
    registry = CollectorRegistry()
    settings = AgentSettings(
        node_name="health-node",
        interval_s=0.2,
        probes=("taskstats", "psi", "no-such-probe"),
        ncpu=2,
    )
    sink = GatedSink()
    agent = Agent(settings, StaticPodDirectory(), sink, metrics=AgentMetrics(registry))
    server = AgentHttpServer(
        "127.0.0.1", 0, registry, agent.liveness_problem, agent.readiness_problem
    )
    server.start()
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    try:
        assert get(server.port, "/healthz") == (503, agent.liveness_problem() + "\n")
        assert "starting" in get(server.port, "/healthz")[1]
        assert get(server.port, "/readyz") == (503, "no report measured yet\n")
        agent.start()
        thread.start()
        wait_for("/readyz to answer 200", lambda: get(server.port, "/readyz")[0] == 200, 30)
        assert get(server.port, "/healthz") == (200, "ok\n")
        sink.accept = False  # Redis goes away
        wait_for("/readyz to fail", lambda: get(server.port, "/readyz")[0] == 503, 30)
        assert agent.consecutive_publish_failures >= 3
        assert "reports could not be published (limit 3)" in get(server.port, "/readyz")[1]
        assert get(server.port, "/healthz") == (200, "ok\n")  # alive: only Redis is away
        sink.accept = True
        wait_for("/readyz to recover", lambda: get(server.port, "/readyz")[0] == 200, 30)

        status, text = get(server.port, "/metrics")
        assert status == 200
        found = samples(text)
        assert found[("interference_agent_intervals_measured_total", ())] >= 2
        assert found[("interference_agent_publish_failures_total", ())] >= 3
        assert found[("interference_agent_probes_running", ())] == 2
        disabled = {
            dict(labels)["probe"]: dict(labels)["reason"]
            for (name, labels), value in found.items()
            if name == "interference_agent_probe_disabled" and value == 1
        }
        assert disabled == {"no-such-probe": agent.disabled_probes["no-such-probe"]}
        assert "unknown probe" in disabled["no-such-probe"]
        assert found[("interference_agent_collect_duration_seconds_count", (("probe", "psi"),))]

        sink.open.clear()  # the next publish hangs: the loop stops completing intervals
        wait_for("/healthz to fail", lambda: get(server.port, "/healthz")[0] == 503, 30)
        assert "no interval measured for" in get(server.port, "/healthz")[1]
        assert get(server.port, "/readyz")[0] == 200  # it did measure; it is just stuck
        sink.open.set()
        wait_for("/healthz to recover", lambda: get(server.port, "/healthz")[0] == 200, 30)
        assert get(server.port, "/nothing")[0] == 404
    finally:
        stop.set()
        sink.open.set()
        if thread.is_alive():
            thread.join(timeout=10)
        server.stop()
        agent.close()
    assert not thread.is_alive()
    assert sink.withdrawn == ["health-node"]


def test_not_ready_while_no_core_probe_runs() -> None:
    """Every probe that could measure the run queue disabled: the agent runs, publishes
    reports saying so (``measured`` lacks ``runq``), and is not ready, naming why."""
    settings = AgentSettings(
        node_name="no-core",
        interval_s=0.2,
        probes=("runqlat", "psi"),
        bpf_source_dir="/nonexistent",
        ncpu=1,
    )
    sink = GatedSink()
    agent = Agent(settings, StaticPodDirectory(), sink, metrics=AgentMetrics(CollectorRegistry()))
    try:
        agent.start()
        assert "runqlat" in agent.disabled_probes
        problem = agent.readiness_problem()
        assert problem.startswith("no probe measures the core signal family runq"), problem
        assert "runqlat:" in problem  # the reason the probe could not start
        report = agent.measure()
        assert "runq" not in report.measured and "psi" in report.measured
        assert agent.readiness_problem() == problem
    finally:
        agent.close()


@pytest.mark.slow
def test_the_real_agent_serves_its_endpoints_while_redis_is_down(tmp_path: Path) -> None:
    """``interference-agent`` with an unreachable Redis: alive (the loop runs) but not ready
    (no report can be published), every dropped report counted; a second agent on the
    same port stops at once (exit 1): with hostNetwork, kubelet's probes would otherwise
    reach the first one."""
    port = free_port()
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    env = {**os.environ, "HTTP_PORT": str(port), "HTTP_ADDRESS": "127.0.0.1"}
    argv = [AGENT, "--no-kubernetes", "--probes", "taskstats,psi", "--interval", "0.3"]
    argv += ["--redis-url", unreachable]
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with logs[0].open("wb") as log:
            procs.append(subprocess.Popen([*argv, "--node-name", "first"], stderr=log, env=env))
        wait_for("/healthz of the real agent", lambda: alive(port), 60)
        wait_for("3 failed publishes", lambda: "could not be published" in get(port, "/readyz")[1])
        assert get(port, "/readyz")[0] == 503

        def dropped() -> float:
            found = samples(get(port, "/metrics")[1])
            return found[("interference_agent_publish_failures_total", ())]

        wait_for("two dropped reports counted", lambda: dropped() >= 2, 60)
        with logs[1].open("wb") as log:
            second = subprocess.Popen([*argv, "--node-name", "second"], stderr=log, env=env)
        assert second.wait(timeout=60) == 1, read(logs[1])
        assert procs[0].poll() is None, read(logs[0])
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=30) for proc in procs]
    assert codes == [0], [read(log) for log in logs]
    assert f"on 127.0.0.1:{port}" in read(logs[0])
    assert "Address already in use); pick another --http-port" in read(logs[1])


def alive(port: int) -> bool:
    try:
        return get(port, "/healthz")[0] == 200
    except OSError:  # not listening yet
        return False


def read(path: Path) -> str:
    return path.read_text(errors="replace")


def test_a_probe_that_cannot_measure_an_interval_leaves_its_family_out_of_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A transient collect failure (:class:`CollectFailed`) is an interval not measured —
    the family leaves ``measured`` (unknown, never quiet) — logged once per streak without
    a traceback, with a line when the probe measures again."""
    settings = AgentSettings(node_name="flaky", interval_s=0.2, probes=("psi",), ncpu=1)
    agent = Agent(settings, StaticPodDirectory(), metrics=AgentMetrics(CollectorRegistry()))
    try:
        agent.start()
        (psi,) = agent._probes
        working = psi.collect

        def fail() -> Sample:
            raise CollectFailed("reading /proc/pressure/cpu failed: [Errno 5] I/O error")

        psi.collect = fail  # type: ignore[method-assign]
        with caplog.at_level(logging.INFO, logger="node_agent.agent"):
            assert "psi" not in agent.measure().measured
            assert "psi" not in agent.measure().measured
            psi.collect = working  # type: ignore[method-assign]
            assert "psi" in agent.measure().measured
        lines = [r for r in caplog.records if r.getMessage().startswith("probe psi ")]
        assert [(r.levelno, r.exc_info) for r in lines] == [
            (logging.WARNING, None),
            (logging.INFO, None),
        ]
        assert "could not measure this interval (reading /proc/pressure/cpu" in lines[0].message
        assert lines[1].getMessage() == "probe psi measures again"
    finally:
        agent.close()
