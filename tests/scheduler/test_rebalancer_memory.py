"""The rebalancer's memory of its moves (issue 29, items 4 and 5): the ledger's rules as a
table, then over the real cache, table and cycle (tests/scheduler/test_rebalancer.py's
World): the move budget, a move that did not help, a dry run apart from enforcing, and a
new leader reading all of it back. On a real apiserver: tests/e2e/test_rebalancer_memory.py."""

from __future__ import annotations

import pytest

from scheduler.api.pods import parse_pod
from scheduler.cycle.settings import CycleSettings
from scheduler.rebalancing.metrics import EVICTED, WOULD_EVICT
from scheduler.rebalancing.mover import HELD
from scheduler.rebalancing.rebalance import (
    CLUSTER_LIMIT,
    COOLDOWN,
    MOVE_BUDGET,
    MOVE_DID_NOT_HELP,
    NODE_LIMIT,
    EvictionLedger,
    Moved,
    MoveOutcomes,
    RebalancerSettings,
)
from tests.builders import pod_obj
from tests.scheduler.test_rebalancer import NOISY, QUIET, Journal, World

NOW = 100_000.0
SETTINGS = RebalancerSettings(
    mode="enforce",
    cooldown_s=60,
    rate_window_s=60,
    max_per_node=10,
    max_per_namespace=10,
    max_per_cluster=10,
    max_moves_per_workload=3,
    move_budget_window_s=3600,
)


def victim(created_at: float = 0.0, workload: str = "web") -> object:
    obj = pod_obj(
        "web-1",
        "shop",
        nodeName="node-a",
        created_at=created_at,
        annotations={"interference.io/max-runq-p99-us": "500"},
    )
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": workload,
         "uid": f"rs-{workload}", "controller": True}
    ]  # fmt: skip
    return parse_pod(obj)


def move(ago_s: float, workload: str = "rs-web", **flags: bool) -> Moved:
    return Moved(NOW - ago_s, "node-z", "other", workload, **flags)


@pytest.mark.parametrize(
    ("moves", "dry_run", "expected"),
    [
        ([], False, None),
        ([move(30)], False, COOLDOWN),  # within cooldown_s
        ([move(90)], False, None),
        ([move(90), move(1000), move(2000)], False, MOVE_BUDGET),  # 3 in the hour
        ([move(90), move(1000), move(3700)], False, None),  # the third is older than the hour
        ([move(90), move(1000), move(2000)], True, None),  # evictions spend no dry-run budget
        ([move(30, dry_run=True)], False, None),  # a dry run spends no enforce cool-down
        ([move(30, dry_run=True)], True, COOLDOWN),  # … but its own
        ([move(90, dry_run=True)] * 3, False, None),  # … nor the enforce budget
        ([move(500, unhelpful=True)], False, MOVE_DID_NOT_HELP),
        ([move(500, unhelpful=True)], True, None),  # a mark holds evictions only
        ([move(3700, unhelpful=True)], False, None),  # marked for move_budget_window_s
        ([move(50, "rs-api")], False, None),  # another workload, another node
        ([move(50, "rs-api"), move(40, "rs-db")], False, None),
    ],
)
def test_which_guard_rail_holds_a_victim(
    moves: list[Moved], dry_run: bool, expected: str | None
) -> None:
    ledger = EvictionLedger()
    for moved in moves:
        ledger.note(moved)
    assert ledger.hold_reason(victim(), NOW, SETTINGS, dry_run=dry_run) == expected


def test_node_and_cluster_limits_count_only_moves_of_the_same_kind() -> None:
    settings = RebalancerSettings(max_per_node=1, max_per_cluster=2, max_per_namespace=9)
    ledger = EvictionLedger()
    ledger.note(Moved(NOW - 5, "node-a", "x", "rs-a", dry_run=True))
    assert ledger.hold_reason(victim(), NOW, settings, dry_run=True) == NODE_LIMIT
    assert ledger.hold_reason(victim(), NOW, settings) is None
    ledger.note(Moved(NOW - 5, "node-b", "x", "rs-b"))
    ledger.note(Moved(NOW - 5, "node-c", "x", "rs-c"))
    assert ledger.hold_reason(victim(), NOW, settings) == CLUSTER_LIMIT


