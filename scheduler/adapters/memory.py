"""An in-memory Kubernetes cluster implementing :class:`scheduler.cycle.ports.Cluster`.

Nodes, namespaces and pods are API-style JSON dicts (camelCase, as the API server
serialises them) with a cluster-wide ``resourceVersion`` counter.
:meth:`InMemoryCluster.run_informers` delivers ``replace`` for every informed kind, then
every later change as ``apply`` events in the order they happened, like list-then-watch.
:meth:`InMemoryCluster.bind` behaves like the Binding subresource (409 →
:class:`BindConflict` when the pod is already bound or gone).
Events, conditions and binds are recorded for assertions.

Used by the cycle tests, the throughput benchmark and ``interference simulate``; the
objects it holds are made by :mod:`scheduler.adapters.object_builders`.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.cycle.ports import (
    CLUSTER_SCOPED_KINDS,
    INFORMED_KINDS,
    PREEMPTION_KINDS,
    BindConflict,
    ClusterError,
    ClusterHandler,
    EventType,
    K8sObject,
    ObjectKind,
    PodRef,
    Preemption,
)

_KINDS: tuple[ObjectKind, ...] = INFORMED_KINDS + PREEMPTION_KINDS
"""What the informers deliver: this cluster implements the Preemptor too."""
_TRIM_BATCH = 4096
"""Seen changes are dropped in batches of at least this many."""


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """An Event the scheduler emitted about a pod."""

    namespace: str
    pod: str
    type: str
    """``Normal`` or ``Warning``."""
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class _Change:
    kind: ObjectKind
    event: EventType
    obj: K8sObject


def _object_key(kind: ObjectKind, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata", {})
    if kind in CLUSTER_SCOPED_KINDS:
        return str(meta["name"])
    return f"{meta.get('namespace', 'default')}/{meta['name']}"


class InMemoryInformer:
    """One list-then-watch consumer of an :class:`InMemoryCluster`.

    :meth:`sync` delivers, in the caller's thread, the initial ``replace`` on its first
    call and every change since the previous call afterwards — deterministic tests call
    it directly; :meth:`InMemoryCluster.run_informers` calls it in a loop.
    """

    def __init__(self, cluster: InMemoryCluster, handler: ClusterHandler) -> None:
        self._cluster = cluster
        self._handler = handler
        self._position: int | None = None

    def sync(self) -> int:
        """Deliver what the handler has not seen yet; returns the number of calls made."""
        if self._position is None:
            objects, self._position = self._cluster._snapshot()
            for kind in _KINDS:
                self._handler.replace(kind, objects[kind])
            return len(_KINDS)
        changes, self._position = self._cluster._changes_since(self._position)
        for change in changes:
            self._handler.apply(change.kind, change.event, change.obj)
        return len(changes)


class InMemoryCluster:
    """A cluster held in dicts; thread-safe; records what the scheduler wrote."""

    def __init__(self) -> None:
        self._lock = threading.Condition(threading.Lock())
        self._objects: dict[ObjectKind, dict[str, K8sObject]] = {k: {} for k in _KINDS}
        self._changes: list[_Change] = []
        self._log_start = 0
        """Position (counted since the cluster was made) of ``_changes[0]``; changes every
        informer has seen are dropped so a long simulation does not grow without bound."""
        self._informers: weakref.WeakSet[InMemoryInformer] = weakref.WeakSet()
        self._resource_version = 0
        self._bind_failures: list[ClusterError] = []
        self.events: list[RecordedEvent] = []
        """Every Event recorded, in order."""
        self.binds: list[tuple[str, str]] = []
        """``(namespace/name, node)`` for every successful bind, in order."""
        self.bind_calls = 0
        """Every call to :meth:`bind`, successful or not."""
        self.preemptions: list[Preemption] = []
        """Every :meth:`preempt` call, in order."""
        self.deleted_conditions: dict[str, list[dict[str, Any]]] = {}
        """``namespace/name`` of each preempted pod → its conditions when it was deleted."""

    # ---- the Cluster Protocol --------------------------------------------------------

    def informer(self, handler: ClusterHandler) -> InMemoryInformer:
        """A list-then-watch consumer driven by hand (see :class:`InMemoryInformer`)."""
        informer = InMemoryInformer(self, handler)
        with self._lock:
            self._informers.add(informer)
        return informer

    def run_informers(self, handler: ClusterHandler, stop: threading.Event) -> None:
        """List then watch until ``stop`` is set."""
        informer = self.informer(handler)
        while not stop.is_set():
            informer.sync()
            with self._lock:
                if informer._position == self._log_end():
                    self._lock.wait(0.05)

    def bind(self, pod: PodRef, node: str) -> None:
        """Set ``spec.nodeName``; :class:`BindConflict` when bound already or gone."""
        key = f"{pod.namespace}/{pod.name}"
        with self._lock:
            self.bind_calls += 1
            if self._bind_failures:
                raise self._bind_failures.pop(0)
            obj = self._objects["Pod"].get(key)
            if obj is None:
                raise BindConflict(f"pods {key!r} not found (404)")
            if pod.uid and obj["metadata"].get("uid") != pod.uid:
                raise BindConflict(f"pod {key!r} was recreated with another uid (409)")
            bound = obj["spec"].get("nodeName")
            if bound:
                raise BindConflict(f"pod {key!r} is already assigned to node {bound!r} (409)")
            if node not in self._objects["Node"]:
                raise ClusterError(f"node {node!r} not found")
            updated = copy.deepcopy(obj)
            updated["spec"]["nodeName"] = node
            updated["status"]["phase"] = "Running"
            conditions = [
                c for c in updated["status"].get("conditions", []) if c["type"] != "PodScheduled"
            ]
            conditions.append({"type": "PodScheduled", "status": "True"})
            updated["status"]["conditions"] = conditions
            self._store("Pod", "MODIFIED", updated)
            self.binds.append((key, node))

    def record_event(self, pod: PodRef, event_type: str, reason: str, message: str) -> None:
        """Keep the Event in :attr:`events`."""
        with self._lock:
            self.events.append(RecordedEvent(pod.namespace, pod.name, event_type, reason, message))

    def set_unschedulable(self, pod: PodRef, message: str) -> None:
        """Set ``PodScheduled=False/Unschedulable`` (a status update watchers see)."""
        key = f"{pod.namespace}/{pod.name}"
        with self._lock:
            obj = self._objects["Pod"].get(key)
            if obj is None:
                raise BindConflict(f"pods {key!r} not found (404)")
            updated = copy.deepcopy(obj)
            _set_unschedulable(updated, message)
            self._store("Pod", "MODIFIED", updated)

    # ---- the Preemptor Protocol ------------------------------------------------------

    def nominate(self, pod: PodRef, node: str, unschedulable: str = "") -> None:
        """Set ``status.nominatedNodeName`` (``""`` clears it) and, with ``unschedulable``,
        ``PodScheduled=False/Unschedulable`` in the same update; a pod that is gone is no
        error."""
        with self._lock:
            obj = self._objects["Pod"].get(f"{pod.namespace}/{pod.name}")
            if obj is None:
                return
            if not unschedulable and obj["status"].get("nominatedNodeName", "") == node:
                return
            updated = copy.deepcopy(obj)
            if node:
                updated["status"]["nominatedNodeName"] = node
            else:
                updated["status"].pop("nominatedNodeName", None)
            if unschedulable:
                _set_unschedulable(updated, unschedulable)
            self._store("Pod", "MODIFIED", updated)

    def preempt(self, preemption: Preemption) -> None:
        """As the API server would see kube-scheduler's calls: each victim gets the
        ``DisruptionTarget`` condition, is deleted (at once: no grace period here) and gets
        a ``Preempted`` Event; then the listed nominations are cleared."""
        preemptor = preemption.preemptor
        with self._lock:
            self.preemptions.append(preemption)
            for victim in preemption.victims:
                key = f"{victim.namespace}/{victim.name}"
                obj = self._objects["Pod"].get(key)
                if obj is None or (victim.uid and obj["metadata"].get("uid") != victim.uid):
                    continue
                updated = copy.deepcopy(obj)
                conditions = [
                    c
                    for c in updated["status"].get("conditions", [])
                    if c["type"] != "DisruptionTarget"
                ]
                conditions.append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "PreemptionByScheduler",
                        "message": f"{preemption.scheduler_name}: preempting to accommodate"
                        " a higher priority pod",
                    }
                )
                updated["status"]["conditions"] = conditions
                self._store("Pod", "MODIFIED", updated)
                self.deleted_conditions[key] = conditions
                del self._objects["Pod"][key]
                self._resource_version += 1
                self._changes.append(_Change("Pod", "DELETED", updated))
                self.events.append(
                    RecordedEvent(
                        victim.namespace,
                        victim.name,
                        "Normal",
                        "Preempted",
                        f"Preempted by pod {preemptor.uid} on node {preemption.node}",
                    )
                )
            self._lock.notify_all()
        for pod in preemption.clear_nominated:
            self.nominate(pod, "")

    # ---- helpers for tests and simulation ---------------------------------------------

    def add_node(self, obj: K8sObject) -> None:
        """Create or replace a node (ADDED when new, MODIFIED otherwise)."""
        self._put("Node", obj)

    def add_pod(self, obj: K8sObject) -> None:
        """Create or replace a pod (ADDED when new, MODIFIED otherwise)."""
        self._put("Pod", obj)

    def add_namespace(self, obj: K8sObject) -> None:
        """Create or replace a namespace (see
        :func:`~scheduler.adapters.object_builders.namespace_object`)."""
        self._put("Namespace", obj)

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace (no-op when absent); its pods stay, unlike in kube."""
        self._delete("Namespace", name)

    def put(self, kind: ObjectKind, obj: K8sObject) -> None:
        """Create or replace an object of any kind (claims, volumes, storage classes, …)."""
        self._put(kind, obj)

    def delete(self, kind: ObjectKind, key: str) -> None:
        """Delete an object by ``name`` or ``namespace/name`` (no-op when absent)."""
        self._delete(kind, key)

    def add_raw(self, kind: ObjectKind, obj: K8sObject) -> None:
        """Store an object without looking inside it (for malformed-object tests).

        It is keyed by a fresh synthetic name so even objects without metadata fit.
        """
        with self._lock:
            self._resource_version += 1
            stored = copy.deepcopy(obj)
            self._objects[kind][f"raw/{self._resource_version}"] = stored
            self._changes.append(_Change(kind, "ADDED", stored))
            self._lock.notify_all()

    def delete_node(self, name: str) -> None:
        """Delete a node (no-op when absent)."""
        self._delete("Node", name)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod (no-op when absent)."""
        self._delete("Pod", f"{namespace}/{name}")

    def get_node(self, name: str) -> K8sObject | None:
        """A copy of the node, or None."""
        with self._lock:
            obj = self._objects["Node"].get(name)
            return copy.deepcopy(obj) if obj is not None else None

    def get_pod(self, namespace: str, name: str) -> K8sObject | None:
        """A copy of the pod, or None."""
        with self._lock:
            obj = self._objects["Pod"].get(f"{namespace}/{name}")
            return copy.deepcopy(obj) if obj is not None else None

    def pods(self) -> list[K8sObject]:
        """Copies of every pod."""
        with self._lock:
            return [copy.deepcopy(o) for o in self._objects["Pod"].values()]

    def node_of(self, namespace: str, name: str) -> str | None:
        """The node the pod is bound to, or None."""
        pod = self.get_pod(namespace, name)
        return None if pod is None else pod["spec"].get("nodeName")

    def fail_next_binds(self, *errors: ClusterError) -> None:
        """Make the next ``len(errors)`` bind calls raise these errors, in order."""
        with self._lock:
            self._bind_failures.extend(errors)

    def events_for(self, namespace: str, name: str) -> list[RecordedEvent]:
        """Events recorded about one pod, in order."""
        with self._lock:
            return [e for e in self.events if (e.namespace, e.pod) == (namespace, name)]

    def pod_condition(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod's ``PodScheduled`` condition, or None."""
        pod = self.get_pod(namespace, name)
        if pod is None:
            return None
        for condition in pod["status"].get("conditions", []):
            if condition.get("type") == "PodScheduled":
                return dict(condition)
        return None

    # ---- internals -------------------------------------------------------------------

    def _put(self, kind: ObjectKind, obj: K8sObject) -> None:
        with self._lock:
            key = _object_key(kind, obj)
            event: EventType = "MODIFIED" if key in self._objects[kind] else "ADDED"
            self._store(kind, event, copy.deepcopy(obj))

    def _delete(self, kind: ObjectKind, key: str) -> None:
        with self._lock:
            obj = self._objects[kind].pop(key, None)
            if obj is not None:
                self._resource_version += 1
                self._changes.append(_Change(kind, "DELETED", obj))
                self._lock.notify_all()

    def _store(self, kind: ObjectKind, event: EventType, obj: K8sObject) -> None:
        """Caller holds the lock and hands over ``obj`` (never mutated afterwards)."""
        self._resource_version += 1
        obj["metadata"]["resourceVersion"] = str(self._resource_version)
        self._objects[kind][_object_key(kind, obj)] = obj
        self._changes.append(_Change(kind, event, obj))
        self._lock.notify_all()

    def _snapshot(self) -> tuple[dict[ObjectKind, list[K8sObject]], int]:
        with self._lock:
            objects = {kind: list(found.values()) for kind, found in self._objects.items()}
            return objects, self._log_end()

    def _changes_since(self, position: int) -> tuple[list[_Change], int]:
        with self._lock:
            self._trim()
            return self._changes[position - self._log_start :], self._log_end()

    def _log_end(self) -> int:
        return self._log_start + len(self._changes)

    def _trim(self) -> None:
        """Drop changes before the lowest position a live informer still needs."""
        positions = [i._position for i in self._informers if i._position is not None]
        low = min(positions, default=self._log_end())
        if low - self._log_start >= _TRIM_BATCH:
            del self._changes[: low - self._log_start]
            self._log_start = low


def _set_unschedulable(pod: K8sObject, message: str) -> None:
    """Replace ``pod``'s PodScheduled condition with False/Unschedulable and ``message``."""
    status = pod["status"]
    conditions = [c for c in status.get("conditions", []) if c["type"] != "PodScheduled"]
    conditions.append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    )
    status["conditions"] = conditions
