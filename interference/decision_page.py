"""A picture of one scheduling decision: a self-contained HTML page (inline SVG and CSS,
no script, no external asset, so it opens offline) drawn from its decision record
(:class:`interference.decision.Decision`).

The page shows, top to bottom: the outcome and, for a pod no node passed for its
run-queue tolerance, **what to do** (the nearest node against the tolerance, when the pod
is relaxed or that it never is, how far to raise the tolerance); the **funnel** of nodes
through each filter in the order they ran (one bar per filter, its width the nodes left,
the first filter that removed nodes highlighted and, when none was left, the filter that
removed the last ones marked "failing filter"), ending with the chosen node or "none";
each recorded node's **run-queue p99 against the pod's tolerance** (a bar per node, the
tolerance a line, over the window the filter read: what it compared at the decision,
stored in the record); the finalists' **score parts** (weight × score per plugin as
stacked bars and, under them, each part named; the total at the end, the chosen node
marked); the rejected nodes with their reasons, the reason counts and how many nodes the
record leaves out; the **interference index the decision read** on each recorded node (a
bar per node, from the record: the scheduler's own index from the scheduling record, which
the index an agent publishes may not equal); the chosen node's **index as its agent
publishes it now**, read when the page is drawn, not at the decision (the node's report
stream: its last ``NODE_REPORTS_MAXLEN`` reports, about ten seconds; the simulator: the
trace's 300 s before the decision, said so), context only; and the trace id. It fits a
700 px wide window: the charts scale down with it.

Each number a reader may want back carries a stable attribute: a funnel stage is
``<g class="stage" data-stage=NAME data-in=N data-out=M data-mark=first-cut|failing>``,
the end of the funnel ``id="chosen" data-node=NODE``, a finalist ``data-node``
``data-total`` (its parts ``data-plugin`` ``data-part``), a run-queue bar
``class="runq" data-node data-runq-us data-over`` under ``id="runq-tolerance"
data-tolerance-us``, the advice ``id="advice" data-nearest data-raise-to-us
data-relax-at``, an index the decision read ``class="index-read" data-node
data-index`` under ``id="index-read" data-window``, a published index point ``data-ts``
``data-index``. Every string from the record
is escaped.

Size: over 500 lines because the page's sections share one layout (the label column, the
bar width, the row height, the style sheet) and one escaping rule; split, each would carry
a copy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape

from interference.decision import (
    CandidateVerdict,
    Decision,
    FunnelStage,
    raise_to_us,
    runq_advice,
)

__all__ = ["failing_stage", "first_cut_stage", "render_decision_page"]

WIDTH = 640
"""Width of the page's charts in CSS pixels: a 700 px window less the page's margins (a
narrower window scales them down)."""
_LABEL_W = 230
_BAR_W = WIDTH - _LABEL_W - 20
_FUNNEL_W = _BAR_W - 160
"""Widest funnel bar: room is left after it for the mark of a highlighted filter."""
_ROW_H = 30
_PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
    "#e15759",
)

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;
color:#1d1d1f;background:#fff;max-width:1000px;overflow-wrap:break-word}
td,th{overflow-wrap:anywhere}td.node{min-width:9em}td.num,th{white-space:nowrap}
svg{max-width:100%;height:auto}
.advice{border-left:4px solid #c62828;background:#fdf1f1;padding:8px 12px;margin:10px 0}
.runq.over .bar{fill:#e15759}.runq .bar{fill:#59a14f}
.tolerance{stroke:#1d1d1f;stroke-width:2;stroke-dasharray:5 3}
.part i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px}
h1{font-size:22px;margin:0 0 6px}h2{font-size:17px;margin:26px 0 8px;
border-bottom:1px solid #ddd;padding-bottom:4px}
.outcome{font-weight:600}.scheduled,.dry_run{color:#1a7f37}.unschedulable,
.bind_failed{color:#c62828}.muted{color:#666;font-size:13px}
svg text{font-family:inherit;font-size:13px;fill:#1d1d1f}
.stage .in{fill:#e8ecf1}.stage .out{fill:#4e79a7}
.stage.first-cut .out{fill:#f28e2b}.stage.failing .out,.stage.failing .in{fill:#f6d2d2}
.stage.failing .label{fill:#c62828;font-weight:700}
.stage.first-cut .label{font-weight:700}
.chosen-line{font-weight:700}
table{border-collapse:collapse;font-size:13px;margin-bottom:12px}td,th{border-bottom:1px solid #eee;
padding:3px 10px 3px 0;text-align:left;vertical-align:top}
.legend span{display:inline-block;margin-right:14px;font-size:13px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;
vertical-align:-1px}
.index-line{fill:none;stroke:#c62828;stroke-width:2}
.grid{stroke:#ddd;stroke-width:1}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px}
"""


