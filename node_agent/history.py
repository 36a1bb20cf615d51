"""A node's recent intervals, and the windowed signals the agent publishes beside each
interval's (:class:`interference.signals.WindowMetrics`).

One second decides nothing: a quiet node's per-second run-queue p99 is the maximum of a
few dozen wake-ups, and an antagonist that is on for 5 s and off for 5 s looks quiet half
of the time. So every report also carries, per window span ``W`` (10 s and 60 s), over
the intervals that ended in the last ``W`` seconds:

- ``runq_p99_us``: the p99 of the *merged* log2 run-queue histogram (every wake-up of the
  window counts once; not a percentile of per-second percentiles);
- ``runq_wait_ratio_*``, ``reclaim_stall_ms_per_s_*``, ``index_*``: mean, maximum and
  population standard deviation σ of the per-interval values (the other signals of the
  index, ``throttled_ms_per_s``, ``psi_cpu_some``, ``psi_mem_some``, ``net_drops_per_s``:
  mean and σ, from which the scheduler computes its own index; each signal over the
  intervals that measured its family, so an unmeasured 0 never averages in as "quiet"),
  each interval weighted by its length ``T``:
  ``mean = Σ Tᵢ·xᵢ / Σ Tᵢ``, ``σ² = Σ Tᵢ·(xᵢ − mean)² / Σ Tᵢ``.

Burstiness reads as σ or as peak-to-mean (``max / mean``).

Only intervals that measured the run queue enter a window (an interval whose run-queue
probe failed says nothing about it), so a window never averages "unknown" as "quiet".
Memory is bounded: intervals older than the longest span are dropped.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from interference import hist
from interference.signals import CORE_FAMILIES, WINDOWS_S, NodeMetrics, WindowMetrics, window_name


@dataclass(frozen=True, slots=True)
class IntervalMetrics:
    """What a window needs from one interval."""

    ended_at: float
    """Unix time at the end of the interval (the report's ``ts``)."""
    interval_s: float
    runq_us: tuple[int, ...]
    """The interval's node run-queue log2 histogram."""
    runq_wait_ratio: float
    reclaim_stall_ms_per_s: float
    interference_index: float
    throttled_ms_per_s: float = 0.0
    psi_cpu_some: float = 0.0
    psi_mem_some: float = 0.0
    net_drops_per_s: float = 0.0
    measured: frozenset[str] = frozenset()
    """The families the interval measured: a signal's window moments use only intervals
    that measured its family (an unmeasured 0 is "unknown", not "quiet")."""


class SignalHistory:
    """The last ``max(spans_s)`` seconds of intervals; :meth:`windows` summarises them."""

    def __init__(self, spans_s: Sequence[float] = WINDOWS_S) -> None:
        if not spans_s or any(not span > 0 for span in spans_s):
            raise ValueError(f"window spans must be > 0 seconds, got {list(spans_s)}")
        self.spans_s = tuple(sorted(spans_s))
        self._intervals: deque[IntervalMetrics] = deque()

    def __len__(self) -> int:
        return len(self._intervals)

    def add(
        self,
        ended_at: float,
        interval_s: float,
        metrics: NodeMetrics,
        runq_us: Iterable[int],
        measured: Iterable[str],
    ) -> None:
        """Remember one interval (left out when it did not measure the core families),
        and forget intervals older than the longest span."""
        measured = tuple(measured)
        if set(measured) >= CORE_FAMILIES:
            self._intervals.append(
                IntervalMetrics(
                    ended_at=ended_at,
                    interval_s=interval_s,
                    runq_us=tuple(runq_us),
                    runq_wait_ratio=metrics.runq_wait_ratio,
                    reclaim_stall_ms_per_s=metrics.reclaim_stall_ms_per_s,
                    interference_index=metrics.interference_index,
                    throttled_ms_per_s=metrics.throttled_ms_per_s,
                    psi_cpu_some=metrics.psi_cpu_some,
                    psi_mem_some=metrics.psi_mem_some,
                    net_drops_per_s=metrics.net_drops_per_s,
                    measured=frozenset(measured),
                )
            )
        horizon = ended_at - self.spans_s[-1]
        while self._intervals and self._intervals[0].ended_at <= horizon:
            self._intervals.popleft()

    def windows(self, now: float) -> dict[str, WindowMetrics]:
        """``{"10s": …, "60s": …}``: each span's summary of the intervals that ended in
        ``(now − span, now]`` (a window with no interval has ``intervals == 0``)."""
        return {
            window_name(span): summarize(
                span, [r for r in self._intervals if r.ended_at > now - span]
            )
            for span in self.spans_s
        }


def summarize(span_s: float, intervals: Sequence[IntervalMetrics]) -> WindowMetrics:
    """The module docstring's formulas over ``intervals``."""
    if not intervals:
        return WindowMetrics(span_s=span_s)
    weights = [r.interval_s for r in intervals]
    merged: list[int] = []
    for interval in intervals:
        merged = hist.add(merged, interval.runq_us)
    wait = _moments([r.runq_wait_ratio for r in intervals], weights)
    reclaim = _family_moments(intervals, "reclaim", "reclaim_stall_ms_per_s")
    index = _moments([r.interference_index for r in intervals], weights)
    throttled = _family_moments(intervals, "throttle", "throttled_ms_per_s")
    psi_cpu = _family_moments(intervals, "psi", "psi_cpu_some")
    psi_mem = _family_moments(intervals, "psi", "psi_mem_some")
    drops = _family_moments(intervals, "net", "net_drops_per_s")
    return WindowMetrics(
        span_s=span_s,
        covered_s=round(sum(weights), 6),
        intervals=len(intervals),
        runq_p99_us=hist.percentile(merged, 0.99),
        runq_wait_ratio_mean=wait[0],
        runq_wait_ratio_max=wait[1],
        runq_wait_ratio_stddev=wait[2],
        reclaim_stall_ms_per_s_mean=reclaim[0],
        reclaim_stall_ms_per_s_max=reclaim[1],
        reclaim_stall_ms_per_s_stddev=reclaim[2],
        throttled_ms_per_s_mean=throttled[0],
        throttled_ms_per_s_stddev=throttled[2],
        psi_cpu_some_mean=psi_cpu[0],
        psi_cpu_some_stddev=psi_cpu[2],
        psi_mem_some_mean=psi_mem[0],
        psi_mem_some_stddev=psi_mem[2],
        net_drops_per_s_mean=drops[0],
        net_drops_per_s_stddev=drops[2],
        index_mean=index[0],
        index_max=index[1],
        index_stddev=index[2],
    )


def _family_moments(
    intervals: Sequence[IntervalMetrics], family: str, signal: str
) -> tuple[float, float, float]:
    """:func:`_moments` of ``signal`` over the intervals that measured ``family``."""
    measured = [r for r in intervals if family in r.measured]
    return _moments([getattr(r, signal) for r in measured], [r.interval_s for r in measured])


def _moments(values: Sequence[float], weights: Sequence[float]) -> tuple[float, float, float]:
    """Weighted mean, maximum and weighted population standard deviation."""
    total = sum(weights)
    if total <= 0:
        return 0.0, 0.0, 0.0
    mean = sum(w * x for w, x in zip(weights, values, strict=True)) / total
    variance = sum(w * (x - mean) ** 2 for w, x in zip(weights, values, strict=True)) / total
    return mean, max(values), math.sqrt(max(0.0, variance))
