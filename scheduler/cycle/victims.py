"""The preemption dry run's per-node arithmetic (scheduler.cycle.preemption): which pods go first
and how many of them a node can keep.

When NodeResourcesFit is the only filter whose verdict depends on the placed pods
(scheduler.cycle.dry_run says when), the dry run checks once, with every lower-priority pod gone,
that the pod passes every filter on a node; after that only the node's free resources
change as pods are put back, so the rest is NodeResourcesFit's own comparison redone on
that node's numbers (:func:`reprieve`), the way kube-scheduler runs the filters on one
cloned NodeInfo rather than on the whole cluster::

    room[k]  = free[k, node] + Σ_{q ∈ lower} need(q, k)          (every lower pod gone)
    keep q  ⇔ ∀k: room[k] − need(q, k) ≥ amount[k]   (then room −= need(q)), else victim
    need(q, pods) = 1,  need(q, r) = q.requests[r]
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from scheduler.api.budgets import DisruptionBudgetInfo
from scheduler.api.objects import PodInfo
from scheduler.api.quantity import PODS
from scheduler.plugins.node_resources_fit import TOO_MANY_PODS, FitPlan, insufficient_reason
from scheduler.signals.table import NodeTable

Queued = tuple[PodInfo, bool]
"""A pod the dry run may put back, and whether evicting it would violate a budget."""


def more_important_first(
    pods: Iterable[PodInfo], start_time: Callable[[PodInfo], float]
) -> list[PodInfo]:
    """Higher priority first, then the one that started earlier (kube's
    ``MoreImportantPod``)."""
    return sorted(pods, key=lambda p: (-p.priority, start_time(p)))


def split_by_budget(
    pods: Sequence[PodInfo], budgets: Sequence[DisruptionBudgetInfo]
) -> tuple[list[PodInfo], list[PodInfo]]:
    """(violating, not violating), each in the given order: a pod violates when evicting it
    and the pods before it takes a budget that covers it below zero (a pod the budget
    already counts as disrupted uses none of it)."""
    if not budgets:
        return [], list(pods)
    allowed = [budget.disruptions_allowed for budget in budgets]
    violating: list[PodInfo] = []
    fine: list[PodInfo] = []
    for pod in pods:
        violated = False
        if pod.labels:
            for i, budget in enumerate(budgets):
                if not budget.covers(pod.namespace, pod.labels):
                    continue
                if pod.name in budget.disrupted_pods:
                    continue
                allowed[i] -= 1
                if allowed[i] < 0:
                    violated = True
        (violating if violated else fine).append(pod)
    return violating, fine


def requested(pods: Iterable[PodInfo]) -> dict[str, int]:
    """What ``pods`` request together (``pods``: how many)."""
    totals: dict[str, int] = {PODS: 0}
    for pod in pods:
        totals[PODS] += 1
        for resource, amount in pod.requests.items():
            totals[resource] = totals.get(resource, 0) + amount
    return totals


@dataclass(frozen=True, slots=True)
class Needs:
    """What NodeResourcesFit asks of a node for a pod, looked up once per dry run."""

    pods_row: int | None
    """The row of ``pods`` in :attr:`NodeTable.free` (``None``: no node offers it)."""
    resources: tuple[tuple[str, int | None, int], ...]
    """(resource, its row or ``None`` where no node offers it, amount) for each resource
    the pod requests more than 0 of."""


def needs(pod: PodInfo, table: NodeTable) -> Needs:
    return Needs(
        table.resource_row(PODS),
        tuple(
            (resource, table.resource_row(resource), amount)
            for resource, amount in pod.requests.items()
            if amount > 0
        ),
    )


def resources_short(
    need: Needs, table: NodeTable, row: int, lower: dict[str, int]
) -> tuple[str, ...]:
    """NodeResourcesFit's reasons on node ``row`` with pods requesting ``lower`` together
    (:func:`requested`) gone, from the table's columns alone (a necessary condition: the
    dry run checks the nodes that meet it with every filter)::

        short(r) = free[r, row] + lower[r] < req[r]   (pods: count, +1 needed)
    """
    free = table.free
    reasons: list[str] = []
    if need.pods_row is not None and free[need.pods_row, row] + lower[PODS] < 1:
        reasons.append(TOO_MANY_PODS)
    for resource, resource_row, amount in need.resources:
        if resource_row is None or free[resource_row, row] + lower.get(resource, 0) < amount:
            reasons.append(insufficient_reason(resource))
    return tuple(reasons)


def reprieve(
    plan: FitPlan,
    table: NodeTable,
    row: int,
    lower: dict[str, int],
    queue: Sequence[Queued],
    forced: Collection[str],
) -> list[Queued]:
    """The victims on node ``row`` (module formula): ``queue`` is every pod of lower
    priority there (requesting ``lower`` together), in the order they are put back; the
    pods keyed in ``forced`` are victims whatever fits. Only for a node where the pod
    passes every filter with the whole queue gone, and only NodeResourcesFit's verdict
    depends on the placed pods."""
    free = table.free
    room = [
        int(free[r, row]) + lower.get(name, 0)
        for name, r in zip(plan.resources, plan.rows, strict=True)
    ]
    amounts = plan.amounts
    wanted = tuple(enumerate(plan.resources[1:], start=1))
    victims: list[Queued] = []
    for queued in queue:
        pod = queued[0]
        if forced and pod.key in forced:
            victims.append(queued)
            continue
        after = room.copy()
        after[0] -= 1
        fits = after[0] >= amounts[0]
        if fits:  # plain loops: this runs for every pod of up to 100 nodes a dry run
            requests = pod.requests
            for k, name in wanted:
                after[k] -= requests.get(name, 0)
                if after[k] < amounts[k]:
                    fits = False
                    break
        if fits:
            room = after
        else:
            victims.append(queued)
    return victims
