"""Typed access to one raw API object (camelCase JSON dicts), and the error it raises.

Large lists never go through the ``kubernetes`` client's model classes; adapters hand the
JSON dicts straight to the parsers (:func:`scheduler.api.nodes.parse_node`,
:func:`scheduler.api.pods.parse_pod`, …), which read only the fields scheduling needs through
a :class:`Reader` and raise :class:`ObjectError` naming the offending field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.api.quantity import QuantityError, resource_amount


class ObjectError(ValueError):
    """A malformed object or annotation; the message names the object and the field."""


class Reader:
    """Typed access to one object's JSON, raising :class:`ObjectError` with the field path."""

    def __init__(self, obj: Mapping[str, Any], kind: str) -> None:
        if not isinstance(obj, Mapping):
            raise ObjectError(f"{kind}: expected a JSON object, got {type(obj).__name__}")
        self.kind = kind
        self.label = kind
        self.metadata = self.mapping(obj, "metadata")
        name = self.metadata.get("name")
        if not isinstance(name, str) or not name:
            raise self.error("metadata.name", "missing or not a string")
        self.name = name
        namespace = self.metadata.get("namespace")
        self.label = f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"

    def error(self, field: str, problem: str) -> ObjectError:
        return ObjectError(f"{self.label}: {field}: {problem}")

    def mapping(self, parent: Mapping[str, Any], path: str) -> Mapping[str, Any]:
        """The object at ``path``'s last segment under ``parent`` (``{}`` when absent)."""
        return self.as_mapping(parent.get(path.rsplit(".", 1)[-1]), path)

    def as_mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(path, f"expected an object, got {type(value).__name__}")
        return value

    def sequence(self, parent: Mapping[str, Any], path: str) -> list[Any]:
        """The list at ``path``'s last segment under ``parent`` (``[]`` when absent)."""
        value = parent.get(path.rsplit(".", 1)[-1])
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(path, f"expected a list, got {type(value).__name__}")
        return value

    def string(self, parent: Mapping[str, Any], key: str, path: str) -> str:
        if not isinstance(parent, Mapping):
            raise self.error(path.rsplit(".", 1)[0], "expected an object")
        value = parent.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.error(path, f"expected a string, got {value!r}")
        return value

    def string_map(self, parent: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
        value = parent.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise self.error(path, "expected an object of string values")
        return dict(value)

    def resources(self, quantities: Mapping[str, Any], path: str) -> dict[str, int]:
        amounts: dict[str, int] = {}
        for resource, quantity in quantities.items():
            try:
                amounts[resource] = resource_amount(resource, quantity)
            except QuantityError as exc:
                raise self.error(f"{path}.{resource}", str(exc)) from exc
        return amounts
