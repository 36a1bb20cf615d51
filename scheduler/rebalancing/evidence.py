"""Which of the agents' reports the rebalancer takes rows from: the signal reader's checks.

The rebalancer reads each node's report stream for the per-interval rows of its pods
(:mod:`scheduler.adapters.node_reports`); those reports are as untrusted as the scheduling
records the signal reader decodes (:mod:`scheduler.signals.records`), and are held to the
same rules, each defined once:

- ``clock_ahead``: the report's ``ts`` is more than ``max_clock_skew_s`` ahead of the
  scheduler's clock, or no time at all (:func:`scheduler.signals.records.in_clock_window`,
  the reader's rule, for the newest side): refused, not kept (a report dated ahead would
  otherwise outrank every on-time one after it). An old report is no clock fault: the
  stream holds minutes of them, and the window (up to 60 s) needs them; its age is the
  window's and the node's freshness's business;
- ``unmeasured``: the report did not measure a core family, the run queue
  (:func:`interference.freshness.missing_core`): its rows are no evidence of a quiet or a
  noisy run queue;
- the node itself: rows count only while the node's scheduling record is fresh in the
  table (``fresh_until ≥ now``, :func:`scheduler.signals.records.signal_columns`), so rows
  left in the stream of an agent whose keys expired count for nothing.

An agent that keeps publishing while its reports are refused or stale on arrival has a
skewed clock: :class:`AgentClocks` says so once per change, for a Warning (log, metric and
an Event on the node's pods with a tolerance), rather than the node silently dropping out
of rebalancing.
"""

from __future__ import annotations

from dataclasses import dataclass

from interference.freshness import missing_core, stale_after_s
from interference.signals import NodeReport
from scheduler.signals.records import MAX_CLOCK_SKEW_S, in_clock_window

CLOCK_AHEAD = "clock_ahead"
UNMEASURED = "unmeasured"
REPORT_REFUSALS = (CLOCK_AHEAD, UNMEASURED)
"""Why a report's rows are left out (the ``reason`` label of
``interference_scheduler_rebalance_refused_reports_total``)."""


def report_refusal(
    report: NodeReport, now: float, max_skew_s: float = MAX_CLOCK_SKEW_S
) -> str | None:
    """Why the rows of ``report`` are no evidence now, ``None`` when they are."""
    if not report.ts < now and not in_clock_window(report.ts, now, max_skew_s):
        return CLOCK_AHEAD
    if missing_core(report.measured):
        return UNMEASURED
    return None


@dataclass(frozen=True, slots=True)
class Skew:
    """A node whose agent publishes with a clock the scheduler cannot use."""

    node: str
    offset_s: float
    """Its newest report's ``ts − now`` (negative: behind)."""
    text: str


class AgentClocks:
    """Per node, whether its agent's clock is skewed, judged at each look from the newest
    report in its stream::

        publishing = newest ts ≠ the newest ts at the previous look
        skewed     = publishing and |newest ts − now| > stale_after_s(interval_s)

    (a report that far off is refused, or stale on arrival, or fresh for too long);
    :meth:`note` answers the :class:`Skew` when a node becomes skewed, so a Warning is
    said once per change, not at every look."""

    def __init__(self) -> None:
        self._newest: dict[str, float] = {}
        self._skewed: set[str] = set()

    def note(
        self, node: str, newest: NodeReport, now: float, max_skew_s: float = MAX_CLOCK_SKEW_S
    ) -> Skew | None:
        """The node's skew when it has just become skewed, else ``None``."""
        previous = self._newest.get(node)
        self._newest[node] = newest.ts
        if previous is None or newest.ts == previous:
            return None  # first sight, or nothing published since: a silent agent is stale
        offset = newest.ts - now
        if abs(offset) <= stale_after_s(newest.interval_s):
            self._skewed.discard(node)
            return None
        if node in self._skewed:
            return None
        self._skewed.add(node)
        if abs(offset) > max_skew_s:
            effect = f"ignored (more than {max_skew_s:g} s off)"
        elif offset < 0:
            effect = "stale on arrival"
        else:
            effect = "fresh for longer than they are true"
        direction = "behind" if offset < 0 else "ahead of"
        text = (
            f"the agent of node {node} publishes reports stamped {abs(offset):.0f} s {direction}"
            f" the scheduler's clock: they are {effect}, so the rebalancer does not judge the"
            f" node's pods on them; check the node's clock (NTP)"
        )
        return Skew(node, offset, text)

    def skewed(self) -> int:
        return len(self._skewed)

    def keep_only(self, nodes: set[str]) -> None:
        for node in [n for n in self._newest if n not in nodes]:
            del self._newest[node]
            self._skewed.discard(node)
