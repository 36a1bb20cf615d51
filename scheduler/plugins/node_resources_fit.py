"""NodeResourcesFit (kube-scheduler's plugin of that name): room for the pod's requests.

Filter — for each resource ``r`` the pod requests (``request[r] > 0``; cpu, memory,
ephemeral-storage and extended resources such as ``nvidia.com/gpu``, counted with init
containers and overhead as in :mod:`scheduler.api.requests`)::

    insufficient[i, r] = request[r] > allocatable[i, r] − requested[i, r]
    too_many_pods[i]   = pods_on_node[i] + 1 > allocatable_pods[i]
    passed[i]          = ¬too_many_pods[i] ∧ ¬∃r insufficient[i, r]

A resource no node offers is insufficient everywhere. Reasons: ``Too many pods`` and
``Insufficient <resource>`` (every one that applies, as kube-scheduler lists them).

Score — kube-scheduler's default ``LeastAllocated`` strategy, emptier nodes first. Per
resource ``r`` ∈ {cpu, memory}, with requests counted as for scoring (containers
without a request count 100m CPU / 200Mi memory)::

    part[r] = 100 · max(0, 1 − (requested[r] + pod[r]) / allocatable[r])
              (0 where allocatable is 0)
    score   = (part[cpu] + part[memory]) / 2

computed as ``max(0, room[r] − pod[r] · per_unit[r])`` with ``per_unit = 50 / allocatable``
(0 without allocatable) and ``room = 50 − requested · per_unit``, a column the table keeps
current row by row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scheduler.api.events import Action, ClusterEvent, EventInterest
from scheduler.api.objects import PodInfo
from scheduler.api.quantity import CPU, EPHEMERAL_STORAGE, MEMORY, PODS
from scheduler.plugins.base import (
    Code,
    CycleState,
    Filter,
    FilterResult,
    Score,
    filter_by_table_and_pod,
)
from scheduler.signals.table import NodeTable

NAME = "NodeResourcesFit"
TOO_MANY_PODS = "Too many pods"
_ORDER = {CPU: 0, MEMORY: 1, EPHEMERAL_STORAGE: 2}


def insufficient_reason(resource: str) -> str:
    """kube-scheduler's wording for a node without room for ``resource``."""
    return f"Insufficient {resource}"


@dataclass(frozen=True, slots=True)
class _Plan:
    """What to compare for one set of requests: table rows, amounts, reasons."""

    rows: tuple[int, ...]
    amounts: tuple[int, ...]
    reasons: tuple[str, ...]
    unoffered: tuple[int, ...]
    """Positions in ``amounts`` of resources no node offers (their rows are left out)."""
    resources: tuple[str, ...]
    """What ``amounts`` are of (``pods`` first)."""


def _plan(table: NodeTable, pod: PodInfo) -> _Plan:
    # kube-scheduler checks (and lists) cpu, memory, ephemeral storage, then the rest
    wanted = sorted(pod.requests.items(), key=lambda item: (_ORDER.get(item[0], 3), item[0]))
    rows = [table.resource_row(r) for r in (PODS, *(r for r, _ in wanted))]
    return _Plan(
        tuple(r for r in rows if r is not None),
        (1, *(a for _, a in wanted)),
        (TOO_MANY_PODS, *(insufficient_reason(r) for r, _ in wanted)),
        tuple(i for i, r in enumerate(rows) if r is None),
        (PODS, *(r for r, _ in wanted)),
    )


def _plan_for(table: NodeTable, pod: PodInfo) -> _Plan:
    key = (NAME, *pod.requests.items())
    # resource rows never move; one no node offers yet may come with any heartbeat
    return table.cached("constraints", key, _plan, table, pod, still_valid=_all_offered)


@dataclass(frozen=True, slots=True)
class FitPlan:
    """What the filter compares for a pod: node ``i`` passes iff
    ``free[rows[k], i] >= amounts[k]`` for every ``k``."""

    resources: tuple[str, ...]
    """``pods`` first (each pod counts 1 of it), then the resources the pod requests."""
    rows: tuple[int, ...]
    """Their rows of :attr:`NodeTable.free`."""
    amounts: tuple[int, ...]


def fit_plan(table: NodeTable, pod: PodInfo) -> FitPlan | None:
    """The filter's comparison for ``pod`` (the preemption dry run redoes it on one node's
    numbers as it puts pods back); ``None`` when a resource is offered by no node (the
    filter then fails everywhere)."""
    plan = _plan_for(table, pod)
    if plan.unoffered:
        return None
    return FitPlan(plan.resources, plan.rows, plan.amounts)


