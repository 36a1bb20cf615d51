"""The rebalancer's rules, as pure functions: who may be moved, when, and how often.

A running pod that declares an interference tolerance (``interference.io/max-runq-p99-us``,
``interference.io/max-reclaim-stall-ms-per-s``, :mod:`scheduler.api.pods`) is a
**victim** when, over the settings' ``window``::

    runq_breach    = p99(Σ the pod's own run-queue histograms of the window)
                         > max_runq_p99_us
    reclaim_breach = reclaim_mean[window] of its node > max_reclaim_stall_ms_per_s

has held at every look for ``sustained_for_s`` (:class:`BreachTracker`; a look without
usable signals — no fresh pod row, a stale or degraded node — ends the streak: unknown is
never a breach), the run-queue part also in each look's own rows (the rows that came since
the previous look, :attr:`OwnWindow.recent_runq_p99_us`) and the reclaim part in the node's
shorter window (:data:`RECENT_WINDOW`), so one burst staying inside the window is no
streak. The rows are the evidence the signal reader would accept
(:mod:`scheduler.rebalancing.evidence`).
A victim is moved only when, in this order (:func:`eligible`, then :func:`hold_reason` and
:class:`EvictionLedger`):

1. it is movable at all: its namespace is not ``kube-system`` nor in ``never_namespaces``,
   it does not opt out (``interference.io/rebalance: "false"``), this scheduler places its
   replacement (its ``schedulerName`` is ours) (:func:`eligible`), and an eviction brings
   it back whole: a ``controller_kinds`` controller recreates it, it is no Job, DaemonSet,
   mirror or static pod, not system-critical, and keeps no data on the node
   (:func:`scheduler.rebalancing.evictable.refusal`: each a hold reason);
2. for a run-queue breach, the wait is its neighbours' doing: the window's means split by
   :func:`interference.contention.contention_shares` (own CPU limit, own tasks,
   neighbours) name ``neighbours`` the largest part — a pod throttled by its own quota, or
   with more runnable threads than CPUs, waits as long on any node (:func:`own_cause`);
3. its workload has not been moved within ``cooldown_s``, fewer than
   ``max_moves_per_workload`` times within ``move_budget_window_s``, and no move of it
   within ``move_budget_window_s`` left its replacement over the tolerance
   (:class:`MoveOutcomes`: a move that did not help marks the workload);
4. fewer than ``max_per_node`` / ``max_per_namespace`` / ``max_per_cluster`` evictions in
   the last ``rate_window_s`` from its node / namespace / the cluster;
5. a node other than its own passes every filter for it now (the scheduling cycle, run
   by :class:`scheduler.rebalancing.rebalancer.Rebalancer`).

Dry runs count in the ledger apart from evictions: a dry run's cool-downs and limits hold
its own "would evict"s (so it shows what enforcing would do), and never an eviction
(switching to ``enforce`` acts at the next look).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from interference import hist
from interference.contention import contention_shares
from interference.signals import PodMetrics
from scheduler.api.objects import PodInfo

RebalanceMode = Literal["off", "dry_run", "enforce"]
REBALANCE_MODES: tuple[RebalanceMode, ...] = ("off", "dry_run", "enforce")
RebalanceWindow = Literal["10s", "60s"]
WINDOW_SECONDS: dict[str, float] = {"10s": 10.0, "60s": 60.0}
RECENT_WINDOW: dict[str, str] = {"10s": "latest", "60s": "10s"}
"""The node's window a look's own interval reads for the reclaim stall (the record's windows
are the latest interval, 10 s and 60 s): the breach must hold there too."""
ALWAYS_SPARED_NAMESPACE = "kube-system"
"""Never rebalanced, whatever ``never_namespaces`` says."""

# Why a victim was not moved (the ``reason`` label of
# ``interference_scheduler_rebalance_holds_total``).
OWN_LIMIT = "own_limit"
OWN_TASKS = "own_tasks"
COOLDOWN = "cooldown"
NODE_LIMIT = "node_limit"
NAMESPACE_LIMIT = "namespace_limit"
CLUSTER_LIMIT = "cluster_limit"
NO_BETTER_NODE = "no_better_node"
RETRY_LATER = "retry_later"
MOVE_BUDGET = "move_budget"
MOVE_DID_NOT_HELP = "move_did_not_help"
HOLD_REASONS = (
    OWN_LIMIT,
    OWN_TASKS,
    COOLDOWN,
    NODE_LIMIT,
    NAMESPACE_LIMIT,
    CLUSTER_LIMIT,
    NO_BETTER_NODE,
    RETRY_LATER,
    MOVE_BUDGET,
    MOVE_DID_NOT_HELP,
)


@dataclass(frozen=True, slots=True)
class RebalancerSettings:
    """The rebalancer (the ``rebalancer`` section; docs/operations.md, Rebalancing)."""

    mode: RebalanceMode = "dry_run"
    """``dry_run``: a victim gets an ``InterferenceWouldEvict`` Event, a metric and a
    decision record, and the Eviction API is asked with ``dryRun=All`` (PodDisruptionBudgets
    are checked, nothing is evicted); ``enforce``: it is evicted; ``off``: nothing is looked
    at."""
    interval_s: float = 5.0
    """How often the leader looks at the pods with a tolerance."""
    window: RebalanceWindow = "60s"
    """Span of the pod's own run-queue p99 (its per-interval histograms merged) and of its
    node's reclaim stall mean."""
    sustained_for_s: float = 30.0
    """How long the window must have broken the tolerance, look after look, before the pod
    is a victim."""
    controller_kinds: tuple[str, ...] = (
        "ReplicaSet",
        "StatefulSet",
        "ReplicationController",
    )
    """Kinds of controlling owner that recreate an evicted pod whole; any other pod is never
    moved (a Job, CronJob or DaemonSet pod never, listed or not:
    scheduler/rebalancing/evictable.py)."""
    never_namespaces: tuple[str, ...] = (ALWAYS_SPARED_NAMESPACE,)
    """Namespaces whose pods are never moved (``kube-system`` always, listed or not)."""
    max_per_node: int = 1
    """Evictions from one node per ``rate_window_s``."""
    max_per_namespace: int = 2
    """Evictions in one namespace per ``rate_window_s``."""
    max_per_cluster: int = 5
    """Evictions in the whole cluster per ``rate_window_s``."""
    rate_window_s: float = 600.0
    """The window of the ``max_per_*`` limits (a dry run's "would evict"s count against
    a dry run's limits, never an eviction's)."""
    cooldown_s: float = 600.0
    """After one of its pods was moved, a workload (controller) is not moved again for this long."""
    retry_after_s: float = 30.0
    """After the Eviction API answered 429 (a PodDisruptionBudget allows no disruption
    now), the pod is not tried again for this long."""
    max_moves_per_workload: int = 3
    """Moves of one workload (controller) per ``move_budget_window_s``; then it stays where
    it is (two nodes noisy in turn would otherwise move it once per cool-down)."""
    move_budget_window_s: float = 3600.0
    """The window of ``max_moves_per_workload``, and how long a workload whose move did not
    bring its replacement back under its tolerance is left where it is."""
    reserve_for_s: float = 180.0
    """How long the room found for an evicted pod is held for its replacement (no other
    pod of no higher priority is placed there meanwhile); let go at once when the
    replacement is placed."""

    def __post_init__(self) -> None:
        if self.mode not in REBALANCE_MODES:
            raise ValueError(f"mode: {self.mode!r} is not one of {', '.join(REBALANCE_MODES)}")
        if self.window not in WINDOW_SECONDS:
            raise ValueError(f"window: {self.window!r} is not one of 10s, 60s")
        for name in ("interval_s", "rate_window_s", "retry_after_s", "move_budget_window_s",
                     "reserve_for_s"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be a number > 0")
        for name in ("sustained_for_s", "cooldown_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be a number ≥ 0")
        for name in ("max_per_node", "max_per_namespace", "max_per_cluster",
                     "max_moves_per_workload"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be an integer ≥ 0")

    @property
    def window_s(self) -> float:
        return WINDOW_SECONDS[self.window]


def eligible(pod: PodInfo, settings: RebalancerSettings, scheduler_name: str) -> str | None:
    """Why ``pod`` is never moved, ``None`` when it may be (rule 1 of the module)."""
    if pod.tolerance is None or (
        pod.tolerance.max_runq_p99_us is None and pod.tolerance.max_reclaim_stall_ms_per_s is None
    ):
        return "declares no run-queue or reclaim tolerance"
    if pod.namespace == ALWAYS_SPARED_NAMESPACE or pod.namespace in settings.never_namespaces:
        return f"namespace {pod.namespace} is never rebalanced"
    if pod.rebalance_opt_out:
        return 'opts out (interference.io/rebalance: "false")'
    if pod.scheduler_name != scheduler_name:
        return f"its replacement would be placed by {pod.scheduler_name}, not by this scheduler"
    if pod.terminating or pod.finished:
        return "it is terminating or finished"
    return None


@dataclass(frozen=True, slots=True)
class OwnWindow:
    """A pod's own signals over the window (its published per-interval rows merged)."""

    intervals: int
    runq_p99_us: float
    runq_wait_ms_per_s: float
    """Mean over the intervals (as are the fields below)."""
    throttled_ms_per_s: float
    cpu_ms_per_s: float = 0.0
    own_wait_ms_per_s: float = 0.0
    """Waits behind its own tasks (the agent's culprit attribution; 0 from older agents)."""
    neighbour_wait_ms_per_s: float = 0.0
    recent_runq_p99_us: float | None = None
    """p99 of the rows that came since the previous look (``None``: not known apart from
    the window)."""


@dataclass(slots=True)
class PodHistory:
    """The per-interval rows of one pod seen so far (deduplicated by publication time)."""

    uid: str
    rows: deque[tuple[float, PodMetrics]] = field(default_factory=deque)
    looked_until: float = float("-inf")
    """Publication time of the newest row the previous :meth:`window` saw."""
    recent_p99_us: float = 0.0
    """p99 of the rows new at the previous :meth:`window` (kept while no new row came)."""

    def add(self, row: PodMetrics, updated_at: float) -> None:
        if self.rows and updated_at <= self.rows[-1][0]:
            return
        self.rows.append((updated_at, row))

    def window(self, now: float, span_s: float, fresh_for_s: float) -> OwnWindow | None:
        """The rows of the last ``span_s``; ``None`` when the latest is older than
        ``fresh_for_s`` (the agent stopped publishing the pod: unknown, not quiet)."""
        while self.rows and self.rows[0][0] < now - span_s:
            self.rows.popleft()
        if not self.rows or now - self.rows[-1][0] > fresh_for_s:
            return None
        merged: list[int] = []
        sums = [0.0] * 5
        for _, row in self.rows:
            merged = hist.add(merged, row.runq_us)
            for i, value in enumerate(
                (
                    row.runq_wait_ms_per_s,
                    row.throttled_ms_per_s,
                    row.cpu_ms_per_s,
                    row.own_wait_ms_per_s,
                    row.neighbour_wait_ms_per_s,
                )
            ):
                sums[i] += value
        count = len(self.rows)
        p99 = hist.percentile(merged, 0.99) if hist.total(merged) else 0.0
        recent: list[int] = []
        for at, row in self.rows:
            if at > self.looked_until:
                recent = hist.add(recent, row.runq_us)
        if self.rows[-1][0] > self.looked_until:  # no new row: the last look's slice stands
            self.recent_p99_us = hist.percentile(recent, 0.99) if hist.total(recent) else 0.0
            self.looked_until = self.rows[-1][0]
        own = OwnWindow(count, p99, *(total / count for total in sums))
        return dataclasses.replace(own, recent_runq_p99_us=self.recent_p99_us)


@dataclass(frozen=True, slots=True)
class Breach:
    """What a victim's window broke, for Events and records."""

    runq: bool
    reclaim: bool
    text: str
    """``run-queue p99 2900 µs > tolerance 500 µs``; both parts joined by ``; ``."""
    severity: float = 1.0
    """The largest ratio of measured to tolerance among the broken parts: the worst breach
    on a node moves first (a tolerance of 0 broken is infinitely severe)."""


def breach(
    pod: PodInfo,
    own: OwnWindow | None,
    node_reclaim_ms_per_s: float | None,
    node_recent_reclaim_ms_per_s: float | None = None,
) -> Breach | None:
    """What of ``pod``'s tolerance its window breaks now, ``None`` when nothing known does.

    ``own`` is ``None`` without fresh rows of the pod; ``node_reclaim_ms_per_s`` is
    ``None`` when the node's signals are not usable. Each part must break the tolerance
    over the window and in the look's own interval (``own.recent_runq_p99_us``,
    ``node_recent_reclaim_ms_per_s``: :data:`RECENT_WINDOW`), when that is known.
    """
    tolerance = pod.tolerance
    if tolerance is None:
        return None
    parts: list[str] = []
    runq = reclaim = False
    severity = 0.0
    bound = tolerance.max_runq_p99_us
    recent = None if own is None else own.recent_runq_p99_us
    if (
        bound is not None
        and own is not None
        and own.runq_p99_us > bound
        and (recent is None or recent > bound)
    ):
        runq = True
        severity = max(severity, _ratio(own.runq_p99_us, bound))
        last = "" if recent is None else f" ({recent:.0f} µs since the last look)"
        parts.append(f"its run-queue p99 {own.runq_p99_us:.0f} µs{last} > tolerance {bound:g} µs")
    bound = tolerance.max_reclaim_stall_ms_per_s
    recent_reclaim = node_recent_reclaim_ms_per_s
    if (
        bound is not None
        and node_reclaim_ms_per_s is not None
        and node_reclaim_ms_per_s > bound
        and (recent_reclaim is None or recent_reclaim > bound)
    ):
        reclaim = True
        severity = max(severity, _ratio(node_reclaim_ms_per_s, bound))
        parts.append(
            f"its node's reclaim stall {node_reclaim_ms_per_s:.3g} ms/s > tolerance {bound:g} ms/s"
        )
    if not parts:
        return None
    return Breach(runq, reclaim, "; ".join(parts), severity)


def _ratio(measured: float, bound: float) -> float:
    """``measured / bound``; ``inf`` for a tolerance of 0."""
    return measured / bound if bound > 0 else math.inf


def own_cause(found: Breach, own: OwnWindow | None) -> str | None:
    """Rule 2: ``own_limit`` or ``own_tasks`` when the pod's own doing is the largest part
    of its run-queue wait (a run-queue breach alone), else ``None``.

    The parts are :func:`interference.contention.contention_shares` of the window's means;
    from an agent that publishes no culprits (``own + neighbour = 0``) the whole wait
    counts as the neighbours' before its own throttling is taken out.
    """
    if not found.runq or found.reclaim or own is None:
        return None
    attributed = own.own_wait_ms_per_s + own.neighbour_wait_ms_per_s
    shares = contention_shares(
        own_wait_ms_per_s=own.own_wait_ms_per_s,
        neighbour_wait_ms_per_s=own.neighbour_wait_ms_per_s
        if attributed > 0
        else own.runq_wait_ms_per_s,
        throttled_ms_per_s=own.throttled_ms_per_s,
        cpu_ms_per_s=own.cpu_ms_per_s,
    )
    cause = shares.cause
    return cause if cause in (OWN_LIMIT, OWN_TASKS) else None


class BreachTracker:
    """Since when each pod's window has broken its tolerance at every look."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def note(self, uid: str, breaching: bool, now: float) -> float:
        """Seconds the streak has lasted (0 when it is not breaching now)."""
        if not breaching:
            self._since.pop(uid, None)
            return 0.0
        since = self._since.setdefault(uid, now)
        return now - since

    def forget(self, uid: str) -> None:
        self._since.pop(uid, None)

    def keep_only(self, uids: set[str]) -> None:
        for uid in list(self._since):
            if uid not in uids:
                del self._since[uid]


@dataclass(frozen=True, slots=True)
class Moved:
    """One eviction (or dry-run eviction) the ledger counts, or the verdict at ``at`` on
    the workload's latest move: ``unhelpful`` (it did not bring the workload back under its
    tolerance: a mark the ledger keeps) or ``helped`` (journaled only, so a later leader
    does not judge that move again)."""

    at: float
    node: str
    namespace: str
    workload_uid: str
    dry_run: bool = False
    unhelpful: bool = False
    helped: bool = False


class EvictionLedger:
    """Recent evictions, for the cool-down, the move budget and the rate limits (rule 3
    and 4), dry runs apart from evictions; and the workloads marked as not helped by a move."""

    def __init__(self) -> None:
        self._moves: deque[Moved] = deque()
        self._marked: dict[str, float] = {}
        """Workload UID → when its unhelpful move was made."""

    def note(self, moved: Moved) -> None:
        if moved.helped:  # a verdict, not a move
            return
        if moved.unhelpful:
            self._marked[moved.workload_uid] = max(
                moved.at, self._marked.get(moved.workload_uid, moved.at)
            )
        else:
            self._moves.append(moved)

    def hold_reason(
        self, pod: PodInfo, now: float, settings: RebalancerSettings, dry_run: bool = False
    ) -> str | None:
        """Which guard rail keeps ``pod`` where it is now, ``None`` when none does; only
        moves of the same kind (dry run or eviction) count::

            move_did_not_help its workload is marked, now − mark < move_budget_window_s
            cooldown          ∃ move of its workload with now − at < cooldown_s
            move_budget       |moves of its workload, now − at < move_budget_window_s|
                                  ≥ max_moves_per_workload
            node_limit, …     |moves from its node, … , now − at < rate_window_s| ≥ max_per_…
        """
        keep = max(settings.rate_window_s, settings.cooldown_s, settings.move_budget_window_s)
        while self._moves and self._moves[0].at < now - keep:
            self._moves.popleft()
        for uid, at in list(self._marked.items()):
            if now - at >= settings.move_budget_window_s:
                del self._marked[uid]
        workload = pod.controller.uid if pod.controller is not None else ""
        if not dry_run and workload in self._marked:
            return MOVE_DID_NOT_HELP
        mine = [m for m in self._moves if m.dry_run == dry_run]
        if any(m.workload_uid == workload and now - m.at < settings.cooldown_s for m in mine):
            return COOLDOWN
        moved = sum(
            m.workload_uid == workload and now - m.at < settings.move_budget_window_s for m in mine
        )
        if moved >= settings.max_moves_per_workload:
            return MOVE_BUDGET
        recent = [m for m in mine if now - m.at < settings.rate_window_s]
        if sum(m.node == pod.node_name for m in recent) >= settings.max_per_node:
            return NODE_LIMIT
        if sum(m.namespace == pod.namespace for m in recent) >= settings.max_per_namespace:
            return NAMESPACE_LIMIT
        if len(recent) >= settings.max_per_cluster:
            return CLUSTER_LIMIT
        return None


MoveVerdict = Literal["helped", "did_not_help"]


class MoveOutcomes:
    """Whether each workload's latest eviction helped: its replacement (a pod of the
    workload created after the move) seen under its tolerance at a look with its own
    rows means it did; its replacement breaking the tolerance for ``sustained_for_s``
    before that means it did not (:meth:`judge` answers each once)."""

    def __init__(self) -> None:
        self._awaiting: dict[str, float] = {}
        """Workload UID → when its latest eviction was made."""

    def moved(self, workload_uid: str, at: float) -> None:
        self._awaiting[workload_uid] = at

    def judged(self, workload_uid: str, at: float) -> None:
        """A verdict made at ``at`` (by this leader or, read back, an earlier one): the
        moves before it are judged."""
        if self._awaiting.get(workload_uid, math.inf) <= at:
            del self._awaiting[workload_uid]

    def judge(
        self, pod: PodInfo, known: bool, breaching_for: float | None, sustained_for_s: float
    ) -> MoveVerdict | None:
        """Note a look at ``pod``: ``known`` whether its window was known, ``breaching_for``
        how long it has broken its tolerance (``None``: not breaking it). The verdict on
        its workload's latest move when this look settles it, else ``None``."""
        workload = pod.controller.uid if pod.controller is not None else ""
        since = self._awaiting.get(workload)
        if since is None or pod.created_at < math.floor(since):  # whole seconds
            return None
        if breaching_for is None:
            if not known:
                return None
            del self._awaiting[workload]
            return "helped"  # back under its tolerance
        if breaching_for < sustained_for_s:
            return None
        del self._awaiting[workload]
        return "did_not_help"

    def forget_before(self, at: float) -> None:
        for uid in [u for u, t in self._awaiting.items() if t < at]:
            del self._awaiting[uid]
