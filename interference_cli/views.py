"""Rich renderings of what the store holds: node ranking, one node, one pod's decision
records.

Every name and message from the store (nodes, pods, namespaces, plugins, reasons,
messages, windows, histograms) goes in as :func:`interference_cli.plain.text`: printed
as text, never as rich markup or terminal control sequences."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from interference import hist, keys
from interference.decision import (
    CandidateVerdict,
    Decision,
    PreemptionRecord,
    RunqCheck,
    relax_text,
)
from interference.signals import WindowMetrics
from interference_cli.plain import plain, text
from interference_cli.store_model import NodeDetail, NodeRow, PodRecords, PodRow

BAR_WIDTH = 40
"""Characters of the longest histogram bar."""

TOP_PODS = 5
"""Victim, culprit and antagonist pods listed per node."""
CULPRITS_SHOWN = 2
"""Culprits named beside each victim."""


def side_by_side(title: str, sides: tuple[str, str], rows: Sequence[tuple[str, str, str]]) -> Table:
    """Two schedulers' figures for one pod: each row a label and one value per side
    (``make demo`` and ``make demo-cluster``)."""
    table = Table(title=title)
    table.add_column("")
    for side in sides:
        table.add_column(side, justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def top_table(rows: Sequence[NodeRow], now: float, source: str) -> Table:
    """Nodes ranked by interference index (0 quiet – 100 saturated) with the key metrics;
    ``degraded`` (a core signal family not measured) and ``stale`` nodes marked. ``index``
    is the scheduler's (its ranking) where it ranks the node, else the agent's own
    (``agent index``)."""
    table = Table(title=text(f"interference by node — {source}"), title_justify="left")
    for name in ("node", "index", "agent index", "runq p99 µs", "wait ratio", "reclaim ms/s"):
        table.add_column(name, justify="left" if name == "node" else "right")
    for name in ("throttled ms/s", "psi cpu %", "psi mem %", "pods", "age s", "state"):
        table.add_column(name, justify="right" if name != "state" else "left")
    for row in rows:
        age = row.age_s(now)
        age_text = "—" if age == float("inf") else f"{age:.1f}"
        state = text(row.state, style=_STATE_STYLES.get(row.state, "bold red"))
        m = row.metrics
        ranked = row.scheduler_index
        index = Text("—") if ranked is None else Text(f"{ranked:.1f}", style=_index_style(ranked))
        if m is None:
            table.add_row(
                text(row.node), index, *["—"] * 8, age_text, Text("stale (expired)", style="red")
            )
            continue
        table.add_row(
            text(row.node),
            index if ranked is not None else Text(f"{m.interference_index:.1f}", style="dim"),
            Text(f"{m.interference_index:.1f}", style=_index_style(m.interference_index)),
            f"{m.runq_p99_us:.0f}",
            f"{m.runq_wait_ratio:.3f}",
            f"{m.reclaim_stall_ms_per_s:.2f}",
            f"{m.throttled_ms_per_s:.1f}",
            f"{m.psi_cpu_some:.1f}",
            f"{m.psi_mem_some:.1f}",
            str(row.pod_count),
            age_text,
            state,
        )
    return table


def node_view(detail: NodeDetail, now: float) -> RenderableType:
    """A node's metrics, its histograms as bars, its top victims (with whom they waited
    behind and why), the culprits, and the pods using the most CPU."""
    row = detail.row
    assert row.metrics is not None  # node_detail raises for expired nodes
    state = row.state.upper() if row.stale else "ok"
    metrics = Table(
        title=text(
            f"node {row.node} — {state}, report {row.age_s(now):.1f} s old, "
            f"interval {row.interval_s:g} s, {row.pod_count} pods"
        ),
        title_justify="left",
        show_header=False,
    )
    metrics.add_column("metric")
    metrics.add_column("value", justify="right")
    for name in type(row.metrics).__dataclass_fields__:
        metrics.add_row(name, f"{getattr(row.metrics, name):g}")
    parts: list[RenderableType] = [metrics]
    if row.scheduler_index is not None:
        parts.append(Text(f"scheduler's interference index: {row.scheduler_index:.1f}"))
    parts.append(text(f"measured: {', '.join(row.measured) or 'nothing'}"))
    if detail.disabled_probes:
        parts.append(text(f"disabled probes: {detail.disabled_probes}", style="yellow"))
    if detail.windows:
        parts.append(window_table(detail.windows))
    for name, buckets in detail.histograms.items():
        parts.append(histogram_table(name, buckets))
    parts.append(
        victim_table(sorted(detail.pods, key=lambda p: -p.metrics.runq_wait_ms_per_s)[:TOP_PODS])
    )
    parts.append(culprit_table(detail.pods))
    parts.append(
        pod_table(
            "antagonists (most CPU)",
            sorted(detail.pods, key=lambda p: -p.metrics.cpu_ms_per_s)[:TOP_PODS],
        )
    )
    return Group(*parts)


def victim_table(pods: Sequence[PodRow]) -> Table:
    """Pods that waited the most, with whose tasks they waited behind and what the wait
    was mostly down to (:func:`interference.contention.contention_shares`): ``neighbours``,
    or the pod's own doing (``own_limit``: its CFS quota; ``own_tasks``: its own threads)."""
    table = Table(title="victims (most run-queue wait)", title_justify="left")
    table.add_column("pod")
    table.add_column("qos")
    for name in ("runq wait ms/s", "runq p99 µs", "behind neighbours ms/s", "throttled ms/s"):
        table.add_column(name, justify="right")
    table.add_column("mostly")
    table.add_column("waited behind (ms/s)")
    for pod in pods:
        m = pod.metrics
        cause = m.contention().cause
        table.add_row(
            text(m.key),
            text(m.qos or "—"),
            f"{m.runq_wait_ms_per_s:.2f}",
            f"{m.runq_p99_us:.0f}",
            f"{m.neighbour_wait_ms_per_s:.2f}",
            f"{m.throttled_ms_per_s:.1f}",
            Text(cause, style="bold red" if cause == "neighbours" else ""),
            text(", ".join(f"{key} {ms:.1f}" for key, ms in m.culprits[:CULPRITS_SHOWN]) or "—"),
        )
    return table


