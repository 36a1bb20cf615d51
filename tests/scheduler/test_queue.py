"""SchedulingQueue: priority then age, backoff 1 s doubling to 10 s, early requeue."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from scheduler.api.events import Action, ClusterEvent, EventInterest
from scheduler.api.pods import parse_pod
from scheduler.cycle.queue import QueueState, SchedulingQueue
from tests.builders import pod_obj


class FakeClock:
    """A monotonic clock the test advances by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def queue(clock: FakeClock) -> SchedulingQueue:
    return SchedulingQueue(clock=clock)


def drain(queue: SchedulingQueue) -> list[str]:
    keys = []
    while (key := queue.pop()) is not None:
        keys.append(key)
    return keys


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param(
            [("a", 0, 3.0), ("b", 0, 1.0), ("c", 0, 2.0)],
            ["b", "c", "a"],
            id="same-priority-oldest-first",
        ),
        pytest.param(
            [("low", 0, 1.0), ("high", 100, 5.0), ("mid", 10, 3.0)],
            ["high", "mid", "low"],
            id="priority-beats-age",
        ),
        pytest.param(
            [("neg", -5, 1.0), ("zero", 0, 9.0)], ["zero", "neg"], id="negative-priority-last"
        ),
        pytest.param([("y", 1, 2.0), ("x", 1, 2.0)], ["y", "x"], id="full-tie-first-in-first-out"),
    ],
)
def test_pop_order(
    queue: SchedulingQueue, pods: list[tuple[str, int, float]], expected: list[str]
) -> None:
    for key, priority, created in pods:
        queue.add(key, priority, created)
    assert drain(queue) == expected


def test_add_twice_keeps_one_entry(queue: SchedulingQueue) -> None:
    queue.add("ns/a", 0, 1.0)
    queue.add("ns/a", 0, 1.0)
    queue.add("ns/a", 5, 1.0)
    assert len(queue) == 1
    assert drain(queue) == ["ns/a"]
    assert queue.pop() is None


def test_priority_update_reorders_active_pod(queue: SchedulingQueue) -> None:
    queue.add("a", 0, 1.0)
    queue.add("b", 0, 2.0)
    queue.add("b", 10, 2.0)
    assert drain(queue) == ["b", "a"]


def test_popped_pod_is_in_flight_and_not_readded(queue: SchedulingQueue) -> None:
    queue.add("a", 0, 1.0)
    assert queue.pop() == "a"
    assert queue.state("a") is QueueState.IN_FLIGHT
    queue.add("a", 0, 1.0)  # an informer update while the pod is being scheduled
    assert queue.pop() is None
    assert queue.counts()[QueueState.IN_FLIGHT] == 1


def test_backoff_doubles_to_ten_seconds(queue: SchedulingQueue, clock: FakeClock) -> None:
    queue.add("a", 0, 1.0)
    delays = []
    for _ in range(6):
        assert queue.pop() == "a"
        delay = queue.backoff("a")
        delays.append(delay)
        clock.advance(delay - 0.01)
        assert queue.pop() is None, "pod came back before its backoff expired"
        clock.advance(0.01)
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert queue.pop() == "a"


def test_remove_forgets_every_state(queue: SchedulingQueue) -> None:
    for age, key in enumerate(("active", "backoff", "flight")):
        queue.add(key, 0, float(age))
    assert queue.pop() == "active"
    queue.requeue("active")
    queue.pop()  # "active" again, the oldest
    queue.backoff("active")
    assert queue.pop() == "backoff"
    for key in ("active", "backoff", "flight"):
        queue.remove(key)
    assert len(queue) == 0
    assert queue.counts() == {
        QueueState.ACTIVE: 0,
        QueueState.BACKOFF: 0,
        QueueState.IN_FLIGHT: 0,
    }
    assert queue.pop() is None


def test_cluster_event_moves_backed_off_pods_early(
    queue: SchedulingQueue, clock: FakeClock
) -> None:
    queue.add("a", 0, 1.0)
    for _ in range(4):  # 1 + 2 + 4 + 8 s
        assert queue.pop() == "a"
        clock.advance(queue.backoff("a"))
    assert queue.pop() == "a"
    assert queue.backoff("a") == 10.0
    clock.advance(1.5)
    assert queue.cluster_event(None) == 1
    assert queue.pop() == "a"


def test_cluster_event_never_retries_within_initial_backoff(
    queue: SchedulingQueue, clock: FakeClock
) -> None:
    queue.add("a", 0, 1.0)
    queue.pop()
    queue.backoff("a")  # ready in 1 s: an event cannot make it earlier
    assert queue.cluster_event(None) == 0
    queue.pop()  # not ready
    clock.advance(1.0)
    assert queue.pop() == "a"
    queue.backoff("a")  # 2 s now
    clock.advance(0.5)
    assert queue.cluster_event(None) == 1  # moved to last attempt + 1 s
    assert queue.pop() is None
    clock.advance(0.5)
    assert queue.pop() == "a"


NODE_ADDED = ClusterEvent("Node", Action.ADD)
NODE_TAINTED = ClusterEvent("Node", Action.UPDATE_NODE_TAINT)
POD_DELETED = ClusterEvent("Pod", Action.DELETE)


def only(*events: ClusterEvent) -> Callable[[ClusterEvent], bool]:
    """A ``retry_on`` predicate accepting exactly ``events``."""
    return lambda event: event in events


