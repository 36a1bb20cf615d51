"""A pod kept Pending only by its interference tolerance is relaxed after
``cycle.relax_after_s`` and bound; the decision is a Warning ``InterferenceRelaxed`` Event
on the real apiserver (not only a metric)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from interference.signals import NodeMetrics, NodeReport, WindowMetrics, window_name
from tests.e2e.agents import agents_publishing
from tests.e2e.conftest import start_scheduler
from tests.e2e.kube import Kube, SchedulerProcess, wait_for

pytestmark = [pytest.mark.e2e]

SCHEDULER = "e2e-relax"
NAMESPACE = "e2e-relax"
NODES = ("relax-node-a", "relax-node-b")


@pytest.fixture
def noisy_nodes(kube: Kube, redis_url: str) -> Iterator[tuple[str, ...]]:
    """Nodes whose agents report a run-queue p99 of 50 ms, every second."""
    for name in NODES:
        kube.create_node(name, cpu="8")
    kube.ensure_namespace(NAMESPACE)

    def reports(now: float) -> list[NodeReport]:
        metrics = NodeMetrics(runq_p99_us=50_000)
        windows = {
            window_name(span): WindowMetrics(span_s=span, covered_s=span, intervals=int(span),
                                             runq_p99_us=50_000)
            for span in (10.0, 60.0)
        }  # fmt: skip
        return [
            NodeReport(node=name, ts=now, interval_s=1.0, metrics=metrics,
                       measured=("psi", "runq"), windows=windows, histograms={"runq_us": [1]})
            for name in NODES
        ]  # fmt: skip

    with agents_publishing(redis_url, reports):
        yield NODES
    for name in NODES:
        kube.delete_node(name)


def test_relaxed_placement_is_an_event(
    kube: Kube,
    noisy_nodes: tuple[str, ...],
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
) -> None:
    scheduler = start_scheduler(schedulers, tmp_path, scheduler_kubeconfig, redis_url, SCHEDULER,
                                extra={"cycle": {"relax_after_s": 3}})  # fmt: skip
    reports = "interference_scheduler_signal_age_seconds_count"
    wait_for(lambda: scheduler.metrics().get(reports, 0) >= 2 * len(NODES),
             "the scheduler to receive both nodes' reports")  # fmt: skip
    kube.create_pod(NAMESPACE, "picky", SCHEDULER,
                    annotations={"interference.io/max-runq-p99-us": "500"})  # fmt: skip

    def reasons() -> list[str]:
        return sorted(e["reason"] for e in kube.events(NAMESPACE)
                      if e["regarding"]["name"] == "picky")  # fmt: skip

    wait_for(lambda: "InterferenceRelaxed" in reasons(), "the InterferenceRelaxed Event")
    pod = wait_for(lambda: (p := kube.pod(NAMESPACE, "picky"))["spec"].get("nodeName") and p,
                   "the relaxed pod to be bound")  # fmt: skip
    assert pod["spec"]["nodeName"] in NODES
    (relaxed,) = [e for e in kube.events(NAMESPACE) if e["reason"] == "InterferenceRelaxed"]
    assert relaxed["type"] == "Warning"
    assert "blocked only by interference filters" in relaxed["note"]
    failed = [e for e in kube.events(NAMESPACE) if e["reason"] == "FailedScheduling"]
    assert len(failed) == 1  # the waits before the relax: one series, not one per retry
    assert "Scheduled" in reasons()
