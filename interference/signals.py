"""Signal dataclasses shared by the node agent and the scheduler (docs/design.md §3).

Units are part of every field name. A ``NodeReport`` is what an agent publishes once
per interval; the codec in :mod:`interference.codec` turns it into msgpack for the
stream and into decimal-string hashes for ``redis-cli``.

A report says which signal families it actually measured (``measured``); a metric of a
family that was not measured reads 0 but means "unknown", never "quiet". Families:

- ``runq``: run-queue delay (``runqlat`` BPF probe, else ``taskstats``) — the core family;
- ``reclaim``: reclaim stall (``reclaim`` BPF probe, else ``taskstats``);
- ``throttle``: CFS quota throttling (``cpu_throttle``);
- ``psi``: pressure stall information (``psi``);
- ``net``: network drops (``network``);
- ``memory_events``: ``memory.events`` high/max/oom (``memory_events``).

A family counts as measured only when its probes saw the whole interval: one whose BPF
maps lost entries (``bpf_lost_entries``) is incomplete and left out
(:func:`interference.freshness.complete_families`). A report lacking a family of
:data:`CORE_FAMILIES` is *degraded*: the scheduler treats it exactly like a stale one
(see :mod:`interference.freshness`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from interference.contention import ContentionShares, contention_shares

SCHEMA_VERSION = 3
"""Version of the msgpack NodeReport; bump on an incompatible change. A reader decodes only
its own version (:func:`interference.codec.decode_report`): agents and scheduler run the
same release."""

TOP_CULPRITS = 5
"""Culprits kept per pod row: the neighbours its tasks waited behind the longest."""

SIGNAL_FAMILIES = ("runq", "reclaim", "throttle", "psi", "net", "memory_events")
"""Every family a report can list in ``measured``."""

CORE_FAMILIES = frozenset({"runq"})
"""Families without which a report is degraded (treated as stale)."""

WINDOWS_S = (10, 60)
"""Spans (s) of the windowed signals the agent publishes beside each interval's."""

SYSTEM_POD = "system"
"""Pseudo-pod that collects every cgroup not belonging to a Kubernetes pod."""


@dataclass(frozen=True, slots=True)
class NodeMetrics:
    """One node's summary for one interval."""

    runq_p50_us: float = 0.0
    """Median run-queue delay of all tasks on the node, µs."""
    runq_p99_us: float = 0.0
    """99th percentile run-queue delay, µs."""
    runq_wait_ratio: float = 0.0
    """Seconds tasks spent waiting for a CPU per CPU-second of the interval."""
    reclaim_stall_ms_per_s: float = 0.0
    """Milliseconds per second tasks spent in memcg or direct reclaim."""
    reclaim_events_per_s: float = 0.0
    """Reclaim episodes (memcg + direct + vmscan throttles) per second."""
    throttled_ms_per_s: float = 0.0
    """CFS-quota throttled milliseconds per second, summed over pods."""
    psi_cpu_some: float = 0.0
    """Percent of the interval in which some task waited for CPU (node PSI)."""
    psi_mem_some: float = 0.0
    """Percent of the interval in which some task stalled on memory."""
    psi_mem_full: float = 0.0
    """Percent of the interval in which all non-idle tasks stalled on memory."""
    psi_mem_some_avg10: float = 0.0
    """The kernel's own 10 s average of ``psi_mem_some`` (``some avg10`` of the agent's
    cgroup root's ``memory.pressure``, ``/proc/pressure/memory`` for ``/``), percent: read
    as the kernel smooths it, not derived from totals. Not part of the index; the
    scheduler's MemoryPressure score reads it (docs/design.md §8)."""
    net_drops_per_s: float = 0.0
    """Packets dropped per second on all interfaces and qdiscs."""
    idle_wakeup_ms_per_s: float = 0.0
    """Milliseconds per second tasks waited for an idle CPU to wake up: the CPU's idle-exit
    latency (C-states, vCPU wake-up), not contention. Published, never part of the index."""
    bpf_missed_events: float = 0.0
    """Events the kernel skipped for the agent's BPF programs in the interval (each loses
    at most one wait or stall); non-zero means the figures may read slightly low."""
    bpf_lost_entries: float = 0.0
    """BPF map entries the agent's programs could not keep in the interval (a map full, a
    queued task's entry evicted): each loses a wait, a stall or a cgroup's counts. The
    families of a probe that lost entries are left out of ``measured`` (so a loss in
    ``runq`` makes the report degraded) and the interval publishes no per-pod rows."""
    interference_index: float = 0.0
    """0 (quiet) – 100 (saturated), from :func:`interference.index.interference_index`."""


