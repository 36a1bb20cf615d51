"""A pod deleted, or bound by someone else, between the scheduler's decision and its Binding.

The real loop and adapter run in this process as deploy/'s scheduler ServiceAccount; the
only addition is a hook in ``bind`` that, right before the real POST, deletes the pod or
binds it elsewhere as the admin: exactly the window between decision and Binding.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from scheduler.adapters.kubernetes import KubernetesCluster
from scheduler.adapters.kubernetes_settings import make_api_client
from scheduler.cycle.ports import PodRef
from scheduler.cycle.settings import CycleSettings
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.standalone.loop import LoopSettings, SchedulingLoop
from tests.e2e.kube import BindingWatch, Kube, wait_for
from tests.scheduler.runtime_helpers import MemoryDecisions, MemorySignals

pytestmark = [pytest.mark.e2e]

SCHEDULER = "e2e-conflicts"
NAMESPACE = "e2e-conflicts"
NODES = ("conflict-node-a", "conflict-node-b")


class RacingCluster(KubernetesCluster):
    """The real adapter; ``race[pod]`` runs just before that pod's Binding is POSTed."""

    def __init__(self, kube: Kube, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.kube = kube
        self.binds: Counter[str] = Counter()
        self.race: dict[str, str] = {}

    def bind(self, pod: PodRef, node: str) -> None:
        self.binds[pod.name] += 1
        action = self.race.get(pod.name)
        if action == "delete":
            self.kube.delete_pod(pod.namespace, pod.name)
        elif action == "bind-elsewhere":
            other = next(n for n in NODES if n != node)
            self.kube.bind(pod.namespace, pod.name, other)
        super().bind(pod, node)


@pytest.fixture
def nodes(kube: Kube) -> Iterator[tuple[str, ...]]:
    for name in NODES:
        kube.create_node(name, cpu="8")
    kube.ensure_namespace(NAMESPACE)
    yield NODES
    for name in NODES:
        kube.delete_node(name)


def test_pod_deleted_or_bound_elsewhere_before_binding(
    kube: Kube, nodes: tuple[str, ...], scheduler_kubeconfig: Path
) -> None:
    api = make_api_client(str(scheduler_kubeconfig))
    cluster = RacingCluster(kube, api, identity="conflicts-0")
    cluster.race = {"deleted": "delete", "taken": "bind-elsewhere"}
    metrics = SchedulerMetrics(CollectorRegistry())
    leading, stop = threading.Event(), threading.Event()
    leading.set()
    loop = SchedulingLoop(
        cluster,
        MemorySignals(),
        MemoryDecisions(),
        CycleSettings(),
        LoopSettings(scheduler_name=SCHEDULER),
        leading,
        metrics,
    )
    watch = BindingWatch(kube, NAMESPACE)
    watch.start()
    runner = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    runner.start()
    try:
        for name in ("deleted", "taken", "plain"):
            kube.create_pod(NAMESPACE, name, SCHEDULER, cpu="1")
        wait_for(lambda: {"taken", "plain"} <= set(watch.bound()), "two pods bound")
        time.sleep(5)  # long enough for several backoff rounds, were the pods retried
        kube.create_pod(NAMESPACE, "after", SCHEDULER, cpu="1")
        wait_for(lambda: "after" in watch.bound(), "the loop to keep scheduling")
    finally:
        stop.set()
        runner.join(30)
        watch.close()
    assert not runner.is_alive()
    # One Binding each: a conflict drops the pod, no retries.
    assert cluster.binds == {"deleted": 1, "taken": 1, "plain": 1, "after": 1}
    assert metrics.bind_errors.labels("conflict")._value.get() == 2
    assert metrics.bind_errors.labels("error")._value.get() == 0
    assert metrics.binds._value.get() == 2
    for kind in ("event", "condition", "decision", "report"):
        assert metrics.side_effect_errors.labels(kind)._value.get() == 0, kind
    # Nothing double-bound: every pod had one node, the racer's for "taken".
    bound = watch.bound()
    assert all(len(history) == 1 for history in bound.values()), bound
    assert "deleted" not in bound
    taken = kube.pod(NAMESPACE, "taken")["spec"]["nodeName"]
    assert bound["taken"][0][0] == taken
    with pytest.raises(Exception, match="404"):
        kube.pod(NAMESPACE, "deleted")
    # Our Events: Scheduled for the pods we bound, nothing about the lost races.
    reasons = sorted((e["regarding"]["name"], e["reason"]) for e in kube.events(NAMESPACE))
    assert reasons == [("after", "Scheduled"), ("plain", "Scheduled")]
