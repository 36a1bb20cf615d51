"""The query CLI (`top`, `node`, `explain`) against a real redis-server."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from interference import keys
from interference.decision import CandidateVerdict, Decision, decision_hash
from interference.signals import NodeMetrics, NodeReport, PodMetrics, WindowMetrics
from interference_cli.main import main
from interference_cli.trace import load_trace
from node_agent.publisher import PublisherSettings, RedisPublisher
from tests.conftest import RedisServer, free_port

pytestmark = pytest.mark.redis

CLI = [sys.executable, "-m", "interference_cli.main"]


def publish(client: redis.Redis, report: NodeReport) -> None:
    """Write a report with the agent's own publisher."""
    url = "redis://{host}:{port}/0".format(**client.connection_pool.connection_kwargs)
    publisher = RedisPublisher(PublisherSettings(url, ttl_s=keys.ttl_seconds(report.interval_s)))
    try:
        assert publisher.publish(report)
    finally:
        publisher.close()


def _report(node: str, score: float, ts: float, pods: list[PodMetrics]) -> NodeReport:
    return NodeReport(
        node=node,
        ts=ts,
        interval_s=1.0,
        metrics=NodeMetrics(
            runq_p99_us=40 * score, runq_wait_ratio=score / 100, interference_index=score
        ),
        histograms={"runq_us": [0, 3, 10, 40, 7, 0, 2]},
        pods=pods,
        measured=("runq",),
        windows={
            "10s": WindowMetrics(
                10.0,
                10.0,
                10,
                runq_p99_us=3100,
                index_mean=score,
                index_max=min(100.0, 2 * score),
                index_stddev=score / 4,
            ),
        },
    )


@pytest.fixture
def filled(redis_server: RedisServer) -> RedisServer:
    client = redis_server.client()
    now = time.time()
    publish(
        client,
        _report(
            "busy-node",
            72.5,
            now,
            [
                PodMetrics("batch", "stress-1", uid="u1", qos="besteffort", cpu_ms_per_s=990.0),
                PodMetrics("web", "api-0", uid="u2", qos="burstable", runq_wait_ms_per_s=35.0),
            ],
        ),
    )
    publish(client, _report("quiet-node", 3.0, now, [PodMetrics("", "system")]))
    # Agents that died: the sorted sets remember them, their hashes have expired — one
    # just now (shown as stale), one a minute ago (left out until a sweep removes it).
    client.zadd(keys.NODES_UPDATED, {"dying-node": now - 7, "dead-node": now - 60})
    client.zadd(keys.NODES_BY_SCORE, {"dying-node": 10.0, "dead-node": 10.0})
    # An agent whose run-queue probes all failed: fresh, all zeros, nothing measured.
    broken = replace(_report("broken-node", 0.0, now, []), measured=("psi",), histograms={})
    publish(client, broken)
    decision = Decision(
        namespace="web",
        pod="api-1",
        result="scheduled",
        node="quiet-node",
        message="scheduled on quiet-node (total 91.0)",
        ts=now,
        candidates=[
            CandidateVerdict(
                "quiet-node",
                True,
                [],
                {"Interference": 97.0, "NodeResourcesFit": 80.0},
                91.0,
                details={"gpu_model": "NVIDIA-H100-80GB-HBM3"},
            ),
            CandidateVerdict(
                "busy-node", True, [], {"Interference": 27.5, "NodeResourcesFit": 85.0}, 45.2
            ),
            CandidateVerdict("gpu-node", False, ["Insufficient nvidia.com/gpu"]),
        ],
        rejected_by_reason={"Insufficient nvidia.com/gpu": 1, "node(s) were unschedulable": 3},
    )
    client.hset(keys.decision_key("web", "api-1"), mapping=decision_hash(decision))
    return redis_server