@pytest.mark.parametrize(
    ("created_at", "looks", "expected"),
    [
        (NOW - 100, [(True, 40.0)], None),  # the victim's sibling, older than the move
        (NOW + 5, [(True, 10.0)], None),  # the replacement, not sustained yet
        (NOW + 5, [(True, 30.0)], "did_not_help"),  # the replacement, sustained
        (NOW + 5, [(True, None)], "helped"),  # seen under its tolerance
        (NOW + 5, [(True, None), (True, 30.0)], None),  # helped first: judged once
        (NOW + 5, [(False, None), (True, 30.0)], "did_not_help"),  # unknown is not "under"
        (NOW, [(True, 30.0)], "did_not_help"),  # created the same second as the move
    ],
)
def test_whether_a_move_helped(
    created_at: float, looks: list[tuple[bool, float | None]], expected: str | None
) -> None:
    outcomes = MoveOutcomes()
    outcomes.moved("rs-web", NOW + 0.5)
    answers = [outcomes.judge(victim(created_at), known, lasted, 30.0) for known, lasted in looks]
    assert answers[-1] == expected and all(a in (None, "helped") for a in answers[:-1])
    if expected is not None:  # answered once
        assert outcomes.judge(victim(created_at), True, 60.0, 30.0) is None


def noisy_pod(w: World, name: str, node: str) -> None:
    """A pod of ReplicaSet web on ``node``, created now, its agent rows noisy."""
    obj = pod_obj(
        name,
        "shop",
        nodeName=node,
        created_at=w.h.clock.now,
        annotations={"interference.io/max-runq-p99-us": "500"},
    )
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs-web",
         "controller": True}
    ]  # fmt: skip
    w.h.cluster.add_pod(obj)
    w.reports.rows.setdefault(node, {})[f"shop/{name}"] = NOISY


def evict_and_replace(w: World, old: str, new: str, node: str) -> None:
    """What the ReplicaSet and the loop do after an eviction: the old pod goes, a new one
    runs on ``node``."""
    w.h.cluster.delete_pod("shop", old)
    for rows in w.reports.rows.values():
        rows.pop(f"shop/{old}", None)
    w.h.clock.advance(1)
    noisy_pod(w, new, node)


def moved_once(journal: Journal) -> World:
    """ReplicaSet web's pod noisy on node-a, evicted, and its replacement web-2 on
    node-b (as noisy as node-a until a test says otherwise)."""
    w = World(SETTINGS, journal)
    noisy_pod(w, "web-1", "node-a")
    w.step()
    (evicted,) = w.step(30)
    assert evicted.outcome == EVICTED  # type: ignore[attr-defined]
    evict_and_replace(w, "web-1", "web-2", "node-b")
    return w


