"""In-memory SignalSource and DecisionSink, and a harness driving the real SchedulingLoop.

The harness runs the real loop, cache, queue, cycle and binder threads over an
:class:`InMemoryCluster`; only time is driven by hand (one fake clock for wall and
monotonic time), and the informer is synced explicitly so every step is deterministic.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence

from prometheus_client import CollectorRegistry

from interference.decision import Decision
from interference.signals import SIGNAL_FAMILIES, NodeMetrics
from scheduler.adapters.memory import InMemoryCluster, InMemoryInformer
from scheduler.cycle.ports import DecisionTracer, NodeSignals, SignalSource
from scheduler.cycle.settings import CycleSettings
from scheduler.cycle.stage_trace import Attributes, StageRecorder
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.standalone.loop import LoopSettings, SchedulingLoop
from tests.indexed_signals import metrics_with_index

START = 1_800_000_000.0


def schedule_pending(loop: SchedulingLoop) -> int:
    """Attempt every pod that is ready now, once each; returns how many. Binds complete
    asynchronously: call ``loop.flush`` to wait for them."""
    attempted = 0
    for _ in range(len(loop.queue) + 1):  # the last call finds none and tidies up
        if not loop.run_once():
            break
        attempted += 1
    return attempted


class FakeClock:
    """Wall and monotonic time the test advances by hand."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class MemorySignals:
    """A SignalSource holding node signals in a dict (a new mapping on every change)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._signals: Mapping[str, NodeSignals] = {}
        self.is_healthy = True

    def report(self, node: str, at: float, index: float | None = None, **metrics: float) -> None:
        """Store a report for ``node`` made at ``at`` with the given NodeMetrics fields;
        ``index``: the scheduler's index its record gives (:mod:`tests.indexed_signals`)."""
        values = NodeMetrics(**metrics) if index is None else metrics_with_index(index, **metrics)
        with self._lock:
            signals = dict(self._signals)
            signals[node] = NodeSignals(values, updated_at=at, measured=SIGNAL_FAMILIES)
            self._signals = signals

    def snapshot(self) -> Mapping[str, NodeSignals]:
        with self._lock:
            return self._signals

    def healthy(self) -> bool:
        return self.is_healthy


class MemoryDecisions:
    """A DecisionSink keeping every decision in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[Decision] = []

    def write(self, decision: Decision) -> None:
        with self._lock:
            self.items.append(decision)

    def for_pod(self, name: str, namespace: str = "default") -> list[Decision]:
        with self._lock:
            return [d for d in self.items if (d.namespace, d.pod) == (namespace, name)]

    def last(self, name: str, namespace: str = "default") -> Decision:
        decisions = self.for_pod(name, namespace)
        assert decisions, f"no decision recorded for {namespace}/{name}"
        return decisions[-1]


class LoopHarness:
    """The real SchedulingLoop over an InMemoryCluster, stepped by hand."""

    def __init__(
        self,
        cycle: CycleSettings | None = None,
        loop: LoopSettings | None = None,
        cluster: InMemoryCluster | None = None,
        leading: bool = True,
        tracer: DecisionTracer | None = None,
        signals: SignalSource | None = None,
        preempts: bool = False,
        antagonists: Callable[[Sequence[str]], Mapping[str, Collection[str]]] | None = None,
    ) -> None:
        """``signals``: the loop's signal source instead of :attr:`signals`; ``preempts``:
        the cluster acts on preemptions (the in-memory cluster's Preemptor)."""
        self.clock = FakeClock()
        self.cluster = cluster or InMemoryCluster()
        self.signals = MemorySignals()
        self.decisions = MemoryDecisions()
        self.leading = threading.Event()
        if leading:
            self.leading.set()
        self.metrics = SchedulerMetrics(CollectorRegistry())
        self.loop = SchedulingLoop(
            self.cluster,
            signals or self.signals,
            self.decisions,
            cycle or CycleSettings(),
            loop or LoopSettings(bind_workers=4),
            self.leading,
            self.metrics,
            clock=self.clock,
            monotonic=self.clock,
            seed=7,
            tracer=tracer,
            preemptor=self.cluster if preempts else None,
            antagonists=antagonists,
        )
        self.informer: InMemoryInformer = self.cluster.informer(self.loop.cache)

    def step(self) -> int:
        """Sync the cache, attempt every ready pod once, finish all writes, sync again."""
        self.informer.sync()
        attempted = schedule_pending(self.loop)
        assert self.loop.flush(60), "binder did not finish"
        self.informer.sync()
        return attempted

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value

    def close(self) -> None:
        self.loop.close()


class KeptTraces:
    """A DecisionTracer sampling every attempt and keeping what it is handed:
    ``(name, recorder, root attributes, end_ns)`` per finished trace."""

    def __init__(self) -> None:
        self.finished: list[tuple[str, StageRecorder, Attributes, int | None]] = []

    def start(self) -> StageRecorder | None:
        return StageRecorder(len(self.finished) + 1, 7)

    def finish(
        self,
        recorder: StageRecorder,
        name: str,
        start_ns: int,
        attributes: Attributes,
        end_ns: int | None = None,
    ) -> None:
        self.finished.append((name, recorder, attributes, end_ns))
