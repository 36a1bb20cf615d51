"""``-o json`` of ``top``, ``node`` and ``explain``: the facts their tables show, as JSON
documents a program parses (the tables are for people: :mod:`interference_cli.views`).

Numbers are numbers (not the tables' rounded text), times are Unix seconds and ages
seconds; what a table shows as ``—`` is ``null`` (an age never known, a node's metrics
after its hash expired, the total of a candidate that did not pass). Names keep the
wording of the tables' columns in snake case, with the units the tables' headers give.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from interference import hist
from interference.decision import CandidateVerdict, Decision, RunqCheck, raise_to_us, runq_advice
from interference.signals import PodMetrics
from interference_cli.store_model import NodeDetail, NodeRow, PodRecords, PodRow
from interference_cli.views import TOP_PODS, funnel_line, ranked_culprits


def dumps(document: Any, *, compact: bool = False) -> str:
    """Strict JSON (no NaN or infinity: :func:`_finite` made them ``null``)."""
    return json.dumps(
        _finite(document),
        allow_nan=False,
        ensure_ascii=False,
        indent=None if compact else 2,
        separators=(",", ":") if compact else None,
    )


def top_document(rows: Sequence[NodeRow], now: float, source: str) -> dict[str, Any]:
    """``interference top``: each node in the table's order with every column."""
    return {"source": source, "time": now, "nodes": [_top_row(row, now) for row in rows]}


def _top_row(row: NodeRow, now: float) -> dict[str, Any]:
    m = row.metrics
    return {
        "node": row.node,
        "index": row.scheduler_index,
        "agent_index": None if m is None else m.interference_index,
        "runq_p99_us": None if m is None else m.runq_p99_us,
        "runq_wait_ratio": None if m is None else m.runq_wait_ratio,
        "reclaim_stall_ms_per_s": None if m is None else m.reclaim_stall_ms_per_s,
        "throttled_ms_per_s": None if m is None else m.throttled_ms_per_s,
        "psi_cpu_some": None if m is None else m.psi_cpu_some,
        "psi_mem_some": None if m is None else m.psi_mem_some,
        "pods": row.pod_count,
        "age_s": row.age_s(now),
        "updated_at": row.updated_at or None,
        "interval_s": row.interval_s,
        "state": row.state,
        "expired": m is None,
        "measured": list(row.measured),
    }


def node_document(detail: NodeDetail, now: float) -> dict[str, Any]:
    """``interference node NODE``: its metrics, windows, histograms (with the p50 and p99
    the titles give), victims, culprits, antagonists, and every pod's metrics."""
    row = detail.row
    assert row.metrics is not None  # node_detail raises for expired nodes
    pods = detail.pods
    return {
        **{k: v for k, v in _top_row(row, now).items() if k not in ("expired",)},
        "metrics": dataclasses.asdict(row.metrics),
        "disabled_probes": detail.disabled_probes,
        "windows": {name: dataclasses.asdict(w) for name, w in detail.windows.items()},
        "histograms": {name: _histogram(buckets) for name, buckets in detail.histograms.items()},
        "victims": [
            _victim(pod) for pod in sorted(pods, key=lambda p: -p.metrics.runq_wait_ms_per_s)
        ][:TOP_PODS],
        "culprits": _culprits(pods),
        "antagonists": [
            _pod(pod.metrics) for pod in sorted(pods, key=lambda p: -p.metrics.cpu_ms_per_s)
        ][:TOP_PODS],
        "pod_metrics": [_pod(pod.metrics) | {"updated_at": pod.updated_at} for pod in pods],
    }


def _histogram(buckets: Sequence[int]) -> dict[str, Any]:
    samples = hist.total(buckets)
    return {
        "buckets": list(buckets),
        "slot_bounds": [list(hist.slot_bounds(slot)) for slot in range(len(buckets))],
        "samples": samples,
        "p50": hist.percentile(buckets, 0.5) if samples else None,
        "p99": hist.percentile(buckets, 0.99) if samples else None,
    }


def _pod(m: PodMetrics) -> dict[str, Any]:
    return {"pod": m.key, **dataclasses.asdict(m)}


