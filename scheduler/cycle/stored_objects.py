"""The informed kinds the cache keeps as they come, for the filters and preemption to read.

Namespaces (their labels decide which pods a namespace selector sees), the volume
objects (PersistentVolumeClaims, PersistentVolumes, StorageClasses and CSINodes, for the
volume filters) and PodDisruptionBudgets (read at preemption). Unlike nodes and pods
they take no row and join no pending set: :class:`StoredObjects` stores them in the
node table's catalogs (budgets in a dict of its own) and says whether a change is one
the queue should hear of. Not thread-safe: the cache calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from scheduler.api.budgets import DisruptionBudgetInfo, parse_disruption_budget
from scheduler.api.nodes import parse_namespace
from scheduler.api.storage import parse_claim, parse_csi_node, parse_storage_class, parse_volume
from scheduler.cycle.informed_objects import object_key
from scheduler.cycle.ports import K8sObject, ObjectKind
from scheduler.signals.table import NodeTable

_T = TypeVar("_T")

VOLUME_KINDS: frozenset[ObjectKind] = frozenset(
    {"PersistentVolumeClaim", "PersistentVolume", "StorageClass", "CSINode"}
)
"""Kinds the volume filters read (kept in the table's :attr:`~NodeTable.volumes`)."""
STORED_KINDS: frozenset[ObjectKind] = VOLUME_KINDS | {"Namespace", "PodDisruptionBudget"}
"""Every kind :class:`StoredObjects` keeps."""


class ObjectParser(Protocol):
    """The cache's parse: the object, or None once a malformed one is counted and logged."""

    def __call__(
        self, obj: K8sObject, parse: Callable[[K8sObject], _T], kind: ObjectKind
    ) -> _T | None: ...


class StoredObjects:
    """Namespaces, volume objects and disruption budgets, by kind and key."""

    def __init__(self, table: NodeTable, parse: ObjectParser) -> None:
        self._table = table
        self._parse = parse
        self._budgets: dict[str, DisruptionBudgetInfo] = {}

    def budgets(self) -> list[DisruptionBudgetInfo]:
        """The PodDisruptionBudgets listed so far."""
        return list(self._budgets.values())

    def replace(self, kind: ObjectKind, objects: list[K8sObject]) -> None:
        """A full (re)list of one kind: objects missing from it (or no longer parsing) go."""
        if kind == "Namespace":
            parsed = (self._parse(obj, parse_namespace, kind) for obj in objects)
            namespaces = {n.name: n for n in parsed if n is not None}
            for name in self._table.namespaces.names():
                if name not in namespaces:
                    self._table.namespaces.remove(name)
            for namespace in namespaces.values():
                self._table.namespaces.upsert(namespace)
        elif kind == "PodDisruptionBudget":
            budgets = (self._parse(obj, parse_disruption_budget, kind) for obj in objects)
            self._budgets = {budget.key: budget for budget in budgets if budget is not None}
        else:
            listed = {object_key(kind, obj) for obj in objects}
            for key in self._volume_keys(kind):
                if key not in listed:
                    self._remove_volume_object(kind, key)
            for obj in objects:
                self._upsert_volume_object(kind, obj)

    def upsert(self, kind: ObjectKind, obj: K8sObject) -> bool:
        """Store one object from the watch; True when the queue should hear of it (a
        claim bound or a volume changed may fit a pod now; a budget is read at
        preemption only, so no pod waits on it)."""
        if kind == "PodDisruptionBudget":
            budget = self._parse(obj, parse_disruption_budget, kind)
            if budget is not None:
                self._budgets[budget.key] = budget
            return False
        if kind == "Namespace":
            namespace = self._parse(obj, parse_namespace, kind)
            return namespace is not None and self._table.namespaces.upsert(namespace)
        return self._upsert_volume_object(kind, obj)

    def delete(self, kind: ObjectKind, key: str) -> bool:
        """Forget one object; True when the queue should hear of it."""
        if kind == "PodDisruptionBudget":
            self._budgets.pop(key, None)
            return False
        if kind == "Namespace":
            return self._table.namespaces.remove(key)
        return self._remove_volume_object(kind, key)

    def _upsert_volume_object(self, kind: ObjectKind, obj: K8sObject) -> bool:
        """Store a claim, PersistentVolume, StorageClass or CSINode; True when it changed. One that
        no longer parses is dropped (a pod using it waits, as for a missing one)."""
        volumes = self._table.volumes
        if kind == "PersistentVolumeClaim":
            claim = self._parse(obj, parse_claim, kind)
            if claim is not None:
                return volumes.upsert_claim(claim)
        elif kind == "PersistentVolume":
            volume = self._parse(obj, parse_volume, kind)
            if volume is not None:
                return volumes.upsert_volume(volume)
        elif kind == "StorageClass":
            storage_class = self._parse(obj, parse_storage_class, kind)
            if storage_class is not None:
                return volumes.upsert_storage_class(storage_class)
        else:
            csi_node = self._parse(obj, parse_csi_node, kind)
            if csi_node is not None:
                return volumes.upsert_csi_node(csi_node)
        key = object_key(kind, obj)
        return key is not None and self._remove_volume_object(kind, key)

    def _remove_volume_object(self, kind: ObjectKind, key: str) -> bool:
        volumes = self._table.volumes
        if kind == "PersistentVolumeClaim":
            return volumes.remove_claim(key)
        if kind == "PersistentVolume":
            return volumes.remove_volume(key)
        if kind == "StorageClass":
            return volumes.remove_storage_class(key)
        return volumes.remove_csi_node(key)

    def _volume_keys(self, kind: ObjectKind) -> list[str]:
        volumes = self._table.volumes
        if kind == "PersistentVolumeClaim":
            return volumes.claim_keys()
        if kind == "PersistentVolume":
            return volumes.volume_names()
        if kind == "StorageClass":
            return volumes.storage_class_names()
        return volumes.csi_node_names()
