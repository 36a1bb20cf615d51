"""Room the rebalancer holds for a victim's replacement, from before the eviction until the
replacement is placed (docs/design.md §11; Koordinator reserves before it migrates).

Without it, two victims judged in one look could both count on the one node with room
for one, and a replacement that found its room taken waited, was relaxed and went back
to the node it had left. So the rebalancer, in one look:

1. judges each victim with the rooms already held — those of the victims before it in
   this look among them — on the table (:func:`scheduler.cycle.nominated.held_room`), so no
   two count on one room;
2. before it evicts, holds the room on the node it found: a nominated pod's hold
   (:class:`scheduler.cycle.nominated.RoomHolds`, the cache's, which the scheduling loop's
   cycle honours) for :func:`replacement_of` the victim, under a key no pod can have,
   for any pod of the victim's workload (``Hold.workload_uid``): the replacement may use
   it, a pod of another workload of no higher priority may not;
3. lets it go (:meth:`Reservations.settle`) once a pod of that workload created since is
   placed (bound or assumed), or after ``reserve_for_s``, or when the eviction did not
   happen.

A replacement that finds no room even so is not relaxed back onto the node it left:
RebalancedAway is not relaxable (:mod:`scheduler.plugins.rebalanced_away`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.api.objects import PodInfo
from scheduler.cycle.nominated import RoomHolds

REPLACEMENT_SUFFIX = "~replacement"
"""Ends the key of a reservation's pod: ``~`` is in no Kubernetes name, so no pod's key
(and no nomination, which the cache keys by pod) can be it."""


def replacement_of(victim: PodInfo) -> PodInfo:
    """The pod a reservation holds room for: the victim as its controller will recreate it
    (its requests, ports, labels, terms and priority), pending, under a key of its own."""
    return dataclasses.replace(victim, name=victim.name + REPLACEMENT_SUFFIX, uid="", node_name="")


@dataclass(frozen=True, slots=True)
class Reservation:
    key: str
    """The held pod's key in :class:`RoomHolds`."""
    workload_uid: str
    node: str
    at: float
    until: float


class Reservations:
    """The rooms the rebalancer holds, by workload (one each: the cool-down moves a
    workload once at a time). Callers hold the cache lock, as for :class:`RoomHolds`."""

    def __init__(self) -> None:
        self._by_workload: dict[str, Reservation] = {}

    def __len__(self) -> int:
        return len(self._by_workload)

    def reserve(
        self, holds: RoomHolds, victim: PodInfo, node: str, now: float, reserve_for_s: float
    ) -> Reservation:
        """Hold room on ``node`` for the replacement of ``victim`` (which has a controller)
        until ``now + reserve_for_s``."""
        assert victim.controller is not None
        workload = victim.controller.uid
        self.release(holds, workload)
        pod = replacement_of(victim)
        holds.hold(pod, node, workload)
        made = Reservation(pod.key, workload, node, now, now + reserve_for_s)
        self._by_workload[workload] = made
        return made

    def release(self, holds: RoomHolds, workload_uid: str) -> Reservation | None:
        made = self._by_workload.pop(workload_uid, None)
        if made is not None:
            holds.release(made.key)
        return made

    def settle(
        self, holds: RoomHolds, placed: Iterable[PodInfo], now: float
    ) -> list[tuple[Reservation, str]]:
        """Let go of the rooms whose replacement is ``placed`` (a pod of the workload
        created at or after the reservation, whole seconds, on a node) or whose time is
        up; returns each with why (``placed`` or ``expired``)."""
        if not self._by_workload:
            return []
        done: list[tuple[Reservation, str]] = []
        for pod in placed:
            controller = pod.controller
            made = None if controller is None else self._by_workload.get(controller.uid)
            if made is not None and pod.node_name and pod.created_at >= math.floor(made.at):
                self.release(holds, made.workload_uid)
                done.append((made, "placed"))
        for made in list(self._by_workload.values()):
            if now >= made.until:
                self.release(holds, made.workload_uid)
                done.append((made, "expired"))
        return done
