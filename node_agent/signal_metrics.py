"""The node's and its pods' interference signals on the agent's ``/metrics``
(docs/operations.md, "Metrics": every series, its labels and its cardinality bound).

:class:`SignalCollector` is a custom collector: the measure loop hands it each report
(:meth:`SignalCollector.observe`) and a scrape builds the series from the latest one, so
a pod that left has no series at the next scrape and no per-pod object outlives it.

- **Per node** (labels ``node``, and ``window``: ``latest`` for the interval, ``10s`` and
  ``60s`` for the agent's windows, :mod:`node_agent.history`): every signal of the
  interference index as the report and the scheduling record carry it (windows: the
  run-queue p99 of the merged histogram, the mean of the others), in base units
  (``ms/s`` → ratio, percent → ratio, µs → seconds). A family the latest report did not
  measure has no series (0 would read as quiet); ``interference_node_signal_measured``
  says which were. The run-queue delay is also a real histogram,
  ``interference_node_runq_delay_seconds``: the agent's log2 slots added up since it
  started (a counter per slot, never samples observed again), slot ``i`` holding waits of
  ``[2^i, 2^(i+1))`` µs as the probe truncates them to whole µs, so its bucket ``le`` is
  ``2^(i+1)`` µs; the last slot also holds every longer wait and is ``+Inf``. ``_sum`` is
  the run-queue wait of the same intervals (``runq_wait_ratio · T · ncpu``).
- **Per pod** (labels ``node``, ``namespace``, ``pod``; never a UID, and never a pod the
  agent knows only by UID or the ``system`` bucket): the pods that declare a tolerance,
  the :data:`TOP_PODS` victims (most run-queue wait behind neighbours, their own CFS limit
  taken out, :func:`interference.contention.contention_shares`) and the :data:`TOP_PODS`
  antagonists (most wait other pods' tasks ended behind, from their ``culprits``) of the
  latest interval. Their run-queue p99 also per window (label ``window``, as the node's:
  the p99 of the pod's slots merged over the last 10 s and 60 s, which the collector keeps
  for every named pod: the keys and slot tuples of the intervals of the longest window),
  the other pod series of the latest interval. At most ``max_pods`` pods
  (``--metrics-max-pods``): victims first, then antagonists, then pods with a tolerance
  by name; the rest are counted in ``interference_agent_pod_metrics_left_out`` and
  logged once.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from interference import hist
from interference.signals import (
    SIGNAL_FAMILIES,
    SYSTEM_POD,
    TOP_CULPRITS,
    WINDOWS_S,
    NodeMetrics,
    NodeReport,
    PodMetrics,
    WindowMetrics,
    window_name,
)
from node_agent.tolerances import PodTolerance

log = logging.getLogger(__name__)

DEFAULT_MAX_PODS = 50
"""Pods with per-pod series per agent unless ``--metrics-max-pods`` says otherwise."""
TOP_PODS = TOP_CULPRITS
"""Victims, and antagonists, exported per interval (as many as a pod row names culprits)."""
LATEST = "latest"
"""The ``window`` label of the interval's own values."""

US = 1e-6
MS = 1e-3
PERCENT = 1e-2


@dataclass(frozen=True)
class NodeSignal:
    """One per-node signal: its metric, the report's fields for it and their scale."""

    metric: str
    help: str
    family: str | None
    """The signal family that must be measured; None: always shown (the index)."""
    latest: str
    """Field of :class:`NodeMetrics`."""
    window: str | None
    """Field of :class:`WindowMetrics`; None: only the interval's value."""
    scale: float = 1.0


NODE_RUNQ_P99 = "interference_node_runq_p99_seconds"
POD_TOLERANCE_RUNQ_P99 = "interference_pod_tolerance_runq_p99_seconds"

