"""SignalFrame built from NodeSignals: what it counts as usable (fail closed)."""

from __future__ import annotations

from interference.signals import SIGNAL_FAMILIES, NodeMetrics
from scheduler.signal_frame import NodeSignals, SignalFrame
from tests.scheduler.frames import stale_nodes

NOW = 1_000_000.0


def test_signals_that_do_not_say_what_they_measured_count_as_nothing_measured() -> None:
    frame = SignalFrame.from_signals({"unsaid": NodeSignals(NodeMetrics(), updated_at=NOW)})
    assert frame.families("unsaid") == ()
    assert stale_nodes(frame, NOW) == ["unsaid"]  # degraded: treated like a stale report


def test_signals_that_measured_every_family_are_usable_while_fresh() -> None:
    signals = NodeSignals(NodeMetrics(), updated_at=NOW, measured=SIGNAL_FAMILIES)
    frame = SignalFrame.from_signals({"full": signals})
    assert set(frame.families("full")) == set(SIGNAL_FAMILIES)
    assert stale_nodes(frame, NOW) == []
    assert stale_nodes(frame, NOW + 60) == ["full"]
