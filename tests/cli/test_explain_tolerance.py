"""An unschedulable pod says what to do (issue 31, item 5): ``interference explain`` and its
``-o json`` name the nearest node against the pod's run-queue tolerance, say when the pod
is relaxed to interference-blind (or that it never is) and how far to raise the
tolerance — from a decision record a real :class:`SchedulingCycle` made, stored in a real
redis-server."""

from __future__ import annotations

import json
import time

import pytest

from interference import keys
from interference.decision import Decision, decision_hash, parse_decision_hash
from interference.signals import SIGNAL_FAMILIES, NodeMetrics
from interference_cli.json_output import decision_document
from scheduler.api.objects import ANNOTATION_MAX_RUNQ_P99_US
from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.ports import NodeSignals
from scheduler.cycle.settings import CycleSettings, Profile
from tests.builders import node_obj, pod_obj, table_of
from tests.cli.test_query import _cli
from tests.conftest import RedisServer

RUNQ_P99_US = {"quiet": 900.0, "loud": 4000.0, "busy": 2600.0, "small": 100.0}
"""small is the quietest but has too little CPU: it is not the nearest node."""


def picky_decision(
    now: float, waited_s: float = 0.0, profile: Profile | None = None, cpu: str = "2"
) -> Decision:
    """The record of ``shop/picky-0`` (``cpu``, ``max-runq-p99-us: 500``) on four nodes
    none of which is within its tolerance, the pod having first waited ``waited_s`` before
    ``now`` (``relax_after_s`` 60 s), as read back from Redis."""
    table = table_of(
        [
            node_obj("quiet", cpu="8"),
            node_obj("loud", cpu="8"),
            node_obj("busy", cpu="8"),
            node_obj("small", cpu="1"),
        ]
    )
    table.set_signals(
        {
            name: NodeSignals(
                NodeMetrics(runq_p99_us=value), updated_at=now, measured=SIGNAL_FAMILIES
            )
            for name, value in RUNQ_P99_US.items()
        }
    )
    pod = parse_pod(
        pod_obj(
            "picky-0",
            "shop",
            requests={"cpu": cpu},
            annotations={ANNOTATION_MAX_RUNQ_P99_US: "500"},
        )
    )
    cycle = SchedulingCycle(CycleSettings(profile=profile or Profile()), seed=0)
    if waited_s:
        cycle.schedule(pod, table, now - waited_s)
    result = cycle.schedule(pod, table, now)
    assert result.node is None
    decision = Decision(
        "shop",
        "picky-0",
        "unschedulable",
        "",
        result.message,
        now,
        candidates=list(result.candidates),
        rejected_by_reason=dict(result.reason_counts),
        funnel=list(result.funnel),
        omitted=dict(result.omitted),
        runq=result.runq,
    )
    return parse_decision_hash(decision_hash(decision))


def store(server: RedisServer, decision: Decision) -> None:
    record: dict[str | bytes, bytes | float | int | str] = {}
    record.update(decision_hash(decision))
    server.client().hset(keys.decision_key(decision.namespace, decision.pod), mapping=record)


@pytest.mark.redis
def test_explain_names_the_nearest_node_when_the_pod_is_relaxed_and_what_to_raise(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    decided = time.time() - 5
    store(redis_server, picky_decision(decided, waited_s=10))  # relaxed 45 s from now
    code, out, err = _cli(capsys, redis_server.url, "explain", "shop/picky-0")
    assert code == 0, err
    flat = " ".join(out.split())  # rich wraps long lines
    assert (
        "Nearest node: quiet, run-queue p99 900 µs against the tolerance 500 µs (10s window)."
        in flat
    )
    assert "Hint: raise interference.io/max-runq-p99-us to at least 900 µs." in flat
    assert (
        "run-queue p99 against the tolerance 500 µs (10s window, at the decision): "
        "small 100 µs, quiet 900 µs ✗ (nearest), busy 2600 µs ✗, loud 4000 µs ✗"
    ) in flat
    relax_at = time.strftime("%H:%M:%S UTC", time.gmtime(decided + 50))
    assert "now: Relaxed to interference-blind in 4" in flat  # 45 s, less the seconds since
    assert f"(at {relax_at})" in flat

    code, out, err = _cli(capsys, redis_server.url, "explain", "shop/picky-0", "-o", "json")
    assert code == 0, err
    runq = json.loads(out)["placement"]["runq"]
    assert runq["tolerance_us"] == 500.0 and runq["window"] == "10s"
    assert runq["measured_us"] == RUNQ_P99_US
    assert (runq["nearest"], runq["nearest_us"], runq["raise_to_us"]) == ("quiet", 900.0, 900.0)
    assert runq["relax_at"] == pytest.approx(decided + 50, abs=0.01)
    assert 40 < runq["relax_in_s"] <= 45 and runq["never_relaxed"] is False
    assert runq["advice"].startswith("Nearest node: quiet, run-queue p99 900 µs")
    assert runq["advice"].endswith("raise interference.io/max-runq-p99-us to at least 900 µs.")


@pytest.mark.redis
def test_explain_says_a_pod_other_filters_refuse_as_well_is_never_relaxed(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Interference listed first: the nodes it refuses lack the CPU as well (the pod asks
    for more than any has), so no node is nearest and relaxing would not help."""
    profile = Profile(filters=("Interference", "NodeResourcesFit"))
    decision = picky_decision(time.time(), profile=profile, cpu="16")
    store(redis_server, decision)
    code, out, err = _cli(capsys, redis_server.url, "explain", "shop/picky-0", "-o", "json")
    assert code == 0, err
    runq = json.loads(out)["placement"]["runq"]
    assert runq["never_relaxed"] is True and runq["relax_in_s"] is None
    assert runq["nearest"] is None and runq["raise_to_us"] is None
    assert runq["advice"] == (
        "Never relaxed to interference-blind: another filter refuses each node as well."
    )
    code, out, _ = _cli(capsys, redis_server.url, "explain", "shop/picky-0")
    assert "now: Never relaxed to interference-blind" in " ".join(out.split())


def test_a_record_without_the_runq_check_explains_as_before() -> None:
    """Records stored before the check was kept: ``runq`` is null, nothing is invented."""
    old = Decision("shop", "old-0", "unschedulable", "", "0/4 nodes are available: …", 1.0)
    assert decision_document(old, 2.0)["runq"] is None
