"""Room held on a node for a pod that is not placed there yet.

A preemptor waits while its victims terminate; until it is bound, the room it was
nominated for must not go to a pod of lower or equal priority (kube-scheduler's
nominated pods). The same mechanism serves any reservation: whoever holds room names
the pod (its requests, host ports, labels and terms count as if it were placed) and the
node. :class:`RoomHolds` keeps them; :func:`held_room` puts them on the table for one
run of the filters.

A hold counts against a pod being scheduled when the held pod's priority is at least
the pod's (kube-scheduler's ``addGENominatedPods``) and it is not the pod itself (nor, for
room held for a workload's next pod, a pod of that workload: the rebalancer's reservation
for a victim's replacement, :mod:`scheduler.rebalancing.reservations`). The
filters then run twice, with and without the held pods, and a node passes only if it
passes both (kube-scheduler's ``RunFilterPluginsWithNominatedPods``): with them, so a
pod of lower priority does not take the room; without them, so a pod whose affinity or
spread is met only by a held pod does not count on a pod that may never come.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from scheduler.api.objects import PodInfo
from scheduler.signals.table import NodeTable


@dataclass(frozen=True, slots=True)
class Hold:
    pod: PodInfo
    """The pod the room is held for; its priority decides which pods it keeps out."""
    node: str
    workload_uid: str = ""
    """Held for any pod of this controller (a replacement not created yet), else ``""``."""


class RoomHolds:
    """Room held per pod (one node each); not thread-safe: callers hold the cache lock."""

    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}

    def __len__(self) -> int:
        return len(self._holds)

    def hold(self, pod: PodInfo, node: str, workload_uid: str = "") -> None:
        """Hold room for ``pod`` on ``node`` (replacing any room held for it elsewhere);
        with ``workload_uid``, for whichever pod of that controller comes."""
        self._holds[pod.key] = Hold(pod, node, workload_uid)

    def release(self, key: str) -> Hold | None:
        """Stop holding room for pod ``key``; what was held, if anything."""
        return self._holds.pop(key, None)

    def all(self) -> list[Hold]:
        """Every hold."""
        return list(self._holds.values())

    def node_of(self, key: str) -> str | None:
        hold = self._holds.get(key)
        return None if hold is None else hold.node

    def on_node(self, node: str) -> list[PodInfo]:
        """The pods room is held for on ``node``."""
        return [h.pod for h in self._holds.values() if h.node == node]

    def against(self, pod: PodInfo) -> list[Hold]:
        """The holds that count when scheduling ``pod``: priority ≥ its own, not its own
        (nor its workload's)."""
        workload = pod.controller.uid if pod.controller is not None else None
        return [
            h
            for key, h in self._holds.items()
            if key != pod.key and h.pod.priority >= pod.priority and h.workload_uid != workload
        ]


@contextmanager
def held_room(table: NodeTable, holds: list[Hold]) -> Iterator[int]:
    """Place the held pods on the table for the duration (without stamping their load on
    the interference index: they do not run yet), then take them off again. A hold whose
    pod the table already has placed (bound meanwhile) is skipped. Yields how many were
    placed."""
    placed: list[PodInfo] = []
    try:
        for hold in holds:
            if table.node_of(hold.pod.key) is None and table.row_of(hold.node) is not None:
                table.add_pod(hold.pod, hold.node, -float("inf"))
                placed.append(hold.pod)
        yield len(placed)
    finally:
        for pod in placed:
            table.remove_pod(pod)


class TableRoom:
    """Keeps the held room placed on a table between decisions, so a decision costs table
    changes only for what changed since the last one and for the holds that do not count
    against its pod (its own, lower priorities): with hundreds of preemptors waiting for
    their victims, placing every hold anew for every decision would dominate it.

    A held pod is placed without a load stamp; preemption never picks it as a victim. A
    pod the table has placed for real (bound or assumed) is never touched: placing it
    replaced the held one.
    """

    def __init__(self, table: NodeTable) -> None:
        self.table = table
        self._placed: dict[str, Hold] = {}

    def sync(self, holds: RoomHolds) -> None:
        """Make the table hold exactly ``holds`` (O(holds), table changes only for the
        holds that changed)."""
        wanted = {hold.pod.key: hold for hold in holds.all()}
        for key, placed in list(self._placed.items()):
            held = wanted.get(key)
            # the same Hold object, mostly: comparing PodInfo field by field cost 11 % of
            # the scheduling thread with 500 preemptors waiting (bench/preemption_real_api.py)
            if held is not placed and held != placed:
                self._take_off(key)
        for key, hold in wanted.items():
            if key not in self._placed:
                self._put_on(hold)

    def clear(self) -> None:
        """Take every held pod off the table."""
        for key in list(self._placed):
            self._take_off(key)

    @contextmanager
    def counting_for(self, pod: PodInfo, holds: RoomHolds) -> Iterator[int]:
        """For one decision of ``pod``: only the holds that count against it stay on the
        table (:meth:`RoomHolds.against`); yields how many do."""
        counting = {hold.pod.key for hold in holds.against(pod)}
        off = [hold for key, hold in self._placed.items() if key not in counting]
        for hold in off:
            self._take_off(hold.pod.key)
        try:
            yield len(self._placed)
        finally:
            for hold in off:
                self._put_on(hold)

    @contextmanager
    def without(self) -> Iterator[None]:
        """Every held pod off the table for the duration (kube's second filter pass)."""
        off = list(self._placed.values())
        for hold in off:
            self._take_off(hold.pod.key)
        try:
            yield
        finally:
            for hold in off:
                self._put_on(hold)

    def _put_on(self, hold: Hold) -> None:
        table = self.table
        if table.node_of(hold.pod.key) is None and table.row_of(hold.node) is not None:
            table.add_pod(hold.pod, hold.node, -float("inf"))
            self._placed[hold.pod.key] = hold

    def _take_off(self, key: str) -> None:
        hold = self._placed.pop(key)
        if self.table.pods_on_node(hold.node).get(key) is hold.pod:
            self.table.remove_pod(hold.pod)
