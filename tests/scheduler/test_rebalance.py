"""The rebalancer's rules (scheduler/rebalancing/rebalance.py), table-driven, and the RebalancedAway
filter that keeps a moved workload off the node it left."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from interference.signals import PodMetrics
from scheduler.api.nodes import parse_node
from scheduler.api.objects import ControllerRef, InterferenceTolerance, PodInfo
from scheduler.api.pods import parse_pod
from scheduler.plugins.base import CycleState
from scheduler.plugins.rebalanced_away import (
    LEFT_NODE,
    Departure,
    DepartureLookup,
    RebalancedAwayArgs,
    rebalanced_away,
)
from scheduler.rebalancing.rebalance import (
    CLUSTER_LIMIT,
    COOLDOWN,
    NAMESPACE_LIMIT,
    NODE_LIMIT,
    OWN_LIMIT,
    OWN_TASKS,
    BreachTracker,
    EvictionLedger,
    Moved,
    OwnWindow,
    PodHistory,
    RebalancerSettings,
    breach,
    eligible,
    own_cause,
)
from scheduler.signals.table import NodeTable
from tests.builders import node_obj, pod_obj

RS = ControllerRef("ReplicaSet", "web-7d9", "rs-uid")


def running(
    name: str = "web-1",
    *,
    namespace: str = "shop",
    node: str = "node-a",
    annotations: dict[str, str] | None = None,
    owner: dict[str, object] | None = None,
    scheduler_name: str = "interference-scheduler",
) -> PodInfo:
    obj = pod_obj(
        name,
        namespace,
        nodeName=node,
        schedulerName=scheduler_name,
        annotations={"interference.io/max-runq-p99-us": "500"}
        if annotations is None
        else annotations,
    )
    ref = {"kind": "ReplicaSet", "name": "web-7d9", "uid": "rs-uid", "controller": True}
    if owner is not None:
        ref = {**ref, **owner}
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", **ref}]
    return parse_pod(obj)


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (running(), None),
        (running(owner={"kind": "StatefulSet"}), None),
        (running(owner={"kind": "Job"}), None),  # looked at; refused as a victim (evictable)
        (running(annotations={}), "declares no run-queue or reclaim tolerance"),
        (
            running(annotations={"interference.io/max-index": "40"}),
            "declares no run-queue or reclaim tolerance",
        ),
        (
            running(annotations={"interference.io/max-reclaim-stall-ms-per-s": "2"}),
            None,
        ),
        (running(namespace="kube-system"), "namespace kube-system is never rebalanced"),
        (running(namespace="payments"), "namespace payments is never rebalanced"),
        (
            running(
                annotations={
                    "interference.io/max-runq-p99-us": "500",
                    "interference.io/rebalance": "false",
                }
            ),
            'opts out (interference.io/rebalance: "false")',
        ),
        (
            running(scheduler_name="default-scheduler"),
            "its replacement would be placed by default-scheduler, not by this scheduler",
        ),
    ],
)
def test_who_may_be_moved(pod: PodInfo, why: str | None) -> None:
    settings = RebalancerSettings(never_namespaces=("payments",))
    assert eligible(pod, settings, "interference-scheduler") == why


def test_kube_system_is_spared_even_when_not_listed() -> None:
    settings = RebalancerSettings(never_namespaces=())
    assert eligible(running(namespace="kube-system"), settings, "interference-scheduler")


def tolerant(runq: float | None = 500, reclaim: float | None = 2) -> PodInfo:
    return dataclasses.replace(running(), tolerance=InterferenceTolerance(runq, reclaim))


def own(p99: float, wait: float = 10.0, throttled: float = 0.0) -> OwnWindow:
    return OwnWindow(60, p99, wait, throttled)


@pytest.mark.parametrize(
    ("pod", "window", "reclaim", "runq_breach", "reclaim_breach", "text"),
    [
        (tolerant(), own(400), 1.0, None, None, None),
        (tolerant(), own(500), 2.0, None, None, None),  # at the bound is within it
        (tolerant(), own(2900), 1.0, True, False, "its run-queue p99 2900 µs > tolerance 500 µs"),
        (
            tolerant(),
            own(100),
            3.5,
            False,
            True,
            "its node's reclaim stall 3.5 ms/s > tolerance 2 ms/s",
        ),
        (tolerant(), own(900), 3.0, True, True, None),
        (tolerant(), None, None, None, None, None),  # nothing known is no breach
        (tolerant(reclaim=None), own(100), 50.0, None, None, None),  # no reclaim bound
        (tolerant(runq=None), own(90_000), 1.0, None, None, None),  # no run-queue bound
    ],
)
def test_what_a_window_breaks(
    pod: PodInfo,
    window: OwnWindow | None,
    reclaim: float | None,
    runq_breach: bool | None,
    reclaim_breach: bool | None,
    text: str | None,
) -> None:
    found = breach(pod, window, reclaim)
    if runq_breach is None:
        assert found is None
        return
    assert found is not None
    assert (found.runq, found.reclaim) == (runq_breach, reclaim_breach)
    if text is not None:
        assert found.text == text
    else:
        assert "; " in found.text


@pytest.mark.parametrize(
    ("window", "reclaim", "cause"),
    [
        # a thread with a 0.2-CPU quota: runs 200, waits 400 ms/s, throttled 400 ms/s
        (OwnWindow(60, 2900, 400, 400, 200, 0, 400), None, OWN_LIMIT),
        # the same numbers from an agent without culprits: the wait counts as neighbours'
        (OwnWindow(60, 2900, 400, 400, 200), None, OWN_LIMIT),
        (OwnWindow(60, 2900, 300, 0, 500, 0, 300), None, None),  # neighbours: move it
        (OwnWindow(60, 2900, 350, 0, 800, 300, 50), None, OWN_TASKS),  # its own threads
        (OwnWindow(60, 2900, 20, 15, 0), None, None),  # barely running: mostly neighbours
        (OwnWindow(60, 2900, 400, 400, 200), 9.0, None),  # reclaim is the node's doing
    ],
)
def test_whose_doing_a_run_queue_breach_is(
    window: OwnWindow, reclaim: float | None, cause: str | None
) -> None:
    found = breach(tolerant(), window, reclaim)
    assert found is not None
    assert own_cause(found, window) == cause


def rows(*p99_buckets: list[int], start: float = 1000.0) -> PodHistory:
    history = PodHistory("uid")
    for i, buckets in enumerate(p99_buckets):
        history.add(
            PodMetrics("shop", "web-1", runq_us=tuple(buckets), runq_wait_ms_per_s=4.0), start + i
        )
    return history


def test_a_window_merges_every_interval_histogram() -> None:
    quiet = [100]  # 100 waits in slot 0 (≤ 1 µs)
    noisy = [0] * 12 + [10]  # 10 waits in slot 12 (4–8 ms)
    history = rows(*([quiet] * 50), *([noisy] * 10))
    window = history.window(1059.0, 60.0, 5.0)
    assert window is not None
    assert window.intervals == 60
    assert 4096 <= window.runq_p99_us <= 8191  # 100 of 5,100 waits are slow: p99 is one
    # one noisy second in sixty: its waits are 10 of 5,000 + 10, under 1 %
    history = rows(*([quiet] * 59), noisy)
    window = history.window(1059.0, 60.0, 5.0)
    assert window is not None and window.runq_p99_us <= 1


def test_a_window_forgets_old_rows_and_an_old_latest_row_is_unknown() -> None:
    history = rows([0] * 12 + [10], *([[100]] * 5), start=1000.0)
    window = history.window(1001.5 + 60.0, 60.0, 100.0)
    assert window is not None and window.intervals == 4  # the first rows fell out
    assert history.window(1005.0 + 6.0, 60.0, 5.0) is None  # latest row 6 s old


def test_a_row_published_twice_counts_once() -> None:
    history = PodHistory("uid")
    row = PodMetrics("shop", "web-1", runq_us=(1,))
    history.add(row, 10.0)
    history.add(row, 10.0)
    history.add(row, 9.0)
    assert len(history.rows) == 1


def test_a_streak_is_broken_by_one_look_within_tolerance() -> None:
    tracker = BreachTracker()
    assert tracker.note("a", True, 100.0) == 0.0
    assert tracker.note("a", True, 130.0) == 30.0
    assert tracker.note("a", False, 135.0) == 0.0
    assert tracker.note("a", True, 140.0) == 0.0
    assert tracker.note("a", True, 150.0) == 10.0


LIMITS = RebalancerSettings(
    max_per_node=1, max_per_namespace=2, max_per_cluster=3, rate_window_s=600, cooldown_s=300
)


@pytest.mark.parametrize(
    ("moves", "now", "reason"),
    [
        ([], 1000.0, None),
        ([Moved(900, "node-b", "other", "rs-uid")], 1000.0, COOLDOWN),  # same workload
        ([Moved(600, "node-b", "other", "rs-uid")], 1000.0, None),  # cool-down over
        ([Moved(900, "node-a", "other", "x")], 1000.0, NODE_LIMIT),
        ([Moved(300, "node-a", "other", "x")], 1000.0, None),  # out of the rate window
        ([Moved(900, "node-b", "shop", "x"), Moved(901, "node-c", "shop", "y")], 1000.0,
         NAMESPACE_LIMIT),
        ([Moved(900 + i, f"node-{i}", f"ns-{i}", f"w{i}") for i in range(3)], 1000.0,
         CLUSTER_LIMIT),
        ([Moved(900 + i, f"node-{i}", f"ns-{i}", f"w{i}") for i in range(2)], 1000.0, None),
    ],
)  # fmt: skip
def test_guard_rails(moves: list[Moved], now: float, reason: str | None) -> None:
    ledger = EvictionLedger()
    for moved in moves:
        ledger.note(moved)
    assert ledger.hold_reason(running(), now, LIMITS) == reason


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("mode", "on", "mode: 'on' is not one of off, dry_run, enforce"),
        ("window", "30s", "window: '30s' is not one of 10s, 60s"),
        ("interval_s", 0, "interval_s: 0 must be a number > 0"),
        ("sustained_for_s", -1, "sustained_for_s: -1 must be a number ≥ 0"),
        ("max_per_node", -1, "max_per_node: -1 must be an integer ≥ 0"),
    ],
)
def test_settings_validation(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        RebalancerSettings(**{field: value})  # type: ignore[arg-type]


# ---- RebalancedAway ------------------------------------------------------------------


def three_nodes() -> NodeTable:
    table = NodeTable()
    for name in ("node-a", "node-b", "node-c"):
        table.upsert_node(parse_node(node_obj(name)))
    return table


def replacement(controller: ControllerRef | None = RS) -> PodInfo:
    return dataclasses.replace(running("web-2", node=""), node_name="", controller=controller)


@pytest.mark.parametrize(
    ("departures", "pod", "now", "passed"),
    [
        ([], replacement(), 1000.0, None),
        ([Departure("rs-uid", "ReplicaSet/web-7d9", "node-a", 900.0, "x")], replacement(),
         1000.0, [False, True, True]),
        ([Departure("rs-uid", "ReplicaSet/web-7d9", "node-a", 300.0, "x")], replacement(),
         1000.0, None),  # older than avoid_for_s
        ([Departure("other", "ReplicaSet/db", "node-a", 900.0, "x")], replacement(), 1000.0,
         None),  # another workload's
        ([Departure("rs-uid", "ReplicaSet/web-7d9", "node-a", 900.0, "x"),
          Departure("rs-uid", "ReplicaSet/web-7d9", "node-c", 950.0, "x")], replacement(),
         1000.0, [False, True, False]),
        ([Departure("rs-uid", "ReplicaSet/web-7d9", "node-a", 900.0, "x")], replacement(None),
         1000.0, None),  # no controller: nothing to check
        ([Departure("rs-uid", "ReplicaSet/web-7d9", "gone-node", 900.0, "x")], replacement(),
         1000.0, None),
    ],
)  # fmt: skip
def test_rebalanced_away(
    departures: list[Departure], pod: PodInfo, now: float, passed: list[bool] | None
) -> None:
    table = three_nodes()
    departures_of = DepartureLookup()
    for departure in departures:
        departures_of.record(departure, 0.0)
    state = CycleState(pod, table, now)
    result = rebalanced_away(state, departures_of, RebalancedAwayArgs(avoid_for_s=600))
    if passed is None:
        assert result is None
        return
    assert result is not None
    assert result.passed.tolist() == passed
    (why,) = result.failure_reasons(np.array([0]))
    assert why == [f"{LEFT_NODE} (ReplicaSet/web-7d9 left node-a 100 s ago: x)"]


def test_departures_older_than_the_window_are_forgotten() -> None:
    departures_of = DepartureLookup()
    departures_of.record(Departure("w1", "ReplicaSet/a", "node-a", 100.0, "x"), 0.0)
    departures_of.record(Departure("w2", "ReplicaSet/b", "node-b", 800.0, "x"), 200.0)
    assert [d.workload_uid for d in departures_of.all()] == ["w2"]