def ranked_culprits(
    pods: Sequence[PodRow],
) -> list[tuple[str, float, list[tuple[float, str]]]]:
    """The :data:`TOP_PODS` culprits causing the most wait: each with the run-queue wait it
    caused summed over the pods that named it (from each pod's
    :data:`~interference.signals.TOP_CULPRITS`) and those pods, (ms/s, pod key) each."""
    caused: dict[str, float] = {}
    waiters: dict[str, list[tuple[float, str]]] = {}
    for pod in pods:
        for key, ms in pod.metrics.culprits:
            caused[key] = caused.get(key, 0.0) + ms
            waiters.setdefault(key, []).append((ms, pod.metrics.key))
    ranked = sorted(caused.items(), key=lambda item: (-item[1], item[0]))[:TOP_PODS]
    return [(key, total, waiters[key]) for key, total in ranked]


def culprit_table(pods: Sequence[PodRow]) -> RenderableType:
    """Whose tasks held the CPU while other pods waited: per culprit, the run-queue wait
    it caused summed over the pods that named it, how many pods, and the one it kept
    waiting longest (:func:`ranked_culprits`)."""
    culprits = ranked_culprits(pods)
    if not culprits:
        return Text("culprits: no pod waited behind another this interval", style="dim")
    table = Table(
        title="culprits (whose tasks held the CPU while pods waited)", title_justify="left"
    )
    table.add_column("culprit")
    for name in ("wait caused ms/s", "pods kept waiting"):
        table.add_column(name, justify="right")
    table.add_column("longest kept waiting")
    for key, total, waiters in culprits:
        longest_ms, longest = max(waiters)
        table.add_row(
            text(key), f"{total:.1f}", str(len(waiters)), text(f"{longest} ({longest_ms:.1f})")
        )
    return table


def window_table(windows: Mapping[str, WindowMetrics]) -> Table:
    """The windowed signals side by side: run-queue p99 of the merged histogram, and
    mean / max / σ of the interference index, wait ratio and reclaim stall."""
    table = Table(title="windows (mean / max / σ per interval)", title_justify="left")
    table.add_column("window")
    for name in ("intervals", "runq p99 µs", "index", "wait ratio", "reclaim ms/s"):
        table.add_column(name, justify="right")
    for name, w in sorted(windows.items(), key=lambda item: item[1].span_s):
        table.add_row(
            text(name),
            str(w.intervals),
            f"{w.runq_p99_us:.0f}",
            f"{w.index_mean:.1f} / {w.index_max:.1f} / {w.index_stddev:.1f}",
            f"{w.runq_wait_ratio_mean:.3f} / {w.runq_wait_ratio_max:.3f} / "
            f"{w.runq_wait_ratio_stddev:.3f}",
            f"{w.reclaim_stall_ms_per_s_mean:.2f} / {w.reclaim_stall_ms_per_s_max:.2f} / "
            f"{w.reclaim_stall_ms_per_s_stddev:.2f}",
        )
    return table


