"""`interference recommend-tolerance` on a live agent: real interference-agents with their
kernel probes publish to a real redis-server (:class:`interference_demo.lab.LocalLab`),
node-a running the demo's stress-ng batch pod and node-b the demo's latency pod, and the
command reads the reports their streams hold."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from interference import keys
from interference_cli.main import main
from interference_demo.lab import LocalLab
from interference_demo.local_cluster import load_manifests, load_nodes

pytestmark = [pytest.mark.bpf, pytest.mark.redis, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[2] / "deploy" / "demo"


@pytest.fixture(scope="module")
def lab() -> Iterator[LocalLab]:
    batch, latency = load_manifests([DEMO / "pods" / "batch.yaml", DEMO / "pods" / "latency.yaml"])
    latency["spec"]["nodeName"] = "node-b"
    lab = LocalLab(
        load_nodes(DEMO / "nodes.yaml"),
        [batch, latency],
        f"intf-test-recommend-{os.getpid()}",
        log=lambda _: None,
    )
    try:
        lab.start()
        lab.await_reports()
        time.sleep(4)  # a few intervals with both pods running
        yield lab
    finally:
        lab.close()


def test_the_streams_of_live_agents_recommend_the_quiet_node_only(
    lab: LocalLab, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--redis-url", lab.url, "recommend-tolerance", "demo/latency-web", "-o", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    document = json.loads(out)
    assert document["workload_p99"]["pods"] == ["latency-web"]
    assert document["source"].startswith("the report streams in Redis at")
    nodes = {n["node"]: n for n in document["nodes"]}
    assert set(nodes) == {"node-a", "node-b"}
    assert all(1 <= n["samples"] <= keys.NODE_REPORTS_MAXLEN for n in nodes.values())
    # four CPU hogs on node-a's one CPU: its run-queue p99 is far above the quiet node's
    assert [n["node"] for n in document["nodes"]] == ["node-b", "node-a"]
    assert nodes["node-b"]["passes_target"] and not nodes["node-a"]["passes_target"]
    assert document["target_us"] >= 1.15 * document["lower_bound_us"]
    assert document["passing_at_target"] == 1


def test_a_workload_the_agents_do_not_report_is_one_line_and_exit_1(
    lab: LocalLab, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--redis-url", lab.url, "recommend-tolerance", "demo/nobody"])
    _, err = capsys.readouterr()
    assert code == 1 and err.count("\n") == 1
    assert "no run-queue p99 of a pod of demo/nobody in the report streams in Redis" in err
