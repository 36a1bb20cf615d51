"""The Pending-rate guard of a configuration reload: after a reload, watch how many pods
the reload itself leaves Pending and say when the new configuration should be rolled back.

**What it judges: the reload, pod by pod.** A pod the new configuration finds no node for
is asked again of the last good configuration, on the same cluster state (the loop does
that, :mod:`scheduler.standalone.reload_baseline`): *before* (the last good configuration) against
*after* (the new one). Each attempted pod falls in one of three classes:

* **placed** — the new configuration found a node (a failed bind is the API server's
  verdict; a dry run's ``would bind`` counts as placed);
* **left Pending by the reload** — the new configuration finds no node and the last good
  one would have; and every pod the last good configuration would attempt that the new one
  stopped attempting (another ``loop.scheduler_name``, a namespace newly in
  ``loop.ignore_namespaces``), counted as Pending whether or not it would fit;
* **Pending anyway** — neither configuration finds a node (an unbound claim, no room, a
  taint): a reason the reload did not touch. Left out of the count. A reload that changes
  nothing that decides placement (only ``rebalancer``, say) leaves every Pending pod here.

Pods never ours under either configuration (another scheduler's, gated ones — a quota
controller's scheduling gate) are never attempted and never counted.

**Pending rate.** At time ``t``, over the pods of the window ``(t − window_s, t]`` since
the reload, each counted once by its latest attempt::

    pending_rate(t) = U / N
    N = pods placed + pods left Pending by the reload (the pods the reload could change)
    U = pods left Pending by the reload

Retries do not inflate the rate: a pod left Pending is retried at least every 10 s (the
queue's longest backoff), so it stays in a 60 s window as one pod. The rate is judged only
when ``N ≥ min_pods`` — a handful of pods is not evidence.

**Verdicts** (:meth:`ReloadGuard.check`, called about once a second while watching):

* ``warn`` — the rate is above ``warn_above`` (default 15 %): once per reload;
* ``roll_back`` — the rate stayed above ``roll_back_above`` (default 8 %) at every check
  for ``roll_back_after_s`` (default 180 s); a check below it, or one with fewer than
  ``min_pods`` pods, starts the count again;
* ``confirmed`` — ``watch_for_s`` (default 600 s) passed without a roll back, at least
  ``min_pods`` pods the reload could change were attempted since it, and the rate (of
  however many pods are in the window) is not above ``roll_back_above``: the
  configuration becomes the last good one;
* ``undecided`` — ``watch_for_s`` passed without that evidence (too few pods, or a few
  pods left Pending): said once; the watch goes on until the evidence comes.

Pure: no I/O, time passed in; the CLI wiring (:mod:`scheduler.entry.config_reload`) acts on the
verdicts (Event, metric, log, the roll back itself).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
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
    """Fewest pods the reload could change in the window for the rate to be judged, and
    attempted since the reload for it to be kept."""

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
    UNDECIDED = "undecided"
    """The watch's time is up without the evidence to keep or reject: still watching."""


class Outcome(Enum):
    """A pod's latest attempt, as the guard counts it (see the module docstring)."""

    PLACED = "placed"
    PENDING = "pending"
    """Left Pending by the reload."""
    PENDING_ANYWAY = "pending_anyway"
    """Pending under the last good configuration too: not counted."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One check: the verdict and the figures behind it."""

    verdict: Verdict
    pending: int = 0
    """U: pods left Pending by the reload, in the window."""
    attempted: int = 0
    """N: pods the reload could change (placed or left Pending by it), in the window."""
    above_for_s: float = 0.0
    """How long the rate has stayed above ``roll_back_above`` (0 when it is not)."""
    pending_anyway: int = 0
    """Pods in the window Pending under the last good configuration too (not counted)."""
    seen: int = 0
    """Pods the reload could change attempted since the reload (at most ``min_pods``)."""

    @property
    def rate(self) -> float | None:
        """The Pending rate, ``None`` when no pod the reload could change is in the window."""
        return self.pending / self.attempted if self.attempted else None


