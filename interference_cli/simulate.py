"""``interference simulate``: what would each policy have done on a recorded trace?

The trace's NodeReports are replayed in time order together with a pod arrival list;
every arrival is placed by the real :class:`scheduler.cycle.cycle.SchedulingCycle` over a real
:class:`scheduler.signals.table.NodeTable` (no copy of any filter or score), with the signals
of the latest report of each node at that moment. The signals reach the table as in
production: each report's scheduling record, encoded as its agent writes it, decoded with
the Redis follower's checks and columns, the index computed from it with the policy
file's ``redis.index_references`` (:mod:`interference_cli.replay_signals`;
docs/design.md §8) — so a replay decides what the scheduler following those records
would (``tests/cli/test_replay_parity.py`` runs traces both ways). Per policy it reports:

``violations``
    placements whose node exceeded the pod's interference tolerance during the windows
    that followed: of the node's reports in ``(t, t + horizon_s]`` after placement at
    ``t``, at least ``violation_fraction`` failed the pod's tolerance, judged by the
    scheduler's own tolerance filter (:func:`scheduler.plugins.interference.interference_filter`)
    on that report with default cycle settings — the same judge for every policy.
``nodes_used``
    distinct nodes that received at least one of the simulated pods.
``gpu_fragmentation``
    at the end of the replay, the share of free GPUs that sit on partly used GPU nodes:
    ``Σ free GPUs on nodes with 0 < used < allocatable / Σ free GPUs`` (0 with none free).
``unschedulable``
    pods that never found a node (each is retried with backoff while the trace lasts).
``decisions_per_s``
    cycle decisions (attempts, retries included) per second of time spent in the cycle.

The trace's measurements already contain whatever ran on the nodes when it was recorded,
not the simulated pods' own load; the cycle's recent-load term stands in for that.

The ``--pods`` file is read by :mod:`interference_cli.workload`.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from interference import sched_record
from interference.decision import Decision, decision_hash
from interference.index import IndexReferences
from interference.signals import NodeReport
from interference_cli.errors import CliError
from interference_cli.output_files import write_page
from interference_cli.plain import text
from interference_cli.replay_signals import RecordReplay, ReplaySignals
from interference_cli.store import split_pod_ref
from interference_cli.trace import load_trace
from interference_cli.views import decision_view
from interference_cli.workload import Arrival, Workload, load_workload
from scheduler.adapters.object_builders import node_object
from scheduler.api.nodes import parse_node
from scheduler.api.objects import PodInfo
from scheduler.api.pods import parse_pod
from scheduler.api.reader import ObjectError
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.settings import CycleSettings
from scheduler.entry.config import ConfigError, load_config
from scheduler.plugins.interference import InterferenceArgs, interference_filter
from scheduler.signals.records import DEFAULT_REFERENCES, frame_of_records
from scheduler.signals.table import NodeTable

GPU_RESOURCE = "nvidia.com/gpu"
RETRY_INITIAL_S = 1.0
RETRY_MAX_S = 10.0
"""Backoff of an unschedulable pod between attempts, as the scheduling queue's."""


@dataclass(frozen=True, slots=True)
class Policy:
    """A scheduler config file as the simulator runs it."""

    name: str
    settings: CycleSettings
    """``cycle:`` of the file; ``interference_aware: false`` makes an interference-blind
    policy (tolerance filters off, no quietness score), as the loop runs without signals."""
    references: IndexReferences = DEFAULT_REFERENCES
    """``redis.index_references`` of the file: the references the scheduler computes each
    node's index from its record with."""
    max_agent_interval_s: float = 2.0
    """``redis.max_agent_interval_s`` of the file: a record claiming a longer interval is
    ignored, as the follower ignores it."""


@dataclass
class PolicyResult:
    """What one policy did on the trace."""

    policy: str
    placed: int = 0
    unschedulable: int = 0
    violations: int = 0
    with_tolerance: int = 0
    """Placed pods that declare a tolerance (the ones that can violate it)."""
    nodes_used: int = 0
    gpu_fragmentation: float = 0.0
    decisions_per_s: float = 0.0
    placements: list[tuple[float, str, str]] = field(default_factory=list)
    """``(t_s, pod, node)`` of every placement."""
    explained: Decision | None = None
    """The decision record of the pod asked for with ``explain`` (its last attempt), as
    the scheduler would have written it."""
    decisions: list[Decision] = field(default_factory=list)
    """Every attempt's decision record, in order, when :func:`simulate` was asked to keep
    them (``keep_decisions``); not part of the JSON."""

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(dataclasses.replace(self, explained=None, decisions=[]))
        del out["decisions"]
        out["placements"] = [list(p) for p in self.placements]
        out["explained"] = decision_hash(self.explained) if self.explained else None
        return out


