"""The one Protocol every probe implements, its sample type and the probe registry.

A probe is a small collector (koordlet style): ``start()`` either succeeds or raises
:class:`ProbeUnavailable` with a reason a person can act on (what to mount, install or
enable); the agent then logs that reason once and runs without the probe. ``collect()``
returns what happened since the previous call (deltas, never cumulative counters). When
a transient problem keeps it from measuring an interval it raises :class:`CollectFailed`
(never an empty sample: that would read as a quiet node); the agent leaves the probe's
families out of that interval's ``measured`` and the probe keeps running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)

# Metric names used in samples; the aggregator (node_agent.aggregate) reads these.
RUNQ_COUNT = "runq_count"
"""Number of run-queue waits that ended in the interval."""
RUNQ_NS = "runq_ns"
"""Total run-queue wait, ns."""
IDLE_WAKEUP_COUNT = "idle_wakeup_count"
"""Number of waits that ended by switching in from the idle task (the CPU was idle)."""
IDLE_WAKEUP_NS = "idle_wakeup_ns"
"""Total wait of those, ns: the CPU's idle-exit latency, not interference (published only)."""
BPF_MISSED_EVENTS = "bpf_missed_events"
"""Events the kernel skipped for a probe's BPF programs (``recursion_misses``) in the interval."""
BPF_LOST_ENTRIES = "bpf_lost_entries"
"""Map entries a probe's BPF programs could not keep in the interval (a map full, or a
queued task's entry evicted): that probe's families are incomplete for the interval."""
CULPRIT_WAIT_COUNT = "wait_count"
"""Run-queue waits of one (waiting cgroup, culprit cgroup) pair (``Sample.waits_by_culprit``)."""
CULPRIT_WAIT_NS = "wait_ns"
"""Their total, ns: part of the waiting cgroup's ``runq_ns``."""
ONCPU_NS = "oncpu_ns"
"""Time on CPU, ns."""
RECLAIM_COUNT = "reclaim_count"
"""memcg + direct reclaim episodes."""
RECLAIM_NS = "reclaim_ns"
"""Time spent stalled in reclaim, ns."""
VMSCAN_THROTTLED = "vmscan_throttled"
"""``mm_vmscan_throttled`` occurrences."""
THROTTLED_NS = "throttled_ns"
"""CFS-quota throttled time (cpu.stat), ns."""
THROTTLED_PERIODS = "throttled_periods"
MEM_HIGH_EVENTS = "memory_high_events"
MEM_MAX_EVENTS = "memory_max_events"
MEM_OOM_EVENTS = "memory_oom_events"
PSI_CPU_SOME_US = "psi_cpu_some_us"
"""Stall time (µs) accumulated in the interval, from a pressure file's ``total=``."""
PSI_MEM_SOME_US = "psi_mem_some_us"
PSI_MEM_FULL_US = "psi_mem_full_us"
PSI_IO_SOME_US = "psi_io_some_us"
PSI_MEM_SOME_AVG10 = "psi_mem_some_avg10"
"""The kernel's own 10 s average (percent) of memory ``some`` pressure of the agent's
cgroup root: a gauge read each interval, not a delta."""
NET_DROPS = "net_drops"
"""Packets dropped (rx + tx on links, drops on qdiscs)."""
NET_BACKLOG_BYTES = "net_backlog_bytes"
"""Current qdisc backlog (a gauge, not a delta)."""
CPU_DELAY_NS = "cpu_delay_ns"
"""Taskstats CPU delay (run-queue wait), ns: the BPF-less fallback for runq_ns."""
CPU_DELAY_COUNT = "cpu_delay_count"
RECLAIM_DELAY_NS = "reclaim_delay_ns"
"""Taskstats direct-reclaim delay, ns: the BPF-less fallback for reclaim_ns."""

HIST_RUNQ_US = "runq_us"
"""Log2 histogram (µs) of run-queue waits."""
HIST_RECLAIM_US = "reclaim_us"
"""Log2 histogram (µs) of reclaim stalls."""


class ProbeUnavailable(RuntimeError):
    """The probe cannot run here; the message says why and what to do about it."""


