"""The scheduler's decision record (interference.decision): round trip and PayloadError."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from interference.codec import PayloadError
from interference.decision import (
    CandidateVerdict,
    Decision,
    FunnelStage,
    RunqCheck,
    decision_hash,
    parse_decision_hash,
    runq_advice,
)

DECISION = Decision(
    namespace="ml",
    pod="trainer-0",
    result="scheduled",
    node="gpu-2",
    message="bound to gpu-2",
    ts=1_700_000_000.5,
    dry_run=False,
    candidates=[
        CandidateVerdict("gpu-1", False, ["Insufficient nvidia.com/gpu"]),
        CandidateVerdict(
            "gpu-2",
            True,
            [],
            {"Interference": 80.0, "GpuPacking": 55.5},
            215.5,
            weights={"Interference": 2.0, "GpuPacking": 1.0},
        ),
    ],
    funnel=[FunnelStage("NodeResourcesFit", 40, 12), FunnelStage("Interference", 12, 3)],
    omitted={"feasible": 2, "rejected": 36},
    trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
    runq=RunqCheck(500.0, "10s", {"gpu-1": 2900.0, "gpu-2": 120.5}),
)


def test_decision_round_trips_and_reads_well() -> None:
    fields = decision_hash(DECISION)
    assert fields["result"] == "scheduled"
    assert fields["dry_run"] == "0"
    assert json.loads(fields["candidates"])[0]["reasons"] == ["Insufficient nvidia.com/gpu"]
    assert json.loads(fields["funnel"]) == [["NodeResourcesFit", 40, 12], ["Interference", 12, 3]]
    assert json.loads(fields["omitted"]) == {"feasible": 2, "rejected": 36}
    assert parse_decision_hash(fields) == DECISION
    as_bytes = {k.encode(): v.encode() for k, v in fields.items()}
    assert parse_decision_hash(as_bytes) == DECISION


def test_the_runq_check_is_stored_with_the_decision_and_read_back() -> None:
    unschedulable = Decision(
        "ml",
        "picky-0",
        "unschedulable",
        "",
        "0/2 nodes are available: …",
        1_700_000_000.0,
        runq=RunqCheck(500.0, "60s", {"gpu-1": 2900.04, "gpu-3": 640.0}, "gpu-3", 1_700_000_042.0),
    )
    fields = decision_hash(unschedulable)
    assert json.loads(fields["runq"]) == {
        "tolerance_us": 500.0,
        "window": "60s",
        "measured_us": {"gpu-1": 2900.0, "gpu-3": 640.0},  # to 0.1 µs: the record stays small
        "nearest": "gpu-3",
        "relax_at": 1_700_000_042.0,
    }
    parsed = parse_decision_hash(fields)
    assert parsed.runq == RunqCheck(
        500.0, "60s", {"gpu-1": 2900.0, "gpu-3": 640.0}, "gpu-3", 1_700_000_042.0
    )
    never = RunqCheck(500.0, "10s", {"gpu-1": 2900.0})  # never relaxed: relax_at null
    assert json.loads(decision_hash(replace(unschedulable, runq=never))["runq"])["relax_at"] is None
    assert parse_decision_hash(decision_hash(replace(unschedulable, runq=never))).runq == never


def test_the_advice_raises_the_tolerance_to_the_nearest_nodes_p99_rounded_up() -> None:
    check = RunqCheck(500.0, "10s", {"a": 2749.4, "b": 3164.0}, "a", 42.0)
    assert runq_advice(check, 0.0) == (
        "Nearest node: a, run-queue p99 2749.4 µs against the tolerance 500 µs (10s window). "
        "Relaxed to interference-blind in 42 s (at 00:00:42 UTC). "
        "Hint: raise interference.io/max-runq-p99-us to at least 2750 µs."
    )
    # seen after it was due (explain, later): at the pod's next attempt
    assert "at its next attempt (due since 00:00:42 UTC)" in runq_advice(check, 50.0)


def test_a_record_stored_without_the_runq_check_still_reads() -> None:
    assert parse_decision_hash(_with(runq=None)) == replace(DECISION, runq=None)


def test_dry_run_flag_round_trips() -> None:
    fields = decision_hash(Decision("ns", "p", "dry_run", "n", "", 1.0, dry_run=True))
    assert fields["dry_run"] == "1"
    assert parse_decision_hash(fields).dry_run is True


def _with(**changes: str | None) -> dict[str, str]:
    fields = decision_hash(DECISION)
    for name, value in changes.items():
        if value is None:
            del fields[name]
        else:
            fields[name] = value
    return fields


@pytest.mark.parametrize(
    "raw",
    [
        {},
        _with(namespace=None),
        _with(pod=None),
        _with(result=None),
        _with(ts=None),
        _with(ts="later"),
        _with(candidates="[not json"),
        _with(candidates="5"),
        _with(candidates='["gpu-1"]'),
        _with(candidates='[{"passed": true}]'),
        _with(candidates='[{"node": "a", "passed": true, "scores": [1]}]'),
        _with(candidates='[{"node": "a", "passed": true, "scores": {"x": "high"}}]'),
        _with(runq="[1]"),
        _with(runq='{"window": "10s"}'),
        _with(runq='{"tolerance_us": 500, "measured_us": {"a": "loud"}}'),
        {b"namespace": b"\xff"},
    ],
)
def test_malformed_decision_records_raise_payload_error(raw: dict[object, object]) -> None:
    with pytest.raises(PayloadError):
        parse_decision_hash(raw)
