"""DefaultPreemption, kube-scheduler v1.36's PostFilter: when no node passes the filters,
find a node where evicting pods of lower priority lets the pod pass every filter, and the
pods to evict there.

The steps, each as kube-scheduler's (``defaultpreemption/default_preemption.go``,
``framework/preemption/preemption.go``):

1. **Eligible?** Not with ``preemptionPolicy: Never``; not while a pod of lower priority
   terminates by preemption on the pod's nominated node (its earlier victims are still
   going), unless that node now rejects the pod for good.
2. **Potential nodes**: those whose first failing filter rejected them ``Unschedulable``
   (evicting pods may undo it: resources, host ports, anti-affinity, spread, a
   ReadWriteOncePod claim), never ``UnschedulableAndUnresolvable`` (labels, taints,
   readiness, cordon, the pod's own interference tolerance).
3. **Dry run** from a random offset, in table order, until ``n`` candidates are found
   (at least one of them violating no PodDisruptionBudget)::

       n = min(nodes, max(nodes · min_candidate_nodes_percentage / 100,
                          min_candidate_nodes_absolute))

   On each node (:func:`select_victims`): remove every pod of lower priority; the node is
   a candidate only if the pod then passes **every filter of the cycle**, run on the table
   with those pods removed (``fits``); then add the removed pods back, most important
   first (priority, then the longest running), the ones whose eviction would violate a
   budget before the others, each kept only if the pod still fits. Those left out are
   the victims.
4. **The node** (:func:`pick_one_node`): fewest budget violations, then the lowest
   highest-victim priority, the smallest sum of victim priorities (each + 2³¹), the
   fewest victims, the latest start time of the most important victims; then the first.

The table is changed only for the duration of a check and put back exactly as it was
(load stamps included). The caller runs the pod's filters in ``fits``, with the nominated
pods' room held (:mod:`scheduler.cycle.nominated`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from interference.signals import NodeReport
from interference_infra.strict import SettingsError
from scheduler.api.budgets import DisruptionBudgetInfo
from scheduler.api.objects import PREEMPT_NEVER, PodInfo
from scheduler.cycle.messages import failed_scheduling_message
from scheduler.cycle.nominated import RoomHolds, TableRoom
from scheduler.cycle.victims import (
    Queued,
    more_important_first,
    needs,
    reprieve,
    requested,
    resources_short,
    split_by_budget,
)
from scheduler.plugins.base import Code, Filter, FilterResult
from scheduler.plugins.node_resources_fit import fit_plan
from scheduler.signals.table import NodeTable

NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NEVER = "not eligible due to preemptionPolicy=Never."
TERMINATING = "not eligible due to a terminating pod on the nominated node."
ANTAGONIST_NODES = 32
"""Nodes the opt-in antagonist rule looks at per decision (it reads the agents' reports)."""
SYSTEM = "system"
"""What the agents name when the CPU was held by no pod: never a victim, so a node with it
among its antagonists is not made quiet by preemption."""
_PRIORITY_OFFSET = 2**31
"""Added to each victim's priority in the sum (kube's ``MaxInt32 + 1``), so a node with a
few victims of negative priority does not beat one with fewer of the same priority."""

Fits = Callable[[Sequence[int]], dict[int, tuple[str, ...]]]
"""Node rows → the reasons of the first failing filter of each of them where the pod does
not pass every filter as the table is now (the rows it passes are left out)."""


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """DefaultPreemption's args (kube-scheduler's ``DefaultPreemptionArgs``)."""

    enabled: bool = True
    """Standalone mode preempts as kube-scheduler does; false: never (pods only wait)."""
    min_candidate_nodes_percentage: int = 10
    """Candidates the dry run looks for, as a share of the potential nodes (0–100)."""
    min_candidate_nodes_absolute: int = 100
    """… and at least this many (or every potential node when fewer)."""
    preempt_antagonists: bool = False
    """Opt-in: a node the pod's interference tolerance rejects counts as a candidate when
    every antagonist the agents name on it has a lower priority than the pod; they are
    then the victims (docs/design.md §5, "Preemption")."""

    def __post_init__(self) -> None:
        problems = []
        if not 0 <= self.min_candidate_nodes_percentage <= 100:
            problems.append(
                f"min_candidate_nodes_percentage: {self.min_candidate_nodes_percentage!r} must"
                " be an integer from 0 to 100, e.g. 10"
            )
        if self.min_candidate_nodes_absolute < 0:
            problems.append(
                f"min_candidate_nodes_absolute: {self.min_candidate_nodes_absolute!r} must be"
                " an integer ≥ 0, e.g. 100"
            )
        if self.min_candidate_nodes_percentage == 0 == self.min_candidate_nodes_absolute:
            problems.append(
                "min_candidate_nodes_percentage and min_candidate_nodes_absolute: both 0"
                " finds no candidate; set either above 0"
            )
        if problems:
            raise SettingsError(problems)


@dataclass(frozen=True, slots=True)
class PreemptionInputs:
    """What the PostFilter reads besides the table (the cache's, in standalone mode)."""

    holds: RoomHolds = field(default_factory=RoomHolds)
    """Nominated pods' room (the pod's own nomination included)."""
    room: TableRoom | None = None
    """``holds`` kept placed on the table between decisions (synced by the caller);
    ``None``: placed for the decision only."""
    budgets: Sequence[DisruptionBudgetInfo] = ()
    start_time: Callable[[PodInfo], float] = lambda pod: pod.created_at
    """When a placed pod started (``status.startTime``; kube counts one without as now)."""
    preempted: Callable[[PodInfo], bool] = lambda pod: False
    """Whether a placed pod terminates by preemption (deleting, ``DisruptionTarget`` set
    by a scheduler)."""
    antagonists: Callable[[Sequence[str]], Mapping[str, Collection[str]]] | None = None
    """Nodes → the antagonists the agents name on each (:func:`antagonists_in`), asked
    only for the nodes the interference filter rejected first (at most
    :data:`ANTAGONIST_NODES`) and only with :attr:`PreemptionArgs.preempt_antagonists`."""


@dataclass(frozen=True, slots=True)
class Victims:
    node: str
    pods: tuple[PodInfo, ...]
    """Most important first."""
    pdb_violations: int


@dataclass(frozen=True, slots=True)
class PreemptionOutcome:
    """What the PostFilter decided."""

    node: str | None
    """The node the pod is nominated to, its victims evicted; ``None``: no preemption."""
    victims: tuple[PodInfo, ...] = ()
    message: str = ""
    """``preemption: …`` (kube-scheduler's PostFilter message) when there is no node."""
    clear_nomination: bool = False
    """No node helps: the pod's nomination (if any) is cleared, as kube-scheduler does."""
    why: str = ""
    """Why this node among the candidates, for the decision record."""
    found: tuple[Victims, ...] = ()
    """Every candidate the dry run found (those violating no budget first)."""
    pdb_violations: int = 0
    antagonists: tuple[str, ...] = ()
    """Victims evicted because the agents named them antagonists (opt-in rule)."""


def candidate_count(nodes: int, args: PreemptionArgs) -> int:
    """How many candidates the dry run looks for among ``nodes`` potential nodes::

    n = min(nodes, max(⌊nodes · percentage / 100⌋, absolute))
    """
    return min(
        nodes,
        max(nodes * args.min_candidate_nodes_percentage // 100, args.min_candidate_nodes_absolute),
    )


def potential_rows(
    failing: Iterable[tuple[Filter, FilterResult, NDArray[np.bool_]]], count: int
) -> NDArray[np.bool_]:
    """Nodes whose first failing filter rejected them only for reasons whose code is
    ``Unschedulable`` (a node with any unresolvable reason is left out, as kube)."""
    found = np.zeros(count, dtype=np.bool_)
    for plugin, result, first in failing:
        codes = [plugin.code(reason) for reason in result.reasons]
        unresolvable = [code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE for code in codes]
        if all(unresolvable):
            continue
        if not any(unresolvable):
            found |= first
            continue
        columns = result.reason_columns()
        blocked = np.zeros(count, dtype=np.bool_)
        for column, hard in zip(columns, unresolvable, strict=True):
            if hard:
                blocked |= column
        found |= first & ~blocked
    return found


def select_victims(
    pod: PodInfo,
    table: NodeTable,
    rows: Sequence[int],
    fits: Fits,
    inputs: PreemptionInputs,
    forced: Mapping[int, Collection[str]],
    light: bool = False,
) -> dict[int, Victims | tuple[str, ...]]:
    """Per node of ``rows``: the fewest pods of lower priority to evict for ``pod`` to pass
    every filter there, or why there are none (the reasons of the failing filter with
    every such pod removed, or :data:`NO_VICTIMS`). Pods keyed in ``forced[row]`` are
    victims whatever fits (the antagonists of the opt-in rule).

    Every node of ``rows`` is changed at once and checked with one ``fits`` call per step
    (remove, then the k-th pod of each node put back): exact when each node's verdict
    depends only on its own pods, which the caller ensures by passing one row otherwise.
    ``light``: NodeResourcesFit is the only filter whose verdict reads the placed pods;
    then the pods are taken away from the resource columns only
    (:meth:`~scheduler.signals.table.NodeTable.shift_load`) for the one ``fits`` call, and put
    back by NodeResourcesFit's arithmetic on each node's numbers (:mod:`scheduler.cycle.victims`).
    """
    plan = fit_plan(table, pod) if light else None
    found: dict[int, Victims | tuple[str, ...]] = {}
    removed: dict[int, dict[str, PodInfo]] = {}
    totals: dict[int, dict[str, int]] = {}
    stamps: dict[str, float] = {}
    holds = inputs.holds
    shifted = False
    need = needs(pod, table)
    try:
        for row in rows:
            lower = {  # a held pod (on the table for its room) is never a victim
                key: p
                for key, p in table.pods_on_node(table.names[row]).items()
                if p.priority < pod.priority and holds.node_of(key) is None
            }
            if not lower:
                found[row] = (NO_VICTIMS,)
                continue
            total = requested(lower.values())
            short = resources_short(need, table, row, total)
            if short:  # the real filter would say so too: no need to move pods to see it
                found[row] = short
                continue
            removed[row] = lower
            totals[row] = total
            if plan is not None:
                continue
            for key, victim in lower.items():
                stamps[key] = table.load_stamp(key)
                table.remove_pod(victim)
        if plan is not None and totals:
            table.shift_load(totals, -1)
            shifted = True
        failures = fits(list(removed)) if removed else {}
        if shifted:  # put back now: the rest is arithmetic on each node's numbers
            table.shift_load(totals, 1)
            shifted = False
        queues: dict[int, list[Queued]] = {}
        for row, pods in removed.items():
            if row in failures:
                found[row] = failures[row]
                continue
            violating, fine = split_by_budget(
                more_important_first(pods.values(), inputs.start_time), inputs.budgets
            )
            queues[row] = [(p, True) for p in violating] + [(p, False) for p in fine]
        if plan is not None:
            for row, queue in queues.items():
                chosen = reprieve(plan, table, row, totals[row], queue, forced.get(row, ()))
                found[row] = _victims(table.names[row], chosen, inputs)
            return found
        victims = _put_back(table, queues, removed, stamps, fits, forced)
        for row, chosen in victims.items():
            found[row] = _victims(table.names[row], chosen, inputs)
        return found
    finally:
        if shifted:
            table.shift_load(totals, 1)
        if plan is None:
            for row, pods in removed.items():
                for victim in pods.values():
                    table.add_pod(victim, table.names[row], stamps[victim.key])


def _put_back(
    table: NodeTable,
    queues: dict[int, list[Queued]],
    removed: dict[int, dict[str, PodInfo]],
    stamps: Mapping[str, float],
    fits: Fits,
    forced: Mapping[int, Collection[str]],
) -> dict[int, list[Queued]]:
    """Puts the k-th pod of each node's queue back on the table and keeps it there if the
    pod still passes every filter, for k = 0, 1, …; the victims per node (those left out,
    still in ``removed``)."""
    victims: dict[int, list[Queued]] = {row: [] for row in queues}
    step = 0
    while True:
        trying: dict[int, PodInfo] = {}
        for row, queue in queues.items():
            named = forced.get(row, ())
            while step < len(queue) and queue[step][0].key in named:
                victims[row].append(queue.pop(step))  # forced: never put back
            if step < len(queue):
                candidate = queue[step][0]
                table.add_pod(candidate, table.names[row], stamps[candidate.key])
                del removed[row][candidate.key]
                trying[row] = candidate
        if not trying:
            return victims
        failing = fits(list(trying))
        for row, candidate in trying.items():
            if row in failing:
                table.remove_pod(candidate)
                removed[row][candidate.key] = candidate
                victims[row].append((candidate, queues[row][step][1]))
        step += 1


def _victims(node: str, chosen: Sequence[Queued], inputs: PreemptionInputs) -> Victims:
    """The victims of a node, most important first, with their budget violations."""
    pods_out = [p for p, _ in chosen]
    if any(c for _, c in chosen) and not all(c for _, c in chosen):
        pods_out = more_important_first(pods_out, inputs.start_time)
    return Victims(node, tuple(pods_out), sum(c for _, c in chosen))


def pick_one_node(
    candidates: Sequence[Victims], start_time: Callable[[PodInfo], float]
) -> tuple[Victims, str]:
    """The candidate to preempt on, and which rule chose it (kube's
    ``pickOneNodeForPreemption``; each rule applies only among the ties of the rules
    before it)::

        1. min pdb_violations   2. min max(priority of victims)
        3. min Σ (priority + 2³¹)   4. min |victims|
        5. max earliest start time among the victims of the highest priority
        6. the first
    """
    rules: list[tuple[str, Callable[[Victims], float]]] = [
        ("fewest PodDisruptionBudget violations", lambda c: -c.pdb_violations),
        ("lowest highest-victim priority", lambda c: -c.pods[0].priority),
        (
            "smallest sum of victim priorities",
            lambda c: -sum(p.priority + _PRIORITY_OFFSET for p in c.pods),
        ),
        ("fewest victims", lambda c: -len(c.pods)),
        ("latest start time of its most important victims", lambda c: _earliest(c, start_time)),
    ]
    left = list(candidates)
    if len(left) == 1:
        return left[0], "the only candidate"
    for rule, score in rules:
        scored = [(score(c), c) for c in left]
        best = max(s for s, _ in scored)
        left = [c for s, c in scored if s == best]
        if len(left) == 1:
            return left[0], rule
    return left[0], "the first of equal candidates"


def _earliest(candidate: Victims, start_time: Callable[[PodInfo], float]) -> float:
    top = candidate.pods[0].priority
    return min(start_time(p) for p in candidate.pods if p.priority == top)


def eligible(
    pod: PodInfo,
    table: NodeTable,
    inputs: PreemptionInputs,
    unresolvable: Callable[[int], bool],
) -> str | None:
    """``None`` when ``pod`` may preempt now, else why not (kube's
    ``PodEligibleToPreemptOthers``)."""
    if pod.preemption_policy == PREEMPT_NEVER:
        return NEVER
    nominated = inputs.holds.node_of(pod.key)
    if nominated:
        row = table.row_of(nominated)
        if row is not None and unresolvable(row):
            return None
        for placed in table.pods_on_node(nominated).values():
            if placed.priority < pod.priority and inputs.preempted(placed):
                return TERMINATING
    return None


def preempt(
    pod: PodInfo,
    table: NodeTable,
    potential: NDArray[np.bool_],
    fits: Fits,
    inputs: PreemptionInputs,
    args: PreemptionArgs,
    rng: random.Random,
    considered: int,
    forced: Mapping[int, Collection[str]] | None = None,
    batch: bool = False,
    light: bool = False,
) -> PreemptionOutcome:
    """The dry run over the ``potential`` nodes and the choice among its candidates
    (module docstring, steps 3 and 4); ``considered`` nodes were filtered (for the
    message). ``forced`` adds nodes (row → victims that must go) of the opt-in
    antagonist rule. With ``batch`` (every filter that has anything to check for the pod
    judges a node by its own pods alone) the nodes are checked ``n`` at a time, in the
    same order and with the same result as one by one."""
    forced = forced or {}
    rows = np.flatnonzero(potential).tolist()
    extra = [row for row in forced if not potential[row]]
    rows = sorted(rows + extra)
    if not rows:
        return _none(considered, {NOT_HELPFUL: considered})
    offset = rng.randrange(len(rows))
    wanted = candidate_count(len(rows), args)
    order = [rows[(offset + i) % len(rows)] for i in range(len(rows))]
    size = max(1, wanted) if batch else 1
    fine: list[Victims] = []
    violating: list[Victims] = []
    statuses: dict[str, int] = {}
    checked_rows = 0
    done = False
    for first in range(0, len(order), size):
        chunk = order[first : first + size]
        results = select_victims(pod, table, chunk, fits, inputs, forced, light)
        for row in chunk:
            checked_rows += 1
            found = results[row]
            if isinstance(found, tuple):
                for reason in found:
                    statuses[reason] = statuses.get(reason, 0) + 1
                continue
            if not found.pods:
                statuses[NO_VICTIMS] = statuses.get(NO_VICTIMS, 0) + 1
                continue
            if found.pdb_violations == 0:
                if len(fine) < wanted:
                    fine.append(found)
            elif len(violating) < wanted:
                violating.append(found)
            if fine and len(fine) + len(violating) >= wanted:
                done = True
                break
        if done:
            break
    candidates = fine + violating
    if not candidates:
        statuses[NOT_HELPFUL] = considered - checked_rows
        return _none(considered, statuses)
    chosen, why = pick_one_node(candidates, inputs.start_time)
    chosen_row = table.row_of(chosen.node)
    named = forced.get(chosen_row, ()) if chosen_row is not None else ()
    return PreemptionOutcome(
        chosen.node,
        chosen.pods,
        why=why,
        found=tuple(candidates),
        pdb_violations=chosen.pdb_violations,
        antagonists=tuple(p.key for p in chosen.pods if p.key in named),
    )


def _none(considered: int, statuses: dict[str, int]) -> PreemptionOutcome:
    message = "preemption: " + failed_scheduling_message(considered, statuses)
    return PreemptionOutcome(None, message=message, clear_nomination=True)


def not_eligible(reason: str) -> PreemptionOutcome:
    """No preemption this time; the nomination stays (kube returns no result)."""
    return PreemptionOutcome(None, message=f"preemption: {reason}")


def antagonists_in(reports: Iterable[NodeReport]) -> frozenset[str]:
    """The antagonists the agents name on a node: every culprit (pod key, or
    :data:`SYSTEM`) its pods' waits ended behind in ``reports``, with any wait."""
    return frozenset(
        culprit
        for report in reports
        for row in report.pods
        for culprit, waited_ms in row.culprits
        if waited_ms > 0 and culprit != row.key
    )


def lowest_victim_priority(table: NodeTable) -> float:
    """The lowest priority of any placed pod (``inf`` without pods): a pod at or below it
    can preempt no one, so the dry run is skipped."""
    lowest = table.lowest_priority()
    return math.inf if lowest is None else lowest