class CollectFailed(RuntimeError):
    """This interval could not be measured (the message says why); the next may be."""


@dataclass
class Sample:
    """What a probe measured since its previous ``collect()``.

    Keys: ``by_cgroup_id`` uses cgroup v2 ids (what BPF sees, the inode number of the
    cgroup directory); ``by_cgroup_path`` uses paths relative to the cgroup mount
    (v2 paths, or v1 paths of the probe's controller) starting with ``/``; ``by_pid``
    is for per-task sources such as taskstats. Values are the metric names above.
    """

    node: dict[str, float] = field(default_factory=dict)
    by_cgroup_id: dict[int, dict[str, float]] = field(default_factory=dict)
    by_cgroup_path: dict[str, dict[str, float]] = field(default_factory=dict)
    by_pid: dict[int, dict[str, float]] = field(default_factory=dict)
    histograms_by_cgroup_id: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    """Per cgroup id, log2 histograms by name (``runq_us``, ``reclaim_us``)."""
    waits_by_culprit: dict[tuple[int, int], dict[str, float]] = field(default_factory=dict)
    """Per ``(waiting cgroup id, culprit cgroup id)``: the run-queue waits of the first
    that ended by switching in after a task of the second (``wait_count``, ``wait_ns``)."""


class Probe(Protocol):
    """A source of interference signals."""

    name: str
    """Stable name, same stem as the module (and the BPF C file where there is one)."""

    def start(self) -> None:
        """Acquire resources; raise :class:`ProbeUnavailable` when it cannot run here."""

    def collect(self) -> Sample:
        """Deltas since the previous call (the first call returns deltas since start)."""

    def close(self) -> None:
        """Release everything; safe to call twice."""


@dataclass(frozen=True)
class ProbeContext:
    """What probes may need to know about the host; passed explicitly, never global."""

    cgroup_root: str = "/"
    """Only cgroups at or below this path (relative to each hierarchy) are reported."""
    cgroup_v2_mount: str = "/sys/fs/cgroup/unified"
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` on pure-v2 hosts)."""
    cgroup_v1_mount: str = "/sys/fs/cgroup"
    """Parent of the v1 controller mounts (``cpu``, ``memory``, …); ignored on pure v2."""
    proc_root: str = "/proc"
    tracefs: str = "/sys/kernel/tracing"
    bpf_source_dir: str = ""
    """Directory holding ``*.bpf.c``; empty means the ``bpf/`` folder shipped with the agent."""


ProbeFactory = Callable[[ProbeContext], Probe]

_REGISTRY: dict[str, ProbeFactory] = {}


def register(name: str) -> Callable[[ProbeFactory], ProbeFactory]:
    """Class/func decorator adding a probe factory to the registry under ``name``."""

    def add(factory: ProbeFactory) -> ProbeFactory:
        if name in _REGISTRY:
            raise ValueError(f"probe {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return add


def registered() -> dict[str, ProbeFactory]:
    """All registered probe factories by name (import ``node_agent.probes`` first)."""
    return dict(_REGISTRY)


def start_probes(names: list[str], ctx: ProbeContext) -> tuple[list[Probe], dict[str, str]]:
    """Start the named probes; returns the running ones and ``{name: reason}`` for the rest.

    Each unavailable probe is logged once at WARNING with its reason.
    """
    running: list[Probe] = []
    disabled: dict[str, str] = {}
    for name in names:
        factory = _REGISTRY.get(name)
        if factory is None:
            disabled[name] = f"unknown probe (known: {', '.join(sorted(_REGISTRY))})"
            log.warning("probe %s disabled: %s", name, disabled[name])
            continue
        probe = factory(ctx)
        try:
            probe.start()
        except ProbeUnavailable as exc:
            disabled[name] = str(exc)
            log.warning("probe %s disabled: %s", name, exc)
            probe.close()
            continue
        except Exception as exc:  # a probe bug must not take the other probes down with it
            disabled[name] = f"failed to start ({type(exc).__name__}: {exc}); please report this"
            log.exception("probe %s disabled: unexpected error at start", name)
            probe.close()
            continue
        running.append(probe)
    return running, disabled
