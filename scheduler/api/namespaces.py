"""The Namespaces the scheduler watches: their labels, and which a selector picks.

kube-scheduler resolves a pod affinity term's ``namespaceSelector`` against the
namespaces' labels; an unknown namespace has no labels, as it assumes.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.api.objects import NamespaceInfo
from scheduler.api.selectors import LabelSelector


class NamespaceCatalog:
    """Namespace name → labels, with the selections cached until a namespace changes."""

    def __init__(self) -> None:
        self._labels: dict[str, Mapping[str, str]] = {}
        self._selections: dict[LabelSelector, frozenset[str]] = {}

    def upsert(self, namespace: NamespaceInfo) -> bool:
        """Store a namespace's labels; True when they changed."""
        if self._labels.get(namespace.name) == namespace.labels:
            return False
        self._labels[namespace.name] = namespace.labels
        self._selections.clear()
        return True

    def remove(self, name: str) -> bool:
        """Forget a namespace; True when it was known."""
        if self._labels.pop(name, None) is None:
            return False
        self._selections.clear()
        return True

    def names(self) -> list[str]:
        return list(self._labels)

    def labels(self, name: str) -> Mapping[str, str]:
        """The labels of namespace ``name`` (none when unknown, as kube-scheduler assumes)."""
        return self._labels.get(name, {})

    def matching(self, selector: LabelSelector) -> frozenset[str]:
        """Names of the known namespaces whose labels ``selector`` matches (cached until a
        namespace changes)."""
        found = self._selections.get(selector)
        if found is None:
            found = frozenset(
                name for name, labels in self._labels.items() if selector.matches(labels)
            )
            self._selections[selector] = found
        return found