def first_cut_stage(funnel: Sequence[FunnelStage]) -> FunnelStage | None:
    """The first filter that removed any node, ``None`` when every filter let all through."""
    return next((s for s in funnel if s.nodes_out < s.nodes_in), None)


def failing_stage(funnel: Sequence[FunnelStage]) -> FunnelStage | None:
    """The filter that removed the last nodes (``None`` unless the funnel ends empty)."""
    if not funnel or funnel[-1].nodes_out > 0:
        return None
    return next((s for s in funnel if s.nodes_in > 0 and s.nodes_out == 0), None)


def render_decision_page(
    decision: Decision,
    index_history: Sequence[tuple[float, float]] | None = None,
    *,
    history_note: str = "",
    history_before_decision: bool = False,
) -> str:
    """The whole HTML document for ``decision``. ``index_history`` is the chosen node's
    interference index as ``(unix time, 0–100)`` pairs, read now unless
    ``history_before_decision`` (a replayed trace's reports up to the decision); without
    one the page says it is not available. ``history_note`` says where the history came
    from (or why it is missing)."""
    e = escape
    title = f"{decision.namespace}/{decision.pod}"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(decision.ts))
    outcome = (
        f'<p><span class="outcome {e(decision.result)}" id="result" '
        f'data-result="{e(decision.result)}">{e(decision.result)}</span>'
        + (f" on <b>{e(decision.node)}</b>" if decision.node else "")
        + f' <span class="muted">at {e(when)}{", dry run" if decision.dry_run else ""}'
        "</span></p>"
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>decision {e(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Scheduling decision for {e(title)}</h1>",
        outcome,
        f'<p id="message">{e(_fit_message(decision))}</p>',
        _advice(decision),
        _preemption(decision),
        "<h2>Funnel: the nodes each filter let through</h2>",
        _funnel_svg(decision),
        _runq_chart(decision),
        "<h2>Finalists' scores</h2>",
        _scores_svg(decision),
        "<h2>Rejected nodes</h2>",
        _rejected(decision),
        _index_read_chart(decision),
        "<h2>Interference index of "
        + (e(decision.node) if decision.node else "the chosen node")
        + " as its agent publishes it"
        + (" before the decision" if history_before_decision else " now, not at the decision")
        + "</h2>",
        _index_chart(decision.node, index_history, history_note),
        "<h2>Trace</h2>",
        (
            f'<p>trace id <code id="trace" data-trace="{e(decision.trace_id)}">'
            f"{e(decision.trace_id)}</code></p>"
            if decision.trace_id
            else '<p class="muted" id="trace">no trace (tracing off or not sampled)</p>'
        ),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _fit_message(decision: Decision) -> str:
    """The record's message less the advice the page shows on its own (:func:`_advice`)."""
    if decision.runq is None:
        return decision.message
    return decision.message.removesuffix(" " + runq_advice(decision.runq, decision.ts))


def _advice(decision: Decision) -> str:
    """For a pod no node passed with a run-queue tolerance: what to do (nothing else)."""
    check = decision.runq
    if check is None or decision.result != "unschedulable":
        return ""
    e = escape
    nearest = check.nearest if check.nearest in check.measured_us else ""
    raise_to = f"{raise_to_us(check):.0f}" if nearest else ""
    relax_at = "" if check.relax_at is None else f"{check.relax_at:.3f}"
    return (
        f'<p class="advice" id="advice" data-nearest="{e(nearest)}" '
        f'data-raise-to-us="{raise_to}" data-relax-at="{relax_at}"><b>What to do:</b> '
        f"{e(runq_advice(check, decision.ts))}</p>"
    )


def _runq_chart(decision: Decision) -> str:
    """Each recorded node's run-queue p99 against the pod's tolerance, as the filter
    compared them at the decision (nothing for a pod without a run-queue tolerance)."""
    check = decision.runq
    if check is None:
        return ""
    e = escape
    heading = (
        "<h2>What decided: run-queue p99 against the pod's tolerance "
        f"({e(check.window)} window)</h2>"
    )
    measured = sorted(check.measured_us.items(), key=lambda item: (item[1], item[0]))
    if not measured:
        return heading + (
            '<p class="muted" id="runq-none">No recorded node had usable signals: the filter '
            "compared none.</p>"
        )
    top = max([check.tolerance_us] + [v for _, v in measured]) * 1.1 or 1.0
    scale = (_BAR_W - 90) / top
    rows = []
    for i, (node, value) in enumerate(measured):
        y = i * _ROW_H + 22
        over = value > check.tolerance_us
        mark = " ◀ nearest" if node == check.nearest else ""
        label = ("▶ " if node == decision.node else "") + node
        rows.append(
            f'<g class="runq{" over" if over else ""}" data-node="{e(node)}" '
            f'data-runq-us="{value:.1f}" data-over="{int(over)}">'
            f'<text x="0" y="{y + 19}">{e(_clipped(label))}</text>'
            f'<rect class="bar" x="{_LABEL_W}" y="{y + 5}" width="{max(1.0, value * scale):.1f}" '
            f'height="20"><title>{e(node)}: {value:.0f} µs</title></rect>'
            f'<text x="{_LABEL_W + value * scale + 6:.1f}" y="{y + 19}">{value:.0f} µs{mark}'
            "</text></g>"
        )
    x = _LABEL_W + check.tolerance_us * scale
    height = len(measured) * _ROW_H + 30
    svg = (
        f'<svg id="runq" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" '
        'aria-label="run-queue p99 of each node against the tolerance">'
        + "".join(rows)
        + f'<line class="tolerance" id="runq-tolerance" data-tolerance-us="{check.tolerance_us:g}"'
        f' x1="{x:.1f}" x2="{x:.1f}" y1="14" y2="{height}"/>'
        f'<text x="{x:.1f}" y="11" text-anchor="middle">tolerance {check.tolerance_us:g} µs'
        "</text></svg>"
    )
    caption = (
        '<p class="muted" id="runq-note">The run-queue p99 the Interference filter compared on '
        f"each node the record keeps (and the nearest), over its {e(check.window)} window, "
        "stored with the decision; red: above the pod's max-runq-p99-us, refused. "
        "▶ marks the chosen node.</p>"
    )
    return heading + svg + caption


def _index_read_chart(decision: Decision) -> str:
    """Each recorded node's interference index as the Interference plugin read it at the
    decision (nothing for a record without it: an interference-blind profile)."""
    read = decision.interference_index
    if read is None:
        return ""
    e = escape
    heading = f"<h2>What decided: the interference index read ({e(read.window)} window)</h2>"
    indices = sorted(read.by_node.items(), key=lambda item: (item[1], item[0]))
    if not indices:
        return heading + (
            '<p class="muted" id="index-read-none">No recorded node had usable signals: the '
            "plugin read no index.</p>"
        )
    scale = (_BAR_W - 60) / 100
    rows = []
    for i, (node, index) in enumerate(indices):
        y = i * _ROW_H + 4
        label = ("▶ " if node == decision.node else "") + node
        rows.append(
            f'<g class="index-read" data-node="{e(node)}" data-index="{index:.1f}">'
            f'<text x="0" y="{y + 19}">{e(_clipped(label))}</text>'
            f'<rect class="bar" x="{_LABEL_W}" y="{y + 5}" width="{max(1.0, index * scale):.1f}" '
            f'height="20" fill="#c62828"><title>{e(node)}: {index:.1f}</title></rect>'
            f'<text x="{_LABEL_W + index * scale + 6:.1f}" y="{y + 19}">{index:.1f}</text></g>'
        )
    height = len(indices) * _ROW_H + 10
    svg = (
        f'<svg id="index-read" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        'aria-label="interference index each node had at the decision" '
        f'data-window="{e(read.window)}">' + "".join(rows) + "</svg>"
    )
    caption = (
        '<p class="muted" id="index-read-note">Index 0 (quiet) – 100 (saturated) as the '
        "Interference plugin read it on each node the record keeps, over its "
        f"{e(read.window)} window, stored with the decision: the scheduler's own, from the "
        "node's scheduling record plus the load placed since, which the index an agent "
        "publishes may not equal. ▶ marks the chosen node.</p>"
    )
    return heading + svg + caption


def _clipped(label: str, most: int = 28) -> str:
    """A node name short enough for the chart's label column (the tables show it whole)."""
    return label if len(label) <= most else label[: most - 1] + "…"


def _preemption(decision: Decision) -> str:
    """Who the pod preempted and why that node (nothing when it preempted no one)."""
    record = decision.preemption
    if record is None:
        return ""
    e = escape
    victims = "".join(
        f"<li>{e(v)}{' (named antagonist)' if v in record.antagonists else ''}</li>"
        for v in record.victims
    )
    return (
        f'<h2>Preemption</h2><p id="preemption" data-node="{e(record.node)}">nominated to '
        f"<b>{e(record.node)}</b>: {e(record.why)} among {record.candidates} candidate "
        f"node(s), {record.pdb_violations} PodDisruptionBudget violation(s). Evicted:</p>"
        f'<ul id="victims">{victims}</ul>'
    )


def _funnel_svg(decision: Decision) -> str:
    e = escape
    funnel = decision.funnel
    if not funnel:
        return (
            '<p class="muted" id="funnel-empty">No filter ran: the record holds no funnel '
            "(the pod was refused before the filters, or the record is older than the "
            "funnel).</p>" + _chosen_line(decision, 0)
        )
    top = max(1, funnel[0].nodes_in)
    cut = first_cut_stage(funnel)
    failing = failing_stage(funnel)
    rows = []
    for i, stage in enumerate(funnel):
        y = i * _ROW_H
        mark = "failing" if stage is failing else ("first-cut" if stage is cut else "")
        w_in = max(1.0, _FUNNEL_W * stage.nodes_in / top) if stage.nodes_in else 0.0
        w_out = max(1.0, _FUNNEL_W * stage.nodes_out / top) if stage.nodes_out else 0.0
        note = {"failing": "failing filter", "first-cut": "first to remove nodes"}.get(mark, "")
        rows.append(
            f'<g class="stage {mark}" id="stage-{i}" data-stage="{e(stage.name)}" '
            f'data-in="{stage.nodes_in}" data-out="{stage.nodes_out}" data-mark="{mark}">'
            f'<text class="label" x="0" y="{y + 19}">{e(stage.name)}: '
            f"{stage.nodes_in:,} → {stage.nodes_out:,}</text>"
            f'<rect class="in" x="{_LABEL_W}" y="{y + 5}" width="{w_in:.1f}" height="20"/>'
            f'<rect class="out" x="{_LABEL_W}" y="{y + 5}" width="{w_out:.1f}" height="20"/>'
            + (
                f'<text class="label note" x="{_LABEL_W + max(w_in, w_out) + 8:.1f}" '
                f'y="{y + 19}">◀ {note}</text>'
                if note
                else ""
            )
            + "</g>"
        )
    height = len(funnel) * _ROW_H + 4
    svg = (
        f'<svg id="funnel" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        'aria-label="funnel of nodes through the filters">' + "".join(rows) + "</svg>"
    )
    legend = (
        '<p class="muted">Bar width: nodes left out of '
        f"{funnel[0].nodes_in:,} (pale: nodes the filter was given). "
        + (
            f"First to remove nodes: <b>{e(cut.name)}</b>. "
            if cut
            else "No filter removed a node. "
        )
        + (f'Failing filter: <b class="unschedulable">{e(failing.name)}</b>.' if failing else "")
        + "</p>"
    )
    return svg + legend + _chosen_line(decision, funnel[-1].nodes_out)


def _chosen_line(decision: Decision, left: int) -> str:
    e = escape
    if decision.node:
        return (
            f'<p class="chosen-line" id="chosen" data-node="{e(decision.node)}">'
            f"→ chosen: {e(decision.node)}</p>"
        )
    if decision.result in ("filtered", "prioritized"):
        what = f"{left:,} node(s) handed back to kube-scheduler, which picks"
    else:
        what = "none"
    return f'<p class="chosen-line" id="chosen" data-node="">→ chosen: {e(what)}</p>'


def _scores_svg(decision: Decision) -> str:
    e = escape
    finalists = sorted(
        (c for c in decision.candidates if c.passed), key=lambda c: (-c.total, c.node)
    )
    if not finalists:
        return '<p class="muted" id="scores-empty">No node passed every filter.</p>'
    plugins = sorted({p for c in finalists for p in c.scores})
    colour = {p: _PALETTE[i % len(_PALETTE)] for i, p in enumerate(plugins)}
    parts_of = {c.node: _weighted_parts(c, plugins) for c in finalists}
    widest = max([sum(parts_of[c.node].values()) for c in finalists] + [c.total for c in finalists])
    scale = (_BAR_W - 70) / widest if widest > 0 else 0.0
    rows = []
    for i, cand in enumerate(finalists):
        y = i * _ROW_H
        chosen = cand.node == decision.node
        label = ("▶ " if chosen else "") + cand.node
        x = float(_LABEL_W)
        segments = []
        for plugin, part in parts_of[cand.node].items():
            w = part * scale
            segments.append(
                f'<rect data-plugin="{e(plugin)}" data-part="{part:.2f}" x="{x:.1f}" '
                f'y="{y + 5}" width="{w:.1f}" height="20" fill="{colour[plugin]}">'
                f"<title>{e(plugin)}: {_part_text(cand, plugin)}</title></rect>"
            )
            x += w
        rows.append(
            f'<g class="finalist{" chosen" if chosen else ""}" data-node="{e(cand.node)}" '
            f'data-total="{cand.total:.2f}"><text x="0" y="{y + 19}"'
            + (' font-weight="700"' if chosen else "")
            + f">{e(_clipped(label))}</text>"
            + "".join(segments)
            + f'<text x="{x + 6:.1f}" y="{y + 19}">{cand.total:.1f}</text></g>'
        )
    height = len(finalists) * _ROW_H + 4
    svg = (
        f'<svg id="scores" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        'aria-label="score parts">' + "".join(rows) + "</svg>"
    )
    weighted = any(c.weights for c in finalists)
    legend = (
        '<p class="legend">'
        + "".join(f'<span><i style="background:{colour[p]}"></i>{e(p)}</span>' for p in plugins)
        + "</p>"
        + '<p class="muted">'
        + (
            "Each part is weight × score (score 0–100); the number at the end is the total "
            "the node was ranked by. ▶ marks the chosen node."
            if weighted
            else "The record holds no weights: each part is the plugin's score; the number "
            "at the end is the total the node was ranked by. ▶ marks the chosen node."
        )
        + "</p>"
    )
    return svg + legend + _parts_table(finalists, decision.node, colour)


def _parts_table(finalists: Sequence[CandidateVerdict], chosen: str, colour: dict[str, str]) -> str:
    """Each finalist's score parts named, weight × score = part (HTML, so it wraps in a
    narrow window where the bars above cannot carry the names)."""
    e = escape
    rows = []
    for cand in finalists:
        parts = ", ".join(
            f'<span class="part" data-plugin="{e(plugin)}"><i style="background:'
            f'{colour[plugin]}"></i>{e(plugin)} {e(_part_text(cand, plugin))}</span>'
            for plugin in sorted(cand.scores)
        )
        mark = "▶ " if cand.node == chosen else ""
        rows.append(
            f'<tr data-node="{e(cand.node)}"><td class="node">{mark}{e(cand.node)}</td>'
            f'<td>{parts}</td><td class="num">{cand.total:.1f}</td></tr>'
        )
    return (
        '<table id="score-parts"><tr><th>node</th><th>parts (weight × score = part)</th>'
        "<th>total</th></tr>" + "".join(rows) + "</table>"
    )


def _weighted_parts(cand: CandidateVerdict, plugins: Sequence[str]) -> dict[str, float]:
    out = {}
    for plugin in plugins:
        if plugin in cand.scores:
            weight = cand.weights.get(plugin, 1.0) if cand.weights else 1.0
            out[plugin] = max(0.0, weight * cand.scores[plugin])
    return out


def _part_text(cand: CandidateVerdict, plugin: str) -> str:
    score = cand.scores[plugin]
    if plugin in cand.weights:
        weight = cand.weights[plugin]
        return f"{weight:g} × {score:.1f} = {weight * score:.1f}"
    return f"{score:.1f}"


def _rejected(decision: Decision) -> str:
    e = escape
    rejected = [c for c in decision.candidates if not c.passed]
    out = []
    if rejected:
        out.append('<table id="rejected"><tr><th>node</th><th>reasons</th></tr>')
        for cand in rejected:
            reasons = "; ".join(cand.reasons) or "rejected"
            out.append(
                f'<tr data-node="{e(cand.node)}"><td class="node">{e(cand.node)}</td>'
                f"<td>{e(reasons)}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append('<p class="muted" id="rejected">The record lists no rejected node.</p>')
    feasible = decision.omitted.get("feasible", 0)
    more_rejected = decision.omitted.get("rejected", 0)
    if feasible or more_rejected:
        said = " and ".join(
            text
            for count, text in (
                (feasible, f"{feasible:,} more feasible"),
                (more_rejected, f"{more_rejected:,} more rejected"),
            )
            if count
        )
        out.append(
            f'<p class="muted" id="omitted" data-feasible="{feasible}" '
            f'data-rejected="{more_rejected}">{said} node(s) omitted: the record keeps the '
            "best and the first rejected (cycle.record_top_k of each).</p>"
        )
    if decision.rejected_by_reason:
        out.append('<table id="reasons"><tr><th>nodes</th><th>rejected because</th></tr>')
        for reason, count in sorted(decision.rejected_by_reason.items(), key=lambda kv: -kv[1]):
            out.append(
                f'<tr data-reason="{e(reason)}" data-count="{count}"><td class="num">{count:,}</td>'
                f"<td>{e(reason)}</td></tr>"
            )
        out.append("</table>")
    return "".join(out)


def _index_chart(node: str, history: Sequence[tuple[float, float]] | None, note: str) -> str:
    e = escape
    points = sorted(history or ())
    if not node:
        return '<p class="muted" id="index-none">No node was chosen.</p>'
    if not points:
        why = note or (
            "Not available offline: the record holds no history of the node's index "
            "(interference explain --html reads it from the node's report stream)."
        )
        return f'<p class="muted" id="index-none">{e(why)}</p>'
    width, height, left, top, bottom = WIDTH, 220, 50, 10, 30
    plot_w, plot_h = width - left - 20, height - top - bottom
    t0, t1 = points[0][0], points[-1][0]
    span = max(t1 - t0, 1.0)

    def xy(ts: float, index: float) -> tuple[float, float]:
        x = left + plot_w * ((ts - t0) / span if t1 > t0 else 1.0)
        y = top + plot_h * (1 - min(100.0, max(0.0, index)) / 100)
        return x, y

    grid = []
    for level in (0, 20, 50, 100):
        _, y = xy(t0, level)
        grid.append(
            f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{level}</text>'
        )
    coords = [xy(ts, index) for ts, index in points]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
    dots = "".join(
        f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="#c62828" '
        f'data-ts="{ts:.3f}" data-index="{index:.1f}"><title>{index:.1f}</title></circle>'
        for (x, y), (ts, index) in zip(coords, points, strict=True)
    )
    axis = (
        f'<text x="{left}" y="{height - 8}">−{t1 - t0:.0f} s</text>'
        f'<text x="{left + plot_w}" y="{height - 8}" text-anchor="end">latest report</text>'
    )
    svg = (
        f'<svg id="index" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="interference index over time" '
        f'data-span-s="{t1 - t0:.1f}">'
        + "".join(grid)
        + f'<polyline class="index-line" points="{line}"/>'
        + dots
        + axis
        + "</svg>"
    )
    caption = note or f"{len(points)} report(s) covering {t1 - t0:.0f} s."
    return (
        svg
        + f'<p class="muted" id="index-note">Index 0 (quiet) – 100 (saturated). {e(caption)}</p>'
    )