def load_policy(path: str | Path) -> Policy:
    """A scheduler config file; :class:`CliError` when it does not load."""
    try:
        config = load_config(str(path))
    except ConfigError as exc:
        raise CliError(f"policy {path} is invalid: {'; '.join(exc.problems)}") from exc
    except (OSError, ValueError) as exc:
        raise CliError(f"policy {path}: {exc}") from exc
    redis = config.redis
    return Policy(Path(path).stem, config.cycle, redis.index_references, redis.max_agent_interval_s)


def simulate(
    reports: Sequence[NodeReport],
    workload: Workload,
    policy: Policy,
    explain: str | None = None,
    signals: ReplaySignals | None = None,
    keep_decisions: bool = False,
) -> PolicyResult:
    """Replay ``reports`` and ``workload`` through the cycle under ``policy``.

    Time advances over every report and arrival. A pod is attempted when it arrives; an
    unschedulable one is retried with the scheduling queue's backoff (1 s doubling to
    10 s) while the trace lasts, and counts as unschedulable if it never fits.
    ``explain`` (``NAMESPACE/POD``) keeps that pod's decision record of its last attempt;
    ``keep_decisions`` every attempt's. ``signals``: how the reports reach the scheduler
    (default :class:`RecordReplay`; a test passes a real Redis and the follower).
    """
    if not reports:
        raise CliError("the trace holds no reports")
    ordered = sorted(reports, key=lambda r: r.ts)
    t0 = ordered[0].ts
    if signals is None:
        signals = RecordReplay(trace_nodes(ordered), policy.references, policy.max_agent_interval_s)
    replay = _Replay(ordered, workload, policy, signals, explain, keep_decisions)
    ticks = sorted(
        [(report.ts, 0, None) for report in ordered]
        + [(t0 + arrival.at_s, 1, arrival) for arrival in workload.arrivals],
        key=lambda tick: (tick[0], tick[1]),
    )
    for now, _, arrival in ticks:
        replay.advance(now)
        replay.retry_pending(now)
        if arrival is not None:
            replay.arrive(arrival, now)
    result = replay.result
    result.unschedulable = len(replay.pending)
    result.placed = len(replay.placed)
    result.nodes_used = len({node for _, _, node in replay.placed})
    result.gpu_fragmentation = gpu_fragmentation(replay.table)
    result.decisions_per_s = replay.attempts / replay.cycle_s if replay.cycle_s > 0 else 0.0
    result.placements = [(round(t - t0, 3), pod.key, node) for t, pod, node in replay.placed]
    result.explained = replay.explained
    result.decisions = replay.decisions
    judge = _ToleranceJudge(ordered, workload)
    for placed_at, pod, node in replay.placed:
        if pod.tolerance is None:
            continue
        result.with_tolerance += 1
        if judge.violated(pod, node, placed_at):
            result.violations += 1
    return result


@dataclass
class _Pending:
    pod: PodInfo
    duration_s: float | None
    next_try: float
    backoff_s: float


