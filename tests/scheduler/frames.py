"""Reading a signal frame in tests: which nodes' records are stale or degraded."""

from __future__ import annotations

import numpy as np

from scheduler.signals.frame import SignalFrame


def stale_nodes(frame: SignalFrame, now: float) -> list[str]:
    """Nodes with a record that is stale or degraded (:mod:`interference.freshness`)."""
    at = frame.columns["signals_at"]
    unusable = np.flatnonzero((at > -np.inf) & (frame.columns["fresh_until"] < now))
    return sorted(frame.names[i] for i in unusable)
