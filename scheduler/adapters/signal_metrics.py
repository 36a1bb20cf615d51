"""The Redis adapters' metrics (registered on the scheduler's registry), and the bulk
histogram the follower feeds a poll's observations through at once."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from scheduler.signals.records import REJECT_REASONS

UNKNOWN_NODE = "unknown_node"
"""Rejection reason of a record under the key of a name that is no Node."""

POLL_DURATION_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
SIGNAL_AGE_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


class BulkHistogram(Collector):
    """A Prometheus histogram fed a numpy array of observations at once, exposed through a
    custom collector. ``Histogram.observe`` costs ~3 µs a value: 15 ms of every poll at
    5,000 nodes (measured, cProfile), a third of the poll; this is one ``searchsorted``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name, self._documentation = name, documentation
        self._bounds = np.array([*buckets, np.inf])
        self._counts = np.zeros(len(self._bounds), np.int64)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: NDArray[np.float64]) -> None:
        """Count every value (a value equal to a bound falls in that bound's bucket)."""
        slots = np.searchsorted(self._bounds, values, side="left")
        counts = np.bincount(slots, minlength=len(self._bounds))
        with self._lock:
            self._counts += counts
            self._sum += float(values.sum())

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self._name, self._documentation)]

    def collect(self) -> list[HistogramMetricFamily]:
        with self._lock:
            cumulative = np.cumsum(self._counts).tolist()
            total = self._sum
        buckets = [
            (floatToGoString(bound), count)  # type: ignore[no-untyped-call]
            for bound, count in zip(self._bounds.tolist(), cumulative, strict=True)
        ]
        family = HistogramMetricFamily(self._name, self._documentation)
        family.add_metric([], buckets, total)
        return [family]


class SignalMetrics:
    """Counters of the Redis adapters (registered on the scheduler's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.records_rejected = Counter(
            "interference_scheduler_signal_records_rejected",
            "Scheduling records ignored, by reason (size, version, node, clock, interval,"
            " value, unknown_node).",
            ["reason"],
            registry=registry,
        )
        self.records_accepted = Counter(
            "interference_scheduler_signal_records",
            "New scheduling records accepted into the signal cache.",
            registry=registry,
        )
        self.ranking_errors = Counter(
            "interference_scheduler_ranking_write_errors",
            "Failed writes of the node ranking (intf:nodes).",
            registry=registry,
        )
        self.redis_errors = Counter(
            "interference_scheduler_redis_errors",
            "Failed Redis calls of the signal cache (each starts or prolongs an outage).",
            registry=registry,
        )
        self.decision_write_errors = Counter(
            "interference_scheduler_decision_write_errors",
            "Decision records that could not be written to Redis.",
            registry=registry,
        )
        self.signal_age = BulkHistogram(
            "interference_scheduler_signal_age_seconds",
            "Age of each new scheduling record when it reached the cache: now minus the end"
            " of its kernel measurement interval (the record's ts).",
            buckets=SIGNAL_AGE_BUCKETS_S,
            registry=registry,
        )
        self.poll_duration = Histogram(
            "interference_scheduler_signal_poll_seconds",
            "Duration of one poll of every known node's scheduling record: MGET, bulk decode"
            " and checks, the new frame (the follower thread holds the interpreter for most"
            " of it).",
            buckets=POLL_DURATION_BUCKETS_S,
            registry=registry,
        )
        for reason in (*REJECT_REASONS, UNKNOWN_NODE):
            self.records_rejected.labels(reason)
        self.reports_refused = Counter(
            "interference_scheduler_node_reports_refused",
            "Node report streams (the rebalancer's reads) or entries (the decision page's"
            " index chart) not used, by reason: too_big (over the size or msgpack length"
            " limits), undecodable, unreadable (Redis cut or failed the node's own read).",
            ["reason"],
            registry=registry,
        )
        for reason in ("too_big", "undecodable", "unreadable"):
            self.reports_refused.labels(reason)
