"""What the rebalancer reads (:mod:`scheduler.rebalancing.rebalancer`) and acts through
(:mod:`scheduler.rebalancing.mover`); the adapters implement them
(``scheduler.adapters.eviction``, ``node_reports``, ``move_journal``) and tests fake them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from interference.signals import NodeReport
from scheduler.cycle.ports import PodRef
from scheduler.plugins.rebalanced_away import Departure
from scheduler.rebalancing.rebalance import Moved


class EvictionStatus(Enum):
    EVICTED = "evicted"
    """Accepted (with ``dry_run``: would have been)."""
    BLOCKED = "blocked"
    """429: a PodDisruptionBudget allows no disruption now."""
    GONE = "gone"
    """404/409: the pod (this UID) is already gone."""


@dataclass(frozen=True, slots=True)
class EvictionAnswer:
    status: EvictionStatus
    message: str = ""
    """The API server's words (which budget blocked, …)."""


class Evictor(Protocol):
    """The Eviction API (``policy/v1`` Eviction of ``pods/eviction``)."""

    def evict(self, pod: PodRef, dry_run: bool) -> EvictionAnswer:
        """Evict ``pod`` (precondition: its UID); ``dry_run`` asks with ``dryRun=All``.
        Raises :class:`~scheduler.cycle.ports.ClusterError` for any other failure."""


class NodeReportSource(Protocol):
    """The agents' recent reports (their per-pod rows), per node."""

    def recent(self, nodes: Sequence[str]) -> dict[str, list[NodeReport]]:
        """Node → its latest reports (any order; a node without any left out)."""


class MoveJournal(Protocol):
    """Where the leader keeps its moves, so the next leader keeps their guard rails."""

    def add(self, moved: Moved, departure: Departure | None, keep_s: float) -> None:
        """Add ``moved`` (with its departure when the pod was evicted) and forget the
        moves older than ``keep_s`` before it."""

    def since(self, at: float) -> list[tuple[Moved, Departure | None]]:
        """The moves from ``at`` on."""


class EventRecorder(Protocol):
    def record_event(self, pod: PodRef, event_type: str, reason: str, message: str) -> None: ...
