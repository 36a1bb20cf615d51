"""How a replayed trace's reports reach the scheduler in ``interference simulate``.

A replay hands each report to a :class:`ReplaySignals` as its agent would write it, and
asks it for the frame the scheduler's table takes before each decision. The in-process
one, :class:`RecordReplay`, keeps each node's latest scheduling record
(:func:`interference.sched_record.encode`) and reads them with the Redis follower's own
checks and columns (:func:`scheduler.signals.records.frame_of_records`), so a replay
decides on the index the scheduler computes (docs/design.md §8);
``tests/cli/test_replay_parity.py`` puts a real Redis and the follower in its place and
gets the same decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from interference import sched_record
from interference.index import IndexReferences
from interference.signals import NodeReport
from scheduler.signals.frame import SignalFrame
from scheduler.signals.records import frame_of_records


class ReplaySignals(Protocol):
    """How a replay's reports reach the scheduler: an agent's write, the scheduler's read."""

    def publish(self, report: NodeReport) -> None:
        """The node's agent writes ``report`` (its scheduling record)."""

    def frame(self, now: float) -> SignalFrame:
        """What the scheduler's table takes at ``now``."""


class RecordReplay:
    """The in-process :class:`ReplaySignals`: each node's latest record, read as the
    follower reads it when it was written (the follower polls every 0.5 s; a trace's
    reports are about a second apart), with the policy's ``references`` and
    ``max_interval_s`` (its ``redis.index_references``, ``redis.max_agent_interval_s``)."""

    def __init__(
        self, nodes: Sequence[str], references: IndexReferences, max_interval_s: float
    ) -> None:
        self._nodes = tuple(nodes)
        self._references = references
        self._max_interval_s = max_interval_s
        self._records: dict[str, bytes] = {}
        self._frame: SignalFrame | None = None

    def publish(self, report: NodeReport) -> None:
        self._records[report.node] = sched_record.encode(report)
        self._frame = None

    def frame(self, now: float) -> SignalFrame:
        if self._frame is None:
            self._frame = frame_of_records(
                self._nodes,
                [self._records.get(node) for node in self._nodes],
                self._references,
                max_interval_s=self._max_interval_s,
            )
        return self._frame
