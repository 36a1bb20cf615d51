"""A pod's warnings as Warning Events in extender mode, written off the request path.

Standalone mode's loop turns :attr:`PodInfo.warnings <scheduler.api.objects.PodInfo.warnings>`
(``UnknownAnnotation`` naming the closest known key, ``InvalidAnnotation``) into
Warning Events, once per pod, through the cluster adapter's
:meth:`~scheduler.cycle.ports.Cluster.record_event`. In extender mode kube-scheduler schedules
and binds, so without these a pod with a typo such as ``interference.io/max-runq-p99``
would run unprotected and silent. :class:`PodWarningEvents` writes the same Events through
the same adapter, once per pod (per UID and set of warnings, as the loop compares them),
and never on a ``/filter`` answer's time: the request thread only notes the pod (a dict
update under a lock); a thread of its own writes (:meth:`PodWarningEvents.run`).

Bounded: at most :data:`WAITING_PODS` pods wait to be written (beyond, the oldest is
dropped, counted, and warned again on a later call) and :data:`WARNED_PODS` are remembered
as warned. The writer is one thread, so the API server sees one Event request at a time.
As decision records, an Event is written only for a pod the informers know (pending here,
same UID, or seen so just before kube-scheduler's bind:
:meth:`~scheduler.cycle.cache.ClusterCache.vouches_for`), so a caller cannot make Events about
names it chooses; a pod our watch has not delivered yet waits up to
:data:`WAIT_FOR_INFORMER_S` for it.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter

from scheduler.api.objects import PodInfo, PodWarning
from scheduler.cycle.ports import PodRef
from scheduler.cycle.side_effects import write_guarded
from scheduler.endpoint.metrics import SchedulerMetrics

log = logging.getLogger(__name__)

WARNED_PODS = 16384
"""Pods remembered as warned (the oldest forgotten), as the loop remembers them."""
WAITING_PODS = 256
"""Pods whose Events wait to be written."""
WAIT_FOR_INFORMER_S = 10.0
"""How long a noted pod waits for the informers to deliver it before it is dropped."""


class PodEvents(Protocol):
    """Where the Events go: the cluster adapter (:class:`scheduler.cycle.ports.Cluster`)."""

    def record_event(self, pod: PodRef, event_type: str, reason: str, message: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _Waiting:
    ref: PodRef
    warnings: tuple[PodWarning, ...]
    deadline: float
    known: bool
    """The informers had the pod when it was noted."""


class PodWarningEvents:
    """Writes each noted pod's warnings as Warning Events, once per pod, off the caller's
    thread."""

    def __init__(
        self,
        events: PodEvents,
        known: Callable[[str, str], bool],
        metrics: SchedulerMetrics,
        dropped: Counter,
        clock: Callable[[], float],
    ) -> None:
        """``known(key, uid)``: the informers vouch for the pod with that UID;
        ``dropped`` counts the pods whose Events were not written (queue full, or never
        known)."""
        self._events = events
        self._known = known
        self._metrics = metrics
        self._dropped = dropped
        self._clock = clock
        self._lock = threading.Lock()
        self._warned: OrderedDict[str, tuple[str, tuple[PodWarning, ...]]] = OrderedDict()
        """Pod key → (UID, warnings) written or waiting."""
        self._waiting: OrderedDict[str, _Waiting] = OrderedDict()

    def note(self, pod: PodInfo) -> None:
        """Have ``pod``'s warnings written unless they were already (never blocks on I/O)."""
        if not pod.warnings or not pod.uid:
            return  # without a UID the informers cannot vouch for it
        told = (pod.uid, pod.warnings)
        with self._lock:
            if self._warned.get(pod.key) == told:
                return
        known = self._known(pod.key, pod.uid)  # pending now: it may be bound by the write
        dropped = 0
        with self._lock:
            if self._warned.get(pod.key) == told:
                return
            self._warned[pod.key] = told
            self._warned.move_to_end(pod.key)
            while len(self._warned) > WARNED_PODS:
                self._warned.popitem(last=False)
            self._waiting.pop(pod.key, None)
            ref = PodRef(pod.namespace, pod.name, pod.uid)
            deadline = self._clock() + WAIT_FOR_INFORMER_S
            self._waiting[pod.key] = _Waiting(ref, pod.warnings, deadline, known)
            while len(self._waiting) > WAITING_PODS:
                key, oldest = self._waiting.popitem(last=False)
                self._forget(key, oldest)
                dropped += 1
        if dropped:
            self._dropped.inc(dropped)

    def write_due(self) -> int:
        """Write the Events of the waiting pods the informers know; drop (and count) those
        past their wait. Returns how many Events were written."""
        with self._lock:
            if not self._waiting:
                return 0
            waiting = list(self._waiting.items())
        now = self._clock()
        written = 0
        for key, entry in waiting:
            known = entry.known or self._known(key, entry.ref.uid)
            if not known and now < entry.deadline:
                continue
            with self._lock:
                if self._waiting.get(key) is not entry:
                    continue  # noted again meanwhile, with other warnings
                del self._waiting[key]
                if not known:
                    self._forget(key, entry)
            if not known:
                self._dropped.inc()
                continue
            for warning in entry.warnings:
                written += self._write(entry.ref, warning)
        return written

    def run(self, stop: threading.Event, interval_s: float = 0.25) -> None:
        """:meth:`write_due` every ``interval_s`` until ``stop`` is set."""
        while not stop.wait(interval_s):
            try:
                self.write_due()
            except Exception:  # an Event is not worth the thread
                log.exception("writing pod warning Events failed")

    def _forget(self, key: str, entry: _Waiting) -> None:
        """Not written: a later call about the pod notes it again (caller holds the lock)."""
        if self._warned.get(key) == (entry.ref.uid, entry.warnings):
            del self._warned[key]

    def _write(self, ref: PodRef, warning: PodWarning) -> int:
        written = write_guarded(
            lambda: self._events.record_event(ref, "Warning", warning.reason, warning.message),
            "event",
            self._metrics,
        )
        return int(written)
