"""One interval of probe samples → node summary, per-pod rows and node histograms.

:func:`aggregate` is pure: samples, the owners of their keys (from
:func:`resolve_owners`), the interval and the CPU count in, an :class:`Aggregate` out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace

from interference import hist
from interference.freshness import complete_families
from interference.index import IndexReferences, interference_index
from interference.signals import TOP_CULPRITS, NodeMetrics, PodMetrics
from node_agent.attribution import SYSTEM, Attributor, PodIdentity
from node_agent.probes import base

PROBE_FAMILIES: Mapping[str, tuple[str, ...]] = {
    "runqlat": ("runq",),
    "reclaim": ("reclaim",),
    "taskstats": ("runq", "reclaim"),
    "cpu_throttle": ("throttle",),
    "psi": ("psi",),
    "network": ("net",),
    "memory_events": ("memory_events",),
}
"""Signal families (:data:`interference.signals.SIGNAL_FAMILIES`) each probe measures."""

NS_PER_MS = 1e6
NS_PER_S = 1e9
US_PER_S = 1e6


@dataclass(frozen=True)
class Owners:
    """Who owns each key of an interval's samples; ``None`` marks a key outside the
    agent's cgroup root, which is left out of every figure."""

    by_cgroup_id: Mapping[int, PodIdentity | None] = field(default_factory=dict)
    by_cgroup_path: Mapping[str, PodIdentity | None] = field(default_factory=dict)
    by_pid: Mapping[int, PodIdentity | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Aggregate:
    """What one interval adds up to."""

    metrics: NodeMetrics
    histograms: dict[str, list[int]]
    """Node-wide ``runq_us`` and ``reclaim_us`` log2 histograms."""
    pods: list[PodMetrics]
    """One row per pod seen in the interval, plus the ``system`` bucket when it has data;
    none when a probe lost BPF map entries (:func:`aggregate`)."""
    measured: tuple[str, ...] = ()
    """Signal families the samples measured completely (:func:`aggregate`)."""


def measured_families(probes: Iterable[str]) -> tuple[str, ...]:
    """Sorted families measured by the probes that delivered a sample this interval."""
    return tuple(sorted({f for p in probes for f in PROBE_FAMILIES.get(p, ())}))


@dataclass
class _Totals:
    """Metric sums and histograms of one owner."""

    identity: PodIdentity
    values: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    histograms: dict[str, list[int]] = field(default_factory=dict)
    waits_by_culprit_ns: dict[PodIdentity, float] = field(
        default_factory=lambda: defaultdict(float)
    )
    """Run-queue wait by the owner whose task held the CPU when it ended (the container
    left out of the identity: a pod is one culprit)."""

    def add_values(self, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.values[name] += value

    def add_histogram(self, name: str, buckets: list[int]) -> None:
        self.histograms[name] = hist.add(self.histograms.get(name, []), buckets)


def resolve_owners(
    samples: Iterable[base.Sample], attributor: Attributor, cgroup_root: str = "/"
) -> Owners:
    """Look up the owner of every cgroup id, cgroup path and pid in ``samples``.

    Cgroups outside ``cgroup_root`` map to ``None``; below a narrower root than ``/`` a
    cgroup id the attributor cannot place (outside the root, or already removed) does too.
    """
    whole_host = cgroup_root.strip("/") == ""
    ids: dict[int, PodIdentity | None] = {}
    paths: dict[str, PodIdentity | None] = {}
    pids: dict[int, PodIdentity | None] = {}
    for sample in samples:
        culprit_ids = (cgroup_id for pair in sample.waits_by_culprit for cgroup_id in pair)
        for cgroup_id in (*sample.by_cgroup_id, *sample.histograms_by_cgroup_id, *culprit_ids):
            if cgroup_id not in ids:
                path = attributor.path_of(cgroup_id)
                if path is not None:
                    ids[cgroup_id] = attributor.by_path(path)
                else:
                    ids[cgroup_id] = SYSTEM if whole_host else None
        for path in sample.by_cgroup_path:
            if path not in paths:
                inside = whole_host or is_below(path, cgroup_root)
                paths[path] = attributor.by_path(path) if inside else None
        for pid in sample.by_pid:
            if pid not in pids:
                pids[pid] = attributor.by_pid(pid)
    return Owners(by_cgroup_id=ids, by_cgroup_path=paths, by_pid=pids)


def is_below(path: str, root: str) -> bool:
    """Whether cgroup ``path`` is ``root`` or inside it (both relative to a mount)."""
    top = "/" + root.strip("/")
    return path == top or path.startswith(top.rstrip("/") + "/")


def aggregate(
    samples: Mapping[str, base.Sample],
    owners: Owners,
    interval_s: float,
    ncpu: int,
    refs: IndexReferences | None = None,
    cgroup_root: str = "/",
) -> Aggregate:
    """Sum one interval's samples (keyed by probe name) per owner and for the node.

    ``samples`` must hold only probes that collected successfully: the probes present
    decide ``measured`` (:data:`PROBE_FAMILIES`), less the families of every probe whose
    sample lost BPF map entries (``bpf_lost_entries`` > 0,
    :func:`interference.freshness.complete_families`); a family not measured is left out
    of the index. Lost entries may have been any pod's, so such an interval publishes no
    per-pod rows at all rather than rows that read quieter than they were; its node
    figures stay as lower bounds beside ``measured``, which says they are incomplete.

    Run-queue figures come from the ``runqlat`` probe when its sample is present, else
    from taskstats CPU delay (``cpu_delay_ns``; its histogram is approximate: each task's
    waits all land in the slot of that task's mean wait). Reclaim stall likewise comes
    from ``reclaim``, else from taskstats ``reclaim_delay_ns``. With ``T`` the interval
    in seconds:

    - ``runq_p50_us``, ``runq_p99_us``: :func:`interference.hist.percentile` of the
      merged ``runq_us`` histogram;
    - ``runq_wait_ratio = Σ runq_ns / (T · 1e9 · ncpu)`` (waiting-task seconds per
      CPU-second);
    - ``reclaim_stall_ms_per_s = Σ reclaim_ns / 1e6 / T``;
    - ``reclaim_events_per_s = (Σ reclaim_count + Σ vmscan_throttled) / T``;
    - ``throttled_ms_per_s = Σ throttled_ns / 1e6 / T``;
    - ``psi_* = 100 · stall_us / (T · 1e6)``, capped at 100, from the node PSI totals,
      or, below a narrower ``cgroup_root`` than ``/``, from that cgroup's own pressure
      files (they cover its subtree, which is the "node" the agent measures);
    - ``psi_mem_some_avg10``: the kernel's own 10 s average the psi probe read for the
      same subtree (a gauge, as the kernel gives it);
    - ``net_drops_per_s = Σ net_drops / T``;
    - ``interference_index``: :func:`interference.index.interference_index` with
      ``refs`` over the measured families.

    - ``idle_wakeup_ms_per_s = Σ idle_wakeup_ns / 1e6 / T`` (published, not part of the index);
    - ``bpf_missed_events``: Σ of the probes' skipped BPF runs in the interval;
    - ``bpf_lost_entries``: Σ of the map entries the probes' BPF programs could not keep.

    Per pod: ``cpu_ms_per_s`` (on-CPU), ``runq_wait_ms_per_s``, ``idle_wakeup_ms_per_s``,
    ``runq_p99_us``, ``reclaim_stall_ms_per_s`` and ``throttled_ms_per_s``, same formulas;
    from the run-queue waits by culprit (``Sample.waits_by_culprit``, the owner whose task
    held the CPU when a wait ended; outside the measured subtree: ``system``):
    ``own_wait_ms_per_s`` (behind the pod itself, any of its containers),
    ``neighbour_wait_ms_per_s`` (behind anyone else) and ``culprits``, the
    :data:`~interference.signals.TOP_CULPRITS` longest of the latter by pod.
    Keys missing from ``owners`` count as ``system``; keys owned by ``None`` are dropped.
    """
    if interval_s <= 0:
        raise ValueError(f"interval must be > 0, got {interval_s}")
    if ncpu < 1:
        raise ValueError(f"ncpu must be ≥ 1, got {ncpu}")
    runq_from_bpf = "runqlat" in samples
    reclaim_from_bpf = "reclaim" in samples
    per_owner = _per_owner_totals(samples.values(), owners, runq_from_bpf)

    node_values: dict[str, float] = defaultdict(float)
    for sample in samples.values():
        for name, value in sample.node.items():
            node_values[name] += value
    root_path = "/" + cgroup_root.strip("/")
    psi = samples.get("psi")
    if root_path != "/" and psi is not None:
        subtree = psi.by_cgroup_path.get(root_path, {})
        for name in (base.PSI_CPU_SOME_US, base.PSI_MEM_SOME_US, base.PSI_MEM_FULL_US):
            node_values[name] = subtree.get(name, 0.0)

    runq_metric = base.RUNQ_NS if runq_from_bpf else base.CPU_DELAY_NS
    reclaim_metric = base.RECLAIM_NS if reclaim_from_bpf else base.RECLAIM_DELAY_NS
    node_hists = {base.HIST_RUNQ_US: hist.normalize([]), base.HIST_RECLAIM_US: hist.normalize([])}
    pods: list[PodMetrics] = []
    sums: dict[str, float] = defaultdict(float)
    for totals in per_owner.values():
        for name, buckets in totals.histograms.items():
            node_hists[name] = hist.add(node_hists.get(name, []), buckets)
        for name, value in totals.values.items():
            sums[name] += value
        ident = totals.identity
        culprits = _culprit_parts(totals, interval_s)
        pods.append(
            PodMetrics(
                namespace=ident.namespace,
                name=ident.name,
                uid=ident.uid,
                qos=ident.qos,
                cpu_ms_per_s=totals.values[base.ONCPU_NS] / NS_PER_MS / interval_s,
                runq_wait_ms_per_s=totals.values[runq_metric] / NS_PER_MS / interval_s,
                idle_wakeup_ms_per_s=totals.values[base.IDLE_WAKEUP_NS] / NS_PER_MS / interval_s,
                runq_p99_us=hist.percentile(totals.histograms.get(base.HIST_RUNQ_US, []), 0.99),
                runq_us=tuple(hist.trimmed(totals.histograms.get(base.HIST_RUNQ_US, []))),
                reclaim_stall_ms_per_s=totals.values[reclaim_metric] / NS_PER_MS / interval_s,
                throttled_ms_per_s=totals.values[base.THROTTLED_NS] / NS_PER_MS / interval_s,
                own_wait_ms_per_s=culprits.own_ms_per_s,
                neighbour_wait_ms_per_s=culprits.neighbour_ms_per_s,
                culprits=culprits.top,
            )
        )
    pods.sort(key=lambda p: (p.uid != "", p.key))

    runq = node_hists[base.HIST_RUNQ_US]
    partial = NodeMetrics(
        runq_p50_us=hist.percentile(runq, 0.5),
        runq_p99_us=hist.percentile(runq, 0.99),
        runq_wait_ratio=sums[runq_metric] / (interval_s * NS_PER_S * ncpu),
        reclaim_stall_ms_per_s=sums[reclaim_metric] / NS_PER_MS / interval_s,
        reclaim_events_per_s=(
            sums[base.RECLAIM_COUNT]
            + sums[base.VMSCAN_THROTTLED]
            + node_values[base.VMSCAN_THROTTLED]
        )
        / interval_s,
        throttled_ms_per_s=sums[base.THROTTLED_NS] / NS_PER_MS / interval_s,
        psi_cpu_some=_psi_percent(node_values[base.PSI_CPU_SOME_US], interval_s),
        psi_mem_some=_psi_percent(node_values[base.PSI_MEM_SOME_US], interval_s),
        psi_mem_full=_psi_percent(node_values[base.PSI_MEM_FULL_US], interval_s),
        psi_mem_some_avg10=node_values[base.PSI_MEM_SOME_AVG10],
        net_drops_per_s=node_values[base.NET_DROPS] / interval_s,
        idle_wakeup_ms_per_s=sums[base.IDLE_WAKEUP_NS] / NS_PER_MS / interval_s,
        bpf_missed_events=node_values[base.BPF_MISSED_EVENTS],
        bpf_lost_entries=node_values[base.BPF_LOST_ENTRIES],
    )
    lost_entries = [n for n, s in samples.items() if s.node.get(base.BPF_LOST_ENTRIES, 0.0) > 0]
    measured = complete_families(measured_families(samples), measured_families(lost_entries))
    index = interference_index(asdict(partial), refs or IndexReferences(), measured)
    metrics = replace(partial, interference_index=index)
    if lost_entries:
        pods = []
    return Aggregate(metrics=metrics, histograms=node_hists, pods=pods, measured=measured)


@dataclass(frozen=True)
class _CulpritParts:
    own_ms_per_s: float
    neighbour_ms_per_s: float
    top: tuple[tuple[str, float], ...]


def _culprit_parts(totals: _Totals, interval_s: float) -> _CulpritParts:
    """An owner's waits behind itself, behind others, and its :data:`TOP_CULPRITS`."""
    own_key = _pod_of(totals.identity)
    own = 0.0
    neighbours: dict[str, float] = defaultdict(float)
    for culprit, wait_ns in totals.waits_by_culprit_ns.items():
        ms_per_s = wait_ns / NS_PER_MS / interval_s
        if _pod_of(culprit) == own_key:
            own += ms_per_s
        else:
            neighbours[_culprit_key(culprit)] += ms_per_s
    top = sorted(neighbours.items(), key=lambda item: (-item[1], item[0]))[:TOP_CULPRITS]
    return _CulpritParts(
        own_ms_per_s=own,
        neighbour_ms_per_s=sum(neighbours.values()),
        top=tuple((key, round(ms, 3)) for key, ms in top),
    )


def _pod_of(identity: PodIdentity) -> tuple[str, str, str]:
    return (identity.uid, identity.namespace, identity.name)


def _culprit_key(identity: PodIdentity) -> str:
    """The culprit as a pod row names it (:attr:`interference.signals.PodMetrics.key`)."""
    return f"{identity.namespace}/{identity.name}" if identity.namespace else identity.name


def _per_owner_totals(
    samples: Iterable[base.Sample], owners: Owners, runq_from_bpf: bool
) -> dict[tuple[str, str, str], _Totals]:
    totals: dict[tuple[str, str, str], _Totals] = {}

    def owner_totals(identity: PodIdentity | None) -> _Totals | None:
        if identity is None:
            return None
        key = (identity.uid, identity.namespace, identity.name)
        if key not in totals:
            totals[key] = _Totals(identity=identity)
        return totals[key]

    for sample in samples:
        for cgroup_id, values in sample.by_cgroup_id.items():
            if (owner := owner_totals(owners.by_cgroup_id.get(cgroup_id, SYSTEM))) is not None:
                owner.add_values(values)
        for cgroup_id, histograms in sample.histograms_by_cgroup_id.items():
            if (owner := owner_totals(owners.by_cgroup_id.get(cgroup_id, SYSTEM))) is not None:
                for name, buckets in histograms.items():
                    owner.add_histogram(name, buckets)
        for (waiting, culprit), wait in sample.waits_by_culprit.items():
            if (owner := owner_totals(owners.by_cgroup_id.get(waiting, SYSTEM))) is not None:
                # A culprit outside the measured subtree is still a neighbour: system.
                held_by = owners.by_cgroup_id.get(culprit, SYSTEM) or SYSTEM
                owner.waits_by_culprit_ns[held_by] += wait.get(base.CULPRIT_WAIT_NS, 0.0)
        for path, values in sample.by_cgroup_path.items():
            if (owner := owner_totals(owners.by_cgroup_path.get(path, SYSTEM))) is not None:
                owner.add_values(values)
        for pid, values in sample.by_pid.items():
            if (owner := owner_totals(owners.by_pid.get(pid, SYSTEM))) is not None:
                owner.add_values(values)
                if not runq_from_bpf:
                    owner.add_histogram(base.HIST_RUNQ_US, _taskstats_runq_histogram(values))
    return totals


def _taskstats_runq_histogram(values: Mapping[str, float]) -> list[int]:
    """A task's ``cpu_delay_count`` waits placed in the slot of its mean wait (µs)."""
    count = int(values.get(base.CPU_DELAY_COUNT, 0))
    if count <= 0:
        return []
    mean_us = values.get(base.CPU_DELAY_NS, 0.0) / count / 1000
    buckets = [0] * (hist.slot_of(int(mean_us)) + 1)
    buckets[-1] = count
    return buckets


def _psi_percent(stall_us: float, interval_s: float) -> float:
    return min(100.0, max(0.0, 100.0 * stall_us / (interval_s * US_PER_S)))
