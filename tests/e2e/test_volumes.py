"""Volumes in standalone mode on a real kube-apiserver, as deploy/'s scheduler ServiceAccount
(its RBAC must let it list and watch claims, PersistentVolumes and StorageClasses).

No PV controller runs here, so the test plays its part: it writes the claim's
``spec.volumeName`` and ``pv.kubernetes.io/bind-completed`` itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import start_scheduler
from tests.e2e.kube import Kube, SchedulerProcess, condition, wait_for

pytestmark = [pytest.mark.e2e]

SCHEDULER = "e2e-volumes"
NAMESPACE = "e2e-volumes"
NODES = ("volumes-node-a", "volumes-node-b")
HOSTNAME = "kubernetes.io/hostname"
STORAGE_CLASS = "e2e-local-wait"
VOLUMES = ("e2e-pv-on-b", "e2e-pv-on-a")


@pytest.fixture
def cluster(kube: Kube) -> Iterator[None]:
    for name in NODES:
        kube.create_node(name, cpu="4", labels={HOSTNAME: name})
    kube.ensure_namespace(NAMESPACE)
    kube.request(
        "POST",
        "/apis/storage.k8s.io/v1/storageclasses",
        {
            "metadata": {"name": STORAGE_CLASS},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
        },
    )
    yield
    for name in VOLUMES:
        _delete_if_present(kube, f"/api/v1/persistentvolumes/{name}")
    _delete_if_present(kube, f"/apis/storage.k8s.io/v1/storageclasses/{STORAGE_CLASS}")
    for name in NODES:
        kube.delete_node(name)


def _delete_if_present(kube: Kube, path: str) -> None:
    try:
        kube.request("DELETE", path)
    except Exception as exc:  # urllib's HTTPError; 404 when the test never created it
        if getattr(exc, "code", None) != 404:
            raise


def create_local_volume(kube: Kube, name: str, node: str) -> None:
    """A local PersistentVolume only ``node`` can reach."""
    kube.request(
        "POST",
        "/api/v1/persistentvolumes",
        {
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": STORAGE_CLASS,
                "local": {"path": f"/mnt/{name}"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": HOSTNAME, "operator": "In", "values": [node]}
                                ]
                            }
                        ]
                    }
                },
            },
        },
    )


def claim_body(name: str, volume: str = "") -> dict[str, Any]:
    """A claim of the test's class; with ``volume``, bound to it as the PV controller would
    leave it."""
    metadata: dict[str, Any] = {"name": name, "namespace": NAMESPACE}
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": STORAGE_CLASS,
        "resources": {"requests": {"storage": "1Gi"}},
    }
    if volume:
        metadata["annotations"] = {"pv.kubernetes.io/bind-completed": "yes"}
        spec["volumeName"] = volume
    return {"metadata": metadata, "spec": spec}


def create_pod_with_claim(kube: Kube, name: str, claim: str) -> None:
    spec = {
        "schedulerName": SCHEDULER,
        "containers": [{"name": "c", "image": "registry.invalid/pause:1",
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
    }  # fmt: skip
    body = {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}
    kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body)


def node_of(kube: Kube, name: str) -> str:
    return str(kube.pod(NAMESPACE, name)["spec"].get("nodeName") or "")


def test_claim_bound_to_node_affine_pv_lands_where_the_pv_allows_and_unbound_claim_waits(
    kube: Kube,
    cluster: None,
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
) -> None:
    start_scheduler(schedulers, tmp_path, scheduler_kubeconfig, redis_url, SCHEDULER)
    claims = f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims"
    create_local_volume(kube, VOLUMES[0], NODES[1])
    kube.request("POST", claims, claim_body("bound-data", VOLUMES[0]))
    create_pod_with_claim(kube, "bound", "bound-data")
    assert wait_for(lambda: node_of(kube, "bound"), "the bound-claim pod to be bound") == NODES[1]

    kube.request("POST", claims, claim_body("later-data"))
    create_pod_with_claim(kube, "waits", "later-data")

    def refused() -> dict[str, Any] | None:
        found = condition(kube.pod(NAMESPACE, "waits"), "PodScheduled")
        return found if found and found["status"] == "False" else None

    found = wait_for(refused, "PodScheduled=False on the unbound-claim pod")
    assert found["reason"] == "Unschedulable"
    assert "claim later-data is unbound" in found["message"]
    events = [
        e
        for e in kube.events(NAMESPACE)
        if e["regarding"]["name"] == "waits" and e["reason"] == "FailedScheduling"
    ]
    assert len(events) == 1 and events[0]["type"] == "Warning"
    note = events[0]["note"]
    assert "claim later-data" in note and "WaitForFirstConsumer" in note, note
    assert "extender mode" in note, note
    assert node_of(kube, "waits") == ""

    # Once the claim is bound (here by hand, as the PV controller would), the claim's
    # watch event retries the pod and it lands where its volume is.
    create_local_volume(kube, VOLUMES[1], NODES[0])
    bind = {
        "metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
        "spec": {"volumeName": VOLUMES[1]},
    }
    kube.request("PATCH", f"{claims}/later-data", bind, "application/merge-patch+json")
    assert (
        wait_for(lambda: node_of(kube, "waits"), "the pod to be bound once its claim is")
        == (NODES[0])
    )