def test_a_move_that_did_not_help_marks_the_workload_with_a_warning() -> None:
    journal = Journal()
    w = moved_once(journal)  # and node-b is as noisy for it
    w.step()
    (held,) = w.step(30)
    assert held.outcome == HELD  # type: ignore[attr-defined]
    assert held.reason.startswith(MOVE_DID_NOT_HELP)  # type: ignore[attr-defined]
    ((kind, reason, message),) = w.events("web-2")
    assert (kind, reason) == ("Warning", "InterferenceMoveDidNotHelp")
    assert "ReplicaSet/web was moved here by the rebalancer and still its run-queue p99" in message
    assert "left where it is for 3600 s" in message
    # long after the cool-down it is still left where it is, and says so once
    for _ in range(3):
        (held,) = w.step(120)
        assert held.reason.startswith(MOVE_DID_NOT_HELP)  # type: ignore[attr-defined]
    assert len(w.events("web-2")) == 1
    assert len(w.evictions.calls) == 1
    assert w.metric("interference_scheduler_rebalance_holds_total", reason=MOVE_DID_NOT_HELP) == 1
    # a new leader reads the mark back
    marks = [m for m, _ in journal.moves if m.unhelpful]
    assert [(m.workload_uid, m.node) for m in marks] == [("rs-web", "node-b")]
    w.h.close()
    new = World(SETTINGS, journal)
    new.h.clock.now = w.h.clock.now + 60
    noisy_pod(new, "web-2", "node-b")
    new.step()
    (held,) = new.step(30)
    assert held.reason.startswith(MOVE_DID_NOT_HELP)  # type: ignore[attr-defined]
    assert new.evictions.calls == []
    new.h.close()


def test_a_move_that_helped_then_noise_again_spends_the_budget() -> None:
    """Two nodes noisy in turn: each move helps for a while; the fourth is refused."""
    w = World(SETTINGS)
    noisy_pod(w, "web-1", "node-a")
    w.step()
    nodes = ["node-a", "node-b"]
    for n in range(3):
        (evicted,) = w.step(30)
        assert evicted.outcome == EVICTED, n  # type: ignore[attr-defined]
        here = nodes[(n + 1) % 2]
        evict_and_replace(w, f"web-{n + 1}", f"web-{n + 2}", here)
        w.reports.rows[here][f"shop/web-{n + 2}"] = QUIET  # the move helped …
        w.step()
        w.h.clock.advance(700)  # … past the cool-down and the departure, then this node
        # turns noisy
        w.reports.rows[here][f"shop/web-{n + 2}"] = NOISY
        w.step()
    (held,) = w.step(30)
    assert held.outcome == HELD and held.reason.startswith(MOVE_BUDGET)  # type: ignore[attr-defined]
    assert len(w.evictions.calls) == 3
    assert w.events("web-4") == []  # no move that did not help: each helped for a while
    w.h.close()


def test_a_new_leader_does_not_judge_again_a_move_that_helped() -> None:
    """The verdict is journaled: after a failover, new noise beside the replacement is a
    new breach (moved again), not the old move failing (marked and left in place)."""
    journal = Journal()
    w = moved_once(journal)
    w.reports.rows["node-b"]["shop/web-2"] = QUIET
    w.step()  # back under its tolerance: the move helped
    assert [m.workload_uid for m, _ in journal.moves if m.helped] == ["rs-web"]
    w.h.close()
    new = World(SETTINGS, journal)
    new.h.clock.now = w.h.clock.now + 700  # past the cool-down and the departure
    noisy_pod(new, "web-2", "node-b")  # a new neighbour on node-b
    new.step()
    (evicted,) = new.step(30)
    assert evicted.outcome == EVICTED  # type: ignore[attr-defined]
    assert all(reason != "InterferenceMoveDidNotHelp" for _, reason, _ in new.events("web-2"))
    new.h.close()


def test_a_dry_run_spends_nothing_of_enforce() -> None:
    w = World(RebalancerSettings(mode="dry_run"))
    noisy_pod(w, "web-1", "node-a")
    w.step()
    (would,) = w.step(30)
    assert would.outcome == WOULD_EVICT  # type: ignore[attr-defined]
    (held,) = w.step(5)
    assert held.reason.startswith(COOLDOWN)  # type: ignore[attr-defined]
    w.rebalancer.update_settings(
        CycleSettings(), RebalancerSettings(mode="enforce"), "interference-scheduler"
    )
    (evicted,) = w.step(5)  # the next look: no new streak, no cool-down of the dry run
    assert evicted.outcome == EVICTED  # type: ignore[attr-defined]
    assert [dry for _, dry in w.evictions.calls] == [True, False]
    w.h.close()
