"""Well-formed Kubernetes objects as the API server returns them, for the in-memory cluster.

API-style JSON dicts (camelCase, as the API server serialises them) of every kind the
informers deliver: nodes, pods, namespaces, PodDisruptionBudgets, PersistentVolumeClaims,
PersistentVolumes, StorageClasses and CSINodes, each from a few keyword arguments with
defaults. :class:`scheduler.adapters.memory.InMemoryCluster` holds them; the simulator,
the demo and the throughput benchmark fill it with :func:`node_object` and
:func:`pod_object`, the tests with every builder here.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from scheduler.cycle.ports import K8sObject

DEFAULT_SCHEDULER = "interference-scheduler"


def rfc3339(ts: float) -> str:
    """Unix time → the API server's timestamp format (second precision, ``Z``)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_object(
    name: str,
    *,
    cpu: str = "8",
    memory: str = "32Gi",
    pods: str = "110",
    gpus: int = 0,
    ephemeral_storage: str = "100Gi",
    labels: Mapping[str, str] | None = None,
    taints: Iterable[Mapping[str, str]] = (),
    ready: bool = True,
    unschedulable: bool = False,
    extra_allocatable: Mapping[str, str] | None = None,
) -> K8sObject:
    """A Node as the API server returns it; ``gpus`` sets ``nvidia.com/gpu``."""
    allocatable = {
        "cpu": cpu,
        "memory": memory,
        "pods": pods,
        "ephemeral-storage": ephemeral_storage,
    }
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    allocatable.update(extra_allocatable or {})
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"node-{name}",
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
        },
        "spec": spec,
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
        },
    }


def pod_object(
    name: str,
    *,
    namespace: str = "default",
    cpu: str | None = "100m",
    memory: str | None = "128Mi",
    gpus: int = 0,
    scheduler_name: str = DEFAULT_SCHEDULER,
    node_name: str | None = None,
    priority: int | None = None,
    created_at: float | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Iterable[Mapping[str, Any]] = (),
    affinity: Mapping[str, Any] | None = None,
    phase: str = "Pending",
) -> K8sObject:
    """A single-container Pod as the API server returns it.

    ``node_name`` makes it a running pod bound to that node; ``created_at`` (Unix time)
    sets ``metadata.creationTimestamp``.
    """
    requests: dict[str, str] = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
    resources: dict[str, Any] = {"requests": requests}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "containers": [{"name": "main", "image": "busybox", "resources": resources}],
    }
    if node_name:
        spec["nodeName"] = node_name
    if priority is not None:
        spec["priority"] = priority
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if affinity:
        spec["affinity"] = copy.deepcopy(dict(affinity))
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
    }
    if created_at is not None:
        metadata["creationTimestamp"] = rfc3339(created_at)
    if annotations:
        metadata["annotations"] = dict(annotations)
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": "Running" if node_name and phase == "Pending" else phase},
    }


def namespace_object(name: str, labels: Mapping[str, str] | None = None) -> K8sObject:
    """A Namespace as the API server returns it (with the ``kubernetes.io/metadata.name``
    label the API server sets on every namespace)."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {**(labels or {}), "kubernetes.io/metadata.name": name},
        },
        "status": {"phase": "Active"},
    }


def claim_object(
    name: str,
    namespace: str = "default",
    volume_name: str = "",
    storage_class: str = "",
    access_modes: tuple[str, ...] = ("ReadWriteOnce",),
    bound: bool | None = None,
    owner_uid: str = "",
) -> K8sObject:
    """A PersistentVolumeClaim as the API server returns it. ``bound`` (default: when
    ``volume_name`` is set) adds the PV controller's ``pv.kubernetes.io/bind-completed``
    annotation and phase ``Bound``; ``owner_uid`` makes a pod its controller (an
    ephemeral volume's claim)."""
    is_bound = bool(volume_name) if bound is None else bound
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-pvc-{name}"}
    if is_bound:
        metadata["annotations"] = {"pv.kubernetes.io/bind-completed": "yes"}
    if owner_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": owner_uid, "controller": True}
        ]
    spec: dict[str, Any] = {
        "accessModes": list(access_modes),
        "resources": {"requests": {"storage": "1Gi"}},
    }
    if volume_name:
        spec["volumeName"] = volume_name
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": "Bound" if is_bound else "Pending"},
    }


def volume_object(
    name: str,
    node_affinity: list[dict[str, Any]] | None = None,
    labels: Mapping[str, str] | None = None,
    source: Mapping[str, Any] | None = None,
) -> K8sObject:
    """A PersistentVolume, local unless ``source`` gives its source (``{"csi": {...}}``);
    ``node_affinity`` is its required ``nodeSelectorTerms``."""
    spec: dict[str, Any] = {
        "capacity": {"storage": "1Gi"},
        "accessModes": ["ReadWriteOnce"],
        **(source or {"local": {"path": f"/mnt/{name}"}}),
    }
    if node_affinity is not None:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": node_affinity}}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": spec,
    }


def storage_class_object(
    name: str,
    binding_mode: str = "WaitForFirstConsumer",
    provisioner: str = "kubernetes.io/no-provisioner",
) -> K8sObject:
    """A StorageClass with ``volumeBindingMode``."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": provisioner,
        "volumeBindingMode": binding_mode,
    }


def csi_node_object(name: str, limits: Mapping[str, int]) -> K8sObject:
    """A CSINode for node ``name`` with an attach limit (``allocatable.count``) per driver."""
    drivers = [
        {"name": driver, "nodeID": name, "allocatable": {"count": count}}
        for driver, count in limits.items()
    ]
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {"name": name},
        "spec": {"drivers": drivers},
    }