@dataclass(frozen=True, slots=True)
class PodMetrics:
    """One pod's (or the ``system`` bucket's) measurements for one interval."""

    namespace: str
    """Kubernetes namespace; empty when only the UID is known."""
    name: str
    """Pod name, the pod UID when the name is unknown, or ``system``."""
    uid: str = ""
    qos: str = ""
    """``guaranteed``, ``burstable``, ``besteffort`` or empty."""
    cpu_ms_per_s: float = 0.0
    """On-CPU milliseconds per second (1000 = one full CPU)."""
    runq_wait_ms_per_s: float = 0.0
    """Milliseconds per second the pod's tasks waited in a run queue."""
    idle_wakeup_ms_per_s: float = 0.0
    """Milliseconds per second the pod's tasks waited for an idle CPU to wake up (not part
    of the index)."""
    runq_p99_us: float = 0.0
    reclaim_stall_ms_per_s: float = 0.0
    throttled_ms_per_s: float = 0.0
    runq_us: tuple[int, ...] = ()
    """The pod's run-queue waits of the interval as a log2 µs histogram (trailing empty
    slots left out), so a reader can merge intervals into a p99 over any window."""
    own_wait_ms_per_s: float = 0.0
    """Part of ``runq_wait_ms_per_s`` whose wait ended after a task of this pod itself held
    the CPU (docs/design.md §3, culprits)."""
    neighbour_wait_ms_per_s: float = 0.0
    """Part of ``runq_wait_ms_per_s`` whose wait ended after a task of another pod or of
    ``system`` held the CPU."""
    culprits: tuple[tuple[str, float], ...] = ()
    """The neighbours (pod keys, or ``system``) whose tasks held the CPU when this pod's
    waits ended, with those waits in ms per second, longest first; at most
    :data:`TOP_CULPRITS`, so they may sum to less than ``neighbour_wait_ms_per_s``."""

    @property
    def key(self) -> str:
        """``namespace/name``, or just the name for the system bucket and UID-only pods."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def contention(self) -> ContentionShares:
        """Its attributed wait split into own limit, own tasks and neighbours
        (:func:`interference.contention.contention_shares`)."""
        return contention_shares(
            own_wait_ms_per_s=self.own_wait_ms_per_s,
            neighbour_wait_ms_per_s=self.neighbour_wait_ms_per_s,
            throttled_ms_per_s=self.throttled_ms_per_s,
            cpu_ms_per_s=self.cpu_ms_per_s,
        )


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU as NVML reports it."""

    index: int
    uuid: str
    model: str
    memory_total_mib: float
    memory_used_mib: float
    utilization_pct: float
    process_count: int


@dataclass(frozen=True, slots=True)
class WindowMetrics:
    """A node's signals over the last ``span_s`` seconds: the intervals in it merged.

    ``runq_p99_us`` is the p99 of the window's merged log2 histogram (every wake-up of the
    window, not a percentile of per-second p99s); ``*_mean``/``*_max``/``*_stddev`` are
    the mean, maximum and population standard deviation of the per-interval values.
    ``index_*`` describe the per-interval interference index as the agent computed it
    (for people); the scheduler computes its own from the signals' means and σ
    (:mod:`interference.sched_record`). Burstiness: ``*_stddev`` and
    ``runq_wait_ratio_max / runq_wait_ratio_mean`` (peak-to-mean).
    """

    span_s: float
    """Nominal length of the window, s."""
    covered_s: float = 0.0
    """Seconds of intervals the window actually holds (less while the agent warms up)."""
    intervals: int = 0
    runq_p99_us: float = 0.0
    runq_wait_ratio_mean: float = 0.0
    runq_wait_ratio_max: float = 0.0
    runq_wait_ratio_stddev: float = 0.0
    reclaim_stall_ms_per_s_mean: float = 0.0
    reclaim_stall_ms_per_s_max: float = 0.0
    reclaim_stall_ms_per_s_stddev: float = 0.0
    throttled_ms_per_s_mean: float = 0.0
    throttled_ms_per_s_stddev: float = 0.0
    psi_cpu_some_mean: float = 0.0
    psi_cpu_some_stddev: float = 0.0
    psi_mem_some_mean: float = 0.0
    psi_mem_some_stddev: float = 0.0
    net_drops_per_s_mean: float = 0.0
    net_drops_per_s_stddev: float = 0.0
    index_mean: float = 0.0
    index_max: float = 0.0
    index_stddev: float = 0.0


def window_name(span_s: float) -> str:
    """Key of a window in ``NodeReport.windows`` and in the hash: ``10s``, ``60s``."""
    return f"{span_s:g}s"


@dataclass(frozen=True, slots=True)
class NodeReport:
    """Everything one agent measured on one node in one interval."""

    node: str
    ts: float
    """Unix time at the end of the interval."""
    interval_s: float
    metrics: NodeMetrics
    histograms: dict[str, list[int]] = field(default_factory=dict)
    """Log2 histograms by name, e.g. ``runq_us`` and ``reclaim_us`` (see interference.hist)."""
    pods: list[PodMetrics] = field(default_factory=list)
    gpus: list[GpuDevice] = field(default_factory=list)
    disabled_probes: dict[str, str] = field(default_factory=dict)
    """Probes that could not run on this node, with the reason."""
    measured: tuple[str, ...] = ()
    """Signal families measured this interval (sorted names from :data:`SIGNAL_FAMILIES`)."""
    windows: dict[str, WindowMetrics] = field(default_factory=dict)
    """Windowed signals by :func:`window_name` (``10s``, ``60s``)."""
    v: int = SCHEMA_VERSION
