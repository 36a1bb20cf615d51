"""What a traced scheduling attempt hands the trace exporter: its stages, as plain tuples.

The scheduling cycle notes each stage it runs — PreFilter, each Filter with the nodes in
and out and its reasons counted, each Score, the selection, then the bind — with
wall-clock nanoseconds, only when the attempt is sampled (:class:`StageRecorder`). It
notes them raw, as what the cycle computed anyway (the filters' names, the candidates each
rejected first, the reason counts, one clock reading per filter): :func:`expand` works out
the funnel and turns the notes into one :class:`StageNote` per span, in the exporter
process. Each Python call on the scheduling thread counts here: tracing every attempt costs
under 5 % of the pods bound per second at 5,000 nodes and about 7 % at 1,000
(docs/BENCHMARKS.md#tracing). The
spans themselves are made by the OpenTelemetry SDK in the exporter process
(:mod:`scheduler.adapters.tracing`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from interference.decision import funnel_of

AttributeValue = str | int | float | bool
Attributes = dict[str, AttributeValue]
PREFILTER = "prefilter"
NODE_FILTER = "node_filter"
SCORE_RANKING = "score_ranking"
SELECTION = "selection"
BIND = "bind"
"""``decision_stage`` attribute values, one per kind of span."""


class StageNote(NamedTuple):
    """One stage of an attempt: a child span of the attempt's root span (made from the raw
    parts by :func:`expand`)."""

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
        names: tuple[str, ...],
        static_count: int,
        considered: int,
        first_failures: dict[str, int],
        stamps: list[int],
        counts: dict[str, int],
        reasons: dict[str, tuple[str, ...]],
    ) -> None:
        """The Filter stage: ``names`` the filters that ran, in order, the leading
        ``static_count`` of them cached together; ``considered`` the candidates they were
        given; ``first_failures`` filter → candidates it rejected first; ``stamps`` in
        wall-clock ns: the stage's start, the end of the cached filters, then the end of
        each filter after them; ``counts`` reason → nodes; ``reasons`` each rejecting
        filter's reasons. Kept as they are (the caller hands over its own copies): the
        funnel and the reason counts per span are worked out by :func:`expand`."""
        self.parts.append(
            (_FILTERS, names, static_count, considered, first_failures, stamps, counts, reasons)
        )

    def note_score(self, plugin: str, weight: float, start_ns: int, end_ns: int) -> None:
        """A score plugin with a preference, computed from ``start_ns`` to ``end_ns``."""
        self.parts.append((_SCORE, plugin, weight, start_ns, end_ns))

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
    names: tuple[str, ...],
    static_count: int,
    considered: int,
    first_failures: dict[str, int],
    stamps: list[int],
    counts: dict[str, int],
    reasons: dict[str, tuple[str, ...]],
) -> list[str]:
    """A note per filter that rejected a node (nodes in and out as the decision's funnel,
    its reasons counted); the names of those that let every node through."""
    passed: list[str] = []
    funnel = funnel_of(names, considered, first_failures)
    for position, (name, nodes_in, nodes_out) in enumerate(funnel):
        if nodes_in == nodes_out:
            passed.append(name)
            continue
        at = max(0, position - static_count + 1)  # the cached filters share stamps 0–1
        started, ended = stamps[at : at + 2] if at + 2 <= len(stamps) else (stamps[0], stamps[-1])
        attributes: Attributes = {"nodes_in": nodes_in, "nodes_out": nodes_out}
        for reason in reasons.get(name, ()):
            if counts.get(reason):
                attributes[f"reason.{reason}"] = counts[reason]
        notes.append(StageNote(f"Filter {name}", NODE_FILTER, started, ended, attributes))
    return passed
