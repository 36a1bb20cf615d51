"""Binds pods and writes Events and conditions off the scheduling thread (docs/design.md §5).

The scheduling thread assumes a pod in the cache and hands a :class:`BindRequest` to
the :class:`Binder`; a worker thread POSTs the Binding through ``cluster.bind`` and
reports a :class:`BindOutcome` to the callback the loop registered:

* ``BOUND`` — the API server accepted the Binding;
* ``CONFLICT`` — :class:`~scheduler.cycle.ports.BindConflict` (409/404): the pod is bound
  elsewhere or gone; drop it;
* ``FAILED`` — any other :class:`~scheduler.cycle.ports.ClusterError`: forget the assumption
  and retry the pod with backoff;
* ``DROPPED`` — this replica stopped leading before the request was sent; nothing was
  POSTed and the pod goes back to the queue.

Events, conditions and decision records go through :meth:`Binder.submit` so a slow API
server or Redis never stalls scheduling; their failures are logged and counted, never
raised.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum

from scheduler.cycle.ports import BindConflict, Cluster, ClusterError, PodRef
from scheduler.cycle.side_effects import write_guarded
from scheduler.endpoint.metrics import SchedulerMetrics

log = logging.getLogger(__name__)


class BindStatus(Enum):
    """How a bind request ended."""

    BOUND = "bound"
    CONFLICT = "conflict"
    FAILED = "failed"
    DROPPED = "dropped"


@dataclass(frozen=True, slots=True)
class BindRequest:
    """Bind ``pod`` (queue key ``key``) to ``node``."""

    pod: PodRef
    key: str
    node: str


@dataclass(frozen=True, slots=True)
class BindOutcome:
    """The result of one :class:`BindRequest`; ``error`` explains non-BOUND statuses."""

    request: BindRequest
    status: BindStatus
    error: str = ""


class Binder:
    """A thread pool that performs binds and other API writes for the loop."""

    def __init__(
        self,
        cluster: Cluster,
        leading: threading.Event,
        on_outcome: Callable[[BindOutcome], None],
        metrics: SchedulerMetrics,
        workers: int = 16,
    ) -> None:
        if workers < 1:
            raise ValueError(f"bind workers must be at least 1, got {workers}")
        self._cluster = cluster
        self._leading = leading
        self._on_outcome = on_outcome
        self._metrics = metrics
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="binder")
        self._outstanding = 0
        self._wake_below = 0
        """While the scheduling thread waits for room: wake it when fewer tasks remain."""
        self._idle = threading.Condition(threading.Lock())

    def bind(self, request: BindRequest) -> None:
        """Queue a bind; its outcome arrives through the ``on_outcome`` callback."""
        self._run(lambda: self._bind(request), "bind")

    def submit(self, write: Callable[[], None], kind: str) -> None:
        """Run an API or store write off the scheduling thread.

        ``kind`` (``event``, ``condition``, ``decision``) labels the error metric when
        the write fails.
        """
        self._run(write, kind)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued task has finished; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._outstanding == 0, timeout_s)

    def wait_for_room(self, limit: int, timeout_s: float) -> bool:
        """Wait while ``limit`` or more tasks are queued or running; False on timeout."""
        with self._idle:
            self._wake_below = limit
            try:
                return self._idle.wait_for(lambda: self._outstanding < limit, timeout_s)
            finally:
                self._wake_below = 0

    def close(self) -> None:
        """Finish queued work and stop the threads."""
        self._pool.shutdown(wait=True)

    def _run(self, task: Callable[[], None], kind: str) -> None:
        with self._idle:
            self._outstanding += 1
        try:
            self._pool.submit(self._guarded, task, kind)
        except RuntimeError:
            # The pool is shut down (the scheduler is stopping): nothing will run it.
            self._finished()
            log.warning("scheduler is stopping; dropped a %s write", kind)

    def write_now(self, write: Callable[[], None], kind: str) -> None:
        """Run a write in the calling thread with the same error handling as :meth:`submit`.

        For callbacks that already run on a binder thread (bind outcomes).
        """
        write_guarded(write, kind, self._metrics)

    def _guarded(self, task: Callable[[], None], kind: str) -> None:
        try:
            self.write_now(task, kind)
        finally:
            self._finished()

    def _finished(self) -> None:
        with self._idle:
            self._outstanding -= 1
            if self._outstanding == 0 or self._outstanding < self._wake_below:
                self._idle.notify_all()

    def _bind(self, request: BindRequest) -> None:
        if not self._leading.is_set():
            self._metrics.bind_errors.labels("dropped").inc()
            self._on_outcome(
                BindOutcome(request, BindStatus.DROPPED, "this replica is no longer the leader")
            )
            return
        try:
            self._cluster.bind(request.pod, request.node)
        except BindConflict as exc:
            self._metrics.bind_errors.labels("conflict").inc()
            outcome = BindOutcome(request, BindStatus.CONFLICT, str(exc))
        except ClusterError as exc:
            self._metrics.bind_errors.labels("error").inc()
            outcome = BindOutcome(request, BindStatus.FAILED, str(exc))
        except Exception as exc:
            # An adapter bug must not leave the pod assumed forever: treat it as a failure.
            log.exception("unexpected error binding %s to %s", request.key, request.node)
            self._metrics.bind_errors.labels("error").inc()
            outcome = BindOutcome(request, BindStatus.FAILED, repr(exc))
        else:
            self._metrics.binds.inc()
            outcome = BindOutcome(request, BindStatus.BOUND)
        self._on_outcome(outcome)
