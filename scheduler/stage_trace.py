"""What a traced scheduling attempt hands the trace exporter: its stages, as plain tuples.

The scheduling cycle notes each stage it runs — PreFilter, each Filter with the nodes in
and out and its reasons counted, each Score, the selection — with wall-clock
nanoseconds, only when the attempt is sampled (:class:`StageRecorder`). The spans
themselves are built from these notes by the OpenTelemetry SDK in the exporter process
(:mod:`scheduler.adapters.tracing`), off the scheduling thread: the SDK costs about 50 µs a
span in CPython, ten times what noting a stage here costs (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

AttributeValue = str | int | float | bool
Attributes = dict[str, AttributeValue]
PREFILTER = "prefilter"
NODE_FILTER = "node_filter"
SCORE_RANKING = "score_ranking"
SELECTION = "selection"
BIND = "bind"
"""``decision_stage`` attribute values, one per kind of span."""


@dataclass(frozen=True, slots=True)
class StageNote:
    """One stage of an attempt: a child span of the attempt's root span."""

    name: str
    stage: str
    start_ns: int
    end_ns: int
    attributes: Attributes


@dataclass(slots=True)
class StageRecorder:
    """The stages of one sampled attempt, in the order they ran."""

    trace_id: int
    """128-bit trace id (the decision record holds it as 32 hex digits)."""
    root_span_id: int
    """64-bit id of the attempt's root span (bind spans name it as their parent)."""
    stages: list[StageNote] = field(default_factory=list)
    passed_filters: tuple[str, ...] = ()
    """Filters that let every node through (nothing to check, or every node passed): named
    on the root span, not a span each (the exporter's cost is per span)."""

    @property
    def trace_hex(self) -> str:
        return f"{self.trace_id:032x}"

    def note(
        self,
        name: str,
        stage: str,
        start_ns: int,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        """A stage that started at ``start_ns`` and ends now."""
        self.stages.append(StageNote(name, stage, start_ns, time.time_ns(), dict(attributes or {})))
