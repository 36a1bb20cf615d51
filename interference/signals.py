"""Signal dataclasses shared by the node agent and the scheduler (DESIGN §3).

Units are part of every field name. A ``NodeReport`` is what an agent publishes once
per interval; the codec in :mod:`interference.codec` turns it into msgpack for the
stream and into decimal-string hashes for ``redis-cli``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEMA_VERSION = 1
"""Version of the msgpack NodeReport; bump on an incompatible change."""

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
    net_drops_per_s: float = 0.0
    """Packets dropped per second on all interfaces and qdiscs."""
    score: float = 0.0
    """Interference index 0–100 from :func:`interference.score.interference_score`."""


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
    runq_p99_us: float = 0.0
    reclaim_stall_ms_per_s: float = 0.0
    throttled_ms_per_s: float = 0.0

    @property
    def key(self) -> str:
        """``namespace/name``, or just the name for the system bucket and UID-only pods."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


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
    v: int = SCHEMA_VERSION
