"""Degrading an antagonist, node-local and opt-in (issue 17, item 3; docs/design.md §3).

Off by default (``DegradeSettings.enabled``), and dry-run when on until
``dry_run: false``. Only pods that opted in are ever touched: BestEffort pods, and pods
annotated ``interference.io/degradable: "true"`` (:data:`DEGRADABLE_ANNOTATION`).

Each interval the agent hands its report to :meth:`Degrader.observe`:

- **memory**: while the node's reclaim stall is at least ``reclaim_stall_ms_per_s``
  (default 5 ms/s, the interference index's saturation point), the eligible pod using the
  most memory is the antagonist; its ``memory.high`` (v1: ``memory.soft_limit_in_bytes``)
  is set to ``memory_ratio`` of what it uses, so it reclaims its own pages first;
- **cpu**: pods whose run-queue wait is mostly behind neighbours
  (:func:`interference.contention.contention_shares`, its own CFS limit taken out) by at
  least ``victim_wait_ms_per_s`` are victims; the eligible pod they waited behind the
  longest, summed over victims (their ``culprits``), is the antagonist; its
  ``cpu.weight`` (v1: ``cpu.shares``) is lowered to ``cpu_weight``.

An antagonist is degraded after ``sustain_intervals`` intervals in a row as the
antagonist, and restored (the value read before the write put back) after
``restore_after_intervals`` intervals in a row without the condition and at least
``min_degraded_s`` after the write. At most ``max_degrades_per_window`` degradations per
``window_s`` on the node; restores are never held back. Each action (or, in dry run, each
would-be action) is an Event on the pod saying what changed and why, and a metric.

What survives the agent (:mod:`node_agent.degrade_state`): the value before each write is
recorded in ``state_file`` before the cgroup file is written, durably, and the write is
refused when it cannot be recorded; the rate limit's times are kept with it. Every agent
start, degrading or not, puts back what a previous one left (:func:`restore_previous_run`):
an entry whose file still holds what was written gets its original back; one that holds
anything else (the write never happened, or the kubelet changed it since) is dropped; one
that cannot be written back stays recorded, and that knob is not degraded again meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from interference.contention import contention_shares
from interference.signals import NodeReport, PodMetrics
from node_agent.attribution import QOS_BESTEFFORT
from node_agent.cgroup_knobs import (
    Knob,
    PodCgroups,
    Resource,
    degraded_value,
    memory_usage_bytes,
    read_knob,
    write_knob,
)
from node_agent.degrade_state import (
    MAX_RECENT,
    DegradeState,
    Entry,
    StateUnreadable,
    gone,
    load_state,
    put_back,
    put_back_file,
    save_state,
    warn_left,
)

log = logging.getLogger(__name__)


REASON_DEGRADED = "InterferenceDegraded"
REASON_RESTORED = "InterferenceRestored"
REASON_WOULD_DEGRADE = "InterferenceWouldDegrade"
REASON_WOULD_RESTORE = "InterferenceWouldRestore"
REASON_DEGRADE_FAILED = "InterferenceDegradeFailed"
WHY_RESTARTED = "the agent restarted"


@dataclass(frozen=True)
class DegradeSettings:
    """When the agent degrades an antagonist on its node, and how far."""

    enabled: bool = False
    """Off by default; the agent also needs write access to cgroupfs
    (deploy/components/degrade)."""
    dry_run: bool = True
    """Say what it would do (Events, metric) and write nothing."""
    reclaim_stall_ms_per_s: float = 5.0
    """Node reclaim stall at or above which the memory antagonist is degraded."""
    victim_wait_ms_per_s: float = 100.0
    """Run-queue wait behind neighbours (own limit taken out) that makes a pod a victim."""
    sustain_intervals: int = 5
    """Intervals in a row a pod must be the antagonist before it is degraded."""
    restore_after_intervals: int = 10
    """Intervals in a row without the condition before it is restored."""
    min_degraded_s: float = 60.0
    """Least time between degrading a pod and restoring it (no flapping)."""
    max_degrades_per_window: int = 2
    """Degradations allowed per ``window_s`` on this node."""
    window_s: float = 300.0
    cpu_weight: int = 1
    """``cpu.weight`` written (1–10000; v1 ``cpu.shares`` by 100 ↔ 1024, at least 2)."""
    memory_ratio: float = 0.9
    """``memory.high`` (v1 soft limit) as a share of the pod's memory use when degraded."""
    memory_floor_bytes: int = 64 * 1024 * 1024
    """The ceiling is never set below this."""
    state_file: str = "/run/interference-agent/degraded.json"
    """What was written and the value before, for restoring after a restart."""

    def __post_init__(self) -> None:
        if not 1 <= self.cpu_weight <= 10_000:
            raise ValueError(f"degrade cpu weight must be 1–10000, got {self.cpu_weight}")
        if not 0 < self.memory_ratio <= 1:
            raise ValueError(f"degrade memory ratio must be in (0, 1], got {self.memory_ratio}")
        for name in ("sustain_intervals", "restore_after_intervals", "max_degrades_per_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"degrade {name.replace('_', ' ')} must be ≥ 1")
        for name in ("reclaim_stall_ms_per_s", "victim_wait_ms_per_s", "window_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"degrade {name.replace('_', ' ')} must be > 0")
        if self.min_degraded_s < 0 or self.memory_floor_bytes < 0:
            raise ValueError("degrade min degraded s and memory floor must be ≥ 0")


class EventSink(Protocol):
    """Where the degrader's Events go (the pod's Events in Kubernetes)."""

    def emit(self, pod: PodMetrics, reason: str, message: str, warning: bool) -> None:
        """Record one Event on ``pod``; must not raise."""


class DegradeMetrics:
    """``interference_agent_degrade_actions_total`` and ``interference_agent_degraded_pods``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.actions = Counter(
            "interference_agent_degrade_actions",
            "Antagonists degraded or restored (would_* in dry run; failed: a write refused).",
            ["action", "resource"],
            registry=registry,
        )
        for action in ("degraded", "restored", "would_degrade", "would_restore", "failed"):
            for resource in ("cpu", "memory"):
                self.actions.labels(action=action, resource=resource)
        self.degraded = Gauge(
            "interference_agent_degraded_pods",
            "Pods degraded now (in dry run: would be).",
            ["resource"],
            registry=registry,
        )


@dataclass
class _Held:
    """A pod degraded (or, in dry run, that would be) on one resource."""

    pod: PodMetrics
    knob: Knob
    original: str
    written: str
    since: float
    quiet_intervals: int = 0
    failed_restores: int = 0


@dataclass
class _Candidate:
    pod: PodMetrics
    why: str
    intervals: int = 0


@dataclass
class Degrader:
    """The node's degradation state machine (module docstring); one per agent."""

    settings: DegradeSettings
    cgroups: PodCgroups
    events: EventSink
    metrics: DegradeMetrics
    opted_in: Callable[[str], bool] = lambda _uid: False
    """Whether the pod with this UID carries :data:`DEGRADABLE_ANNOTATION` ``"true"``."""
    wall: Callable[[], float] = time.time
    """The clock of the rate limit's times in the state file (``now`` is monotonic and
    does not carry across processes)."""
    held: dict[tuple[str, Resource], _Held] = field(default_factory=dict)
    _candidates: dict[Resource, _Candidate] = field(default_factory=dict)
    _recent: deque[tuple[float, float | None]] = field(default_factory=deque)
    """``(now, wall time)`` of each degradation in the window; wall None in dry run
    (a would-be action is not recorded)."""
    _loaded_recent: list[float] = field(default_factory=list)
    """Wall times from the state file, placed in ``_recent`` on the next interval."""
    _left: list[Entry] = field(default_factory=list)
    """A previous run's entries that could not be put back yet (retried every interval)."""
    _unusable: str = ""
    """Why the state file cannot be used; while set, nothing is degraded."""

    def eligible(self, pod: PodMetrics) -> bool:
        """BestEffort, or annotated degradable; never the system bucket."""
        return bool(pod.uid) and (pod.qos == QOS_BESTEFFORT or self.opted_in(pod.uid))

    def observe(self, report: NodeReport, now: float) -> None:
        """Advance every resource's state by one interval of ``report``."""
        if self._loaded_recent:
            self._place_loaded_recent(now)
        if self._left:
            self._put_back_left()
        self._step("memory", self._memory_antagonist(report), now)
        self._step("cpu", self._cpu_antagonist(report), now)
        for resource in ("cpu", "memory"):
            self.metrics.degraded.labels(resource=resource).set(
                sum(1 for (_, r) in self.held if r == resource)
            )

    def _memory_antagonist(self, report: NodeReport) -> tuple[PodMetrics, str] | None:
        stall = report.metrics.reclaim_stall_ms_per_s
        if "reclaim" not in report.measured or stall < self.settings.reclaim_stall_ms_per_s:
            return None
        using: list[tuple[int, PodMetrics]] = []
        for pod in report.pods:
            knob = self.cgroups.knob(pod.uid, "memory") if self.eligible(pod) else None
            if knob is not None:
                with contextlib.suppress(OSError, ValueError):
                    using.append((memory_usage_bytes(knob), pod))
        if not using:
            return None
        used, pod = min(using, key=lambda item: (-item[0], item[1].key))
        return pod, (
            f"the node stalled in reclaim {stall:.1f} ms/s (threshold "
            f"{self.settings.reclaim_stall_ms_per_s:g}) and it uses the most memory of the "
            f"pods that may be degraded ({used / 2**20:.0f} MiB)"
        )

    def _cpu_antagonist(self, report: NodeReport) -> tuple[PodMetrics, str] | None:
        if "runq" not in report.measured:
            return None
        by_key = {pod.key: pod for pod in report.pods}
        caused: dict[str, float] = {}
        victims: dict[str, list[str]] = {}
        for pod in report.pods:
            shares = contention_shares(
                own_wait_ms_per_s=pod.own_wait_ms_per_s,
                neighbour_wait_ms_per_s=pod.neighbour_wait_ms_per_s,
                throttled_ms_per_s=pod.throttled_ms_per_s,
                cpu_ms_per_s=pod.cpu_ms_per_s,
            )
            if shares.cause != "neighbours":
                continue
            if shares.neighbours_ms_per_s < self.settings.victim_wait_ms_per_s:
                continue
            for culprit, ms in pod.culprits:
                caused[culprit] = caused.get(culprit, 0.0) + ms
                victims.setdefault(culprit, []).append(f"{pod.key} {ms:.0f} ms/s")
        ranked = sorted(caused.items(), key=lambda item: (-item[1], item[0]))
        for key, total in ranked:
            culprit_pod = by_key.get(key)
            if culprit_pod is not None and self.eligible(culprit_pod):
                return culprit_pod, (
                    f"pods waited behind it for a CPU {total:.0f} ms/s "
                    f"({', '.join(victims[key][:3])})"
                )
        return None

    def _step(self, resource: Resource, found: tuple[PodMetrics, str] | None, now: float) -> None:
        for (uid, held_resource), held in list(self.held.items()):
            if held_resource != resource:
                continue
            still = found is not None and found[0].uid == uid
            held.quiet_intervals = 0 if still else held.quiet_intervals + 1
            if (
                held.quiet_intervals >= self.settings.restore_after_intervals
                and now - held.since >= self.settings.min_degraded_s
            ):
                self._restore(resource, held)
        if found is None:
            self._candidates.pop(resource, None)
            return
        pod, why = found
        candidate = self._candidates.get(resource)
        if candidate is None or candidate.pod.uid != pod.uid:
            candidate = self._candidates[resource] = _Candidate(pod, why)
        candidate.pod, candidate.why = pod, why
        candidate.intervals += 1
        if (pod.uid, resource) in self.held:
            return
        if candidate.intervals < self.settings.sustain_intervals:
            return
        while self._recent and now - self._recent[0][0] >= self.settings.window_s:
            self._recent.popleft()
        if len(self._recent) >= self.settings.max_degrades_per_window:
            return
        self._degrade(resource, pod, why, candidate.intervals, now)

    def _degrade(
        self, resource: Resource, pod: PodMetrics, why: str, intervals: int, now: float
    ) -> None:
        settings = self.settings
        knob = self.cgroups.knob(pod.uid, resource)
        reason = f"for {intervals} intervals {why}"
        if knob is None:
            self._failed(resource, pod, f"no {resource} knob found in cgroupfs for its UID")
            return
        if self._unusable:
            self._failed(resource, pod, f"{self._unusable}, so the value before cannot be kept")
            return
        if any(entry.path == knob.path for entry in self._left):
            self._failed(resource, pod, "a previous run degraded it and could not put it back yet")
            return
        try:
            original = read_knob(knob)
            value = degraded_value(
                knob,
                cpu_weight=settings.cpu_weight,
                memory_ratio=settings.memory_ratio,
                memory_floor_bytes=settings.memory_floor_bytes,
            )
        except (OSError, ValueError) as exc:
            self._failed(resource, pod, f"{knob.path}: {exc}")
            return
        key = (pod.uid, resource)
        self.held[key] = _Held(pod, knob, original, value, now)
        self._recent.append((now, None if settings.dry_run else self.wall()))
        if not settings.dry_run:
            # The original goes to disk first: a crash after the write must find it there.
            try:
                self._save(strict=True)
            except OSError as exc:
                del self.held[key]
                self._recent.pop()
                self._failed(
                    resource,
                    pod,
                    f"the value before could not be recorded in {settings.state_file} "
                    f"({exc}), so nothing was written",
                )
                return
            try:
                write_knob(knob, value)
            except OSError as exc:
                del self.held[key]
                self._recent.pop()
                self._save()
                self._failed(resource, pod, f"{knob.path}: {exc}")
                return
        change = f"{knob.file} {original} → {value} ({knob.directory})"
        if settings.dry_run:
            self.metrics.actions.labels(action="would_degrade", resource=resource).inc()
            self.events.emit(
                pod, REASON_WOULD_DEGRADE, f"dry run: would set {change}: {reason}", False
            )
        else:
            self.metrics.actions.labels(action="degraded", resource=resource).inc()
            self.events.emit(pod, REASON_DEGRADED, f"set {change}: {reason}", True)
        log.info(
            "%s %s of %s: %s",
            "would degrade" if settings.dry_run else "degraded",
            resource,
            pod.key,
            reason,
        )

    def _restore(self, resource: Resource, held: _Held) -> None:
        key = (held.pod.uid, resource)
        change = f"{held.knob.file} {held.written} → {held.original} ({held.knob.directory})"
        why = f"the condition has been gone for {held.quiet_intervals} intervals"
        if self.settings.dry_run:
            del self.held[key]
            self.metrics.actions.labels(action="would_restore", resource=resource).inc()
            self.events.emit(
                held.pod, REASON_WOULD_RESTORE, f"dry run: would set {change}: {why}", False
            )
            return
        try:
            write_knob(held.knob, held.original)
        except OSError as exc:
            if not gone(held.knob, exc):
                # Kept (here and in the state file) and tried again next interval.
                held.failed_restores += 1
                if held.failed_restores == 1:
                    log.warning("cannot put back %s of %s: %s", resource, held.pod.key, exc)
                return
            log.info("not restoring %s of %s: its cgroup is gone", resource, held.pod.key)
            del self.held[key]
        else:
            del self.held[key]
            self.metrics.actions.labels(action="restored", resource=resource).inc()
            self.events.emit(held.pod, REASON_RESTORED, f"set {change}: {why}", False)
        self._save()

    def _failed(self, resource: Resource, pod: PodMetrics, why: str) -> None:
        self.metrics.actions.labels(action="failed", resource=resource).inc()
        self.events.emit(pod, REASON_DEGRADE_FAILED, f"could not degrade {resource}: {why}", True)
        log.warning("could not degrade %s of %s: %s", resource, pod.key, why)

    def restore_all(self) -> None:
        """Put back everything written (the agent stops cleanly, or found a state file)."""
        for (_, resource), held in list(self.held.items()):
            held.quiet_intervals = max(held.quiet_intervals, self.settings.restore_after_intervals)
            self._restore(resource, held)

    def _state(self) -> DegradeState:
        """What the state file must hold now: the knobs written and not put back, and the
        times of the degradations still in the rate-limit window."""
        entries = list(self._left)
        if not self.settings.dry_run:
            entries += [
                Entry(
                    uid=uid,
                    namespace=held.pod.namespace,
                    name=held.pod.name,
                    resource=resource,
                    path=held.knob.path,
                    original=held.original,
                    written=held.written,
                )
                for (uid, resource), held in self.held.items()
            ]
        oldest = self.wall() - self.settings.window_s
        stamps = [w for _, w in self._recent if w is not None] + self._loaded_recent
        # Only the newest max_degrades_per_window can hold the limit back.
        keep = min(self.settings.max_degrades_per_window, MAX_RECENT)
        return DegradeState(entries, sorted(w for w in stamps if w > oldest)[-keep:])

    def _save(self, strict: bool = False) -> None:
        """Write the state file; ``OSError`` when ``strict``, else a warning."""
        if self._unusable:
            return  # left for a person to read: nothing was written meanwhile
        try:
            save_state(self.settings.state_file, self._state())
        except OSError:
            if strict:
                raise
            log.warning(
                "cannot update %s: what it lists is put back only where the cgroup file "
                "still holds what was written",
                self.settings.state_file,
                exc_info=True,
            )

    def _place_loaded_recent(self, now: float) -> None:
        wall_now = self.wall()
        window = self.settings.window_s
        # A time ahead of this clock counts as now: never a longer allowance than due.
        placed = [(now - max(0.0, wall_now - w), w) for w in self._loaded_recent]
        self._recent = deque(
            sorted([*self._recent, *((t, w) for t, w in placed if now - t < window)])
        )
        self._loaded_recent = []

    def _put_back_left(self) -> None:
        restored: list[str] = []
        left = put_back(self._left, self._announce(restored))
        if left != self._left:
            self._left = left
            self._save()

    def _announce(self, restored: list[str]) -> Callable[[Entry], None]:
        return announce_restored(self.events, WHY_RESTARTED, restored, self._count_restored)

    def _count_restored(self, resource: Resource) -> None:
        self.metrics.actions.labels(action="restored", resource=resource).inc()

    def restore_saved(self) -> list[str]:
        """Put back what a previous run of the agent left degraded (its state file, see
        the module docstring) and take over its rate-limit times; returns the pods
        restored. An unreadable state file is left as it is and stops all degrading."""
        try:
            state = load_state(self.settings.state_file)
        except StateUnreadable as exc:
            self._unusable = f"the state file {self.settings.state_file} is unreadable ({exc})"
            log.warning(
                "%s: nothing restored, and nothing degraded until it is removed", self._unusable
            )
            return []
        if state is None:
            return []
        restored: list[str] = []
        self._left = put_back(state.entries, self._announce(restored))
        warn_left(self._left)
        self._loaded_recent = state.recent
        self._save()
        return restored


def announce_restored(
    events: EventSink, why: str, restored: list[str], count: Callable[[Resource], None]
) -> Callable[[Entry], None]:
    """What is done for each entry put back: the Event, the metric, its pod in
    ``restored``."""

    def done(entry: Entry) -> None:
        pod = PodMetrics(entry.namespace, entry.name, uid=entry.uid)
        count(entry.resource)
        change = f"{entry.knob.file} {entry.written} → {entry.original}"
        events.emit(pod, REASON_RESTORED, f"set {change} ({entry.knob.directory}): {why}", False)
        restored.append(pod.key)

    return done


def restore_previous_run(state_file: str, events: EventSink) -> list[str]:
    """What an agent that does not degrade does at start: put back what a previous run
    left in ``state_file`` (:func:`node_agent.degrade_state.put_back_file`); returns the
    pods restored."""
    restored: list[str] = []
    # No metric: an agent that does not degrade registers none.
    put_back_file(state_file, announce_restored(events, WHY_RESTARTED, restored, lambda _: None))
    return restored
