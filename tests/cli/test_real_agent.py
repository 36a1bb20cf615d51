"""Acceptance 3: the CLI against a real redis-server filled by real interference-agents.

Two agents (node-a with a stress-ng pod, node-b with an idle one) report from their own
cgroup partitions through :class:`interference_demo.lab.LocalLab`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from interference.decision import CandidateVerdict, Decision
from interference_cli.main import main
from interference_cli.trace import load_trace
from interference_demo.lab import LocalLab
from interference_demo.local_cluster import load_manifests, load_nodes
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.signal_metrics import SignalMetrics

pytestmark = [pytest.mark.bpf, pytest.mark.redis, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[2] / "deploy" / "demo"


@pytest.fixture(scope="module")
def lab() -> Iterator[LocalLab]:
    lab = LocalLab(
        load_nodes(DEMO / "nodes.yaml"),
        load_manifests([DEMO / "pods" / "batch.yaml", DEMO / "pods" / "cache.yaml"]),
        f"intf-test-cli-{os.getpid()}",
        log=lambda _: None,
    )
    try:
        lab.start()
        lab.await_reports()
        time.sleep(2.5)  # a few intervals with the pods running
        settings = RedisSettings(url=lab.url)
        RedisDecisionSink(connect(settings), settings, SignalMetrics(CollectorRegistry())).write(
            Decision(
                "demo",
                "web",
                "scheduled",
                "node-b",
                "Successfully assigned demo/web to node-b",
                time.time(),
                candidates=[
                    CandidateVerdict("node-b", True, [], {"Interference": 80.0}, 160.0),
                    CandidateVerdict("node-a", True, [], {"Interference": 10.0}, 20.0),
                ],
            )
        )
        yield lab
    finally:
        lab.close()


def _cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    code = main(["--redis-url", url, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_top_ranks_the_stressed_node_first(
    lab: LocalLab, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, lab.url, "top")
    assert code == 0, err
    lines = out.splitlines()
    node_a = next(i for i, line in enumerate(lines) if "node-a" in line)
    node_b = next(i for i, line in enumerate(lines) if "node-b" in line)
    assert node_a < node_b
    assert " ok" in lines[node_a] and "stale" not in lines[node_a]


def test_node_shows_histograms_and_the_antagonist_pod(
    lab: LocalLab, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, lab.url, "node", "node-a")
    assert code == 0, err
    assert "runq_us:" in out and "samples" in out and "█" in out
    antagonists = out[out.index("antagonists") :]
    assert "demo/batch-stress" in antagonists.splitlines()[4]  # first row under the header


def test_explain_reads_the_decision_record(
    lab: LocalLab, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, lab.url, "explain", "demo/web")
    assert code == 0, err
    assert "scheduled on node-b" in out and "▶ node-b" in out


def test_record_takes_reports_from_the_stream(lab: LocalLab, tmp_path: Path) -> None:
    out = tmp_path / "trace.msgpack"
    assert main(["--redis-url", lab.url, "record", "--out", str(out), "--count", "4"]) == 0
    reports = load_trace(out)
    assert len(reports) == 4
    assert {r.node for r in reports} == {"node-a", "node-b"}
    assert all(r.ts > time.time() - 60 for r in reports)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("node", "node-z"), "unknown node 'node-z'"),
        (("explain", "demo/nobody"), "no scheduling decision for pod demo/nobody"),
    ],
)
def test_unknown_names_give_one_line_and_exit_1(
    lab: LocalLab, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], expected: str
) -> None:
    code, out, err = _cli(capsys, lab.url, *args)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and expected in err