NODE_SIGNALS = (
    NodeSignal(
        NODE_RUNQ_P99,
        "99th percentile run-queue delay of the node's tasks (window: of the merged histogram).",
        "runq",
        "runq_p99_us",
        "runq_p99_us",
        US,
    ),
    NodeSignal(
        "interference_node_runq_wait_ratio",
        "Seconds tasks waited for a CPU per CPU-second (window: mean).",
        "runq",
        "runq_wait_ratio",
        "runq_wait_ratio_mean",
    ),
    NodeSignal(
        "interference_node_reclaim_stall_ratio",
        "Seconds tasks stalled in memory reclaim per second (window: mean).",
        "reclaim",
        "reclaim_stall_ms_per_s",
        "reclaim_stall_ms_per_s_mean",
        MS,
    ),
    NodeSignal(
        "interference_node_cpu_throttled_ratio",
        "Seconds of CFS-quota throttling per second, summed over pods (window: mean).",
        "throttle",
        "throttled_ms_per_s",
        "throttled_ms_per_s_mean",
        MS,
    ),
    NodeSignal(
        "interference_node_psi_cpu_some_ratio",
        "Share of time some task waited for a CPU, PSI (window: mean).",
        "psi",
        "psi_cpu_some",
        "psi_cpu_some_mean",
        PERCENT,
    ),
    NodeSignal(
        "interference_node_psi_memory_some_ratio",
        "Share of time some task stalled on memory, PSI (window: mean).",
        "psi",
        "psi_mem_some",
        "psi_mem_some_mean",
        PERCENT,
    ),
    NodeSignal(
        "interference_node_psi_memory_full_ratio",
        "Share of time all non-idle tasks stalled on memory, PSI (the interval only).",
        "psi",
        "psi_mem_full",
        None,
        PERCENT,
    ),
    NodeSignal(
        "interference_node_psi_memory_some_avg10_ratio",
        "The kernel's own 10 s average of the share of time some task stalled on memory, "
        "PSI some avg10 (what the MemoryPressure score reads; the interval only).",
        "psi",
        "psi_mem_some_avg10",
        None,
        PERCENT,
    ),
    NodeSignal(
        "interference_node_network_drops_per_second",
        "Packets dropped per second on all interfaces and qdiscs (window: mean).",
        "net",
        "net_drops_per_s",
        "net_drops_per_s_mean",
    ),
    NodeSignal(
        "interference_node_index",
        "The agent's interference index, 0 quiet - 100 saturated (window: mean).",
        None,
        "interference_index",
        "index_mean",
    ),
)
"""Every per-node gauge, in exposition order."""

RUNQ_HISTOGRAM = "interference_node_runq_delay_seconds"
MEASURED = "interference_node_signal_measured"
POD_LABELS = ("node", "namespace", "pod")
POD_RUNQ_P99 = "interference_pod_runq_p99_seconds"
POD_RECLAIM = "interference_pod_reclaim_stall_ratio"
POD_NEIGHBOUR_WAIT = "interference_pod_neighbour_wait_ratio"
POD_CAUSED_WAIT = "interference_pod_caused_wait_ratio"
POD_TOLERANCES = (
    (
        POD_TOLERANCE_RUNQ_P99,
        "The pod's interference.io/max-runq-p99-us, in seconds.",
        "max_runq_p99_us",
        US,
    ),
    (
        "interference_pod_tolerance_reclaim_stall_ratio",
        "The pod's interference.io/max-reclaim-stall-ms-per-s, as a ratio.",
        "max_reclaim_stall_ms_per_s",
        MS,
    ),
    (
        "interference_pod_tolerance_index",
        "The pod's interference.io/max-index (0-100).",
        "max_index",
        1.0,
    ),
)
PODS_EXPORTED = "interference_agent_pod_metrics_exported"
PODS_LEFT_OUT = "interference_agent_pod_metrics_left_out"


def bucket_bounds() -> tuple[str, ...]:
    """The ``le`` of each log2 slot but the last (which is ``+Inf``), in seconds."""
    return tuple(repr((1 << (i + 1)) * US) for i in range(hist.MAX_SLOTS - 1))


_BOUNDS = bucket_bounds()


def cumulative_buckets(slots: Iterable[int]) -> list[tuple[str, float]]:
    """``(le, count)`` pairs of a log2 histogram, cumulative, ending with ``+Inf`` = total."""
    buckets: list[tuple[str, float]] = []
    seen = 0
    normalized = hist.normalize(list(slots))
    for le, count in zip(_BOUNDS, normalized, strict=False):
        seen += count
        buckets.append((le, float(seen)))
    buckets.append(("+Inf", float(seen + normalized[-1])))
    return buckets


@dataclass(frozen=True)
class _Snapshot:
    report: NodeReport
    runq_slots: tuple[int, ...]
    runq_sum_s: float
    pod_history: tuple[tuple[float, Mapping[str, tuple[int, ...]]], ...] = ()
    """``(ended_at, {pod key: its run-queue slots})`` of the intervals of the longest
    window that had pod rows, newest first."""


ToleranceOf = Callable[[str], PodTolerance | None]


def _no_tolerance(_uid: str) -> PodTolerance | None:
    return None