def back_off_long(
    queue: SchedulingQueue,
    clock: FakeClock,
    retry_on: dict[str, Callable[[ClusterEvent], bool] | None],
) -> None:
    """Pop each pod of ``retry_on`` and back it off with its predicate until its backoff
    is well over the initial 1 s, then let more than 1 s pass: only an event can make
    them active now."""
    for _ in range(3):  # 1 + 2 s, then 4 s
        assert sorted(drain(queue)) == sorted(retry_on)
        delays = {queue.backoff(key, accepts) for key, accepts in retry_on.items()}
        assert len(delays) == 1
        if (delay := delays.pop()) < 4.0:
            clock.advance(delay)
    clock.advance(1.5)


def test_a_pod_with_retry_on_moves_only_on_the_events_it_accepts(
    queue: SchedulingQueue, clock: FakeClock
) -> None:
    queue.add("a", 0, 1.0)
    back_off_long(queue, clock, {"a": only(NODE_ADDED)})
    assert queue.cluster_event(POD_DELETED) == 0
    assert queue.cluster_event(NODE_TAINTED) == 0
    assert queue.pop() is None
    assert queue.state("a") is QueueState.BACKOFF
    assert queue.cluster_event(NODE_ADDED) == 1
    assert queue.pop() == "a"


def test_an_unclassified_change_moves_a_pod_whatever_its_retry_on(
    queue: SchedulingQueue, clock: FakeClock
) -> None:
    queue.add("a", 0, 1.0)
    back_off_long(queue, clock, {"a": only(NODE_ADDED)})
    assert queue.cluster_event(None) == 1
    assert queue.pop() == "a"


def test_a_pod_without_retry_on_moves_on_any_event(
    queue: SchedulingQueue, clock: FakeClock
) -> None:
    queue.add("a", 0, 1.0)
    back_off_long(queue, clock, {"a": None})
    assert queue.cluster_event(POD_DELETED) == 1
    assert queue.pop() == "a"


def test_each_pod_is_moved_by_its_own_retry_on(queue: SchedulingQueue, clock: FakeClock) -> None:
    queue.add("nodes", 0, 1.0)
    queue.add("pods", 0, 2.0)
    back_off_long(queue, clock, {"nodes": only(NODE_ADDED), "pods": only(POD_DELETED)})
    assert queue.cluster_event(POD_DELETED) == 1
    assert drain(queue) == ["pods"]
    assert queue.state("nodes") is QueueState.BACKOFF
    assert queue.cluster_event(NODE_ADDED) == 1
    assert drain(queue) == ["nodes"]


def test_the_latest_backoff_s_retry_on_is_the_one_that_counts(
    queue: SchedulingQueue, clock: FakeClock
) -> None:
    queue.add("a", 0, 1.0)
    back_off_long(queue, clock, {"a": only(NODE_ADDED)})
    assert queue.cluster_event(NODE_ADDED) == 1
    assert queue.pop() == "a"
    assert queue.backoff("a", only(POD_DELETED)) == 8.0
    clock.advance(1.5)
    assert queue.cluster_event(NODE_ADDED) == 0
    assert queue.cluster_event(POD_DELETED) == 1
    assert queue.pop() == "a"


def test_retry_on_works_with_a_plugin_s_event_interest(
    queue: SchedulingQueue, clock: FakeClock
) -> None:
    interest = EventInterest("Node", Action.ADD | Action.UPDATE_NODE_TAINT)
    pod = parse_pod(pod_obj("a"))
    queue.add("a", 0, 1.0)
    back_off_long(queue, clock, {"a": lambda event: interest.wants(pod, event)})
    assert queue.cluster_event(ClusterEvent("Node", Action.UPDATE_NODE_LABEL)) == 0
    assert queue.cluster_event(ClusterEvent("Pod", Action.ADD)) == 0
    assert queue.cluster_event(NODE_TAINTED) == 1
    assert queue.pop() == "a"


def test_requeue_makes_in_flight_pod_active_without_counting(queue: SchedulingQueue) -> None:
    queue.add("a", 0, 1.0)
    queue.pop()
    queue.requeue("a")
    assert queue.attempts("a") == 0
    assert queue.pop() == "a"


def test_counts_follow_states(queue: SchedulingQueue, clock: FakeClock) -> None:
    for key in "abc":
        queue.add(key, 0, 1.0)
    queue.pop()
    queue.backoff("a")
    queue.pop()
    assert queue.counts() == {
        QueueState.ACTIVE: 1,
        QueueState.BACKOFF: 1,
        QueueState.IN_FLIGHT: 1,
    }
    clock.advance(1.0)
    assert queue.counts()[QueueState.ACTIVE] == 2


def test_backoff_of_unknown_key_is_harmless(queue: SchedulingQueue) -> None:
    assert queue.backoff("nope") == 0.0
    queue.requeue("nope")
    assert len(queue) == 0


def test_invalid_backoff_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="backoff"):
        SchedulingQueue(initial_backoff_s=0)
    with pytest.raises(ValueError, match="backoff"):
        SchedulingQueue(initial_backoff_s=5, max_backoff_s=1)


def test_wait_wakes_on_add() -> None:
    queue = SchedulingQueue()
    woke = threading.Event()

    def waiter() -> None:
        queue.wait(30.0)
        woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    queue.add("a", 0, 1.0)
    assert woke.wait(30.0)
    thread.join()
    assert queue.pop() == "a"


def test_concurrent_producers_never_duplicate() -> None:
    queue = SchedulingQueue()
    keys = [f"ns/p{i}" for i in range(200)]

    def produce() -> None:
        for key in keys:
            queue.add(key, 0, 1.0)

    threads = [threading.Thread(target=produce) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    popped = drain(queue)
    assert sorted(popped) == sorted(keys)