def histogram_table(name: str, buckets: Sequence[int]) -> RenderableType:
    """A log2 histogram drawn as bars, from the first to the last non-empty slot."""
    used = [i for i, count in enumerate(buckets) if count > 0]
    if not used:
        return text(f"{name}: no samples this interval", style="dim")
    unit = plain(name.rsplit("_", 1)[-1] if "_" in name else "")
    p50 = hist.percentile(buckets, 0.5)
    p99 = hist.percentile(buckets, 0.99)
    table = Table(
        title=text(
            f"{name}: {hist.total(buckets)} samples, p50 ≈ {p50:.0f} {unit}, p99 ≈ {p99:.0f} {unit}"
        ),
        title_justify="left",
        show_edge=False,
    )
    table.add_column(text(f"range {unit}"), justify="right")
    table.add_column("count", justify="right")
    table.add_column("distribution")
    peak = max(buckets)
    for slot in range(used[0], used[-1] + 1):
        lo, hi = hist.slot_bounds(slot)
        count = buckets[slot]
        width = round(BAR_WIDTH * count / peak) if count else 0
        table.add_row(f"{lo} – {hi}", str(count), Text("█" * max(width, 1 if count else 0)))
    return table


def pod_table(title: str, pods: Sequence[PodRow]) -> Table:
    """Pods with their per-pod metrics."""
    table = Table(title=title, title_justify="left")
    table.add_column("pod")
    table.add_column("qos")
    for name in ("cpu ms/s", "runq wait ms/s", "runq p99 µs", "reclaim ms/s", "throttled ms/s"):
        table.add_column(name, justify="right")
    for pod in pods:
        m = pod.metrics
        table.add_row(
            text(m.key),
            text(m.qos or "—"),
            f"{m.cpu_ms_per_s:.1f}",
            f"{m.runq_wait_ms_per_s:.2f}",
            f"{m.runq_p99_us:.0f}",
            f"{m.reclaim_stall_ms_per_s:.2f}",
            f"{m.throttled_ms_per_s:.1f}",
        )
    return table


def decision_view(decision: Decision, now: float, when: str | None = None) -> RenderableType:
    """The decision record: outcome, chosen node, and every candidate's verdicts and scores
    (``when`` replaces the record's age, e.g. for a simulated decision)."""
    header = Text()
    header.append(plain(f"{decision.namespace}/{decision.pod}: "), style="bold")
    header.append(
        plain(decision.result), style="green" if decision.result == "scheduled" else "red"
    )
    if decision.node:
        header.append(plain(f" on {decision.node}"), style="bold")
    age = when if when is not None else f"{now - decision.ts:.0f} s ago"
    header.append(plain(f" ({age}{', dry run' if decision.dry_run else ''})"))
    plugins = sorted({name for c in decision.candidates for name in c.scores})
    weights = {name: w for c in decision.candidates for name, w in c.weights.items()}
    table = Table(title="candidates", title_justify="left")
    table.add_column("node")
    table.add_column("filters")
    for name in plugins:
        column = f"{name} ×{weights[name]:g}" if name in weights else name
        table.add_column(text(column), justify="right")
    table.add_column("total" + (" = Σ weighted" if weights else ""), justify="right")
    details = sorted({key for c in decision.candidates for key in c.details})
    for key in details:
        table.add_column(text(key))
    ranked = sorted(decision.candidates, key=lambda c: (not c.passed, -c.total, c.node))
    for cand in ranked:
        chosen = cand.node == decision.node
        verdict = (
            Text("pass", style="green")
            if cand.passed
            else text("; ".join(cand.reasons) or "rejected", style="red")
        )
        table.add_row(
            text(("▶ " if chosen else "  ") + cand.node, style="bold" if chosen else ""),
            verdict,
            *[_score_cell(cand, n) for n in plugins],
            f"{cand.total:.1f}" if cand.passed else "—",
            *[text(cand.details.get(key, "—")) for key in details],
        )
    parts: list[RenderableType] = [header, text(decision.message)]
    if decision.runq is not None:
        parts.append(text(runq_line(decision.runq)))
        if decision.result == "unschedulable":
            parts.append(text(f"now: {relax_text(decision.runq, now)}", style="yellow"))
    if decision.preemption is not None:
        parts.append(text(preemption_line(decision.preemption), style="yellow"))
    if decision.funnel:
        parts.append(text("funnel: " + funnel_line(decision)))
    parts.append(table)
    left_out = [
        f"{count} more {kind}" for kind, count in sorted(decision.omitted.items()) if count > 0
    ]
    if left_out:
        parts.append(
            text(
                f"… {' and '.join(left_out)} node(s) not listed: the record keeps the best"
                " and the first rejected (cycle.record_top_k of each)",
                style="dim",
            )
        )
    if weights:
        parts.append(
            text(
                "total = Σ weight × score (0–100 each): "
                + ", ".join(f"{name} ×{w:g}" for name, w in sorted(weights.items()))
            )
        )
    parts += [text(f"  {line}", style="dim") for line in _score_legend(plugins)]
    if decision.rejected_by_reason:
        rejected = ", ".join(
            f"{count} {reason}" for reason, count in sorted(decision.rejected_by_reason.items())
        )
        parts.append(text(f"rejected: {rejected}", style="red"))
    if decision.trace_id:
        parts.append(text(f"trace: {decision.trace_id}"))
    return Group(*parts)


