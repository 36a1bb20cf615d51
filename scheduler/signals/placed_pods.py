"""The pods placed on nodes: by key, node, label, namespace and priority, with the
lookups plugins register on them.

The node table (:class:`scheduler.signals.table.NodeTable`) counts each placed pod in its
node's row; :class:`PlacedPods` keeps what does not depend on rows: which pod is placed
on which node (a node the table does not know yet included), the label and namespace
sets that narrow the pods an affinity term may match, the priorities, the placed pods
that do not parse, and the plugins' lookups (:class:`PlacedPodLookup`), told of every pod
added or removed. Everything is keyed by pod key and node name, so a layout change of
the table moves nothing here. Not thread-safe: callers hold the cache lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

from scheduler.api.objects import AntiAffinityTerm, PodInfo
from scheduler.api.term_lookup import discard, positive_candidates


@dataclass(frozen=True, slots=True)
class PlacedPod:
    pod: PodInfo
    node: str


class PlacedPodLookup(Protocol):
    """What a plugin keeps about placed pods across decisions (ports in use, affinity
    terms…), kept current by the table's add/remove hooks (:meth:`PlacedPods.lookup`)."""

    def add(self, pod: PodInfo, node: str) -> None:
        """``pod`` was placed on ``node`` (a node the table may not know yet)."""

    def remove(self, pod: PodInfo, node: str) -> None:
        """``pod``, added on ``node`` before, is gone from it."""


LookupT = TypeVar("LookupT", bound=PlacedPodLookup)


class PlacedPods:
    """Placed pods by key, with the sets that find them and the lookups kept on them."""

    def __init__(self, lookups: Mapping[str, PlacedPodLookup]) -> None:
        self._pods: dict[str, PlacedPod] = {}
        self._by_node: dict[str, dict[str, PodInfo]] = {}
        self._by_label: dict[tuple[str, str], set[str]] = {}
        self._by_namespace: dict[str, set[str]] = {}
        self._priorities: Counter[int] = Counter()
        """Placed pods per priority (tells at once whether a pod could preempt anyone)."""
        self._lookups: dict[str, PlacedPodLookup] = dict(lookups)
        """Lookups of placed pods registered by plugins (:meth:`lookup`), by name."""
        self._unreadable: dict[str, str] = {}
        """Placed pods (key → node) whose requests, ports, labels or terms do not parse."""

    def get(self, key: str) -> PlacedPod | None:
        """The placed pod ``key`` and its node, ``None`` when it is not placed."""
        return self._pods.get(key)

    def add(self, pod: PodInfo, node: str) -> None:
        """Place ``pod`` on ``node``; the caller removed any earlier placement of its key."""
        self._pods[pod.key] = PlacedPod(pod, node)
        self._by_node.setdefault(node, {})[pod.key] = pod
        for item in pod.labels.items():
            self._by_label.setdefault(item, set()).add(pod.key)
        self._by_namespace.setdefault(pod.namespace, set()).add(pod.key)
        self._priorities[pod.priority] += 1
        for lookup in self._lookups.values():
            lookup.add(pod, node)

    def remove(self, key: str) -> PlacedPod | None:
        """Forget the pod ``key``; what was placed, ``None`` when it was not."""
        placed = self._pods.pop(key, None)
        if placed is None:
            return None
        pod, node = placed.pod, placed.node
        on_node = self._by_node[node]
        del on_node[key]
        if not on_node:
            del self._by_node[node]
        for item in pod.labels.items():
            discard(self._by_label, item, key)
        discard(self._by_namespace, pod.namespace, key)
        self._priorities[pod.priority] -= 1
        if not self._priorities[pod.priority]:
            del self._priorities[pod.priority]
        for lookup in self._lookups.values():
            lookup.remove(pod, node)
        return placed

    def node_of(self, key: str) -> str | None:
        """The node pod ``key`` is placed on, ``None`` when it is not placed."""
        placed = self._pods.get(key)
        return None if placed is None else placed.node

    def on_node(self, name: str) -> Mapping[str, PodInfo]:
        """Pods placed on node ``name`` by key (read only)."""
        return self._by_node.get(name, {})

    def lowest_priority(self) -> int | None:
        """The lowest priority of any placed pod, ``None`` without pods."""
        return min(self._priorities) if self._priorities else None

    def matching(self, term: AntiAffinityTerm) -> Iterable[PodInfo]:
        """Placed pods that fall under ``term`` (label lookups first, then a full check)."""
        candidates = positive_candidates(term.selector, self._by_label)
        if candidates is None:
            if term.namespaces is None:
                candidates = set(self._pods)
            else:
                candidates = set().union(
                    *(self._by_namespace.get(ns, set()) for ns in term.namespaces)
                )
        for key in candidates:
            pod = self._pods[key].pod
            if term.matches(pod.namespace, pod.labels):
                yield pod

    def lookup(self, name: str, build: Callable[[], LookupT]) -> LookupT:
        """The placed-pod lookup registered under ``name`` (a plugin's name), built by
        ``build()`` and filled with every placed pod the first time it is asked for; from
        then on its :meth:`PlacedPodLookup.add` and :meth:`~PlacedPodLookup.remove` are
        called as pods are placed and removed."""
        found = self._lookups.get(name)
        if found is None:
            found = build()
            for placed in self._pods.values():
                found.add(placed.pod, placed.node)
            self._lookups[name] = found
        return cast(LookupT, found)

    def hold_unreadable(self, key: str, node: str) -> bool:
        """Note a pod placed on ``node`` that does not parse; True when that is news."""
        if self._unreadable.get(key) == node:
            return False
        self._unreadable[key] = node
        return True

    def release_unreadable(self, key: str) -> bool:
        """The pod parses again, finished or was deleted; True when it was held."""
        return self._unreadable.pop(key, None) is not None

    def unreadable_keys(self) -> Collection[str]:
        """Keys of the placed pods held as unreadable (read only)."""
        return self._unreadable.keys()

    def unreadable_nodes(self) -> Collection[str]:
        """The nodes of the placed pods held as unreadable (one per pod)."""
        return self._unreadable.values()
