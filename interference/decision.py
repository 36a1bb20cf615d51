"""The scheduler's decision record, ``intf:decision:{ns}/{pod}`` (docs/design.md §5), a
pod's placement record; its rebalancing record (``intf:rebalance:decision:{ns}/{pod}``,
§11) has the same fields.

A hash a person can read with ``redis-cli HGETALL``: ``result``, ``node``, ``message``,
``ts``, ``dry_run``, ``candidates`` — a JSON list with, per node, its filter verdict,
its score breakdown and details such as its GPU model — and ``rejected``, a JSON object
counting the nodes each filter reason rejected (each node at its first failing filter).
For a pod that preempted, ``preemption`` (JSON): the nominated node, the victims, the
rule that chose the node and how many candidates there were. For a pod with a run-queue
tolerance, ``runq`` (JSON): the tolerance, the signal window the Interference filter read,
the run-queue p99 it compared on each recorded candidate, and, for a pod no node passed,
the nearest node and when the relax rule judges the pod interference-blind. Where the
profile runs the Interference plugin, ``interference_index`` (JSON): the signal window and
the interference index the plugin read on each recorded candidate, the scheduler's own
from the scheduling record (docs/design.md §8), which an agent's published index may not
equal.

The record lists only the best candidates and the first rejected nodes (the scheduler's
``record_top_k`` of each: a record per pod must stay small at 5,000 nodes); ``omitted``
says how many of each were left out, and ``funnel`` how many nodes each filter let
through, so the counts are whole even where the list is not. ``trace_id`` names the
decision's OpenTelemetry trace when tracing is on.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from operator import sub
from typing import Any, NamedTuple

from interference.annotations import MAX_RUNQ_P99_US
from interference.codec import PayloadError, decoded_hash


@dataclass(slots=True)
class CandidateVerdict:
    """One node's outcome for one pod.

    Not frozen: about seven are built per decision, and a frozen dataclass's ``__init__``
    (``object.__setattr__`` per field) takes 0.85 µs against 0.22 µs."""

    node: str
    passed: bool
    reasons: list[str] = field(default_factory=list)
    """Why a filter rejected the node (kube-scheduler wording), empty when it passed."""
    scores: dict[str, float] = field(default_factory=dict)
    """Per-plugin score 0–100 before weighting."""
    total: float = 0.0
    """Weighted sum the node was ranked by."""
    details: dict[str, str] = field(default_factory=dict)
    """Facts about the node that explain the verdict, e.g. ``gpu_model`` for GPU pods."""
    weights: dict[str, float] = field(default_factory=dict)
    """Weight of each plugin in ``total``: ``total = Σ weights[p] · scores[p]``."""


class FunnelStage(NamedTuple):
    """One filter of a decision, in the order they ran: the nodes it was given and the
    nodes it let through (a tuple: one is built per filter per decision)."""

    name: str
    nodes_in: int
    nodes_out: int


def funnel_of(
    names: tuple[str, ...], considered: int, first_failures: Mapping[str, int]
) -> tuple[FunnelStage, ...]:
    """Each of the filters ``names`` that ran, in order, with the candidates it was given
    and let through: the first is given the ``considered`` candidates, and each lets
    through what it was given less the candidates it rejected first (``first_failures``,
    filter → count; a filter not in it rejected none first)."""
    left = list(accumulate(map(first_failures.get, names, repeat(0)), sub, initial=considered))
    stages = zip(names, left[:-1], left[1:], strict=True)
    # C loops: built per filter per decision, where FunnelStage(...) runs a Python __new__
    return tuple(map(tuple.__new__, repeat(FunnelStage), stages))


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    """Who a pod preempted and why that node (kube-scheduler's DefaultPreemption)."""

    node: str
    """The node the pod is nominated to."""
    victims: list[str]
    """``namespace/name`` of each pod evicted there, most important first."""
    why: str
    """The rule that chose this node among the candidates (fewest PDB violations, …)."""
    candidates: int
    """Candidate nodes the dry run found."""
    pdb_violations: int = 0
    antagonists: list[str] = field(default_factory=list)
    """Victims evicted because the agents named them antagonists (the opt-in rule)."""


@dataclass(frozen=True, slots=True)
class RunqCheck:
    """A pod's run-queue tolerance as the Interference filter compared it."""

    tolerance_us: float
    """The pod's ``max-runq-p99-us``."""
    window: str
    """The signal window the filter read (its ``signal_window``: latest, 10s or 60s)."""
    measured_us: dict[str, float] = field(default_factory=dict)
    """Node → the run-queue p99 (µs) the filter compared, for the candidates the record
    keeps and the nearest node (a node without usable signals was not compared: absent)."""
    nearest: str = ""
    """For a pod no node passed: the node with the lowest run-queue p99 among those only
    the Interference filter refused (empty when there is none)."""
    relax_at: float | None = None
    """For a pod no node passed: when the relax rule judges it interference-blind (unix
    time); ``None`` when it never will (another filter refuses each node as well)."""


def runq_advice(check: RunqCheck, now: float) -> str:
    """What a pod no node passed for its run-queue tolerance is told: the nearest node
    against the tolerance, when it is relaxed (or that it never is), and what to raise."""
    out = []
    if check.nearest in check.measured_us:
        nearest = check.measured_us[check.nearest]
        out.append(
            f"Nearest node: {check.nearest}, run-queue p99 {nearest:g} µs against the "
            f"tolerance {check.tolerance_us:g} µs ({check.window} window)."
        )
    out.append(relax_text(check, now))
    if check.nearest in check.measured_us:
        out.append(f"Hint: raise {MAX_RUNQ_P99_US} to at least {raise_to_us(check):.0f} µs.")
    return " ".join(out)


def relax_text(check: RunqCheck, now: float) -> str:
    """When the relax rule judges the pod interference-blind, seen from ``now``."""
    if check.relax_at is None:
        return "Never relaxed to interference-blind: another filter refuses each node as well."
    at = time.strftime("%H:%M:%S UTC", time.gmtime(check.relax_at))
    if check.relax_at <= now:
        return f"Relaxed to interference-blind at its next attempt (due since {at})."
    return f"Relaxed to interference-blind in {check.relax_at - now:.0f} s (at {at})."


def raise_to_us(check: RunqCheck) -> float:
    """The least ``max-runq-p99-us`` the nearest node passes (the filter refuses a node
    measuring above the tolerance, so its own measurement, rounded up)."""
    return float(math.ceil(check.measured_us.get(check.nearest, check.tolerance_us)))


@dataclass(frozen=True, slots=True)
class IndexRead:
    """The interference index the Interference plugin read at the decision: the
    scheduler's own, computed from each node's scheduling record, not the index the node's
    agent publishes (the two differ when the references differ)."""

    window: str
    """The signal window the plugin read (its ``signal_window``: latest, 10s or 60s)."""
    by_node: dict[str, float] = field(default_factory=dict)
    """Node → index 0–100 (the window's ``index_mean + risk_k · index_stddev`` plus the
    load placed since the report, capped at 100) for the recorded candidates; a node
    without usable signals was not read: absent."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What the scheduler decided for one pod in one cycle."""

    namespace: str
    pod: str
    result: str
    """``scheduled``, ``unschedulable``, ``bind_failed`` or ``dry_run``; in a rebalancing
    record ``would_evict``, ``evicted`` or ``eviction_blocked``."""
    node: str
    message: str
    ts: float
    dry_run: bool = False
    candidates: list[CandidateVerdict] = field(default_factory=list)
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    """Filter reason → nodes it rejected (also for pods that were scheduled)."""
    funnel: list[FunnelStage] = field(default_factory=list)
    """Each filter that ran, in order, with the nodes in and out."""
    omitted: dict[str, int] = field(default_factory=dict)
    """How many ``feasible`` and ``rejected`` nodes ``candidates`` leaves out."""
    trace_id: str = ""
    """The decision's trace (32 hex digits) when tracing is on."""
    preemption: PreemptionRecord | None = None
    """What preemption did for a pod no node fit (``None``: nothing)."""
    runq: RunqCheck | None = None
    """The run-queue tolerance as compared (``None``: the pod has none, or the filter did
    not run)."""
    interference_index: IndexRead | None = None
    """The index the Interference plugin read (``None``: the profile does not run it, or
    signals were unreadable)."""


def decision_hash(decision: Decision) -> dict[str, str]:
    """The hash fields written to ``intf:decision:{ns}/{pod}``."""
    return {
        "namespace": decision.namespace,
        "pod": decision.pod,
        "result": decision.result,
        "node": decision.node,
        "message": decision.message,
        "ts": f"{decision.ts:.3f}",
        "dry_run": "1" if decision.dry_run else "0",
        "candidates": json.dumps(
            [
                {
                    "node": c.node,
                    "passed": c.passed,
                    "reasons": c.reasons,
                    "scores": {k: round(v, 2) for k, v in c.scores.items()},
                    "total": round(c.total, 2),
                    **({"details": c.details} if c.details else {}),
                    **({"weights": c.weights} if c.weights else {}),
                }
                for c in decision.candidates
            ],
            separators=(",", ":"),
        ),
        "rejected": json.dumps(decision.rejected_by_reason, separators=(",", ":")),
        "funnel": json.dumps(
            [[stage.name, stage.nodes_in, stage.nodes_out] for stage in decision.funnel],
            separators=(",", ":"),
        ),
        "omitted": json.dumps(decision.omitted, separators=(",", ":")),
        "trace_id": decision.trace_id,
        **({"preemption": _preemption_json(decision.preemption)} if decision.preemption else {}),
        **({"runq": _runq_json(decision.runq)} if decision.runq else {}),
        **(
            {"interference_index": _index_read_json(decision.interference_index)}
            if decision.interference_index
            else {}
        ),
    }


def _index_read_json(read: IndexRead) -> str:
    return json.dumps(
        {"window": read.window, "by_node": {n: round(v, 2) for n, v in read.by_node.items()}},
        separators=(",", ":"),
    )


def _parse_index_read(text: str | None) -> IndexRead | None:
    if not text:
        return None
    found = json.loads(text)
    by_node = {str(node): float(index) for node, index in found.get("by_node", {}).items()}
    return IndexRead(str(found.get("window", "")), by_node)


def _runq_json(check: RunqCheck) -> str:
    return json.dumps(
        {
            "tolerance_us": check.tolerance_us,
            "window": check.window,
            "measured_us": {node: round(v, 1) for node, v in check.measured_us.items()},
            "nearest": check.nearest,
            "relax_at": None if check.relax_at is None else round(check.relax_at, 3),
        },
        separators=(",", ":"),
    )


def _parse_runq(text: str | None) -> RunqCheck | None:
    if not text:
        return None
    found = json.loads(text)
    relax_at = found.get("relax_at")
    return RunqCheck(
        tolerance_us=float(found["tolerance_us"]),
        window=str(found.get("window", "")),
        measured_us={str(k): float(v) for k, v in found.get("measured_us", {}).items()},
        nearest=str(found.get("nearest", "")),
        relax_at=None if relax_at is None else float(relax_at),
    )


def _preemption_json(record: PreemptionRecord) -> str:
    return json.dumps(
        {
            "node": record.node,
            "victims": record.victims,
            "why": record.why,
            "candidates": record.candidates,
            "pdb_violations": record.pdb_violations,
            "antagonists": record.antagonists,
        },
        separators=(",", ":"),
    )


def _parse_preemption(text: str | None) -> PreemptionRecord | None:
    if not text:
        return None
    found = json.loads(text)
    return PreemptionRecord(
        node=str(found["node"]),
        victims=[str(v) for v in found.get("victims", [])],
        why=str(found.get("why", "")),
        candidates=int(found.get("candidates", 0)),
        pdb_violations=int(found.get("pdb_violations", 0)),
        antagonists=[str(v) for v in found.get("antagonists", [])],
    )


def parse_decision_hash(raw: Mapping[Any, Any]) -> Decision:
    """Inverse of :func:`decision_hash`; :class:`PayloadError` when malformed."""
    data = decoded_hash(raw)
    try:
        candidates = [
            CandidateVerdict(
                node=str(c["node"]),
                passed=bool(c["passed"]),
                reasons=[str(r) for r in c.get("reasons", [])],
                scores={str(k): float(v) for k, v in c.get("scores", {}).items()},
                total=float(c.get("total", 0.0)),
                details={str(k): str(v) for k, v in c.get("details", {}).items()},
                weights={str(k): float(v) for k, v in c.get("weights", {}).items()},
            )
            for c in json.loads(data.get("candidates", "[]"))
        ]
        return Decision(
            namespace=data["namespace"],
            pod=data["pod"],
            result=data["result"],
            node=data.get("node", ""),
            message=data.get("message", ""),
            ts=float(data["ts"]),
            dry_run=data.get("dry_run") == "1",
            candidates=candidates,
            rejected_by_reason={
                str(k): int(v) for k, v in json.loads(data.get("rejected", "{}")).items()
            },
            funnel=[
                FunnelStage(str(name), int(nodes_in), int(nodes_out))
                for name, nodes_in, nodes_out in json.loads(data.get("funnel", "[]"))
            ],
            omitted={str(k): int(v) for k, v in json.loads(data.get("omitted", "{}")).items()},
            trace_id=data.get("trace_id", ""),
            preemption=_parse_preemption(data.get("preemption")),
            runq=_parse_runq(data.get("runq")),
            interference_index=_parse_index_read(data.get("interference_index")),
        )
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise PayloadError(f"bad decision record: {exc!r}") from exc
