"""The reload guard judges the reload (scheduler.entry.reload_guard,
scheduler.entry.config_reload) on the real apiserver with the scheduler's own processes:
pods Pending for a reason the reload did not touch (unbound claims) never roll it back;
pods a changed scheduler name stops attempting do; too few pods neither keep nor reject a
file; and with two replicas the standby follows the leader's roll back, so after a
failover the good file serves."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import NAMESPACE as SYSTEM_NAMESPACE
from tests.e2e.conftest import start_scheduler
from tests.e2e.kube import Kube, Obj, SchedulerProcess, wait_for
from tests.e2e.test_config_rollback import REJECT_EVERY_NODE, get, rewrite

pytestmark = [pytest.mark.e2e]

NAMESPACE = "e2e-reload-guard"
NODES = ("guard-node-a", "guard-node-b")
IMMEDIATE_CLASS = "e2e-guard-immediate"
FAST_GUARD = {"window_s": 30, "roll_back_after_s": 5, "watch_for_s": 20, "min_pods": 3}
VERDICT_ANNOTATION = "interference.io/reload-verdict"


@pytest.fixture
def nodes(kube: Kube) -> Iterator[tuple[str, ...]]:
    kube.ensure_namespace(NAMESPACE)
    for name in NODES:
        kube.create_node(name, cpu="8")
    yield NODES
    for pod in kube.pods(NAMESPACE):
        kube.delete_pod(NAMESPACE, pod["metadata"]["name"])
    for name in NODES:
        kube.delete_node(name)


def config_events(kube: Kube, config_map: str, reason: str) -> list[Obj]:
    return [
        e
        for e in kube.events(SYSTEM_NAMESPACE)
        if e["regarding"].get("kind") == "ConfigMap"
        and e["regarding"]["name"] == config_map
        and e["reason"] == reason
    ]


def bound(kube: Kube, names: list[str]) -> bool:
    return all(kube.pod(NAMESPACE, name)["spec"].get("nodeName") for name in names)


def metric(scheduler: SchedulerProcess, result: str) -> float:
    name = f'interference_scheduler_config_reloads_total{{result="{result}"}}'
    return scheduler.metrics().get(name, -1.0)


def started(
    schedulers: list[SchedulerProcess],
    tmp_path: Path,
    kubeconfig: Path,
    redis_url: str,
    name: str,
    guard: dict[str, Any],
    replica: str = "scheduler-0",
) -> tuple[SchedulerProcess, Path, dict[str, Any]]:
    """A scheduler ready and its config file with what it holds."""
    scheduler = start_scheduler(
        schedulers, tmp_path, kubeconfig, redis_url, name, replica=replica,
        extra={"reload_guard": guard, "http": {"debug_pages": True}},  # GET /config
    )  # fmt: skip
    path = tmp_path / f"{replica}.yaml"
    wait_for(lambda: get(scheduler.http_port, "/readyz")[0] == 200, f"{replica} ready")
    return scheduler, path, yaml.safe_load(path.read_text())


def create_claim_pod(kube: Kube, name: str, scheduler: str) -> None:
    """A pod whose claim stays unbound (no PV controller, no volume): Pending under any
    configuration."""
    claim = {
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": IMMEDIATE_CLASS,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims", claim)
    spec = {
        "schedulerName": scheduler,
        "containers": [{"name": "c", "image": "registry.invalid/pause:1",
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}],
    }  # fmt: skip
    body = {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}
    kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body)


@pytest.fixture
def immediate_class(kube: Kube) -> Iterator[str]:
    path = "/apis/storage.k8s.io/v1/storageclasses"
    body = {
        "metadata": {"name": IMMEDIATE_CLASS},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "Immediate",
    }
    kube.request("POST", path, body)
    yield IMMEDIATE_CLASS
    kube.request("DELETE", f"{path}/{IMMEDIATE_CLASS}")
    claims = f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims"
    for claim in kube.request("GET", claims)["items"]:
        kube.request("DELETE", f"{claims}/{claim['metadata']['name']}")


def test_pods_waiting_on_unbound_claims_do_not_roll_back_a_reload(
    kube: Kube,
    nodes: tuple[str, ...],
    immediate_class: str,
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name, config_map = "e2e-guard-claims", "e2e-guard-claims-config"
    monkeypatch.setenv("INTERFERENCE_SCHEDULER_CONFIGMAP", config_map)
    scheduler, path, good = started(
        schedulers, tmp_path, scheduler_kubeconfig, redis_url, name, FAST_GUARD
    )
    wait_for(scheduler.leading, "the scheduler to lead")
    claims = [f"claim-{i}" for i in range(6)]
    for pod in claims:
        create_claim_pod(kube, pod, name)

    # A reload that only switches the rebalancer to enforce: nothing that decides placement.
    rewrite(path, {**good, "rebalancer": {"mode": "enforce"}})
    wait_for(lambda: config_events(kube, config_map, "ConfigReloaded"), "the reload applied")
    placed = [f"placed-{i}" for i in range(4)]
    for pod in placed:
        kube.create_pod(NAMESPACE, pod, name)
    wait_for(lambda: bound(kube, placed), "the pods without claims bound")
    wait_for(lambda: metric(scheduler, "confirmed") == 1, "the reload kept", timeout_s=60)

    # A reload that changes the cycle too: the claim pods are asked of the last good
    # configuration, which leaves them Pending as well.
    rewrite(path, {**good, "rebalancer": {"mode": "enforce"},
                   "cycle": {"profile": {"scores": {"Interference": 3}}}})  # fmt: skip
    wait_for(
        lambda: len(config_events(kube, config_map, "ConfigReloaded")) == 2, "the second reload"
    )
    more = [f"more-{i}" for i in range(4)]
    for pod in more:
        kube.create_pod(NAMESPACE, pod, name)
    wait_for(lambda: bound(kube, more), "the new pods bound")
    wait_for(lambda: metric(scheduler, "confirmed") == 2, "the second reload kept", timeout_s=60)

    assert metric(scheduler, "rolled_back") == 0
    assert not config_events(kube, config_map, "ConfigRolledBack")
    assert not config_events(kube, config_map, "PendingRateHigh")
    assert not any(kube.pod(NAMESPACE, pod)["spec"].get("nodeName") for pod in claims)
    code, running = get(scheduler.http_port, "/config")
    assert code == 200 and "Interference: 3" in running, running


def test_a_scheduler_name_typo_is_rolled_back_for_the_pods_it_stops_attempting(
    kube: Kube,
    nodes: tuple[str, ...],
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name, config_map = "e2e-guard-typo", "e2e-guard-typo-config"
    monkeypatch.setenv("INTERFERENCE_SCHEDULER_CONFIGMAP", config_map)
    scheduler, path, good = started(
        schedulers, tmp_path, scheduler_kubeconfig, redis_url, name, FAST_GUARD
    )
    wait_for(scheduler.leading, "the scheduler to lead")
    rewrite(path, {**good, "loop": {**good["loop"], "scheduler_name": "e2e-guard-tpyo"}})
    wait_for(lambda: config_events(kube, config_map, "ConfigReloaded"), "the typo applied")
    pods = [f"typo-{i}" for i in range(15)]
    for pod in pods:
        kube.create_pod(NAMESPACE, pod, name)

    rolled = wait_for(
        lambda: config_events(kube, config_map, "ConfigRolledBack"), "the roll back", 60
    )
    note = rolled[0]["note"]
    assert rolled[0]["type"] == "Warning"
    assert "Pending rate 100% (15 of 15 pods the reload could change" in note, note
    assert config_events(kube, config_map, "PendingRateHigh")
    wait_for(lambda: bound(kube, pods), "the 15 pods bound after the roll back", timeout_s=60)
    code, running = get(scheduler.http_port, "/config")
    assert code == 200 and "e2e-guard-tpyo" not in running


def test_too_few_pods_neither_keep_nor_reject_a_reload(
    kube: Kube,
    nodes: tuple[str, ...],
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name, config_map = "e2e-guard-few", "e2e-guard-few-config"
    monkeypatch.setenv("INTERFERENCE_SCHEDULER_CONFIGMAP", config_map)
    guard = {**FAST_GUARD, "watch_for_s": 15, "min_pods": 5}
    scheduler, path, good = started(
        schedulers, tmp_path, scheduler_kubeconfig, redis_url, name, guard
    )
    wait_for(scheduler.leading, "the scheduler to lead")
    rewrite(path, {**good, "cycle": REJECT_EVERY_NODE})
    wait_for(lambda: config_events(kube, config_map, "ConfigReloaded"), "the bad file applied")
    pods = ["few-0", "few-1"]
    for pod in pods:
        kube.create_pod(NAMESPACE, pod, name)

    undecided = wait_for(
        lambda: config_events(kube, config_map, "ReloadUndecided"), "the watch undecided", 60
    )
    note = undecided[0]["note"]
    assert undecided[0]["type"] == "Warning"
    assert "only 2 pods it could change were attempted (reload_guard.min_pods 5)" in note, note
    assert "Pending rate 100%" not in note and "100% (2 of 2" in note, note
    time.sleep(5)  # a few more checks after the watch's time ran out
    assert metric(scheduler, "confirmed") == 0
    assert metric(scheduler, "undecided") == 1
    assert metric(scheduler, "rolled_back") == 0
    assert not bound(kube, pods[:1]) and not bound(kube, pods[1:])


def test_the_standby_follows_the_leaders_roll_back_and_serves_the_good_file_after_failover(
    kube: Kube,
    nodes: tuple[str, ...],
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name, config_map = "e2e-guard-pair", "e2e-guard-pair-config"
    monkeypatch.setenv("INTERFERENCE_SCHEDULER_CONFIGMAP", config_map)
    guard = {**FAST_GUARD, "watch_for_s": 10}
    leader, leader_path, leader_good = started(
        schedulers, tmp_path, scheduler_kubeconfig, redis_url, name, guard
    )
    wait_for(leader.leading, "scheduler-0 to lead")
    standby, standby_path, standby_good = started(
        schedulers, tmp_path, scheduler_kubeconfig, redis_url, name, guard, "scheduler-1"
    )
    assert not standby.leading()

    reloaded_at = time.monotonic()
    rewrite(leader_path, {**leader_good, "cycle": REJECT_EVERY_NODE})
    rewrite(standby_path, {**standby_good, "cycle": REJECT_EVERY_NODE})
    wait_for(
        lambda: metric(leader, "applied") == 1 and metric(standby, "applied") == 1,
        "both replicas applied the bad file",
    )
    first = [f"pair-{i}" for i in range(4)]
    for pod in first:
        kube.create_pod(NAMESPACE, pod, name)
    wait_for(lambda: config_events(kube, config_map, "ConfigRolledBack"), "the roll back", 60)

    def followed() -> bool:
        code, running = get(standby.http_port, "/config")
        return code == 200 and "the file on disk was rolled back" in running

    wait_for(followed, "the standby to follow the leader's roll back")
    lease = kube.lease(SYSTEM_NAMESPACE, name)
    verdict = json.loads(lease["metadata"]["annotations"][VERDICT_ANNOTATION])
    assert verdict["verdict"] == "rolled_back"
    # Past the standby's own watch: it neither confirmed the bad file nor rolled back twice.
    time.sleep(max(0.0, reloaded_at + guard["watch_for_s"] + 5 - time.monotonic()))
    assert metric(standby, "confirmed") == 0 and metric(standby, "rolled_back") == 1
    code, running = get(standby.http_port, "/config")
    assert code == 200 and "stale_policy: reject" not in running, running
    wait_for(lambda: bound(kube, first), "the first pods bound by the leader after its roll back")

    leader.kill()
    wait_for(standby.leading, "scheduler-1 to take over", timeout_s=30)
    after = [f"after-failover-{i}" for i in range(6)]
    for pod in after:
        kube.create_pod(NAMESPACE, pod, name)
    wait_for(lambda: bound(kube, after), "6 pods bound by the new leader", timeout_s=40)
    assert not config_events(kube, config_map, "ReloadUndecided")
