"""Room held on a node for a pod that is not placed there yet.

A preemptor waits while its victims terminate; until it is bound, the room it was
nominated for must not go to a pod of lower or equal priority (kube-scheduler's
nominated pods). The same mechanism serves any reservation: whoever holds room names
the pod (its requests, host ports, labels and terms count as if it were placed) and the
node. :class:`RoomHolds` keeps them; :func:`held_room` puts them on the table for one
run of the filters.

A hold counts against a pod being scheduled when the held pod's priority is at least
the pod's (kube-scheduler's ``addGENominatedPods``) and it is not the pod itself. The
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
from scheduler.table import NodeTable


@dataclass(frozen=True, slots=True)
class Hold:
    pod: PodInfo
    """The pod the room is held for; its priority decides which pods it keeps out."""
    node: str


class RoomHolds:
    """Room held per pod (one node each); not thread-safe: callers hold the cache lock."""

    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}

    def __len__(self) -> int:
        return len(self._holds)

    def hold(self, pod: PodInfo, node: str) -> None:
        """Hold room for ``pod`` on ``node`` (replacing any room held for it elsewhere)."""
        self._holds[pod.key] = Hold(pod, node)

    def release(self, key: str) -> Hold | None:
        """Stop holding room for pod ``key``; what was held, if anything."""
        return self._holds.pop(key, None)

    def node_of(self, key: str) -> str | None:
        hold = self._holds.get(key)
        return None if hold is None else hold.node

    def on_node(self, node: str) -> list[PodInfo]:
        """The pods room is held for on ``node``."""
        return [h.pod for h in self._holds.values() if h.node == node]

    def against(self, pod: PodInfo) -> list[Hold]:
        """The holds that count when scheduling ``pod``: priority ≥ its own, not its own."""
        return [
            h for key, h in self._holds.items() if key != pod.key and h.pod.priority >= pod.priority
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
            if table.node_of(hold.pod.key) is None and table.index_of(hold.node) is not None:
                table.add_pod(hold.pod, hold.node, -float("inf"))
                placed.append(hold.pod)
        yield len(placed)
    finally:
        for pod in placed:
            table.remove_pod(pod)
