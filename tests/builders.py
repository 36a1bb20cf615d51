"""The Kubernetes objects tests build: Nodes and Pods as API JSON, exactly as the API
server serialises them, with one set of defaults, and a node table holding them.

Every test builds its Nodes and Pods here (a test file may wrap these in a shorter helper
of its own, never with a second set of defaults). ``scheduler.adapters.object_builders``'s
``node_object`` and ``pod_object`` are the simulator's, the demo's and the benchmark's
builders (a program's, not a test's): only tests/scheduler/test_memory_cluster.py, which
tests them, calls them. The other kinds (claims, volumes, storage classes, namespaces) are
built by ``object_builders``, the only builders there are.

Defaults: a Node ``n1`` that is Ready with 4 CPUs, 8 Gi of memory, 110 pods and 100 Gi
of ephemeral storage; a Pod ``p`` in ``default``, uid ``uid-{namespace}-{name}``, created
2024-05-01T12:00:00Z (:data:`CREATED_AT`), of interference-scheduler, ``Pending``, with
one container that requests nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scheduler.adapters.object_builders import rfc3339
from scheduler.api.nodes import parse_node
from scheduler.api.pods import parse_pod
from scheduler.signals.table import NodeTable

CREATED_AT = 1_714_564_800.0
"""A pod's default ``metadata.creationTimestamp``: 2024-05-01T12:00:00Z."""


def node_obj(
    name: str = "n1",
    *,
    cpu: str = "4",
    memory: str = "8Gi",
    pods: str = "110",
    extra: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    taints: Iterable[tuple[str, str, str]] = (),
    ready: bool = True,
    unschedulable: bool = False,
) -> dict[str, Any]:
    """A Node; ``extra`` adds allocatable resources (``{"nvidia.com/gpu": "8"}``),
    ``taints`` are ``(key, value, effect)``."""
    allocatable = {"cpu": cpu, "memory": memory, "pods": pods, "ephemeral-storage": "100Gi"}
    allocatable.update(extra or {})
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {
            "unschedulable": unschedulable,
            "taints": [{"key": k, "value": v, "effect": e} for k, v, e in taints],
        },
        "status": {
            "allocatable": allocatable,
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
        },
    }


def container(requests: Mapping[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """A container ``c`` with these requests (none: no ``resources``)."""
    body: dict[str, Any] = {"name": "c", "image": "busybox", **extra}
    if requests is not None:
        body["resources"] = {"requests": dict(requests)}
    return body


def pod_obj(
    name: str = "p",
    namespace: str = "default",
    *,
    requests: Mapping[str, str] | None = None,
    containers: Sequence[dict[str, Any]] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    created_at: float = CREATED_AT,
    phase: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A Pod of interference-scheduler, one container requesting ``requests`` unless
    ``containers`` are given; extra keyword arguments go into ``spec`` as they are
    (``nodeName="n1"`` binds it, ``priority=100``, ``schedulerName=…``). ``status.phase``
    is ``phase``, else ``Running`` for a bound pod and ``Pending`` for one that is not."""
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
            "creationTimestamp": rfc3339(created_at),
        },
        "spec": {
            "schedulerName": "interference-scheduler",
            "containers": list(containers) if containers else [container(requests or {})],
            **spec,
        },
        "status": {"phase": phase or ("Running" if spec.get("nodeName") else "Pending")},
    }


def table_of(
    nodes: Iterable[dict[str, Any]], placed: Iterable[tuple[dict[str, Any], str]] = ()
) -> NodeTable:
    """A node table with these nodes and ``(pod, node)`` placements (added at time 0)."""
    table = NodeTable()
    for node in nodes:
        table.upsert_node(parse_node(node))
    for pod, node_name in placed:
        table.add_pod(parse_pod(pod), node_name, 0.0)
    return table


def affinity_terms(*terms: Sequence[tuple[str, str, Sequence[str]]]) -> dict[str, Any]:
    """Required node affinity with terms of ``(key, operator, values)`` expressions."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": k, "operator": op, "values": list(v)} for k, op, v in term
                        ]
                    }
                    for term in terms
                ]
            }
        }
    }
