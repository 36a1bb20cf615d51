"""Which running pods an eviction may move (scheduler/rebalancing/evictable.py), table-driven
over pods parsed from their API JSON."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.api.pods import parse_pod
from scheduler.api.storage import parse_volume
from scheduler.rebalancing.evictable import (
    CONTROLLER_KIND,
    DAEMONSET_POD,
    JOB_POD,
    LOCAL_STORAGE,
    MIRROR_POD,
    NO_CONTROLLER,
    STATIC_POD,
    SYSTEM_CRITICAL,
    refusal,
)
from scheduler.rebalancing.rebalance import RebalancerSettings
from tests.builders import pod_obj

KINDS = RebalancerSettings().controller_kinds
OPT_IN = {"interference.io/rebalance": "true"}


def pod(
    *,
    owner: str | None = "ReplicaSet",
    annotations: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    obj = pod_obj(
        "web-1",
        "shop",
        nodeName="node-a",
        annotations={"interference.io/max-runq-p99-us": "500", **(annotations or {})},
    )
    if owner is not None:
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": owner, "name": "web", "uid": "u", "controller": True}
        ]
    obj["spec"].update(spec)
    if volumes is not None:
        obj["spec"]["volumes"] = volumes
    return obj


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (pod(), None),
        (pod(owner="StatefulSet"), None),
        (pod(owner="ReplicationController"), None),
        (pod(owner="Job"), JOB_POD),  # no longer a default controller kind
        (pod(owner="CronJob"), JOB_POD),
        (pod(owner="DaemonSet"), DAEMONSET_POD),
        (pod(owner=None), NO_CONTROLLER),
        (pod(owner="Rollout"), CONTROLLER_KIND),
        (pod(owner="Node", annotations={"kubernetes.io/config.mirror": "abc"}), MIRROR_POD),
        (pod(annotations={"kubernetes.io/config.source": "file"}), STATIC_POD),
        (pod(annotations={"kubernetes.io/config.source": "api"}), None),
        (pod(priority=2_000_000_000), SYSTEM_CRITICAL),
        (pod(priority=1_999_999_999), None),
        (pod(priority=0, priorityClassName="system-node-critical"), SYSTEM_CRITICAL),
        (pod(priorityClassName="system-cluster-critical"), SYSTEM_CRITICAL),
        (pod(volumes=[{"name": "data", "emptyDir": {}}]), LOCAL_STORAGE),
        (pod(volumes=[{"name": "logs", "hostPath": {"path": "/var/log"}}]), LOCAL_STORAGE),
        (pod(volumes=[{"name": "cfg", "configMap": {"name": "cfg"}}]), None),
        # the owner accepts the loss: a Job's attempt, local data, a critical pod, a kind
        (pod(owner="Job", annotations=OPT_IN), None),
        (pod(annotations=OPT_IN, volumes=[{"name": "data", "emptyDir": {}}]), None),
        (pod(annotations=OPT_IN, priorityClassName="system-cluster-critical"), None),
        (pod(owner="Rollout", annotations=OPT_IN), None),
        # no opt-in moves a pod nothing recreates elsewhere
        (pod(owner="DaemonSet", annotations=OPT_IN), DAEMONSET_POD),
        (pod(owner=None, annotations=OPT_IN), NO_CONTROLLER),
        (pod(annotations={**OPT_IN, "kubernetes.io/config.source": "file"}), STATIC_POD),
        (pod(annotations={"interference.io/rebalance": "maybe"}, owner="Job"), JOB_POD),
    ],
)
def test_what_an_eviction_would_not_move_whole(obj: dict[str, Any], reason: str | None) -> None:
    found = refusal(parse_pod(obj), KINDS)
    assert (found.reason if found else None) == reason
    if found is not None:
        assert found.text  # the Event's and record's words


def test_a_claim_bound_to_a_local_volume_is_local_storage() -> None:
    local = parse_volume(
        {"metadata": {"name": "pv-local"}, "spec": {"local": {"path": "/mnt/disk"}}}
    )
    network = parse_volume(
        {"metadata": {"name": "pv-nfs"}, "spec": {"nfs": {"server": "x", "path": "/"}}}
    )
    assert (local.local, network.local) == (True, False)
    obj = pod(volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}])
    info = parse_pod(obj)
    bound = {"data": local}

    def local_volume(namespace: str, claim: str) -> bool:
        return namespace == "shop" and claim in bound and bound[claim].local

    found = refusal(info, KINDS, local_volume)
    assert found is not None and found.reason == LOCAL_STORAGE
    assert "claim data" in found.text
    bound["data"] = network
    assert refusal(info, KINDS, local_volume) is None


def test_job_is_not_a_default_controller_kind() -> None:
    assert "Job" not in RebalancerSettings().controller_kinds
    # listing it changes nothing: a Job's pod is refused before the list is read
    assert refusal(parse_pod(pod(owner="Job")), (*KINDS, "Job")) is not None
