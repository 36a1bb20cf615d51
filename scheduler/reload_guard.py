"""The Pending-rate guard of a configuration reload: after a reload, watch how many of its
pods the scheduler leaves Pending and say when the new configuration should be rolled back.

**Pending rate.** At time ``t``, over the pods this scheduler attempted (popped from its
queue and ran the cycle for) in the window ``(t − window_s, t]`` since the reload, each
pod counted once by its latest attempt in the window::

    pending_rate(t) = U / N
    N = pods with at least one attempt in the window
    U = those whose latest attempt found no node (they stay Pending, ``FailedScheduling``)

An attempt that found a node counts as placed whether or not its bind went through (a
failed bind is the API server's verdict, not the configuration's); a dry run's ``would
bind`` counts as placed. Retries do not inflate the rate: a pod left Pending is retried
at least every 10 s (the queue's longest backoff), so it stays in a 60 s window as one
pod. The rate is judged only when ``N ≥ min_pods`` — a handful of pods is not evidence.

**Verdicts** (:meth:`ReloadGuard.check`, called about once a second while watching):

* ``warn`` — the rate is above ``warn_above`` (default 15 %): once per reload;
* ``roll_back`` — the rate stayed above ``roll_back_above`` (default 8 %) at every check
  for ``roll_back_after_s`` (default 180 s); a check below it, or one with fewer than
  ``min_pods`` pods, starts the count again;
* ``confirmed`` — ``watch_for_s`` (default 600 s) passed without a roll back: the
  configuration becomes the last good one. A watch does not end while the rate is above
  ``roll_back_above``: it ends in a roll back, or once the rate falls below.

Pure: no I/O, time passed in; the CLI wiring (:mod:`scheduler.config_reload`) acts on the
verdicts (Event, metric, log, the roll back itself).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

from interference_infra.strict import SettingsError


@dataclass(frozen=True, slots=True)
class ReloadGuardSettings:
    """How a reload is watched and when it is rolled back (standalone mode; the guard
    watching a reload uses the settings of the configuration it would return to, so a
    reload cannot switch off its own guard)."""

    enabled: bool = True
    """Watch the Pending rate after each reload; false: every valid reload is final."""
    dry_run: bool = False
    """Say ``would roll back`` (Event, metric, log) instead of rolling back."""
    window_s: float = 60.0
    """The Pending rate's window: pods attempted in the last this many seconds."""
    warn_above: float = 0.15
    """A Warning Event when the Pending rate is above this share (0–1)."""
    roll_back_above: float = 0.08
    """Roll back when the Pending rate stays above this share (0–1) for
    ``roll_back_after_s``."""
    roll_back_after_s: float = 180.0
    """How long the Pending rate must stay above ``roll_back_above`` for a roll back."""
    watch_for_s: float = 600.0
    """How long after a reload the guard watches; then the configuration is the last
    good one."""
    min_pods: int = 10
    """Fewest pods attempted in the window for the rate to be judged."""

    def __post_init__(self) -> None:
        problems = []
        for name in ("warn_above", "roll_back_above"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                problems.append(f"{name}: {value!r} must be a share from 0 to below 1, e.g. 0.08")
        for name in ("window_s", "roll_back_after_s"):
            value = getattr(self, name)
            if not value > 0:
                problems.append(f"{name}: {value!r} must be a number of seconds > 0")
        if not self.watch_for_s > self.roll_back_after_s:
            problems.append(
                f"watch_for_s: {self.watch_for_s!r} must be above roll_back_after_s"
                f" ({self.roll_back_after_s!r}), e.g. 600"
            )
        if self.min_pods < 1:
            problems.append(f"min_pods: {self.min_pods!r} must be an integer ≥ 1")
        if problems:
            raise SettingsError(problems)


class Verdict(Enum):
    """What a check says to do."""

    IDLE = "idle"
    """Not watching a reload."""
    WATCHING = "watching"
    """Watching; nothing to do now."""
    WARN = "warn"
    ROLL_BACK = "roll_back"
    CONFIRMED = "confirmed"


@dataclass(frozen=True, slots=True)
class Reading:
    """One check: the verdict and the figures behind it."""

    verdict: Verdict
    pending: int = 0
    attempted: int = 0
    above_for_s: float = 0.0
    """How long the rate has stayed above ``roll_back_above`` (0 when it is not)."""

    @property
    def rate(self) -> float | None:
        """The Pending rate, ``None`` when no pod was attempted in the window."""
        return self.pending / self.attempted if self.attempted else None


class PendingWindow:
    """The latest attempt of each pod in a sliding window (the Pending rate's U and N).

    Pods are kept in order of their latest attempt, so leaving the window pops from the
    front: O(1) per attempt, amortised.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._latest: OrderedDict[str, tuple[float, bool]] = OrderedDict()
        """pod key → (time of its latest attempt, whether it found a node), oldest first."""
        self._pending = 0

    def observe(self, key: str, found_node: bool, now: float) -> None:
        previous = self._latest.pop(key, None)
        if previous is not None and not previous[1]:
            self._pending -= 1
        self._latest[key] = (now, found_node)
        if not found_node:
            self._pending += 1

    def sample(self, now: float) -> tuple[int, int]:
        """``(U, N)`` at ``now``."""
        horizon = now - self.window_s
        while self._latest:
            key, (at, found_node) = next(iter(self._latest.items()))
            if at > horizon:
                break
            del self._latest[key]
            if not found_node:
                self._pending -= 1
        return self._pending, len(self._latest)


class ReloadGuard:
    """Watches the Pending rate after a reload (see the module docstring). Thread-safe:
    the scheduling thread calls :meth:`observe`, the guard's thread :meth:`check`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._settings: ReloadGuardSettings | None = None
        self._window = PendingWindow(1.0)
        self._until = 0.0
        self._above_since: float | None = None
        self._warned = False

    @property
    def watching(self) -> bool:
        return self._settings is not None

    def watch(self, settings: ReloadGuardSettings, now: float) -> None:
        """Start watching a reload made at ``now`` (a reload during a watch starts anew)."""
        with self._lock:
            self._settings = settings if settings.enabled else None
            self._window = PendingWindow(settings.window_s)
            self._until = now + settings.watch_for_s
            self._above_since = None
            self._warned = False

    def stop(self) -> None:
        with self._lock:
            self._settings = None

    def observe(self, key: str, found_node: bool, now: float) -> None:
        """One scheduling attempt's outcome (ignored while not watching)."""
        if self._settings is None:  # unlocked read: a stale answer loses one attempt
            return
        with self._lock:
            if self._settings is not None:
                self._window.observe(key, found_node, now)

    def check(self, now: float) -> Reading:
        """The verdict at ``now``; ``roll_back`` and ``confirmed`` end the watch."""
        with self._lock:
            settings = self._settings
            if settings is None:
                return Reading(Verdict.IDLE)
            pending, attempted = self._window.sample(now)
            judged = attempted >= settings.min_pods
            rate = pending / attempted if attempted else 0.0
            if judged and rate > settings.roll_back_above:
                if self._above_since is None:
                    self._above_since = now
            else:
                self._above_since = None
            above_for = 0.0 if self._above_since is None else now - self._above_since
            if self._above_since is not None and above_for >= settings.roll_back_after_s:
                self._settings = None
                return Reading(Verdict.ROLL_BACK, pending, attempted, above_for)
            if now >= self._until and self._above_since is None:
                self._settings = None
                return Reading(Verdict.CONFIRMED, pending, attempted, above_for)
            if judged and rate > settings.warn_above and not self._warned:
                self._warned = True
                return Reading(Verdict.WARN, pending, attempted, above_for)
            return Reading(Verdict.WATCHING, pending, attempted, above_for)
