"""``-o json`` on ``top``, ``node`` and ``explain``: the same facts as the tables, as JSON
a program parses (issue 31), against a real redis-server."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from interference import keys
from interference.decision import CandidateVerdict, Decision, decision_hash
from tests.cli.test_query import _cli, filled, rank
from tests.conftest import RedisServer

pytestmark = pytest.mark.redis
__all__ = ["filled"]  # the fixture, imported for these tests


def as_json(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> Any:
    code, out, err = _cli(capsys, url, *args)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("flag", [["-o", "json"], ["--output", "json"], ["-ojson"]])
def test_top_as_json(
    filled: RedisServer, capsys: pytest.CaptureFixture[str], flag: list[str]
) -> None:
    rank(filled.client(), time.time())
    document = as_json(capsys, filled.url, "top", "--all", *flag)
    assert document["source"] == filled.url
    nodes = {n["node"]: n for n in document["nodes"]}
    assert [n["node"] for n in document["nodes"]][:2] == ["busy-node", "quiet-node"]
    busy = nodes["busy-node"]
    assert busy["index"] == 70.0 and busy["agent_index"] == 72.5  # scheduler's, agent's
    assert busy["runq_p99_us"] == 2900.0 and busy["runq_wait_ratio"] == 0.725
    assert busy["pods"] == 2 and busy["state"] == "ok" and 0 <= busy["age_s"] < 60
    assert busy["measured"] == ["runq"]
    for column in ("reclaim_stall_ms_per_s", "throttled_ms_per_s", "psi_cpu_some", "psi_mem_some"):
        assert isinstance(busy[column], float)
    assert nodes["broken-node"]["state"] == "degraded" and nodes["broken-node"]["index"] is None
    dying = nodes["dying-node"]  # ranked, its hash expired: no metrics, stale
    assert dying["state"] == "stale" and dying["expired"] and dying["runq_p99_us"] is None


def test_node_as_json(filled: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    document = as_json(capsys, filled.url, "node", "busy-node", "-o", "json")
    assert document["node"] == "busy-node" and document["state"] == "ok"
    assert document["metrics"]["runq_p99_us"] == 2900.0
    assert document["metrics"]["interference_index"] == 72.5
    assert document["measured"] == ["runq"] and document["pods"] == 2
    runq = document["histograms"]["runq_us"]
    assert runq["buckets"][:7] == [0, 3, 10, 40, 7, 0, 2] and runq["samples"] == 62
    assert not any(runq["buckets"][7:]) and runq["slot_bounds"][3] == [8, 15]
    assert runq["p99"] > runq["p50"] > 0
    assert document["windows"]["10s"]["runq_p99_us"] == 3100
    victims = [v["pod"] for v in document["victims"]]
    assert victims[0] == "web/api-0" and document["victims"][0]["runq_wait_ms_per_s"] == 35.0
    assert document["victims"][0]["mostly"] in ("neighbours", "own_limit", "own_tasks", "none")
    assert document["antagonists"][0]["pod"] == "batch/stress-1"
    assert document["culprits"] == []


def test_explain_as_json(filled: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    client = filled.client()
    looked = Decision(
        namespace="web",
        pod="api-1",
        result="would_evict",
        node="busy-node",
        message="would evict (dry run)",
        ts=time.time() - 12,
        dry_run=True,
        candidates=[CandidateVerdict("busy-node", True, [], {"Interference": 60.0}, 60.0)],
    )
    client.hset(keys.rebalance_decision_key("web", "api-1"), mapping=decision_hash(looked))
    document = as_json(capsys, filled.url, "explain", "web/api-1", "-o", "json")
    placement = document["placement"]
    assert placement["result"] == "scheduled" and placement["node"] == "quiet-node"
    assert placement["message"] == "scheduled on quiet-node (total 91.0)"
    candidates = {c["node"]: c for c in placement["candidates"]}
    assert candidates["quiet-node"]["chosen"] and not candidates["busy-node"]["chosen"]
    assert candidates["quiet-node"]["scores"] == {"Interference": 97.0, "NodeResourcesFit": 80.0}
    assert candidates["quiet-node"]["details"] == {"gpu_model": "NVIDIA-H100-80GB-HBM3"}
    assert candidates["gpu-node"]["reasons"] == ["Insufficient nvidia.com/gpu"]
    assert candidates["gpu-node"]["total"] is None  # "—" in the table: it did not pass
    assert placement["rejected_by_reason"] == {
        "Insufficient nvidia.com/gpu": 1,
        "node(s) were unschedulable": 3,
    }
    assert 0 <= placement["age_s"] < 60
    rebalancing = document["rebalancing"]
    assert rebalancing["result"] == "would_evict" and rebalancing["dry_run"] is True
    assert 11 <= rebalancing["age_s"] < 60


def test_explain_as_json_without_a_placement_record(
    filled: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    client = filled.client()
    client.delete(keys.decision_key("web", "api-1"))
    looked = Decision("web", "api-1", "evicted", "busy-node", "evicted", time.time())
    client.hset(keys.rebalance_decision_key("web", "api-1"), mapping=decision_hash(looked))
    document = as_json(capsys, filled.url, "explain", "web/api-1", "-o", "json")
    assert document["placement"] is None and document["rebalancing"]["result"] == "evicted"


def test_an_unknown_output_format_is_a_usage_error(
    filled: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _cli(capsys, filled.url, "top", "-o", "yaml")
    assert exited.value.code == 2
    assert "json" in capsys.readouterr().err


def test_top_watch_as_json_is_one_document_per_line(
    filled: RedisServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    refreshes = []

    def sleep(seconds: float) -> None:
        refreshes.append(seconds)
        if len(refreshes) == 2:
            raise KeyboardInterrupt  # how a watch ends

    monkeypatch.setattr("interference_cli.main.time.sleep", sleep)
    code, out, err = _cli(capsys, filled.url, "top", "--watch", "-o", "json", "--interval", "3")
    assert code == 0, err
    documents = [json.loads(line) for line in out.splitlines()]
    assert len(documents) == 2 and refreshes == [3.0, 3.0]
    assert {n["node"] for n in documents[1]["nodes"]} >= {"busy-node", "quiet-node"}