class _Replay:
    """The state of one policy's replay: the node table, signals, pods and timings."""

    def __init__(
        self,
        ordered: Sequence[NodeReport],
        workload: Workload,
        policy: Policy,
        signals: ReplaySignals,
        explain: str | None = None,
        keep_decisions: bool = False,
    ):
        self._reports = ordered
        self._next_report = 0
        self._cycle = SchedulingCycle(policy.settings, seed=0)
        self._signals = signals
        self._departures: list[tuple[float, int, PodInfo]] = []
        self.table = NodeTable()
        for name in trace_nodes(ordered):
            self.table.upsert_node(parse_node(_node(name, workload.node_allocatable)))
        self.result = PolicyResult(policy.name)
        self.pending: list[_Pending] = []
        self.placed: list[tuple[float, PodInfo, str]] = []
        """``(time, pod, node)`` of every placement."""
        self.attempts = 0
        self.cycle_s = 0.0
        self._explain = explain
        self.explained: Decision | None = None
        self._keep_decisions = keep_decisions
        self.decisions: list[Decision] = []

    def advance(self, now: float) -> None:
        """Apply the reports and departures up to ``now``."""
        while self._next_report < len(self._reports):
            report = self._reports[self._next_report]
            if report.ts > now:
                break
            self._signals.publish(report)
            self._next_report += 1
        while self._departures and self._departures[0][0] <= now:
            self.table.remove_pod(heapq.heappop(self._departures)[2])

    def arrive(self, arrival: Arrival, now: float) -> None:
        try:
            pod = parse_pod(arrival.obj)
        except ObjectError as exc:
            raise CliError(f"pod {arrival.obj['metadata']['name']}: {exc}") from exc
        if not self._attempt(pod, arrival.duration_s, now):
            self.pending.append(
                _Pending(pod, arrival.duration_s, now + RETRY_INITIAL_S, RETRY_INITIAL_S)
            )

    def retry_pending(self, now: float) -> None:
        for entry in [e for e in self.pending if e.next_try <= now]:
            if self._attempt(entry.pod, entry.duration_s, now):
                self.pending.remove(entry)
            else:
                entry.backoff_s = min(2 * entry.backoff_s, RETRY_MAX_S)
                entry.next_try = now + entry.backoff_s

    def _attempt(self, pod: PodInfo, duration_s: float | None, now: float) -> bool:
        self.table.set_signals(self._signals.frame(now))
        started = time.perf_counter()
        decision = self._cycle.schedule(pod, self.table, now)
        self.cycle_s += time.perf_counter() - started
        self.attempts += 1
        if pod.key == self._explain or self._keep_decisions:
            record = Decision(
                pod.namespace,
                pod.name,
                "unschedulable" if decision.node is None else "scheduled",
                decision.node or "",
                decision.message,
                now,
                candidates=decision.candidates,
                rejected_by_reason=dict(decision.reason_counts),
                funnel=list(decision.funnel),
                omitted=dict(decision.omitted),
                runq=decision.runq,
                interference_index=decision.interference_index,
            )
            if pod.key == self._explain:
                self.explained = record
            if self._keep_decisions:
                self.decisions.append(record)
        if decision.node is None:
            return False
        self.table.add_pod(pod, decision.node, now)
        self.placed.append((now, pod, decision.node))
        if duration_s is not None:
            heapq.heappush(self._departures, (now + duration_s, len(self.placed), pod))
        return True


class _ToleranceJudge:
    """Decides with the scheduler's own tolerance filter whether a placement violated it,
    on each later report's scheduling record (default references and checks)."""

    def __init__(self, reports: Sequence[NodeReport], workload: Workload) -> None:
        self._by_node: dict[str, list[NodeReport]] = {}
        for report in reports:
            self._by_node.setdefault(report.node, []).append(report)
        self._workload = workload
        self._judge = InterferenceArgs()
        """Violations are judged with the plugin's default args, whatever the policy."""
        self._tables: dict[str, NodeTable] = {}

    def violated(self, pod: PodInfo, node: str, placed_at: float) -> bool:
        end = placed_at + self._workload.horizon_s
        windows = [r for r in self._by_node.get(node, []) if placed_at < r.ts <= end]
        if not windows:
            return False
        table = self._table(node)
        exceeded = 0
        for report in windows:
            table.set_signals(frame_of_records([node], [sched_record.encode(report)]))
            verdict = interference_filter(table, pod, self._judge, report.ts)
            if verdict is not None and not verdict.passed[0]:
                exceeded += 1
        return exceeded >= self._workload.violation_fraction * len(windows)

    def _table(self, node: str) -> NodeTable:
        if node not in self._tables:
            table = NodeTable(1)
            table.upsert_node(parse_node(_node(node, self._workload.node_allocatable)))
            self._tables[node] = table
        return self._tables[node]


def gpu_fragmentation(table: NodeTable) -> float:
    """Share of free GPUs on partly used nodes (see the module docstring)."""
    row = table.resource_row(GPU_RESOURCE)
    if row is None:
        return 0.0
    alloc = table.alloc[row]
    used = table.requested[row]
    free = alloc - used
    total_free = int(free[free > 0].sum())
    if total_free == 0:
        return 0.0
    partly = (used > 0) & (used < alloc)
    return float(free[partly].sum()) / total_free


