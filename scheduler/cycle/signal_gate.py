"""Whether a decision may read the agents' signals.

While the signal source is unhealthy the scheduling cycle fails closed for pods with an
interference tolerance and judges the others interference-blind (:mod:`scheduler.cycle.cycle`);
the gate asks the source once per decision, sets
the ``signals_healthy`` gauge and logs each change, counts the blind attempts, and hands
the table the latest frame while signals are readable.
"""

from __future__ import annotations

import logging

from scheduler.cycle.ports import SignalSource
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.signals.table import NodeTable

log = logging.getLogger(__name__)


class SignalGate:
    """Whether this decision may read signals, with the metric and log on each change;
    while they are readable, the table gets the latest frame first."""

    def __init__(self, signals: SignalSource, metrics: SchedulerMetrics, mode: str) -> None:
        self._signals = signals
        self._metrics = metrics
        self._mode = mode
        self._healthy: bool | None = None

    def readable(self, table: NodeTable) -> bool:
        """Caller holds the cache lock (the table is written)."""
        healthy = self._signals.healthy()
        if healthy != self._healthy:
            self._healthy = healthy
            self._metrics.signals_healthy.set(1 if healthy else 0)
            if healthy:
                log.info("interference signals are readable again; %s with them", self._mode)
            else:
                log.warning(
                    "interference signals cannot be read; %s: pods with an interference"
                    " tolerance wait (until relax_after_s), the others interference-blind,"
                    " until the signal source recovers",
                    self._mode,
                )
        if not healthy:
            self._metrics.interference_blind_attempts.inc()
            return False
        table.set_signals(self._signals.snapshot())
        return True