def runq_line(check: RunqCheck) -> str:
    """``run-queue p99 against the tolerance 500 µs (10s window): b 480 µs, a 2900 µs ✗``:
    what the Interference filter compared, lowest first, the nearest node marked."""
    measured = sorted(check.measured_us.items(), key=lambda item: (item[1], item[0]))
    nodes = ", ".join(
        f"{node} {value:.0f} µs"
        + (" ✗" if value > check.tolerance_us else "")
        + (" (nearest)" if node == check.nearest else "")
        for node, value in measured
    )
    return (
        f"run-queue p99 against the tolerance {check.tolerance_us:g} µs ({check.window} "
        f"window, at the decision): {nodes or 'no node with usable signals recorded'}"
    )


def preemption_line(record: PreemptionRecord) -> str:
    """What preemption did: the nominated node, the victims and why that node."""
    victims = ", ".join(record.victims) or "none"
    named = f"; named antagonists: {', '.join(record.antagonists)}" if record.antagonists else ""
    return (
        f"preemption: nominated to {record.node}, evicting {victims} — {record.why}"
        f" ({record.candidates} candidate node(s), {record.pdb_violations} PDB violation(s)"
        f"{named})"
    )


def explain_view(records: PodRecords, now: float) -> RenderableType:
    """``interference explain``: the placement record (:func:`decision_view`), then the
    rebalancing record when there is one (:func:`rebalancing_view`); when only that one is
    left, a line saying the placement record is gone."""
    parts: list[RenderableType] = []
    if records.placement is not None:
        parts.append(decision_view(records.placement, now))
    elif records.rebalancing is not None:
        gone = records.rebalancing
        parts.append(
            text(
                f"{gone.namespace}/{gone.pod}: the placement record is gone (kept"
                f" {keys.DECISION_TTL_S // 3600} h): why the pod was placed where it is"
                " cannot be shown",
                style="yellow",
            )
        )
    if records.rebalancing is not None:
        parts.append(rebalancing_view(records.rebalancing, now))
    return Group(*parts)


def rebalancing_view(record: Decision, now: float) -> RenderableType:
    """The rebalancer's latest look at a running pod: its result, the node it found, when,
    whether it was a dry run, its message and trace."""
    header = Text()
    header.append("\nrebalancing record, the rebalancer's latest look: ", style="bold")
    header.append(plain(record.result), style="yellow" if record.dry_run else "red")
    header.append(plain(f", found {record.node}" if record.node else ", no node found"))
    age = f"{now - record.ts:.0f} s ago"
    header.append(plain(f" ({age}, {'dry run' if record.dry_run else 'not a dry run'})"))
    parts: list[RenderableType] = [header, text(record.message)]
    if record.trace_id:
        parts.append(text(f"trace: {record.trace_id}"))
    return Group(*parts)


def funnel_line(decision: Decision) -> str:
    """``5000 nodes → 212 after NodeResourcesFit → 3 after Interference → chosen n7``: the
    filters that removed nodes, in the order they ran."""
    first = decision.funnel[0].nodes_in
    steps = [f"{first} nodes"]
    steps += [
        f"{stage.nodes_out} after {stage.name}"
        for stage in decision.funnel
        if stage.nodes_out != stage.nodes_in
    ]
    if decision.node:
        steps.append(f"chosen {decision.node}")
    elif decision.result in ("filtered", "prioritized"):
        steps.append("kube-scheduler picks")
    elif decision.funnel[-1].nodes_out == 0:
        steps.append("none left")
    return " → ".join(steps)


def _score_legend(plugins: Sequence[str]) -> list[str]:
    """``Name: what it prefers`` for each score plugin of the record the scheduler knows."""
    # the scheduler's plugins pull in numpy: only explaining a decision needs them
    from scheduler.plugins.registry import REGISTRY

    known = [(name, REGISTRY.score_named(name)) for name in plugins]
    return [f"{name}: {plugin.explain}" for name, plugin in known if plugin is not None]


def _score_cell(candidate: CandidateVerdict, plugin: str) -> str:
    """``score`` or, when the record carries the weight, ``score → weighted part``."""
    if plugin not in candidate.scores:
        return "—"
    score = candidate.scores[plugin]
    weight = candidate.weights.get(plugin)
    return f"{score:.1f}" if weight is None else f"{score:.1f} → {weight * score:.1f}"


_STATE_STYLES = {"ok": "green", "degraded": "bold yellow", "stale": "bold red"}


def _index_style(index: float) -> str:
    """Red from an interference index of 50, yellow from 20."""
    if index >= 50:
        return "bold red"
    if index >= 20:
        return "yellow"
    return "green"
