"""One recorded trace, two ways to the scheduler, the same decisions (issue 32, item 1).

``interference simulate`` replays a trace in-process: each report's scheduling record, as
its agent writes it, read with the Redis follower's checks and columns
(:class:`interference_cli.simulate.RecordReplay`). Here the same replay runs with the
production path in its place: the agent's own publisher writes every report into a real
``redis-server`` and the scheduler's follower (:class:`RedisSignalCache`) reads the
records with the replay's clock, as it polls them every 0.5 s. Every attempt's decision
record — node or unschedulable, reasons, every candidate's verdicts and scores — must be
the same, so what ``simulate`` shows is what the scheduler would decide on those signals
(docs/design.md §8)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from interference.decision import decision_hash
from interference.signals import NodeReport
from interference_cli.simulate import (
    Policy,
    PolicyResult,
    load_policy,
    load_workload,
    simulate,
    trace_nodes,
)
from interference_cli.trace import load_trace
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.signals.frame import SignalFrame
from tests.conftest import RedisServer

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
DEMO_ARRIVALS = ROOT / "deploy" / "demo" / "arrivals.yaml"
AWARE = ROOT / "deploy" / "demo" / "policies" / "interference-aware.yaml"
LENIENT = """\
cycle:
  profile:
    scores: {Interference: 2.0, NodeResourcesFit: 1.0, GpuPacking: 1.0}
    plugin_config:
      - name: Interference
        args: {stale_policy: avoid, signal_window: 10s, risk_k: 2.0}
redis:
  index_references: {runq_p99_us: 40000, runq_p99_us_quiet: 8000, runq_wait_ratio: 2.0}
"""
"""A policy with its own index references and window: both sides must use the file's."""


class FollowerReplay:
    """The production path as a :class:`~interference_cli.simulate.ReplaySignals`: the
    agent's :class:`RedisPublisher` writes each report (its scheduling record with the
    rest), the scheduler's follower reads every known node's record with the replay's
    clock — once as each report lands (it polls every 0.5 s; a trace's reports are about a
    second apart) and once at each decision."""

    def __init__(self, url: str, nodes: Sequence[str], policy: Policy) -> None:
        self.now = 0.0
        settings = RedisSettings(
            url=url,
            index_references=policy.references,
            max_agent_interval_s=policy.max_agent_interval_s,
            ranking_interval_s=0.0,
        )
        names = tuple(nodes)
        self.cache = RedisSignalCache(
            connect(settings),
            settings,
            SignalMetrics(CollectorRegistry()),
            lambda: names,
            clock=lambda: self.now,
        )
        self.publisher = RedisPublisher(PublisherSettings(redis_url=url))
        self.accepted = 0

    def publish(self, report: NodeReport) -> None:
        assert self.publisher.publish(report)
        self.now = report.ts
        self.accepted += self.cache.poll_once()

    def frame(self, now: float) -> SignalFrame:
        self.now = now
        self.accepted += self.cache.poll_once()
        return self.cache.snapshot()


def both_ways(
    server: RedisServer, trace: Path, arrivals: Path, policy: Policy
) -> tuple[PolicyResult, PolicyResult, FollowerReplay]:
    reports = load_trace(trace)
    workload = load_workload(arrivals)
    in_process = simulate(reports, workload, policy, keep_decisions=True)
    follower = FollowerReplay(server.url, trace_nodes(reports), policy)
    try:
        production = simulate(reports, workload, policy, signals=follower, keep_decisions=True)
    finally:
        follower.publisher.close()
    return in_process, production, follower


@pytest.mark.parametrize(
    ("trace", "arrivals", "policy_text", "tolerance"),
    [
        ("lab-trace.msgpack", DATA / "lab-arrivals.yaml", None, None),
        ("bursty-trace.msgpack", DATA / "bursty-arrivals.yaml", None, None),
        ("lab-trace.msgpack", DATA / "lab-arrivals.yaml", LENIENT, None),
        ("bursty-trace.msgpack", DATA / "bursty-arrivals.yaml", LENIENT, None),
        # the README's pods with the tolerance recommend-tolerance gives for the trace
        ("lab-trace.msgpack", DEMO_ARRIVALS, None, "7200"),
    ],
    ids=[
        "lab-default",
        "bursty-default",
        "lab-own-references",
        "bursty-own-references",
        "demo-recommended-tolerance",
    ],
)
def test_simulate_decides_what_the_follower_on_a_real_redis_decides(
    redis_server: RedisServer,
    tmp_path: Path,
    trace: str,
    arrivals: Path,
    policy_text: str | None,
    tolerance: str | None,
) -> None:
    path = AWARE
    if policy_text is not None:
        path = tmp_path / "own-references.yaml"
        path.write_text(policy_text)
    if tolerance is not None:
        pods = yaml.safe_load(arrivals.read_text())
        for arrival in pods["arrivals"]:
            if "annotations" in arrival:
                arrival["annotations"]["interference.io/max-runq-p99-us"] = tolerance
        arrivals = tmp_path / "arrivals.yaml"
        arrivals.write_text(yaml.safe_dump(pods))
    policy = load_policy(path)
    in_process, production, follower = both_ways(redis_server, DATA / trace, arrivals, policy)
    reports = load_trace(DATA / trace)
    assert follower.accepted == len(reports)  # every record read, none refused
    assert in_process.decisions, "the replay decided nothing"
    assert [decision_hash(d) for d in production.decisions] == [
        decision_hash(d) for d in in_process.decisions
    ]
    assert production.placements == in_process.placements
    assert (production.placed, production.unschedulable, production.violations) == (
        in_process.placed,
        in_process.unschedulable,
        in_process.violations,
    )
    # not vacuous: the signals decided something (a node refused for its interference,
    # or scores that differ by the node's quietness)
    assert any(
        reason.startswith("node(s) had")
        for d in in_process.decisions
        for reason in d.rejected_by_reason
    ) or any(
        c.scores.get("Interference", 100.0) < 100.0
        for d in in_process.decisions
        for c in d.candidates
    )
