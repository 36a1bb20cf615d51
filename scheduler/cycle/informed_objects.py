"""The informers' raw objects as the cache reads them, beside the API model's parse.

An object's key (``name``, or ``namespace/name`` for a namespaced kind, even for an
object that no longer parses); a pod's state that the parsed :class:`PodInfo` leaves out
(finished, ``status.nominatedNodeName``, ``status.startTime``, terminating by
preemption); whether a pod, parsed or raw, is one this scheduler places; and what to
report of a pod of ours that does not parse. Pure functions of one object: the cache
(:mod:`scheduler.cycle.cache`) keeps the state.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from datetime import datetime

from scheduler.api.objects import PodInfo
from scheduler.api.pods import parse_pod
from scheduler.cycle.ports import CLUSTER_SCOPED_KINDS, K8sObject, ObjectKind, PodRef

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
"""Pods in these phases no longer use their node's resources."""


@dataclasses.dataclass(frozen=True, slots=True)
class UnparseablePod:
    """A pod of ours that does not parse: what to report, and which version."""

    ref: PodRef
    error: str
    """The parse error (names the pod and the field)."""
    fingerprint: str
    """The pod's spec, labels and annotations: a new one is reported again (not a new
    resourceVersion alone, or the condition we write would be reported in a loop)."""


def unparseable_pod(obj: K8sObject, error: str) -> UnparseablePod | None:
    """What to report of a pod that does not parse; None when it has no usable name."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(metadata, Mapping):
        return None
    name, namespace = metadata.get("name"), metadata.get("namespace") or "default"
    uid = metadata.get("uid") or ""
    if not all(isinstance(v, str) for v in (name, namespace, uid)) or not name:
        return None
    content = [obj.get("spec"), metadata.get("labels"), metadata.get("annotations")]
    fingerprint = json.dumps(content, sort_keys=True, default=str)
    return UnparseablePod(PodRef(namespace, name, uid), error, fingerprint)


@dataclasses.dataclass(frozen=True, slots=True)
class PodState:
    """A parsed pod with what the cache reads of its status."""

    pod: PodInfo
    finished: bool
    """``status.phase`` is Succeeded or Failed: the pod no longer uses its node."""
    nominated: str = ""
    """``status.nominatedNodeName``."""
    start_time: float = math.inf
    """``status.startTime`` (``inf`` when absent or unreadable)."""
    preempted: bool = False
    """Deleting, with ``DisruptionTarget`` (reason ``PreemptionByScheduler``) true."""


def placed_on(obj: K8sObject) -> str:
    """The node of a pod's raw JSON that is bound and still holds it, else ""."""
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    status = obj.get("status") if isinstance(obj, Mapping) else None
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    phase = status.get("phase") if isinstance(status, Mapping) else None
    if not isinstance(node, str) or phase in FINISHED_PHASES:
        return ""
    return node


def parse_pod_state(obj: K8sObject) -> PodState:
    """Parse a pod and read its status (raises :class:`~scheduler.api.reader.ObjectError`)."""
    status = obj.get("status") if isinstance(obj, Mapping) else None
    phase = status.get("phase") if isinstance(status, Mapping) else None
    pod = parse_pod(obj)
    if not isinstance(status, Mapping):
        return PodState(pod, phase in FINISHED_PHASES)
    nominated = status.get("nominatedNodeName")
    preempted = pod.terminating and any(
        isinstance(c, Mapping)
        and c.get("type") == "DisruptionTarget"
        and c.get("status") == "True"
        and c.get("reason") == "PreemptionByScheduler"
        for c in status.get("conditions") or ()
    )
    return PodState(
        pod,
        phase in FINISHED_PHASES,
        nominated if isinstance(nominated, str) else "",
        _unix_time(status.get("startTime")),
        preempted,
    )


def _unix_time(value: object) -> float:
    """An RFC 3339 timestamp as Unix time, ``inf`` when absent or unreadable."""
    if not isinstance(value, str):
        return math.inf
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return math.inf


def object_key(kind: ObjectKind, obj: K8sObject) -> str | None:
    """``name`` of a node or ``namespace/name`` of a pod, None when it has no name."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        return None
    if kind in CLUSTER_SCOPED_KINDS:
        return name
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return f"{namespace if isinstance(namespace, str) and namespace else 'default'}/{name}"


def chosen(pod: PodInfo, scheduler_name: str, ignore_namespaces: frozenset[str]) -> bool:
    """Whether ``pod`` is one to place for ``scheduler_name``: unbound, live, ungated and
    not in an ignored namespace."""
    return (
        pod.scheduler_name == scheduler_name
        and not pod.node_name
        and not pod.terminating
        and not pod.scheduling_gates
        and pod.namespace not in ignore_namespaces
    )


def chosen_raw(obj: K8sObject, scheduler_name: str, ignore_namespaces: frozenset[str]) -> bool:
    """:func:`chosen` on raw JSON, for a pod that does not parse."""
    metadata = obj.get("metadata")
    spec = obj.get("spec")
    if not isinstance(metadata, Mapping) or not isinstance(spec, Mapping):
        return False
    namespace = metadata.get("namespace") or "default"
    return (
        spec.get("schedulerName") == scheduler_name
        and not spec.get("nodeName")
        and metadata.get("deletionTimestamp") is None
        and not spec.get("schedulingGates")
        and namespace not in ignore_namespaces
    )
