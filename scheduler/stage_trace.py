"""What a traced scheduling attempt hands the trace exporter: its stages, as plain tuples.

The scheduling cycle notes each stage it runs — PreFilter, each Filter with the nodes in
and out and its reasons counted, each Score, the selection — with wall-clock
nanoseconds, only when the attempt is sampled (:class:`StageRecorder`). It notes them raw,
as references to what the cycle computed anyway (the funnel, the rejection counts, the
ranked candidates) in plain tuples: :func:`expand` turns them into one
:class:`StageNote` per span, in the exporter process. Formatting span names and
attributes on the scheduling thread cost about a quarter of a 1,000-node decision
(docs/BENCHMARKS.md, tracing on vs off). The spans themselves are built by the
OpenTelemetry SDK in the exporter process (:mod:`scheduler.adapters.tracing`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

AttributeValue = str | int | float | bool
Attributes = dict[str, AttributeValue]
PREFILTER = "prefilter"
NODE_FILTER = "node_filter"
SCORE_RANKING = "score_ranking"
SELECTION = "selection"
BIND = "bind"
"""``decision_stage`` attribute values, one per kind of span."""


class StageNote(NamedTuple):
    """One stage of an attempt: a child span of the attempt's root span (a tuple, so
    handing it to the exporter process is a C-level copy, not a field-by-field one)."""

    name: str
    stage: str
    start_ns: int
    end_ns: int
    attributes: Attributes


_NOTE = 0
_FILTERS = 1
_SCORE = 2
_SELECTION = 3
"""The kinds of a recorder's raw parts (the first item of each)."""

Part = tuple[Any, ...]
"""A raw part: a kind, then plain values (picklable, no numpy, no plugin objects)."""


@dataclass(slots=True)
class StageRecorder:
    """The stages of one sampled attempt, in the order they ran, as raw parts."""

    trace_id: int
    """128-bit trace id (the decision record holds it as 32 hex digits)."""
    root_span_id: int
    """64-bit id of the attempt's root span (bind spans name it as their parent)."""
    parts: list[Part] = field(default_factory=list)

    @property
    def trace_hex(self) -> str:
        return f"{self.trace_id:032x}"

    def note(
        self, name: str, stage: str, start_ns: int, attributes: Attributes | None = None
    ) -> None:
        """A stage that started at ``start_ns`` and ends now (``attributes`` is kept, not
        copied: pass a dict of the stage's own)."""
        self.parts.append((_NOTE, name, stage, start_ns, time.time_ns(), attributes or {}))

    def note_filters(
        self,
        funnel: Iterable[tuple[str, int, int]],
        timings: dict[str, tuple[int, int]],
        found: Iterable[tuple[dict[str, int], Iterable[tuple[str, tuple[str, ...]]]]],
    ) -> None:
        """The Filter stage: each filter's (name, nodes in, nodes out) in order, its
        (start, end) in ``timings``, and per set of rejections its reason counts with the
        (filter, reasons) of each filter in it that rejected a node.

        Kept compact, since the part is pickled in this process: a span only for a filter
        that rejected a node (one rejected by a later filter only counts for the first
        that rejected it, so such a filter always lets fewer nodes out than in), and the
        others' names joined in one string."""
        funnel = tuple(funnel)
        rejecting = tuple(
            (name, nodes_in, nodes_out, *timings.get(name, (0, 0)))
            for name, nodes_in, nodes_out in funnel
            if nodes_in != nodes_out
        )
        passed = ",".join(name for name, nodes_in, nodes_out in funnel if nodes_in == nodes_out)
        rejections = tuple((counts, tuple(failing)) for counts, failing in found)
        self.parts.append((_FILTERS, rejecting, passed, rejections))

    def note_score(self, plugin: str, weight: float, start_ns: int) -> None:
        """A score plugin with a preference, computed from ``start_ns`` until now."""
        self.parts.append((_SCORE, plugin, weight, start_ns, time.time_ns()))

    def note_selection(
        self, start_ns: int, chosen: str, feasible: int, top: Iterable[tuple[str, float]]
    ) -> None:
        """The choice among ``feasible`` nodes, the best (node, total) first."""
        self.parts.append((_SELECTION, start_ns, time.time_ns(), chosen, feasible, tuple(top)))

    @property
    def stages(self) -> list[StageNote]:
        return expand(self.parts)[0]

    @property
    def passed_filters(self) -> tuple[str, ...]:
        return expand(self.parts)[1]


def expand(parts: Iterable[Part]) -> tuple[list[StageNote], tuple[str, ...]]:
    """A recorder's raw parts as one note per span, and the filters that let every node
    through (named on the root span, not a span each: the exporter's cost is per span)."""
    notes: list[StageNote] = []
    passed: list[str] = []
    for part in parts:
        kind = part[0]
        if kind == _NOTE:
            notes.append(StageNote(*part[1:]))
        elif kind == _FILTERS:
            passed += _filter_notes(notes, *part[1:])
        elif kind == _SCORE:
            _, plugin, weight, started, ended = part
            notes.append(StageNote(f"Score {plugin}", SCORE_RANKING, started, ended,
                                   {"weight": weight}))  # fmt: skip
        else:
            _, started, ended, chosen, feasible, top = part
            attributes: Attributes = {
                "chosen": chosen,
                "feasible": feasible,
                "top": ", ".join(f"{node}={total:.1f}" for node, total in top),
            }
            notes.append(StageNote("Select", SELECTION, started, ended, attributes))
    return notes, tuple(passed)


def _filter_notes(
    notes: list[StageNote],
    rejecting: Sequence[tuple[str, int, int, int, int]],
    passed: str,
    rejections: Sequence[tuple[dict[str, int], Sequence[tuple[str, tuple[str, ...]]]]],
) -> list[str]:
    """A note per filter that rejected a node (nodes in and out, its reasons counted);
    the names of those that let every node through."""
    reasons: dict[str, dict[str, int]] = {}
    for counts, failing in rejections:
        for name, its_reasons in failing:
            counted = reasons.setdefault(name, {})
            for reason in its_reasons:
                if counts.get(reason):
                    counted[reason] = counts[reason]
    for name, nodes_in, nodes_out, started, ended in rejecting:
        attributes: Attributes = {"nodes_in": nodes_in, "nodes_out": nodes_out}
        for reason, count in reasons.get(name, {}).items():
            attributes[f"reason.{reason}"] = count
        notes.append(StageNote(f"Filter {name}", NODE_FILTER, started, ended, attributes))
    return passed.split(",") if passed else []
