"""RebalancedAway (ours): keep a workload's replacement pod off the node it was moved from.

When the rebalancer (:mod:`scheduler.rebalancing.rebalancer`) evicts a pod because of interference,
its move (:mod:`scheduler.rebalancing.mover`) records a :class:`Departure` — workload ``W``
(the pod's controller) left node ``N`` at ``t`` because … — in this plugin's lookup. For
``avoid_for_s`` after that, the pods of ``W`` do not go back to ``N``::

    passed[i] = ¬∃ departure d of the pod's controller:
                    d.node = name[i]  ∧  now − d.at < avoid_for_s

Reason: ``node(s) were left by this pod's workload because of interference``; a decision
record adds which departure (``ReplicaSet/web left node-a 42 s ago: run-queue p99 …``).
Pods without a controller, or whose workload never left a node, are not checked (``None``).
Rejections are ``UnschedulableAndUnresolvable`` (evicting pods does not change where a
workload left). The filter is not relaxable: a replacement that fits nowhere else (its
held room lost, :mod:`scheduler.rebalancing.reservations`) waits, at most ``avoid_for_s``,
rather than go back to the node it was moved from, where the cool-down would then pin it. Standalone
mode only: the rebalancer runs in the scheduler that places the replacement
(docs/design.md §11).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from scheduler.api.events import Action, EventInterest
from scheduler.api.objects import PodInfo
from scheduler.plugins.base import CycleState, Filter, FilterResult

NAME = "RebalancedAway"
LEFT_NODE = "node(s) were left by this pod's workload because of interference"


@dataclass(frozen=True, slots=True)
class RebalancedAwayArgs:
    """The RebalancedAway plugin's args (``plugin_config``)."""

    avoid_for_s: float = 600.0
    """How long a workload's pods stay off a node the rebalancer moved one of them from."""

    def __post_init__(self) -> None:
        if not self.avoid_for_s >= 0:
            raise ValueError(f"avoid_for_s: {self.avoid_for_s!r} must be a number ≥ 0")


@dataclass(frozen=True, slots=True)
class Departure:
    """Workload ``workload`` left ``node`` at ``at`` (unix time) because ``reason``."""

    workload_uid: str
    workload: str
    """``Kind/name`` of the controller, for people."""
    node: str
    at: float
    reason: str


class DepartureLookup:
    """Departures by workload UID (the plugin's lookup; placed pods do not change it)."""

    def __init__(self) -> None:
        self._by_workload: dict[str, dict[str, Departure]] = {}

    def add(self, pod: PodInfo, node: str) -> None:
        """Placed pods do not matter here."""

    def remove(self, pod: PodInfo, node: str) -> None:
        """Placed pods do not matter here."""

    def record(self, departure: Departure, keep_after: float) -> None:
        """Note ``departure`` and forget the departures older than ``keep_after``."""
        nodes = self._by_workload.setdefault(departure.workload_uid, {})
        nodes[departure.node] = departure
        for uid in list(self._by_workload):
            kept = {n: d for n, d in self._by_workload[uid].items() if d.at >= keep_after}
            if kept:
                self._by_workload[uid] = kept
            else:
                del self._by_workload[uid]

    def of(self, workload_uid: str) -> dict[str, Departure]:
        """Node → the latest departure of that workload from it."""
        return self._by_workload.get(workload_uid, {})

    def all(self) -> list[Departure]:
        return [d for nodes in self._by_workload.values() for d in nodes.values()]


def rebalanced_away(
    state: CycleState, departures: DepartureLookup, args: RebalancedAwayArgs
) -> FilterResult | None:
    """Nodes the pod's workload did not leave within ``avoid_for_s``; ``None`` when none."""
    controller = state.pod.controller
    if controller is None:
        return None
    recent = [
        d for d in departures.of(controller.uid).values() if state.now - d.at < args.avoid_for_s
    ]
    table = state.table
    rows = [(row, d) for d in recent if (row := table.row_of(d.node)) is not None]
    if not rows:
        return None
    passed = np.ones(len(table), dtype=np.bool_)
    why: dict[int, Departure] = {}
    for row, departure in rows:
        passed[row] = False
        why[row] = departure
    return FilterResult(NAME, passed, (LEFT_NODE,), measured=_measured(why, state.now))


def _measured(why: dict[int, Departure], now: float) -> Callable[[int, int], str]:
    def measured(_reason: int, row: int) -> str:
        d = why[row]
        return f"{d.workload} left {d.node} {now - d.at:.0f} s ago: {d.reason}"

    return measured


def _filter(state: CycleState) -> FilterResult | None:
    if state.pod.controller is None:  # most decisions: nothing to look up
        return None
    departures = state.table.lookup(NAME, DepartureLookup)
    return rebalanced_away(state, departures, state.args_of(NAME, RebalancedAwayArgs))


FILTER = Filter(
    name=NAME,
    explain="the pod's workload was not moved away from the node by the rebalancer "
    "within avoid_for_s",
    filter=_filter,
    events=(EventInterest("Node", Action.ADD),),
    relaxable=False,
    in_extender=False,
    args=RebalancedAwayArgs,
    lookup=DepartureLookup,
)
