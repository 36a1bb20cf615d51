"""Decision records queued off the scheduling path for a writer thread that writes them
in batches through :class:`~scheduler.adapters.decision_sink.RedisDecisionSink`."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque

from interference.decision import Decision
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.redis_settings import RedisSettings

RECENT_DECISIONS = 4096
"""Decision records a :class:`QueuedDecisionSink` remembers for the decision page."""


class QueuedDecisionSink:
    """A :class:`~scheduler.cycle.ports.DecisionSink` that queues records for a writer thread,
    which writes them in one pipeline per ``decision_batch`` records or per
    ``decision_linger_s``, whichever comes first.

    :meth:`write` costs the caller a lock and an append, not a Redis round trip. The queue
    is bounded (``decision_queue_size``): while it is full a write waits at most
    ``socket_timeout_s``, then the record is counted as a write error and skipped, so a
    slow or absent Redis never stalls scheduling for long. After :meth:`close`, records
    are written synchronously.
    """

    def __init__(
        self, sink: RedisDecisionSink, settings: RedisSettings, remember: int = RECENT_DECISIONS
    ) -> None:
        self._sink = sink
        self._remember = remember
        self._recent: OrderedDict[tuple[str, str], Decision] = OrderedDict()
        """The last ``remember`` records written here, for the decision page: the deployed
        scheduler user may write records but not read them back."""
        self._capacity = settings.decision_queue_size
        self._batch = settings.decision_batch
        self._linger_s = settings.decision_linger_s
        self._wait_s = settings.socket_timeout_s
        self._queue: deque[Decision] = deque()
        self._writing = 0
        self._flushing = 0
        self._closed = False
        self._changed = threading.Condition(threading.Lock())
        self._thread = threading.Thread(target=self._run, name="decision-writer", daemon=True)
        self._thread.start()

    def write(self, decision: Decision) -> None:
        with self._changed:
            if self._remember > 0:
                pod = (decision.namespace, decision.pod)
                self._recent.pop(pod, None)
                self._recent[pod] = decision
                if len(self._recent) > self._remember:
                    self._recent.popitem(last=False)
            if not self._closed:
                if not self._changed.wait_for(
                    lambda: len(self._queue) < self._capacity or self._closed, self._wait_s
                ):
                    self._sink.failed(
                        1,
                        f"the decision queue stayed full ({self._capacity} records) for"
                        f" {self._wait_s:.0f} s; is Redis slow or down?",
                    )
                    return
                if not self._closed:
                    self._queue.append(decision)
                    if len(self._queue) == self._batch:  # else the writer wakes by itself
                        self._changed.notify_all()
                    return
        self._sink.write(decision)

    def read(self, namespace: str, pod: str) -> Decision | None:
        """The pod's latest record: the one this replica wrote last when it still
        remembers it, else the one in Redis (see :meth:`RedisDecisionSink.read`)."""
        with self._changed:
            recent = self._recent.get((namespace, pod))
        return recent if recent is not None else self._sink.read(namespace, pod)

    def index_history(self, node: str) -> list[tuple[float, float]] | None:
        return self._sink.index_history(node)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued record has been written (or failed); False on timeout."""
        with self._changed:
            self._flushing += 1  # the writer stops lingering
            self._changed.notify_all()
            try:
                return self._changed.wait_for(
                    lambda: not self._queue and not self._writing, timeout_s
                )
            finally:
                self._flushing -= 1

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued and stop the writer thread."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(
                    lambda: (
                        len(self._queue) >= self._batch
                        or (self._flushing and self._queue)
                        or self._closed
                    ),
                    self._linger_s,
                )
                if not self._queue:
                    if self._closed:
                        return  # closed and drained
                    continue
                count = min(len(self._queue), self._batch)
                batch = [self._queue.popleft() for _ in range(count)]
                self._writing = count
                self._changed.notify_all()  # room for writers waiting on a full queue
            self._sink.write_many(batch)
            with self._changed:
                self._writing = 0
                self._changed.notify_all()
