"""Two replicas with leader election; the leader SIGKILLed while pods keep arriving.

The follower takes over once the dead leader's Lease has expired by its own clock: it saw
the last renewal at most one retry period late and polls every retry period, so the bound
from the kill is lease duration + 2 × retry period (client-go's elector behaves the same),
plus the time to bind one pod. Every pod's node is followed with a watch: none is lost and
none is bound twice.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import start_scheduler
from tests.e2e.kube import BindingWatch, Kube, SchedulerProcess, wait_for

pytestmark = [pytest.mark.e2e]

SCHEDULER = "e2e-failover"
NAMESPACE = "e2e-failover"
NODES = tuple(f"failover-node-{i}" for i in range(4))
PODS = 300
LEASE_S, RENEW_S, RETRY_S = 4, 3, 1
BIND_SLACK_S = 1.0
"""Time from acquiring the Lease to the first Binding (a cache already warm)."""


@pytest.fixture
def nodes(kube: Kube) -> Iterator[tuple[str, ...]]:
    for name in NODES:
        kube.create_node(name, cpu="64", pods="500")
    kube.ensure_namespace(NAMESPACE)
    yield NODES
    for name in NODES:
        kube.delete_node(name)


def _ready(proc: SchedulerProcess) -> bool:
    return bool(proc.metrics()) and proc.popen.poll() is None


def test_follower_takes_over_when_leader_is_killed(
    kube: Kube,
    nodes: tuple[str, ...],
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
) -> None:
    lease = (LEASE_S, RENEW_S, RETRY_S)
    first = start_scheduler(schedulers, tmp_path, scheduler_kubeconfig, redis_url, SCHEDULER,
                            replica="replica-a", lease=lease)  # fmt: skip
    wait_for(first.leading, "replica-a to lead")
    second = start_scheduler(schedulers, tmp_path, scheduler_kubeconfig, redis_url, SCHEDULER,
                             replica="replica-b", lease=lease)  # fmt: skip
    wait_for(lambda: _ready(second), "replica-b to serve /metrics")
    assert not second.leading()
    # Pods the leader bound just before dying may still be pending in the follower's
    # cache: its Binding then conflicts (409), at most once per write in flight.
    second.expected_conflicts = 64

    watch = BindingWatch(kube, NAMESPACE)
    watch.start()
    created: list[str] = []

    def create_pods() -> None:
        for i in range(PODS):
            kube.create_pod(NAMESPACE, f"p-{i}", SCHEDULER, cpu="10m")
            created.append(f"p-{i}")
            time.sleep(0.01)

    creator = threading.Thread(target=create_pods, daemon=True)
    creator.start()
    try:
        wait_for(lambda: len(watch.bound()) >= 60, "60 pods bound by the leader")
        killed_at = time.time()
        first.kill()
        wait_for(lambda: not creator.is_alive(), "all pods created", timeout_s=60)
        wait_for(lambda: len(watch.bound()) == PODS, f"all {PODS} pods bound", timeout_s=60)
    finally:
        watch.close()
        creator.join(60)

    bound = watch.bound()
    assert sorted(bound) == sorted(created)  # 0 lost
    twice = {pod: history for pod, history in bound.items() if len(history) != 1}
    assert not twice, f"bound more than once: {twice}"  # 0 bound twice
    scheduled: dict[str, int] = {}
    takeover_at = float("inf")
    for event in kube.events(NAMESPACE):
        if event["reason"] != "Scheduled":
            continue
        pod = event["regarding"]["name"]
        scheduled[pod] = scheduled.get(pod, 0) + (event.get("series") or {}).get("count", 1)
        if event["reportingInstance"].startswith("replica-b_"):
            at = dt.datetime.fromisoformat(event["eventTime"]).timestamp()
            takeover_at = min(takeover_at, at)
    assert max(scheduled.values()) == 1, "a pod was reported Scheduled twice"
    takeover_s = takeover_at - killed_at
    print(f"takeover {takeover_s:.2f} s after SIGKILL (lease {LEASE_S} s, retry {RETRY_S} s)")
    assert 0 < takeover_s <= LEASE_S + 2 * RETRY_S + BIND_SLACK_S, takeover_s
    lease_holder = kube.lease("interference-system", SCHEDULER)["spec"]["holderIdentity"]
    assert lease_holder.startswith("replica-b_")
