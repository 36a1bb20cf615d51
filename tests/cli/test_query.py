"""The query CLI (`top`, `node`, `explain`) against a real redis-server."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from interference import freshness, keys
from interference.decision import CandidateVerdict, Decision, decision_hash
from interference.signals import NodeMetrics, NodeReport, PodMetrics, WindowMetrics
from interference_cli.main import main
from interference_cli.store import SCAN_COMMAND, VIEWER_COMMANDS
from interference_cli.trace import load_trace
from node_agent.publisher import PublisherSettings, RedisPublisher
from tests.conftest import RedisServer, free_port

pytestmark = pytest.mark.redis

CLI = [sys.executable, "-m", "interference_cli.main"]


def publish(client: redis.Redis, report: NodeReport) -> None:
    """Write a report with the agent's own publisher."""
    url = "redis://{host}:{port}/0".format(**client.connection_pool.connection_kwargs)
    publisher = RedisPublisher(
        PublisherSettings(url, ttl_s=freshness.ttl_seconds(report.interval_s))
    )
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


def rank(client: redis.Redis[str], now: float) -> None:
    """The ranking as the scheduler writes it: its own index of each usable node (not the
    agents'), and nodes it has not yet dropped — one whose hash has just expired (shown as
    stale), one gone a minute ago (left out). The degraded node is not ranked."""
    client.zadd(
        keys.NODES_BY_INDEX,
        {"busy-node": 70.0, "quiet-node": 4.0, "dying-node": 10.0, "dead-node": 10.0},
    )
    client.zadd(
        keys.NODES_UPDATED,
        {"busy-node": now, "quiet-node": now, "dying-node": now - 7, "dead-node": now - 60},
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
    # The same pod name on another node: `node busy-node` shows only busy-node's row.
    other_api = PodMetrics("web", "api-0", uid="u9", runq_wait_ms_per_s=1.0)
    publish(client, _report("quiet-node", 3.0, now, [PodMetrics("", "system"), other_api]))
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


def _lines_of(out: str, *nodes: str) -> dict[str, int]:
    lines = out.splitlines()
    return {node: next(i for i, line in enumerate(lines) if f" {node} " in line) for node in nodes}


def test_top_without_a_ranking_lists_every_node_with_a_record(
    filled: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """No scheduler ranks the nodes: top finds them by their scheduling records and ranks
    them by the agents' own index; usable nodes first, then degraded (no run-queue
    measured: not the quietest node)."""
    code, out, err = _cli(capsys, filled.url, "top")
    assert code == 0, err
    lines = out.splitlines()
    at = _lines_of(out, "busy-node", "quiet-node", "broken-node")
    assert at["busy-node"] < at["quiet-node"] < at["broken-node"]
    assert "72.5" in lines[at["busy-node"]] and "2900" in lines[at["busy-node"]]
    assert "│ degraded" in lines[at["broken-node"]] and " ok" not in lines[at["broken-node"]]
    assert " ok" in lines[at["busy-node"]] and " ok" in lines[at["quiet-node"]]
    assert "stale" not in out


def test_top_follows_the_schedulers_ranking(
    filled: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scheduler's ranking decides which nodes are listed and by which index; a node
    it still lists whose hash has expired is stale, one expired long ago is left out."""
    rank(filled.client(), time.time())
    code, out, err = _cli(capsys, filled.url, "top")
    assert code == 0, err
    lines = out.splitlines()
    at = _lines_of(out, "busy-node", "quiet-node", "dying-node")
    assert at["busy-node"] < at["quiet-node"] < at["dying-node"]
    busy = lines[at["busy-node"]]
    assert "70.0" in busy and "72.5" in busy  # the scheduler's index beside the agent's
    assert "stale" in lines[at["dying-node"]] and "stale" not in busy
    assert "dead-node" not in out
    assert "broken-node" not in out  # the scheduler does not rank a degraded node …

    code, out, err = _cli(capsys, filled.url, "top", "--all")  # … --all finds it
    assert code == 0, err
    at = _lines_of(out, "busy-node", "quiet-node", "broken-node", "dying-node")
    assert at["busy-node"] < at["quiet-node"] < at["broken-node"] < at["dying-node"]


def test_top_orders_by_the_schedulers_index_not_the_agents(
    filled: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    filled.client().zadd(keys.NODES_BY_INDEX, {"busy-node": 5.0, "quiet-node": 60.0})
    code, out, err = _cli(capsys, filled.url, "top")
    assert code == 0, err
    at = _lines_of(out, "busy-node", "quiet-node")
    assert at["quiet-node"] < at["busy-node"]


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
    assert "35.0" in victims  # busy-node's web/api-0, not quiet-node's pod of that name
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
    ("placement_kept", "shown", "not_shown"),
    [
        (True, ["scheduled on quiet-node (total 91.0)", "▶ quiet-node"], ["is gone"]),
        (
            False,
            ["web/api-1: the placement record is gone (kept 24 h)"],
            ["scheduled on quiet-node", "▶ quiet-node"],
        ),
    ],
)
def test_explain_shows_the_rebalancing_record_after_the_placement_record(
    filled: RedisServer,
    capsys: pytest.CaptureFixture[str],
    placement_kept: bool,
    shown: list[str],
    not_shown: list[str],
) -> None:
    client = filled.client()
    looked = Decision(
        namespace="web",
        pod="api-1",
        result="would_evict",
        node="busy-node",
        message="would evict (dry run): its run-queue p99 8150 µs > tolerance 500 µs",
        ts=time.time() - 12,
        dry_run=True,
        candidates=[CandidateVerdict("busy-node", True, [], {"Interference": 60.0}, 60.0)],
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
    )
    client.hset(keys.rebalance_decision_key("web", "api-1"), mapping=decision_hash(looked))
    if not placement_kept:
        client.delete(keys.decision_key("web", "api-1"))
    code, out, err = _cli(capsys, filled.url, "explain", "web/api-1")
    assert code == 0, err
    for line in shown:
        assert line in out
    for line in not_shown:
        assert line not in out
    section = out[out.index("rebalancing record, the rebalancer's latest look:") :]
    first = section.splitlines()[0]
    assert re.search(r": would_evict, found busy-node \(1[23] s ago, dry run\)$", first), first
    assert "would evict (dry run): its run-queue p99 8150 µs" in section
    assert "trace: 4bf92f3577b34da6a3ce929d0e0e4736" in section
    assert "Insufficient nvidia.com/gpu" not in section  # the placement record comes first


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
    rank(filled.client(), time.time())  # the scheduler still remembers dead-node
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
    client.hset(keys.node_key("bad"), mapping={"interference_index": "lots", "updated_at": "1"})
    code, _, err = _cli(capsys, redis_server.url, "top")
    assert code == 1
    assert "intf:node:bad is malformed" in err and err.count("\n") == 1


def test_node_with_scheduler_ranking_shows_its_index(
    filled: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    rank(filled.client(), time.time())
    code, out, err = _cli(capsys, filled.url, "node", "busy-node")
    assert code == 0, err
    assert "scheduler's interference index: 70.0" in out


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


def viewer_url(server: RedisServer, *extra: str) -> str:
    """A read-only user with exactly VIEWER_COMMANDS (and ``extra``) on intf:*."""
    server.client().execute_command(
        "ACL", "SETUSER", "viewer", "reset", "on", ">s3cret", "resetkeys", "%R~intf:*",
        "-@all", *(f"+{c}" for c in (*VIEWER_COMMANDS, *extra)),
    )  # fmt: skip
    return f"redis://viewer:s3cret@127.0.0.1:{server.port}/0"


@pytest.mark.parametrize("may_scan", [False, True])
def test_the_viewer_needs_exactly_viewer_commands(
    filled: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], may_scan: bool
) -> None:
    """A read-only user with only VIEWER_COMMANDS on intf:* runs every command while the
    scheduler ranks the nodes; with SCAN also without a ranking, and ``top --all``."""
    url = viewer_url(filled, *([SCAN_COMMAND] if may_scan else []))
    trace_file = tmp_path / "trace.msgpack"
    commands: list[tuple[str, ...]] = [
        ("top",),
        ("top", "--all"),
        ("node", "busy-node"),
        ("explain", "web/api-1"),
        ("record", "--out", str(trace_file), "--from-start", "--duration", "0.5"),
    ]
    for ranked in (False, True):
        if ranked:
            rank(filled.client(), time.time())
        for command in commands:
            code, _out, err = _cli(capsys, url, *command)
            if may_scan or (ranked and command != ("top", "--all")):
                assert code == 0, (ranked, command, err)
            elif command[0] == "top":
                assert code == 1 and "needs SCAN" in err and err.count("\n") == 1, err
            elif command[0] == "record":  # no ranking: no stream it may find, and it says why
                assert code == 1 and "recorded no reports: this Redis user may not SCAN" in err
                assert err.count("\n") == 1, err
    assert [r.node for r in load_trace(trace_file)].count("busy-node") >= 1
    assert may_scan or filled.client().acl_log()[0]["object"] == "scan"


def test_record_finds_the_ranked_nodes_streams_without_scan(
    filled: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rank(filled.client(), time.time())
    out = tmp_path / "trace.msgpack"
    url = viewer_url(filled)
    code, _, err = _cli(capsys, url, "record", "--out", str(out), "--from-start", "--count", "2")
    assert code == 0, err
    assert sorted(r.node for r in load_trace(out)) == ["busy-node", "quiet-node"]