class SignalCollector(Collector):
    """The latest report's signals as Prometheus series (see the module docstring)."""

    def __init__(
        self,
        node: str,
        max_pods: int = DEFAULT_MAX_PODS,
        tolerance_of: ToleranceOf = _no_tolerance,
        top: int = TOP_PODS,
    ) -> None:
        if max_pods < 0:
            raise ValueError(f"max pods must be ≥ 0, got {max_pods}")
        self.node = node
        self.max_pods = max_pods
        self.top = top
        self._tolerance_of = tolerance_of
        self._lock = threading.Lock()
        self._snapshot: _Snapshot | None = None
        self._runq_slots = [0] * hist.MAX_SLOTS
        self._runq_sum_s = 0.0
        self._pod_history: deque[tuple[float, Mapping[str, tuple[int, ...]]]] = deque()
        self._warned = False

    def observe(self, report: NodeReport, ncpu: int) -> None:
        """Take ``report`` as the latest and add its run-queue histogram to the totals."""
        slots = report.histograms.get("runq_us")
        if slots:
            self._runq_slots = hist.add(self._runq_slots, slots)
            self._runq_sum_s += report.metrics.runq_wait_ratio * report.interval_s * ncpu
        if report.pods and "runq" in report.measured:
            self._pod_history.appendleft(
                (report.ts, {p.key: p.runq_us for p in report.pods if p.namespace})
            )
        horizon = report.ts - max(WINDOWS_S)
        while self._pod_history and self._pod_history[-1][0] <= horizon:
            self._pod_history.pop()
        snapshot = _Snapshot(
            report, tuple(self._runq_slots), self._runq_sum_s, tuple(self._pod_history)
        )
        with self._lock:
            self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        """Nothing before the first report; then the node's and the chosen pods' series."""
        with self._lock:
            snapshot = self._snapshot
        if snapshot is None:
            return
        yield from self._node_families(snapshot)
        yield from self._pod_families(snapshot)

    # -- per node -------------------------------------------------------------------
    def _node_families(self, snapshot: _Snapshot) -> Iterator[Metric]:
        report = snapshot.report
        measured = set(report.measured)
        windows: list[tuple[str, NodeMetrics | WindowMetrics]] = [(LATEST, report.metrics)]
        windows += [(name, w) for name, w in sorted(report.windows.items()) if w.intervals > 0]
        for signal in NODE_SIGNALS:
            family = GaugeMetricFamily(signal.metric, signal.help, labels=("node", "window"))
            if signal.family is None or signal.family in measured:
                for name, values in windows:
                    field = signal.latest if name == LATEST else signal.window
                    if field is not None:
                        value = float(getattr(values, field)) * signal.scale
                        family.add_metric((self.node, name), value)
            yield family
        measured_family = GaugeMetricFamily(
            MEASURED,
            "1 for each signal family the latest interval measured completely, else 0.",
            labels=("node", "family"),
        )
        for name in SIGNAL_FAMILIES:
            measured_family.add_metric((self.node, name), 1.0 if name in measured else 0.0)
        yield measured_family
        histogram = HistogramMetricFamily(
            RUNQ_HISTOGRAM,
            "Run-queue delay of the node's tasks since the agent started (log2 buckets).",
            labels=("node",),
        )
        histogram.add_metric(
            (self.node,), cumulative_buckets(snapshot.runq_slots), snapshot.runq_sum_s
        )
        yield histogram

    # -- per pod --------------------------------------------------------------------
    def chosen_pods(self, report: NodeReport) -> tuple[list[PodMetrics], int, dict[str, float]]:
        """The pods with series (victims, antagonists, then pods with a tolerance by
        name, at most ``max_pods``), how many more qualified, and each pod's caused wait."""
        named = {p.key: p for p in report.pods if p.namespace and p.name != SYSTEM_POD}
        caused: dict[str, float] = {}
        victims: list[tuple[float, str]] = []
        for pod in report.pods:
            for culprit, ms in pod.culprits:
                caused[culprit] = caused.get(culprit, 0.0) + ms
            if pod.key not in named:
                continue
            shares = pod.contention()
            if shares.cause == "neighbours":
                victims.append((-shares.neighbours_ms_per_s, pod.key))
        antagonists = sorted((-ms, key) for key, ms in caused.items() if key in named and ms > 0)
        order = [key for _, key in sorted(victims)[: self.top]]
        order += [key for _, key in antagonists[: self.top]]
        order += sorted(key for key, pod in named.items() if self._tolerance_of(pod.uid))
        chosen = list(dict.fromkeys(order))
        pods = [named[key] for key in chosen[: self.max_pods]]
        return pods, max(0, len(chosen) - self.max_pods), caused

    def _pod_families(self, snapshot: _Snapshot) -> Iterator[Metric]:
        report = snapshot.report
        pods, left_out, caused = self.chosen_pods(report)
        windows = pod_windows(snapshot, [p.key for p in pods])
        if left_out and not self._warned:
            self._warned = True
            log.warning(
                "%d pod(s) beyond --metrics-max-pods %d have no per-pod metrics (counted in "
                "%s; logged once)",
                left_out,
                self.max_pods,
                PODS_LEFT_OUT,
            )
        families = {
            POD_RUNQ_P99: GaugeMetricFamily(
                POD_RUNQ_P99,
                "99th percentile run-queue delay of the pod's tasks (windows: of the merged"
                " histogram).",
                labels=(*POD_LABELS, "window"),
            ),
            POD_RECLAIM: GaugeMetricFamily(
                POD_RECLAIM,
                "Seconds the pod's tasks stalled in memory reclaim per second, latest interval.",
                labels=POD_LABELS,
            ),
            POD_NEIGHBOUR_WAIT: GaugeMetricFamily(
                POD_NEIGHBOUR_WAIT,
                "Seconds per second the pod's tasks waited for a CPU behind other pods and"
                " system tasks, its own CFS limit taken out, latest interval.",
                labels=POD_LABELS,
            ),
            POD_CAUSED_WAIT: GaugeMetricFamily(
                POD_CAUSED_WAIT,
                "Seconds per second other pods' tasks waited for a CPU that the pod's tasks"
                " held, latest interval (from their top culprits).",
                labels=POD_LABELS,
            ),
        }
        tolerances = {
            name: GaugeMetricFamily(name, doc, labels=POD_LABELS)
            for name, doc, _, _ in POD_TOLERANCES
        }
        for pod in pods:
            labels = (self.node, pod.namespace, pod.name)
            shares = pod.contention()
            families[POD_RUNQ_P99].add_metric((*labels, LATEST), pod.runq_p99_us * US)
            for name, p99_us in windows.get(pod.key, ()):
                families[POD_RUNQ_P99].add_metric((*labels, name), p99_us * US)
            families[POD_RECLAIM].add_metric(labels, pod.reclaim_stall_ms_per_s * MS)
            families[POD_NEIGHBOUR_WAIT].add_metric(labels, shares.neighbours_ms_per_s * MS)
            families[POD_CAUSED_WAIT].add_metric(labels, caused.get(pod.key, 0.0) * MS)
            tolerance = self._tolerance_of(pod.uid) if pod.uid else None
            if tolerance is None:
                continue
            for name, _, field, scale in POD_TOLERANCES:
                bound = getattr(tolerance, field)
                if bound is not None:
                    tolerances[name].add_metric(labels, bound * scale)
        yield from families.values()
        yield from tolerances.values()
        exported = GaugeMetricFamily(
            PODS_EXPORTED, "Pods with per-pod interference series at this scrape."
        )
        exported.add_metric((), float(len(pods)))
        yield exported
        left = GaugeMetricFamily(
            PODS_LEFT_OUT,
            "Pods that qualified for per-pod series but are beyond --metrics-max-pods.",
        )
        left.add_metric((), float(left_out))
        yield left


