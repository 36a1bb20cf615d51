"""The real :class:`~scheduler.extender.extender.Extender` behind the real
:class:`~scheduler.endpoint.http.ExtenderEndpoint` (plain HTTP on loopback, the default limits)
over given Node and Pod objects, every node with one report (for the costly-request tests
and ``bench/extender_costly_requests.py``)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from interference.signals import SIGNAL_FAMILIES
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.ports import INFORMED_KINDS, NodeSignals
from scheduler.cycle.queue import SchedulingQueue
from scheduler.cycle.settings import CycleSettings
from scheduler.endpoint.http import ExtenderEndpoint, ExtenderSettings
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.extender.extender import Extender
from scheduler.extender.metrics import ExtenderMetrics
from scheduler.signals.table import NodeTable
from tests.indexed_signals import metrics_with_index
from tests.scheduler.runtime_helpers import START, FakeClock, MemoryDecisions


def runq_p99_us(row: int) -> float:
    """The run-queue p99 of the node in row ``row``'s report."""
    return 50.0 + row % 900


def extender_args(pod: dict[str, Any], names: Sequence[str]) -> bytes:
    """An ``ExtenderArgs`` body (nodeCacheCapable: node names)."""
    return json.dumps({"Pod": pod, "NodeNames": list(names)}, separators=(",", ":")).encode()


class _Signals:
    def __init__(self, names: Sequence[str]) -> None:
        self._signals = {
            name: NodeSignals(
                metrics_with_index(float(i % 60), runq_p99_us=runq_p99_us(i)),
                updated_at=START - 1,
                measured=SIGNAL_FAMILIES,
            )
            for i, name in enumerate(names)
        }

    def snapshot(self) -> dict[str, NodeSignals]:
        return self._signals

    def healthy(self) -> bool:
        return True


class ServedExtender:
    """The extender over ``nodes`` (and the bound ``pods``), served on loopback once
    ``endpoint.start()`` is called."""

    def __init__(self, nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]] = ()):
        self.names = [node["metadata"]["name"] for node in nodes]
        self.registry = CollectorRegistry()
        metrics = SchedulerMetrics(self.registry)
        cache = ClusterCache(NodeTable(), SchedulingQueue(), metrics, "interference-scheduler")
        cache.replace("Node", list(nodes))
        cache.replace("Pod", list(pods))
        for kind in INFORMED_KINDS:
            if kind not in ("Node", "Pod"):
                cache.replace(kind, [])
        self.extender = Extender(
            cache,
            _Signals(self.names),
            MemoryDecisions(),
            CycleSettings(),
            metrics,
            ExtenderMetrics(self.registry),
            clock=FakeClock(),
        )
        self.endpoint = ExtenderEndpoint(
            ExtenderSettings(port=0, host="127.0.0.1", plaintext=True),
            self.extender.routes(),
            None,
        )

    def post(self, verb: str, body: bytes, timeout_s: float = 60.0) -> tuple[int, bytes]:
        """``POST /VERB`` with ``body``: (status, answer)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.endpoint.port, timeout=timeout_s)
        try:
            connection.request("POST", f"/{verb}", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def refused(self, reason: str) -> float:
        """``interference_scheduler_extender_refused_total{reason}`` now."""
        value = self.registry.get_sample_value(
            "interference_scheduler_extender_refused_total", {"reason": reason}
        )
        return value or 0.0
