"""What the PostFilter's dry run (:mod:`scheduler.cycle.preemption`) may assume of the
profile's filters: whether a node stays rejected whatever is evicted, whether every filter
judges a node by its own pods (many nodes checked at once; the nominated pods' second pass
skipped), whether only NodeResourcesFit reads the placed pods (their requests moved by its
arithmetic), and the opt-in antagonist rule's nodes.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from scheduler.api.objects import PodInfo
from scheduler.cycle.preemption import ANTAGONIST_NODES, PreemptionInputs
from scheduler.plugins.base import Code, CycleState, Filter, FilterResult
from scheduler.plugins.registry import ResolvedProfile
from scheduler.signals.table import NodeTable


def unresolvable(plugin: Filter, reasons: Iterable[str]) -> bool:
    """Whether a node rejected by ``plugin`` for ``reasons`` stays rejected whatever is
    evicted (any of its reasons is ``UnschedulableAndUnresolvable``, as kube-scheduler)."""
    return any(plugin.code(reason) is Code.UNSCHEDULABLE_AND_UNRESOLVABLE for reason in reasons)


NODE_LOCAL = frozenset(
    {
        "NodeReady",
        "NodeUnschedulable",
        "TaintToleration",
        "NodeAffinity",
        "NodePorts",
        "NodeResourcesFit",
        "Interference",
        "RebalancedAway",
    }
)
"""Filters that judge a node by the node and its own pods alone: the preemption dry run
may change many nodes at once and check them together."""


def node_local(profile: ResolvedProfile, state: CycleState) -> bool:
    """Whether every filter with anything to check for this pod is in :data:`NODE_LOCAL`
    (spread, pod affinity and volume claims look across nodes: one node at a time)."""
    filtered = state.filtered
    return all(
        plugin.name in NODE_LOCAL or filtered.get(plugin.name) is None for plugin in profile.filters
    )


PLACED_PODS_READ = frozenset(
    {"NodePorts", "NodeResourcesFit", "VolumeBinding", "PodTopologySpread", "InterPodAffinity"}
)
"""Filters that read the placed pods themselves (not only the resources they request):
with anything to check, the dry run moves pods on the table for real."""


def resources_only(profile: ResolvedProfile, state: CycleState) -> bool:
    """Whether NodeResourcesFit is in the profile and the only filter with anything to
    check that reads the placed pods (then the dry run only moves their requests and puts
    them back by NodeResourcesFit's arithmetic: scheduler.cycle.victims)."""
    filtered = state.filtered
    return any(plugin.name == "NodeResourcesFit" for plugin in profile.filters) and all(
        name == "NodeResourcesFit" or filtered.get(name) is None for name in PLACED_PODS_READ
    )


def antagonist_rows(
    pod: PodInfo,
    table: NodeTable,
    failing: tuple[tuple[Filter, FilterResult, NDArray[np.bool_]], ...],
    potential: NDArray[np.bool_],
    inputs: PreemptionInputs,
) -> dict[int, frozenset[str]]:
    """The opt-in antagonist rule: nodes first rejected by a relaxable (interference)
    filter (the first :data:`ANTAGONIST_NODES`) where every antagonist the agents name is
    a pod placed there with a lower priority than the pod → those antagonists (victims
    whatever else fits; :data:`~scheduler.cycle.preemption.SYSTEM` is never one)."""
    relaxable_first = np.zeros(len(table), dtype=np.bool_)
    for plugin, _, first in failing:
        if plugin.relaxable:
            relaxable_first |= first
    rows = np.flatnonzero(relaxable_first)[:ANTAGONIST_NODES].tolist()
    if not rows or inputs.antagonists is None:
        return {}
    named_on = inputs.antagonists([table.names[row] for row in rows])
    found: dict[int, frozenset[str]] = {}
    for row in rows:
        named = named_on.get(table.names[row])
        if not named:
            continue
        placed = table.pods_on_node(table.names[row])
        pods = [placed.get(key) for key in named]
        if all(p is not None and p.priority < pod.priority for p in pods):
            found[row] = frozenset(named)
    return found