def _node(name: str, allocatable: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    resources = dict(allocatable.get(name) or allocatable.get("default") or {})
    gpus = int(resources.pop(GPU_RESOURCE, "0"))
    return node_object(
        name,
        cpu=resources.pop("cpu", "8"),
        memory=resources.pop("memory", "32Gi"),
        pods=resources.pop("pods", "110"),
        gpus=gpus,
        extra_allocatable=resources,
    )


def trace_nodes(reports: Sequence[NodeReport]) -> list[str]:
    """The nodes of a trace, sorted: the replay's cluster."""
    return sorted({report.node for report in reports})


# ---- command -----------------------------------------------------------------------------


def run_simulate_command(args: argparse.Namespace, console: Console) -> int:
    """``interference simulate``: print (or JSON-dump, or plot) the side-by-side result."""
    reports = load_trace(args.trace)
    workload = load_workload(args.pods)
    policies = [load_policy(p) for p in args.policy]
    explain = getattr(args, "explain", None)
    if explain is not None:
        namespace, name = split_pod_ref(explain)
        explain = f"{namespace}/{name}"
        if not any(_arrival_key(a) == explain for a in workload.arrivals):
            raise CliError(
                f"--explain {explain}: no such pod in {args.pods}; its arrivals are named "
                + ", ".join(sorted({_arrival_key(a) for a in workload.arrivals})[:5])
                + (" …" if len(workload.arrivals) > 5 else "")
            )
    results = [simulate(reports, workload, p, explain) for p in policies]
    if args.json:
        print(
            json.dumps({"trace_reports": len(reports), "policies": [r.as_json() for r in results]})
        )
    else:
        console.print(result_table(results, len(reports), len(workload.arrivals)))
    if explain is not None and not args.json:
        t0 = min(r.ts for r in reports)
        for result in results:
            console.print()
            console.print(text(f"policy {result.policy}", style="bold"))
            if result.explained is None:  # the pod never reached the cycle
                console.print(text(f"{explain} was never attempted"))
                continue
            when = f"at {result.explained.ts - t0:.1f} s into the trace"
            console.print(decision_view(result.explained, result.explained.ts, when=when))
    html = getattr(args, "html", None)
    if html:
        if explain is None:
            raise CliError("--html draws the decision --explain names: add --explain NS/POD")
        _write_pages(html, results, reports, console if not args.json else None)
    if args.plot:
        plot(results, args.plot)
        if not args.json:
            console.print(text(f"plot written to {args.plot}"))
    return 0


INDEX_HISTORY_S = 300.0
"""How far back the page's index chart reaches from a simulated decision."""


def _write_pages(
    path: str,
    results: Sequence[PolicyResult],
    reports: Sequence[NodeReport],
    console: Console | None,
) -> None:
    """``simulate --explain NS/POD --html FILE``: the explained decision of each policy as
    a page, the chosen node's index drawn from the trace's reports before the decision."""
    from interference.decision_page import render_decision_page

    for result in results:
        decision = result.explained
        if decision is None:
            continue
        target = path
        if len(results) > 1:
            stem, dot, ext = path.rpartition(".")
            safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in result.policy)
            target = f"{stem}-{safe}.{ext}" if dot and "/" not in ext else f"{path}-{safe}"
        history = [
            (r.ts, r.metrics.interference_index)
            for r in reports
            if r.node == decision.node and decision.ts - INDEX_HISTORY_S <= r.ts <= decision.ts
        ]
        note = (
            f"{len(history)} report(s) of the trace in the {INDEX_HISTORY_S:.0f} s before the "
            f"decision, covering {history[-1][0] - history[0][0]:.0f} s."
            if history
            else "Not available: the trace holds no report of the node before the decision."
        )
        page = render_decision_page(
            decision, history or None, history_note=note, history_before_decision=True
        )
        write_page(target, page)
        if console is not None:
            console.print(text(f"decision page ({result.policy}) written to {target}"))


def _arrival_key(arrival: Arrival) -> str:
    meta = arrival.obj["metadata"]
    return f"{meta.get('namespace', 'default')}/{meta['name']}"


def result_table(results: Sequence[PolicyResult], reports: int, arrivals: int) -> Table:
    """Policies side by side."""
    table = Table(title=f"{arrivals} pod arrivals replayed over {reports} node reports")
    table.add_column("")
    for result in results:
        table.add_column(text(result.policy), justify="right")
    rows: list[tuple[str, list[str]]] = [
        ("placed", [str(r.placed) for r in results]),
        ("unschedulable", [str(r.unschedulable) for r in results]),
        (
            "tolerance-violating placements",
            [f"{r.violations} / {r.with_tolerance}" for r in results],
        ),
        ("nodes used", [str(r.nodes_used) for r in results]),
        ("GPU fragmentation", [f"{100 * r.gpu_fragmentation:.0f} %" for r in results]),
        ("decisions/s", [f"{r.decisions_per_s:,.0f}" for r in results]),
    ]
    for label, values in rows:
        table.add_row(label, *values)
    return table


def plot(results: Sequence[PolicyResult], path: str) -> None:
    """Bar charts of violations and nodes used per policy (matplotlib, loaded lazily)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise CliError(
            "--plot needs matplotlib: pip install 'interference-scheduler[plot]'"
        ) from exc
    names = [r.policy for r in results]
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.bar(names, [r.violations for r in results], color="tab:red")
    left.set_title("tolerance-violating placements")
    right.bar(names, [r.nodes_used for r in results], color="tab:blue")
    right.set_title("nodes used")
    figure.tight_layout()
    try:
        figure.savefig(path)
    except OSError as exc:
        raise CliError(f"cannot write plot {path}: {exc}") from exc
    finally:
        plt.close(figure)
