"""Room held for a victim's replacement (issue 29, item 2) over the real cache, table and
cycle (tests/scheduler/test_rebalancer.py's World): one look places every replacement
against the same table, the hold keeps another pod out and lets the replacement in, it is
let go when the replacement is placed or its time is up, and RebalancedAway is never
relaxed. On a real apiserver: tests/e2e/test_rebalancer_memory.py."""

from __future__ import annotations

from scheduler.api.objects import PodInfo
from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.preemption import PreemptionInputs
from scheduler.cycle.settings import CycleSettings
from scheduler.plugins.rebalanced_away import FILTER as REBALANCED_AWAY
from scheduler.rebalancing.metrics import BLOCKED, EVICTED, WOULD_EVICT
from scheduler.rebalancing.mover import HELD
from scheduler.rebalancing.ports import EvictionAnswer, EvictionStatus
from scheduler.rebalancing.rebalance import NO_BETTER_NODE, RebalancerSettings
from scheduler.rebalancing.reservations import REPLACEMENT_SUFFIX
from tests.builders import node_obj, pod_obj
from tests.scheduler.test_rebalancer import NOISY, World

SETTINGS = RebalancerSettings(mode="enforce", reserve_for_s=120)


def owned(name: str, workload: str, node: str | None, created_at: float = 0.0) -> dict:  # type: ignore[type-arg]
    obj = pod_obj(
        name,
        "shop",
        requests={"cpu": "1500m"},
        nodeName=node,
        created_at=created_at,
        annotations={"interference.io/max-runq-p99-us": "500"},
    )
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": workload,
         "uid": f"sts-{workload}", "controller": True}
    ]  # fmt: skip
    return obj


def two_noisy_nodes_one_room(settings: RebalancerSettings) -> World:
    """node-a and node-c noisy, each with a victim of its own workload and no room for
    the other's; node-b (2 CPUs) has room for one of them."""
    w = World(settings)
    w.h.cluster.add_node(node_obj("node-c", cpu="2", memory="32Gi"))
    w.h.cluster.add_pod(pod_obj("filler", "shop", requests={"cpu": "6"}, nodeName="node-a"))
    for name, workload, node in (("web-0", "web", "node-a"), ("api-0", "api", "node-c")):
        w.h.cluster.add_pod(owned(name, workload, node))
        w.reports.rows.setdefault(node, {})[f"shop/{name}"] = NOISY
    return w


def place(w: World, pod: PodInfo) -> str | None:
    """Where the scheduling loop's cycle (nominated pods holding their room) puts ``pod``."""
    cache = w.h.loop.cache
    with cache.lock:
        result = SchedulingCycle(CycleSettings()).schedule(
            pod, cache.table, w.h.clock.now, preemption=PreemptionInputs(cache.holds)
        )
    return result.node


def test_two_victims_never_count_on_one_room() -> None:
    w = two_noisy_nodes_one_room(SETTINGS)
    w.step()
    actions = w.step(30)
    outcomes = sorted((a.outcome, a.target) for a in actions)  # type: ignore[attr-defined]
    assert outcomes == [(EVICTED, "node-b"), (HELD, "")]
    (held,) = [a for a in actions if a.outcome == HELD]  # type: ignore[attr-defined]
    assert held.reason.startswith(NO_BETTER_NODE)  # type: ignore[attr-defined]
    assert len(w.evictions.calls) == 1
    (evicted,) = [a for a in actions if a.outcome == EVICTED]  # type: ignore[attr-defined]
    assert "holds its replacement's room for up to 120 s" in evicted.reason  # type: ignore[attr-defined]
    w.h.close()


def test_a_dry_run_look_counts_each_room_once_too() -> None:
    w = two_noisy_nodes_one_room(RebalancerSettings(mode="dry_run"))
    w.step()
    outcomes = sorted(a.outcome for a in w.step(30))  # type: ignore[attr-defined]
    assert outcomes == [HELD, WOULD_EVICT]
    with w.h.loop.cache.lock:
        assert len(w.h.loop.cache.holds) == 0  # a dry run holds nothing for the loop
    w.h.close()


def test_the_held_room_keeps_others_out_and_lets_the_replacement_in() -> None:
    w = two_noisy_nodes_one_room(SETTINGS)
    w.step()
    (evicted,) = [a for a in w.step(30) if a.outcome == EVICTED]  # type: ignore[attr-defined]
    workload = evicted.workload.split("/")[1]  # type: ignore[attr-defined]
    other = "api" if workload == "web" else "web"
    now = w.h.clock.now
    stranger = parse_pod(owned("stranger-0", other, None, created_at=now))
    assert place(w, stranger) not in ("node-b",)  # the room is held
    replacement = parse_pod(owned(f"{workload}-0", workload, None, created_at=now + 1))
    assert place(w, replacement) == "node-b"
    # placed: the room is let go at the next look
    w.h.cluster.delete_pod("shop", f"{workload}-0")
    w.h.cluster.add_pod(owned(f"{workload}-0", workload, "node-b", created_at=now + 1))
    w.step(1)
    with w.h.loop.cache.lock:
        assert w.h.loop.cache.holds.node_of(f"shop/{workload}-0{REPLACEMENT_SUFFIX}") is None
    w.h.close()


def test_a_held_room_expires() -> None:
    w = two_noisy_nodes_one_room(SETTINGS)
    w.step()
    w.step(30)
    with w.h.loop.cache.lock:
        (key,) = [
            k
            for k in ("shop/web-0", "shop/api-0")
            if w.h.loop.cache.holds.node_of(k + REPLACEMENT_SUFFIX)
        ]
    w.step(119)
    with w.h.loop.cache.lock:
        assert w.h.loop.cache.holds.node_of(key + REPLACEMENT_SUFFIX) == "node-b"
    w.step(1)
    with w.h.loop.cache.lock:
        assert w.h.loop.cache.holds.node_of(key + REPLACEMENT_SUFFIX) is None
    w.h.close()


def test_a_blocked_eviction_holds_no_room() -> None:
    w = two_noisy_nodes_one_room(SETTINGS)
    w.evictions.answers.append(EvictionAnswer(EvictionStatus.BLOCKED, "budget"))
    w.step()
    blocked = [a for a in w.step(30) if a.outcome == BLOCKED]  # type: ignore[attr-defined]
    assert len(blocked) == 1
    with w.h.loop.cache.lock:
        assert w.h.loop.cache.holds.node_of(blocked[0].pod + REPLACEMENT_SUFFIX) is None  # type: ignore[attr-defined]
    w.h.close()


def test_rebalanced_away_is_never_relaxed() -> None:
    """A replacement that lost its room waits rather than go back to the node it left."""
    assert REBALANCED_AWAY.relaxable is False