def resources_fit(table: NodeTable, pod: PodInfo) -> FilterResult:
    """Nodes with room for the pod's requests and one more pod."""
    plan = _plan_for(table, pod)
    if plan.unoffered:  # a resource no node has ever offered fails everywhere
        return FilterResult(
            NAME,
            np.zeros(len(table), dtype=np.bool_),
            plan.reasons,
            lambda: _unoffered(table, plan),
        )
    free = table.free
    passed = free[plan.rows[0]] >= plan.amounts[0]
    for row, amount in zip(plan.rows[1:], plan.amounts[1:], strict=True):
        passed &= free[row] >= amount
    return FilterResult(
        NAME,
        passed,
        plan.reasons,
        lambda: [free[r] < a for r, a in zip(plan.rows, plan.amounts, strict=True)],
    )


def _all_offered(plan: _Plan, table: NodeTable, pod: PodInfo) -> bool:
    return not plan.unoffered


def _unoffered(table: NodeTable, plan: _Plan) -> list[NDArray[np.bool_]]:
    rows = iter(plan.rows)
    return [
        np.ones(len(table), dtype=np.bool_) if i in plan.unoffered else table.free[next(rows)] < a
        for i, a in enumerate(plan.amounts)
    ]


_HALF = 50.0
"""Each resource's share of the 0–100 score."""


def least_allocated(
    table: NodeTable, resource: str, requested: NDArray[np.float64], pod_request: float
) -> NDArray[np.float64]:
    """Half of ``part`` of the module formula for one resource (the two halves add up)."""
    key = (NAME, "per_unit", resource)
    per_unit = table.cached("allocatable", key, _per_unit, table, resource)
    part = per_unit * -pod_request
    part += table.derived(("balance_room", resource), _room, _room_at, per_unit, requested)
    # against a column of zeros, not the scalar 0: numpy's vectorised loop, over twice as fast
    np.maximum(part, table.cached("constraints", (NAME, "zeros"), _zeros, table), out=part)
    return part


def _per_unit(table: NodeTable, resource: str) -> NDArray[np.float64]:
    return table.inverse_allocatable(resource) * _HALF


def _room(per_unit: NDArray[np.float64], requested: NDArray[np.float64]) -> NDArray[np.float64]:
    left: NDArray[np.float64] = np.where(per_unit > 0, _HALF - requested * per_unit, 0.0)
    return left


def _room_at(row: int, per_unit: NDArray[np.float64], requested: NDArray[np.float64]) -> float:
    unit: float = per_unit.item(row)  # Python floats: numpy's IEEE operations, faster
    return _HALF - requested.item(row) * unit if unit > 0 else 0.0


def _zeros(table: NodeTable) -> NDArray[np.float64]:
    zeros = np.zeros(len(table))
    zeros.setflags(write=False)
    return zeros


def least_allocated_score(table: NodeTable, pod: PodInfo) -> NDArray[np.float64]:
    """0–100 per node, higher is emptier (see the module formula)."""
    score = least_allocated(table, CPU, table.nonzero_cpu_m, pod.nonzero_cpu_m)
    score += least_allocated(table, MEMORY, table.nonzero_memory, pod.nonzero_memory)
    return score


def _score(state: CycleState, feasible: NDArray[np.bool_]) -> NDArray[np.float64] | None:
    return least_allocated_score(state.table, state.pod)


def allocatable_may_fit(pod: PodInfo, event: ClusterEvent) -> bool:
    """QueueingHint: a node added or resized helps only if its allocatable alone covers
    every resource the pod requests (what other pods use there is not known here)."""
    node = event.node
    if node is None:
        return True
    return all(
        node.allocatable.get(resource, 0) >= amount for resource, amount in pod.requests.items()
    )


FILTER = Filter(
    name=NAME,
    explain="the node has room for the pod's requests and one more pod",
    filter=filter_by_table_and_pod(resources_fit),
    events=(
        EventInterest("Pod", Action.DELETE | Action.UPDATE_POD_SCALE_DOWN),
        EventInterest("Node", Action.ADD | Action.UPDATE_NODE_ALLOCATABLE, allocatable_may_fit),
    ),
    status=Code.UNSCHEDULABLE,  # evicting lower-priority pods frees their requests
)
SCORE = Score(
    name=NAME,
    explain="least allocated: the share of CPU and memory left free after placing the pod",
    score=_score,
    default_weight=1.0,  # kube-scheduler's default profile weight for NodeResourcesFit
)
