"""Parsing of Node and Namespace API JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.api.objects import NamespaceInfo, NodeInfo, Taint
from scheduler.api.reader import Reader


def parse_node(obj: Mapping[str, Any]) -> NodeInfo:
    """A node from its API JSON; :class:`ObjectError` names the malformed field."""
    reader = Reader(obj, "node")
    name = reader.name
    spec = reader.mapping(obj, "spec")
    status = reader.mapping(obj, "status")
    quantities = reader.mapping(status, "status.allocatable") or reader.mapping(
        status, "status.capacity"
    )
    allocatable = reader.resources(quantities, "status.allocatable")
    conditions = [
        reader.as_mapping(c, f"status.conditions[{i}]")
        for i, c in enumerate(reader.sequence(status, "status.conditions"))
    ]
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = tuple(
        Taint(
            key=reader.string(t, "key", f"spec.taints[{i}].key"),
            value=reader.string(t, "value", f"spec.taints[{i}].value"),
            effect=reader.string(t, "effect", f"spec.taints[{i}].effect"),
        )
        for i, t in enumerate(reader.sequence(spec, "spec.taints"))
    )
    return NodeInfo(
        name=name,
        labels=reader.string_map(reader.metadata, "labels", "metadata.labels"),
        taints=taints,
        allocatable=allocatable,
        ready=ready,
        unschedulable=bool(spec.get("unschedulable", False)),
    )


def parse_namespace(obj: Mapping[str, Any]) -> NamespaceInfo:
    """A namespace from its API JSON (name and labels)."""
    reader = Reader(obj, "namespace")
    return NamespaceInfo(
        reader.name, reader.string_map(reader.metadata, "labels", "metadata.labels")
    )
