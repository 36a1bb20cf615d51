"""The extender's decision records, written only for pods the informers know.

The extender writes a decision record (``intf:decision:{ns}/{pod}``;
:mod:`scheduler.extender.extender` says what each verb's holds) through
:class:`DecisionRecords`. A record is written only for a pod the informers know — pending
for this scheduler under the same namespace, name and UID, or seen so until its bind just
now — so a caller cannot make records (and Redis memory) under names it chooses: a request
about any other pod is answered and records nothing. kube-scheduler may call before our
watch has delivered a new pod, so such a record is held (at most
:data:`UNCONFIRMED_RECORDS`, each for :data:`RECORD_CONFIRM_S`) and written once the
informer has the pod (:meth:`DecisionRecords.confirm`), else dropped and counted. Our watch
can deliver the pod and kube-scheduler's bind back to back, so "has the pod" includes a pod
seen pending and then bound (:meth:`~scheduler.cycle.cache.ClusterCache.vouches_for`): a
poll between the two events is not needed.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from prometheus_client import Counter

from interference.decision import Decision
from scheduler.api.objects import PodInfo
from scheduler.cycle.ports import DecisionSink

log = logging.getLogger(__name__)

UNCONFIRMED_RECORDS = 256
"""Records held for pods the informer has not delivered yet."""
RECORD_CONFIRM_S = 10.0
"""How long such a record waits for its pod before it is dropped."""


class DecisionRecords:
    """Writes the extender's decision records for the pods the informers know; holds those
    of pods not delivered yet until they are, or until :data:`RECORD_CONFIRM_S`."""

    def __init__(
        self,
        decisions: DecisionSink,
        known: Callable[[str, str], bool],
        unknown: Counter,
        clock: Callable[[], float],
    ) -> None:
        """``known(key, uid)``: the informers vouch for the pod with that UID; ``unknown``
        counts the records not written (the pod never known, or too many held)."""
        self._decisions = decisions
        self._known = known
        self._unknown = unknown
        self._clock = clock
        self._lock = threading.Lock()
        self._unconfirmed: OrderedDict[str, tuple[str, Decision, float]] = OrderedDict()
        """Pod key → (UID, record, deadline) for pods the informer has not delivered yet."""

    def write(self, pod: PodInfo, decision: Decision) -> None:
        """Write ``decision`` now when the informer knows ``pod``; else hold it for
        :meth:`confirm` (the oldest held one dropped and counted when full)."""
        if self._known(pod.key, pod.uid):
            self._decisions.write(decision)
            return
        if not pod.uid:
            self._unknown.inc()
            return
        with self._lock:
            self._unconfirmed.pop(pod.key, None)
            deadline = self._clock() + RECORD_CONFIRM_S
            self._unconfirmed[pod.key] = (pod.uid, decision, deadline)
            dropped = max(0, len(self._unconfirmed) - UNCONFIRMED_RECORDS)
            for _ in range(dropped):
                self._unconfirmed.popitem(last=False)
        if dropped:
            self._unknown.inc(dropped)

    def confirm(self) -> None:
        """Write the held records whose pods the informer now knows; drop (and count) those
        past :data:`RECORD_CONFIRM_S`."""
        with self._lock:
            if not self._unconfirmed:
                return
            held = list(self._unconfirmed.items())
        now = self._clock()
        for key, (uid, decision, deadline) in held:
            known = self._known(key, uid)
            if not known and now < deadline:
                continue
            with self._lock:
                entry = self._unconfirmed.get(key)
                if entry is None or entry[1] is not decision:
                    continue  # a newer record replaced it meanwhile
                del self._unconfirmed[key]
            if known:
                self._decisions.write(decision)
            else:
                self._unknown.inc()

    def run(self, stop: threading.Event, interval_s: float = 0.25) -> None:
        """:meth:`confirm` every ``interval_s`` until ``stop`` is set."""
        while not stop.wait(interval_s):
            try:
                self.confirm()
            except Exception:  # a record is not worth the thread
                log.exception("confirming held decision records failed")