def _victim(pod: PodRow) -> dict[str, Any]:
    m = pod.metrics
    return _pod(m) | {
        "mostly": m.contention().cause,
        "waited_behind": [{"pod": key, "ms_per_s": ms} for key, ms in m.culprits],
    }


def _culprits(pods: Sequence[PodRow]) -> list[dict[str, Any]]:
    """As :func:`interference_cli.views.culprit_table`: per culprit, the wait it caused
    summed over the pods that named it, and the pods it kept waiting, longest first."""
    return [
        {
            "culprit": key,
            "wait_caused_ms_per_s": total,
            "pods_kept_waiting": len(waiters),
            "kept_waiting": [
                {"pod": pod, "ms_per_s": ms} for ms, pod in sorted(waiters, reverse=True)
            ],
        }
        for key, total, waiters in ranked_culprits(pods)
    ]


def explain_document(records: PodRecords, now: float) -> dict[str, Any]:
    """``interference explain NS/POD``: the placement record and the rebalancing record,
    each ``null`` when Redis no longer holds it."""
    return {
        "placement": None
        if records.placement is None
        else decision_document(records.placement, now),
        "rebalancing": (
            None if records.rebalancing is None else decision_document(records.rebalancing, now)
        ),
    }


def _decision_or_none(decision: Decision | None, now: float) -> dict[str, Any] | None:
    return None if decision is None else decision_document(decision, now)


def decision_document(decision: Decision, now: float) -> dict[str, Any]:
    """One decision record: outcome, every candidate (verdict, reasons, scores, weights,
    weighted parts, total, details), the funnel, what the record left out, preemption, the
    run-queue tolerance as compared and the interference index the decision read."""
    return {
        "namespace": decision.namespace,
        "pod": decision.pod,
        "result": decision.result,
        "node": decision.node or None,
        "message": decision.message,
        "ts": decision.ts,
        "age_s": now - decision.ts,
        "dry_run": decision.dry_run,
        "candidates": [
            _candidate(c, decision.node)
            for c in sorted(decision.candidates, key=lambda c: (not c.passed, -c.total, c.node))
        ],
        "rejected_by_reason": dict(decision.rejected_by_reason),
        "funnel": [stage._asdict() for stage in decision.funnel],
        "funnel_line": funnel_line(decision) if decision.funnel else None,
        "omitted": dict(decision.omitted),
        "trace_id": decision.trace_id or None,
        "preemption": (
            None if decision.preemption is None else dataclasses.asdict(decision.preemption)
        ),
        "runq": None if decision.runq is None else _runq(decision, decision.runq, now),
        "interference_index": (
            None
            if decision.interference_index is None
            else dataclasses.asdict(decision.interference_index)
        ),
    }


def _runq(decision: Decision, check: RunqCheck, now: float) -> dict[str, Any]:
    """What the Interference filter compared, and for a pod no node passed, what to do."""
    unschedulable = decision.result == "unschedulable"
    nearest = check.measured_us.get(check.nearest) if check.nearest else None
    return {
        "tolerance_us": check.tolerance_us,
        "window": check.window,
        "measured_us": dict(check.measured_us),
        "nearest": check.nearest or None,
        "nearest_us": nearest,
        "raise_to_us": raise_to_us(check) if nearest is not None else None,
        "relax_at": check.relax_at if unschedulable else None,
        "relax_in_s": (
            max(0.0, check.relax_at - now) if unschedulable and check.relax_at is not None else None
        ),
        "never_relaxed": unschedulable and check.relax_at is None,
        "advice": runq_advice(check, now) if unschedulable else None,
    }


def _candidate(candidate: CandidateVerdict, chosen: str) -> dict[str, Any]:
    return {
        "node": candidate.node,
        "chosen": bool(chosen) and candidate.node == chosen,
        "passed": candidate.passed,
        "reasons": list(candidate.reasons),
        "scores": dict(candidate.scores),
        "weights": dict(candidate.weights),
        "weighted": {
            name: candidate.weights[name] * score
            for name, score in candidate.scores.items()
            if name in candidate.weights
        },
        "total": candidate.total if candidate.passed else None,
        "details": dict(candidate.details),
    }


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity ``null`` and every tuple a list."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
