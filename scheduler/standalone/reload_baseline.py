"""The last good configuration's verdict while a reload is judged
(:mod:`scheduler.entry.reload_guard`): would it have placed a pod the new configuration
left Pending, and which pods would it attempt that the new one no longer does.

* **Pending anyway** — a pod the new configuration finds no node for is run through a
  scheduling cycle of the last good ``cycle`` settings on the same table, under the same cache lock
  (so on the same cluster state). No node there either: the pod is Pending for a reason
  the reload did not touch. When the reload left ``cycle`` as it was there is nothing to
  ask: every Pending pod is Pending anyway. The extra cycle runs only for pods left
  Pending, only while a reload is watched, and keeps its own relax notes (the loop's are
  not touched).
* **Stranded** — unbound pods the last good ``loop.scheduler_name`` and
  ``loop.ignore_namespaces`` would attempt that the new ones do not: the reload stopped
  attempting them, and they stay Pending without a word unless the guard counts them.
  Asked only when one of those two settings changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.api.objects import PodInfo
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.settings import CycleSettings
from scheduler.signals.table import NodeTable

Chosen = tuple[str, tuple[str, ...]]
"""Which pods are ours: ``(loop.scheduler_name, loop.ignore_namespaces)``."""


@dataclass(frozen=True, slots=True)
class _Judging:
    cycle: SchedulingCycle | None
    """The cycle of the last good ``cycle`` settings; ``None`` when the reload left them as
    they were."""
    chosen: Chosen | None
    """The last good configuration's choice of pods when it differs; else ``None``."""


class ReloadBaseline:
    """What the last good configuration would do, while a reload is judged."""

    def __init__(self, seed: int | None = None) -> None:
        self._seed = seed
        self._judging: _Judging | None = None
        """Replaced whole (one reference read per use: no lock between the threads)."""

    @property
    def judging(self) -> bool:
        return self._judging is not None

    def judge(
        self,
        before: tuple[CycleSettings, Chosen] | None,
        after: tuple[CycleSettings, Chosen] | None = None,
    ) -> None:
        """Judge a reload from ``before`` (the last good cycle settings and choice of
        pods) to ``after`` (the reloaded ones); ``before=None``: the judging is over."""
        if before is None or after is None:
            self._judging = None
            return
        (settings, chosen), (new_settings, new_chosen) = before, after
        cycle = None if settings == new_settings else SchedulingCycle(settings, seed=self._seed)
        self._judging = _Judging(cycle, chosen if chosen != new_chosen else None)

    def pending_anyway(
        self, pod: PodInfo, table: NodeTable, now: float, signals_readable: bool
    ) -> bool:
        """True when the last good configuration finds no node for ``pod`` either (or the
        reload changed nothing that decides placement). Caller holds the cache lock."""
        judging = self._judging
        if judging is None or judging.cycle is None:
            return True
        judging.cycle.register_lookups(table)  # once per plugin name: the table keeps them
        found = judging.cycle.schedule(pod, table, now, signals_readable=signals_readable)
        return found.node is None

    def stranded(self, cache: ClusterCache) -> list[str]:
        """Keys of the unbound pods the last good loop settings would attempt and the
        running ones do not (empty when the reload did not change which pods are ours)."""
        judging = self._judging
        if judging is None or judging.chosen is None:
            return []
        return cache.unbound_not_ours(*judging.chosen)
