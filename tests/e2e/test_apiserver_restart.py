"""The apiserver killed mid-run and restarted on the same port and etcd, with every
resourceVersion the scheduler held compacted away: its informers relist and every pending
pod still gets bound."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import start_scheduler
from tests.e2e.control_plane import ControlPlane
from tests.e2e.kube import BindingWatch, Kube, SchedulerProcess, wait_for

pytestmark = [pytest.mark.e2e]

SCHEDULER = "e2e-restart"
NAMESPACE = "e2e-restart"
NODES = ("restart-node-a", "restart-node-b")
LOG_DELAY_S = 2.0


@pytest.fixture
def nodes(kube: Kube) -> Iterator[tuple[str, ...]]:
    for name in NODES:
        kube.create_node(name, cpu="32")
    kube.ensure_namespace(NAMESPACE)
    yield NODES
    for name in NODES:
        kube.delete_node(name)


def test_informers_relist_after_apiserver_restart_and_compaction(
    kube: Kube,
    control_plane: ControlPlane,
    nodes: tuple[str, ...],
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
) -> None:
    scheduler = start_scheduler(
        schedulers, tmp_path, scheduler_kubeconfig, redis_url, SCHEDULER, lease=(15, 10, 2)
    )
    watch = BindingWatch(kube, NAMESPACE)
    watch.start()
    try:
        for i in range(10):
            kube.create_pod(NAMESPACE, f"before-{i}", SCHEDULER)
        # Pending until a node carries the label: these wait through the restart.
        for i in range(10):
            kube.create_pod(NAMESPACE, f"waiting-{i}", SCHEDULER, node_selector={"pool": "late"})
        wait_for(lambda: len(watch.bound()) == 10, "the first 10 pods bound")

        killed_at = time.time()
        control_plane.kill_apiserver()
        revision = control_plane.compact_etcd()  # whatever resourceVersion was held expires
        control_plane.start_apiserver()
        # Until /readyz says ok the restarted apiserver refuses (403) what its RBAC cache
        # has not loaded yet; a write answered just before may be logged a little later.
        scheduler.outage = (killed_at, control_plane.ready_at + LOG_DELAY_S)
        kube.label_node(NODES[1], {"pool": "late"})
        for i in range(10):
            kube.create_pod(NAMESPACE, f"after-{i}", SCHEDULER)
        wait_for(lambda: len(watch.bound()) == 30, "all 30 pods bound", timeout_s=60)
    finally:
        watch.close()
    bound = watch.bound()
    assert all(len(history) == 1 for history in bound.values()), bound
    assert {bound[f"waiting-{i}"][0][0] for i in range(10)} == {NODES[1]}
    log = scheduler.log()
    assert scheduler.popen.poll() is None, "the scheduler exited"
    assert "resourceVersion expired" in log, f"no relist after compaction to {revision}"
    assert "cannot reach the API server" in log  # the break was noticed, then recovered