def _cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    code = main(["--redis-url", url, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_top_ranks_nodes_by_index_and_marks_degraded_and_stale(
    filled: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Usable nodes by index, then degraded (no run-queue measured: not the quietest
    node), then stale; a node whose hash expired long ago is left out."""
    code, out, err = _cli(capsys, filled.url, "top")
    assert code == 0, err
    lines = out.splitlines()
    busy = next(i for i, line in enumerate(lines) if "busy-node" in line)
    quiet = next(i for i, line in enumerate(lines) if "quiet-node" in line)
    broken = next(i for i, line in enumerate(lines) if "broken-node" in line)
    dying = next(i for i, line in enumerate(lines) if "dying-node" in line)
    assert busy < quiet < broken < dying
    assert "72.5" in lines[busy] and "2900" in lines[busy]
    assert "│ degraded" in lines[broken] and " ok" not in lines[broken]
    assert "stale" in lines[dying] and "stale" not in lines[busy] + lines[quiet]
    assert " ok" in lines[busy] and " ok" in lines[quiet]
    assert not any("dead-node" in line for line in lines)


def test_node_shows_metrics_histogram_and_pods(
    filled: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, filled.url, "node", "busy-node")
    assert code == 0, err
    assert "runq_p99_us" in out and "2900" in out
    assert "runq_us: 62 samples" in out
    assert "8 – 15" in out and "█" * 40 in out  # the fullest slot has the full-width bar
    victims = out[out.index("victims") : out.index("antagonists")]
    antagonists = out[out.index("antagonists") :]
    assert victims.index("web/api-0") < victims.index("batch/stress-1")
    assert antagonists.index("batch/stress-1") < antagonists.index("web/api-0")
    windows = out[out.index("windows (mean / max / σ") : out.index("runq_us: 62")]
    assert "10s" in windows and "3100" in windows and "72.5 / 100.0 / 18.1" in windows
    assert "measured: runq" in out


def test_explain_shows_every_candidate(
    filled: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, filled.url, "explain", "web/api-1")
    assert code == 0, err
    assert "scheduled on quiet-node" in out
    assert "▶ quiet-node" in out
    assert "Insufficient nvidia.com/gpu" in out
    assert "97.0" in out and "45.2" in out
    assert "NVIDIA-H100-80GB-HBM3" in out  # per-candidate details, e.g. the GPU model
    assert "rejected: 1 Insufficient nvidia.com/gpu, 3 node(s) were unschedulable" in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("node", "no-such-node"), "unknown node 'no-such-node'"),
        (("node", "dead-node"), "node 'dead-node' is stale"),
        (("explain", "web/no-such-pod"), "no scheduling decision for pod web/no-such-pod"),
        (("explain", "missing-namespace"), "expected NAMESPACE/POD"),
    ],
)
def test_unknown_objects_give_one_line_and_exit_1(
    filled: RedisServer,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    expected: str,
) -> None:
    code, out, err = _cli(capsys, filled.url, *args)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1 and expected in err


@pytest.mark.parametrize("command", [("top",), ("node", "n"), ("explain", "a/b")])
def test_empty_redis_gives_one_line_and_exit_1(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    code, _, err = _cli(capsys, redis_server.url, *command)
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("interference: ")
    if command == ("top",):
        assert "no node reports" in err


@pytest.mark.parametrize("command", [("top",), ("node", "n"), ("explain", "a/b")])
def test_unreachable_redis_gives_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    code, _, err = _cli(capsys, url, *command)
    assert code == 1
    assert err.count("\n") == 1 and f"cannot reach Redis at {url}" in err


def test_malformed_node_hash_is_reported_not_crashed(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    client = redis_server.client()
    client.zadd(keys.NODES_UPDATED, {"bad": time.time()})
    client.hset(keys.node_key("bad"), mapping={"score": "lots", "updated_at": "1"})
    code, _, err = _cli(capsys, redis_server.url, "top")
    assert code == 1
    assert "intf:node:bad is malformed" in err and err.count("\n") == 1


def test_top_watch_refreshes_until_ctrl_c(filled: RedisServer) -> None:
    watch = subprocess.Popen(
        [*CLI, "--redis-url", filled.url, "top", "--watch", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(2.0)  # several refreshes
        filled.stop()  # a Redis outage is shown, not fatal
        time.sleep(1.0)
        assert watch.poll() is None
    finally:
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    assert "busy-node" in out  # the table was drawn while Redis was up
    assert "cannot reach Redis" in out


def test_record_keeps_valid_reports_and_skips_malformed_entries(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = redis_server.client()
    publish(client, _report("n1", 10.0, time.time(), []))
    redis.Redis(port=redis_server.port).xadd(keys.STREAM, {keys.STREAM_FIELD: b"\xc1garbage"})
    publish(client, _report("n2", 20.0, time.time(), []))
    out = tmp_path / "trace.msgpack"
    args = ["record", "--out", str(out), "--from-start", "--duration", "1.5"]
    code, stdout, err = _cli(capsys, redis_server.url, *args)
    assert code == 0, err
    assert "recorded 2 reports" in stdout and "skipped 1 malformed" in stdout
    assert [r.node for r in load_trace(out)] == ["n1", "n2"]