class PendingWindow:
    """The latest outcome of each pod in a sliding window (the Pending rate's U and N).

    Pods are kept in order of their latest attempt, so leaving the window pops from the
    front: O(1) per attempt, amortised.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._latest: OrderedDict[str, tuple[float, Outcome]] = OrderedDict()
        """pod key → (time of its latest attempt, its outcome), oldest first."""
        self._counts = dict.fromkeys(Outcome, 0)

    def observe(self, key: str, outcome: Outcome, now: float) -> None:
        previous = self._latest.pop(key, None)
        if previous is not None:
            self._counts[previous[1]] -= 1
        self._latest[key] = (now, outcome)
        self._counts[outcome] += 1

    def sample(self, now: float) -> tuple[int, int, int]:
        """``(U, N, pending anyway)`` at ``now``."""
        horizon = now - self.window_s
        while self._latest:
            key, (at, outcome) = next(iter(self._latest.items()))
            if at > horizon:
                break
            del self._latest[key]
            self._counts[outcome] -= 1
        pending = self._counts[Outcome.PENDING]
        return pending, pending + self._counts[Outcome.PLACED], self._counts[Outcome.PENDING_ANYWAY]


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
        self._undecided_told = False
        self._seen: set[str] = set()
        """Pods the reload could change attempted since it (bounded by ``min_pods``)."""

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
            self._undecided_told = False
            self._seen = set()

    def stop(self) -> None:
        with self._lock:
            self._settings = None

    def observe(self, key: str, found_node: bool, now: float, pending_anyway: bool = False) -> None:
        """One scheduling attempt's outcome (ignored while not watching): ``pending_anyway``
        when no node was found and the last good configuration finds none either."""
        if self._settings is None:  # unlocked read: a stale answer loses one attempt
            return
        if found_node:
            outcome = Outcome.PLACED
        else:
            outcome = Outcome.PENDING_ANYWAY if pending_anyway else Outcome.PENDING
        with self._lock:
            settings = self._settings
            if settings is not None:
                self._window.observe(key, outcome, now)
                if outcome is not Outcome.PENDING_ANYWAY and len(self._seen) < settings.min_pods:
                    self._seen.add(key)

    def observe_stranded(self, keys: Iterable[str], now: float) -> None:
        """Pods the reload stopped attempting (each counts as left Pending by it)."""
        for key in keys:
            self.observe(key, False, now)

    def check(self, now: float) -> Reading:
        """The verdict at ``now``; ``roll_back`` and ``confirmed`` end the watch."""
        with self._lock:
            settings = self._settings
            if settings is None:
                return Reading(Verdict.IDLE)
            pending, attempted, anyway = self._window.sample(now)
            judged = attempted >= settings.min_pods
            rate = pending / attempted if attempted else 0.0
            if judged and rate > settings.roll_back_above:
                if self._above_since is None:
                    self._above_since = now
            else:
                self._above_since = None
            above_for = 0.0 if self._above_since is None else now - self._above_since
            seen = len(self._seen)

            def reading(verdict: Verdict) -> Reading:
                return Reading(verdict, pending, attempted, above_for, anyway, seen)

            if self._above_since is not None and above_for >= settings.roll_back_after_s:
                self._settings = None
                return reading(Verdict.ROLL_BACK)
            if now >= self._until and self._above_since is None:
                if seen >= settings.min_pods and rate <= settings.roll_back_above:
                    self._settings = None
                    return reading(Verdict.CONFIRMED)
                if not self._undecided_told:
                    self._undecided_told = True
                    return reading(Verdict.UNDECIDED)
            if judged and rate > settings.warn_above and not self._warned:
                self._warned = True
                return reading(Verdict.WARN)
            return reading(Verdict.WATCHING)
