"""A picture of one scheduling decision: a self-contained HTML page (inline SVG and CSS,
no script, no external asset, so it opens offline) drawn from its decision record
(:class:`interference.decision.Decision`).

The page shows, top to bottom: the outcome; the **funnel** of nodes through each filter
in the order they ran (one bar per filter, its width the nodes left, the first filter
that removed nodes highlighted and, when none was left, the filter that removed the last
ones marked "failing filter"), ending with the chosen node or "none"; the finalists'
**score parts** (weight × score per plugin as stacked bars, the total at the end, the
chosen node marked); the rejected nodes with their reasons, the reason counts and how
many nodes the record leaves out; the chosen node's **interference index** over the
reports given (the node's report stream: its last ``NODE_REPORTS_MAXLEN`` reports, about
ten seconds; the simulator: the trace's 300 s before the decision); and the trace id.

Each number a reader may want back carries a stable attribute: a funnel stage is
``<g class="stage" data-stage=NAME data-in=N data-out=M data-mark=first-cut|failing>``,
the end of the funnel ``id="chosen" data-node=NODE``, a finalist ``data-node``
``data-total`` (its parts ``data-plugin`` ``data-part``), an index point ``data-ts``
``data-index``. Every string from the record is escaped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape

from interference.decision import CandidateVerdict, Decision, FunnelStage

__all__ = ["failing_stage", "first_cut_stage", "render_decision_page"]

WIDTH = 960
"""Width of the page's charts in CSS pixels."""
_LABEL_W = 330
_BAR_W = WIDTH - _LABEL_W - 20
_FUNNEL_W = _BAR_W - 170
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
color:#1d1d1f;background:#fff;max-width:1000px}
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
) -> str:
    """The whole HTML document for ``decision``. ``index_history`` is the chosen node's
    interference index as ``(unix time, 0–100)`` pairs; without one the page says it is
    not available. ``history_note`` says where the history came from (or why it is
    missing)."""
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
        f'<p id="message">{e(decision.message)}</p>',
        _preemption(decision),
        "<h2>Funnel: the nodes each filter let through</h2>",
        _funnel_svg(decision),
        "<h2>Finalists' scores</h2>",
        _scores_svg(decision),
        "<h2>Rejected nodes</h2>",
        _rejected(decision),
        "<h2>Interference index of "
        + (e(decision.node) if decision.node else "the chosen node")
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
        f'height="{height}" role="img" aria-label="funnel of nodes through the filters">'
        + "".join(rows)
        + "</svg>"
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
            + f">{e(label)}</text>"
            + "".join(segments)
            + f'<text x="{x + 6:.1f}" y="{y + 19}">{cand.total:.1f}</text></g>'
        )
    svg = (
        f'<svg id="scores" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{len(finalists) * _ROW_H + 4}" role="img" aria-label="score parts">'
        + "".join(rows)
        + "</svg>"
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
    return svg + legend


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
                f'<tr data-node="{e(cand.node)}"><td>{e(cand.node)}</td><td>{e(reasons)}</td></tr>'
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
            "best and the first rejected (engine.record_top_k of each).</p>"
        )
    if decision.rejected_by_reason:
        out.append('<table id="reasons"><tr><th>nodes</th><th>rejected because</th></tr>')
        for reason, count in sorted(decision.rejected_by_reason.items(), key=lambda kv: -kv[1]):
            out.append(
                f'<tr data-reason="{e(reason)}" data-count="{count}"><td>{count:,}</td>'
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
        f'height="{height}" role="img" aria-label="interference index over time" '
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