def pod_windows(snapshot: _Snapshot, keys: Iterable[str]) -> dict[str, list[tuple[str, float]]]:
    """Per pod of ``keys``, ``(window, p99 µs)`` of its slots merged over each window of
    :data:`WINDOWS_S` (the intervals ended in ``(ts − span, ts]`` of the latest report
    that had pod rows); a window in which the pod was in no interval is left out."""
    ts = snapshot.report.ts
    spans = sorted(WINDOWS_S)
    found: dict[str, list[tuple[str, float]]] = {}
    for key in keys:
        merged = [0] * hist.MAX_SLOTS
        seen = False
        results: list[tuple[str, float]] = []
        span_index = 0
        for ended_at, slots_of in snapshot.pod_history:
            while span_index < len(spans) and ended_at <= ts - spans[span_index]:
                if seen:
                    results.append((window_name(spans[span_index]), hist.percentile(merged, 0.99)))
                span_index += 1
            if span_index == len(spans):
                break
            slots = slots_of.get(key)
            if slots is not None:
                seen = True
                for i, count in enumerate(slots[: hist.MAX_SLOTS]):
                    merged[i] += count
        while span_index < len(spans):
            if seen:
                results.append((window_name(spans[span_index]), hist.percentile(merged, 0.99)))
            span_index += 1
        found[key] = results
    return found
