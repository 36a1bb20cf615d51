"""The scheduling queue: pending pods by priority then age, with backoff (docs/design.md §5).

Each pending pod is in exactly one state:

* **active** — ready to be scheduled; :meth:`SchedulingQueue.pop` returns the highest
  priority first and, among equal priorities, the oldest (``created_at``) first.
* **backoff** — the last attempt found no node; it becomes active again after
  ``min(initial_backoff_s * 2**(attempts - 1), max_backoff_s)`` seconds (1 s doubling to
  10 s by default), or earlier when a cluster event arrives that may make it fit
  (:meth:`SchedulingQueue.cluster_event`): one the plugins that rejected it registered
  for, whose queueing hint says yes (the ``retry_on`` predicate :meth:`backoff` was
  given; without one, any event).
* **in flight** — popped and being scheduled or bound; the loop decides what happens
  next (:meth:`remove`, :meth:`backoff` or :meth:`requeue`).

A pod key is never held twice. The queue is thread-safe (the informer thread adds and
removes, the scheduling thread pops, binder threads requeue) and takes its clock as an
argument so tests drive time by hand.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from scheduler.api.events import ClusterEvent


class QueueState(Enum):
    """Where a pod is in the queue."""

    ACTIVE = "active"
    BACKOFF = "backoff"
    IN_FLIGHT = "in_flight"


@dataclass(slots=True)
class _Entry:
    key: str
    priority: int
    created_at: float
    state: QueueState
    attempts: int = 0
    """Attempts that ended unschedulable or failed since the pod was added."""
    ready_at: float = 0.0
    """Queue-clock time a backed-off pod becomes active."""
    last_attempt_at: float = 0.0
    generation: int = 0
    """Bumped on every state change so stale heap items are recognised and skipped."""
    retry_on: Callable[[ClusterEvent], bool] | None = None
    """Which events may make the pod fit after its last attempt (``None``: any)."""


class SchedulingQueue:
    """Pending pods ordered by priority then age, with exponential backoff.

    An event-driven early requeue never retries a pod sooner than ``initial_backoff_s``
    after its last attempt: a busy cluster emits many events per second and each one
    would otherwise re-run every unschedulable pod.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 10.0,
    ) -> None:
        if initial_backoff_s <= 0 or max_backoff_s < initial_backoff_s:
            raise ValueError(
                f"backoff must satisfy 0 < initial ({initial_backoff_s}) <= max ({max_backoff_s})"
            )
        self._clock = clock
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._entries: dict[str, _Entry] = {}
        # Heaps of (sort key..., generation, key); items whose generation no longer
        # matches the entry are stale and skipped when they surface.
        self._active: list[tuple[int, float, int, int, str]] = []
        self._sequence = 0
        """Order in which pods became active: the tie-break after priority and age (FIFO)."""
        self._backoff: list[tuple[float, int, str]] = []
        self._active_count = 0
        self._backoff_count = 0
        self._cond = threading.Condition(threading.Lock())

    # ---- producers -------------------------------------------------------------------

    def add(self, key: str, priority: int, created_at: float) -> None:
        """A pending pod appeared or changed; new pods become active.

        A pod already queued keeps its state (a backed-off pod is not retried just
        because its object changed); its priority and age are updated.
        """
        with self._cond:
            entry = self._entries.get(key)
            if entry is None:
                entry = _Entry(key, priority, created_at, QueueState.ACTIVE)
                self._entries[key] = entry
                self._push_active(entry)
                self._cond.notify()
                return
            if (entry.priority, entry.created_at) == (priority, created_at):
                return
            entry.priority = priority
            entry.created_at = created_at
            if entry.state is QueueState.ACTIVE:
                self._active_count -= 1
                self._push_active(entry)

    def remove(self, key: str) -> None:
        """The pod was bound, deleted or is no longer ours: forget it entirely."""
        with self._cond:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._leave_state(entry)

    def backoff(self, key: str, retry_on: Callable[[ClusterEvent], bool] | None = None) -> float:
        """The attempt found no node (or the bind failed): retry later, or earlier on a
        cluster event ``retry_on`` accepts (``None``: any event).

        Returns the delay in seconds, or 0.0 when the key is unknown.
        """
        with self._cond:
            entry = self._entries.get(key)
            if entry is None:
                return 0.0
            self._leave_state(entry)
            entry.retry_on = retry_on
            entry.attempts += 1
            delay = min(
                self._initial_backoff_s * 2.0 ** (entry.attempts - 1),
                self._max_backoff_s,
            )
            now = self._clock()
            entry.last_attempt_at = now
            entry.ready_at = now + delay
            entry.state = QueueState.BACKOFF
            entry.generation += 1
            heapq.heappush(self._backoff, (entry.ready_at, entry.generation, key))
            self._backoff_count += 1
            self._cond.notify()
            return delay

    def requeue(self, key: str) -> None:
        """Make the pod active again at once without counting an attempt.

        Used when an attempt was abandoned for reasons unrelated to the pod, e.g. its
        bind was dropped because this replica lost the leader lease.
        """
        with self._cond:
            entry = self._entries.get(key)
            if entry is None or entry.state is QueueState.ACTIVE:
                return
            self._leave_state(entry)
            self._push_active(entry)
            self._cond.notify()

    def cluster_event(self, event: ClusterEvent | None) -> int:
        """Something that may make unschedulable pods fit happened: retry early the pods
        whose ``retry_on`` accepts ``event`` (``None``: a change nobody classified, such
        as a relist: every backed-off pod).

        Returns how many backed-off pods were moved (or scheduled to move within
        ``initial_backoff_s`` of their last attempt).
        """
        with self._cond:
            now = self._clock()
            moved = 0
            for entry in list(self._entries.values()):
                if entry.state is not QueueState.BACKOFF:
                    continue
                if event is not None and entry.retry_on is not None and not entry.retry_on(event):
                    continue
                earliest = entry.last_attempt_at + self._initial_backoff_s
                if earliest >= entry.ready_at:
                    continue
                moved += 1
                if earliest <= now:
                    self._leave_state(entry)
                    self._push_active(entry)
                else:
                    self._leave_state(entry)
                    entry.ready_at = earliest
                    entry.state = QueueState.BACKOFF
                    entry.generation += 1
                    heapq.heappush(self._backoff, (earliest, entry.generation, entry.key))
                    self._backoff_count += 1
            if moved:
                self._cond.notify_all()
            return moved

    # ---- consumer --------------------------------------------------------------------

    def pop(self) -> str | None:
        """The next pod to schedule (now in flight), or None when none is ready."""
        with self._cond:
            self._promote_expired()
            while self._active:
                _, _, _, generation, key = heapq.heappop(self._active)
                entry = self._entries.get(key)
                if (
                    entry is None
                    or entry.generation != generation
                    or entry.state is not QueueState.ACTIVE
                ):
                    continue
                self._active_count -= 1
                entry.state = QueueState.IN_FLIGHT
                entry.generation += 1
                return key
            return None

    def wait(self, timeout_s: float) -> None:
        """Block until a pod may be ready, at most ``timeout_s`` (real) seconds.

        Wakes early on :meth:`add`, :meth:`requeue`, :meth:`cluster_event` and when the
        first backoff expires.
        """
        with self._cond:
            self._promote_expired()
            if self._active_count:
                return
            if self._backoff_count:
                timeout_s = min(timeout_s, max(0.0, self._backoff[0][0] - self._clock()))
            if timeout_s > 0:
                self._cond.wait(timeout_s)

    # ---- introspection ---------------------------------------------------------------

    def state(self, key: str) -> QueueState | None:
        """Where the pod is, or None when the queue does not hold it."""
        with self._cond:
            entry = self._entries.get(key)
            return None if entry is None else entry.state

    def attempts(self, key: str) -> int:
        """Failed attempts counted for the pod's backoff (0 when unknown)."""
        with self._cond:
            entry = self._entries.get(key)
            return 0 if entry is None else entry.attempts

    def counts(self) -> dict[QueueState, int]:
        """Number of pods per state."""
        with self._cond:
            self._promote_expired()
            in_flight = len(self._entries) - self._active_count - self._backoff_count
            return {
                QueueState.ACTIVE: self._active_count,
                QueueState.BACKOFF: self._backoff_count,
                QueueState.IN_FLIGHT: in_flight,
            }

    def __len__(self) -> int:
        with self._cond:
            return len(self._entries)

    # ---- internals (caller holds the lock) ---------------------------------------------

    def _push_active(self, entry: _Entry) -> None:
        entry.state = QueueState.ACTIVE
        entry.generation += 1
        self._sequence += 1
        heapq.heappush(
            self._active,
            (-entry.priority, entry.created_at, self._sequence, entry.generation, entry.key),
        )
        self._active_count += 1

    def _leave_state(self, entry: _Entry) -> None:
        """Account for the entry leaving its current state (its heap item goes stale)."""
        if entry.state is QueueState.ACTIVE:
            self._active_count -= 1
        elif entry.state is QueueState.BACKOFF:
            self._backoff_count -= 1
        entry.generation += 1

    def _promote_expired(self) -> None:
        now = self._clock()
        while self._backoff and self._backoff[0][0] <= now:
            _, generation, key = heapq.heappop(self._backoff)
            entry = self._entries.get(key)
            if entry is None or entry.generation != generation:
                continue
            self._backoff_count -= 1
            self._push_active(entry)
