"""Columnar node table: one row per node, numpy columns the filters and scores vectorise over.

Row ``i`` of every column belongs to ``names[i]``. Removing a node moves the last row into
its place, so row numbers are only stable between layout changes; :attr:`NodeTable.generation`
changes with every layout change and with every change of a node's labels, taints,
readiness or cordon, and the ``constraints`` cache scope (per-pod-signature constraint
masks) is emptied at the same time. Heartbeat updates that change only allocatable leave it alone.

Pods are kept by ``namespace/name`` with the node they are bound (or assumed) to; a pod on
a node the table does not know yet is counted once that node arrives. Resource accounting::

    requested[r, node] = Σ requests[r] of the node's pods      (``pods`` counts 1 per pod)
    free[r, node]      = allocatable[r, node] − requested[r, node]

GPU labels are the Node's own: what an agent reports about its GPUs never becomes a label
a pod selector matches (an agent speaks for its signals, not for the node's identity).

Signals: the latest :class:`scheduler.signals.frame.SignalFrame`, ingested column by
column in one vectorised step (:meth:`NodeTable.set_signals`), and ``recent_cpu_m`` —
CPU (millicores) requested by pods added to the node after its report's ``updated_at``; a
newer report drops them, since its measurements include their load.

Caches, so a decision costs O(nodes) numpy passes and few of them: :meth:`NodeTable.cached`
values in three scopes named for what empties them (:data:`CacheScope`: ``constraints``,
per pod signature, when :attr:`NodeTable.generation` changes; ``allocatable``; ``signals``)
and :meth:`NodeTable.derived` columns, refreshed only at the rows whose requests, signals or
allocatable changed (:attr:`NodeTable.load_generation`).

Size: over 500 lines because every column and every per-node structure moves together
when a row moves (a removed node's row takes the last one), so the row layout stays in one
class; the caches, label columns, namespaces, term lookups and the plugins' own lookups
live elsewhere.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, fields
from itertools import repeat
from typing import Any, Protocol, TypeVar, cast

import numpy as np
from numpy.typing import NDArray

from scheduler.api.namespaces import NamespaceCatalog
from scheduler.api.objects import (
    GPU_PRODUCT_LABEL,
    AntiAffinityTerm,
    NodeInfo,
    PodInfo,
)
from scheduler.api.quantity import CPU, EPHEMERAL_STORAGE, MEMORY, PODS
from scheduler.api.term_lookup import MatchCounts, discard, positive_candidates
from scheduler.api.volumes import VolumeCatalog
from scheduler.signals.frame import (
    LATEST_WINDOW,
    NODE_PARTS,
    SIGNAL_COLUMNS,
    SIGNAL_WINDOWS,
    WINDOW_PARTS,
    NodeSignals,
    SignalFrame,
    no_signal_value,
    window_column,
)
from scheduler.signals.node_columns import (
    ABSENT,
    LabelColumn,
    TaintColumns,
    WindowColumns,
    label_column,
    taint_columns,
)
from scheduler.signals.records import frame_of_signals
from scheduler.signals.table_caches import CHANGED_ROWS_LIMIT, TableCaches

BASE_RESOURCES = (CPU, MEMORY, EPHEMERAL_STORAGE, PODS)
if tuple(f.name for f in fields(WindowColumns)) != WINDOW_PARTS:  # pragma: no cover
    raise ImportError("WindowColumns' fields are not scheduler.signals.frame.WINDOW_PARTS")


@dataclass(frozen=True, slots=True)
class _PlacedPod:
    pod: PodInfo
    node: str


class PlacedPodLookup(Protocol):
    """What a plugin keeps about placed pods across decisions (ports in use, affinity
    terms…), kept current by the table's add/remove hooks (:meth:`NodeTable.lookup`)."""

    def add(self, pod: PodInfo, node: str) -> None:
        """``pod`` was placed on ``node`` (a node the table may not know yet)."""

    def remove(self, pod: PodInfo, node: str) -> None:
        """``pod``, added on ``node`` before, is gone from it."""


LookupT = TypeVar("LookupT", bound=PlacedPodLookup)


class NodeTable:
    """Nodes, the pods placed on them and their latest signals, as numpy columns."""

    def __init__(self, capacity: int = 64) -> None:
        self._capacity = max(1, capacity)
        self._count = 0
        self.names: list[str] = []
        """Node name of each row."""
        self._rows: dict[str, int] = {}
        self._nodes: list[NodeInfo] = []
        self._resource_rows: dict[str, int] = {r: i for i, r in enumerate(BASE_RESOURCES)}
        self.volumes = VolumeCatalog()
        """Claims, PersistentVolumes, StorageClasses, and the claims placed pods use."""
        cap, rows = self._capacity, len(BASE_RESOURCES)
        self._alloc = np.zeros((rows, cap), dtype=np.int64)
        self._requested = np.zeros((rows, cap), dtype=np.int64)
        self._free = np.zeros((rows, cap), dtype=np.int64)
        self._vectors: dict[str, NDArray[Any]] = {
            "ready": np.zeros(cap, dtype=np.bool_),
            "unschedulable": np.zeros(cap, dtype=np.bool_),
            "nonzero_cpu_m": np.zeros(cap),
            "nonzero_memory": np.zeros(cap),
            **{column: np.full(cap, no_signal_value(column)) for column in SIGNAL_COLUMNS},
            "recent_cpu_m": np.zeros(cap),
        }
        self.generation = 0
        """Changes whenever rows move or a node's constraint-relevant fields change."""
        self.signals_generation = 0
        """Changes whenever any node's signals change."""
        self.caches = TableCaches()
        """Scoped values (:meth:`cached`) and derived columns (:meth:`derived`)."""
        # the caches' own methods, bound here: plugins call them dozens of times a decision
        self.cached = self.caches.cached
        """:meth:`TableCaches.cached`: the plugins' values across decisions, in scopes
        named for what empties them."""
        self.derived = self.caches.derived
        """:meth:`TableCaches.derived`: a per-node column refreshed at the changed rows."""
        self._derived: dict[Hashable, object] = {}
        """Label and taint columns, rebuilt after a constraint change."""
        self._pods: dict[str, _PlacedPod] = {}
        self._unreadable_pods: dict[str, str] = {}
        """Placed pods (key → node) whose requests, ports, labels or terms do not parse."""
        self._pods_by_node: dict[str, dict[str, PodInfo]] = {}
        self._pods_by_label: dict[tuple[str, str], set[str]] = {}
        self._pods_by_namespace: dict[str, set[str]] = {}
        self._priorities: Counter[int] = Counter()
        """Placed pods per priority (tells at once whether a pod could preempt anyone)."""
        self.namespaces = NamespaceCatalog()
        """The Namespaces' labels (namespace selectors of pod affinity terms)."""
        self._match_counts = MatchCounts()
        self._lookups: dict[str, PlacedPodLookup] = {"volumes": self.volumes}
        """Lookups of placed pods registered by plugins (:meth:`lookup`), by name."""
        self._recent: dict[str, dict[str, tuple[float, int]]] = {}
        self._frame = SignalFrame.empty()
        self._signals_source: object = None
        self._frame_rows: tuple[object, int, NDArray[np.intp]] | None = None
        """(frame rows, generation, frame row of each table row or -1), reused while
        both stay the same."""
        self._refresh_views()

    # ---- nodes -------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def row_of(self, name: str) -> int | None:
        """Row of node ``name``, ``None`` when unknown."""
        return self._rows.get(name)

    def rows_of(self, names: Iterable[str]) -> NDArray[np.intp]:
        """Row of each node name, -1 for a name the table does not know (one dict lookup
        per name, with no Python call per name: extender requests carry thousands)."""
        return np.fromiter(map(self._rows.get, names, repeat(-1)), np.intp)

    def node(self, row: int) -> NodeInfo:
        return self._nodes[row]

    def upsert_node(self, node: NodeInfo) -> None:
        """Add a node or update it; pods already placed on it by name are counted."""
        row = self._rows.get(node.name)
        if row is None:
            row = self._append_row(node)
            for pod in self._pods_by_node.get(node.name, {}).values():
                self._account(row, pod, sign=1)
            self._apply_frame_row(row)
            self._bump_generation()
        else:
            previous = self._nodes[row]
            if not node.constraints_equal(previous):
                self._bump_generation()
            elif node.allocatable != previous.allocatable:
                self.caches.clear("allocatable")
                self.caches.note_load_change(row)
            self._nodes[row] = node
        self._vectors["ready"][row] = node.ready
        self._vectors["unschedulable"][row] = node.unschedulable
        self._alloc[:, row] = 0
        for resource, amount in node.allocatable.items():
            resource_row = self._ensure_resource(resource)  # may reallocate the matrices
            self._alloc[resource_row, row] = amount
        self._free[:, row] = self._alloc[:, row] - self._requested[:, row]

    def remove_node(self, name: str) -> None:
        """Drop a node's row; its pods stay known and count again if it comes back."""
        row = self._rows.pop(name, None)
        if row is None:
            return
        last = self._count - 1
        if row != last:
            moved = self.names[last]
            self.names[row] = moved
            self._nodes[row] = self._nodes[last]
            self._rows[moved] = row
            for matrix in (self._alloc, self._requested, self._free):
                matrix[:, row] = matrix[:, last]
            for vector in self._vectors.values():
                vector[row] = vector[last]
        self.names.pop()
        self._nodes.pop()
        self._count = last
        for matrix in (self._alloc, self._requested, self._free):
            matrix[:, last] = 0
        self._refresh_views()
        self._bump_generation()

    # ---- pods --------------------------------------------------------------------------

    def add_pod(self, pod: PodInfo, node: str, now: float) -> None:
        """Count a pod bound or assumed on ``node`` (re-adding the same pod replaces it).

        ``now`` stamps its load for the interference index until the node reports again.
        """
        previous = self._pods.get(pod.key)
        added_at: float | None = now
        if previous is not None:
            if previous.node == node:  # a confirmation keeps the original stamp, if any
                entry = self._recent.get(node, {}).get(pod.key)
                added_at = entry[0] if entry else None
            self.remove_pod(previous.pod)
        self._pods[pod.key] = _PlacedPod(pod, node)
        self._pods_by_node.setdefault(node, {})[pod.key] = pod
        for item in pod.labels.items():
            self._pods_by_label.setdefault(item, set()).add(pod.key)
        self._pods_by_namespace.setdefault(pod.namespace, set()).add(pod.key)
        self._priorities[pod.priority] += 1
        for lookup in self._lookups.values():
            lookup.add(pod, node)
        for resource in pod.requests:
            self._ensure_resource(resource)
        if added_at is not None and added_at > self._signals_updated_at(node):
            self._recent.setdefault(node, {})[pod.key] = (added_at, pod.requests.get(CPU, 0))
        row = self._rows.get(node)
        if row is not None:
            self._account(row, pod, sign=1)
            self._match_counts.update(pod, row, 1)

    def remove_pod(self, pod: PodInfo) -> None:
        """Forget a pod (deleted, finished, or an assumption that failed to bind)."""
        placed = self._pods.pop(pod.key, None)
        if placed is None:
            return
        pod, node = placed.pod, placed.node
        on_node = self._pods_by_node[node]
        del on_node[pod.key]
        if not on_node:
            del self._pods_by_node[node]
        for item in pod.labels.items():
            discard(self._pods_by_label, item, pod.key)
        discard(self._pods_by_namespace, pod.namespace, pod.key)
        self._priorities[pod.priority] -= 1
        if not self._priorities[pod.priority]:
            del self._priorities[pod.priority]
        for lookup in self._lookups.values():
            lookup.remove(pod, node)
        recent = self._recent.get(node)
        if recent is not None:
            recent.pop(pod.key, None)
            if not recent:
                del self._recent[node]
        row = self._rows.get(node)
        if row is not None:
            self._account(row, pod, sign=-1)
            self._match_counts.update(pod, row, -1)

    def node_of(self, key: str) -> str | None:
        """The node pod ``key`` is placed on, ``None`` when it is not placed."""
        placed = self._pods.get(key)
        return None if placed is None else placed.node

    def load_stamp(self, key: str) -> float:
        """When pod ``key``'s load was stamped on its node for the interference index
        (``-inf`` when it is not: the node reported since): :meth:`add_pod` with this
        ``now`` after a :meth:`remove_pod` puts the pod back as it was."""
        placed = self._pods.get(key)
        entry = None if placed is None else self._recent.get(placed.node, {}).get(key)
        return -float("inf") if entry is None else entry[0]

    def shift_load(self, loads: Mapping[int, Mapping[str, int]], sign: int) -> None:
        """Stop counting (``sign`` -1) or count again (+1) pods in the resource columns
        only: ``loads`` maps a node row to what those pods of it request together
        (``pods``: how many). The preemption dry run's light way to take pods away and put
        them back, for a pod whose filters read nothing else of the placed pods
        (scheduler.cycle.preemption). The caller puts back exactly what it took."""
        rows = self._resource_rows
        resource_rows: list[int] = []
        node_rows: list[int] = []
        amounts: list[int] = []
        for row, load in loads.items():
            self.caches.note_load_change(row)
            for resource, amount in load.items():
                resource_rows.append(rows[resource])
                node_rows.append(row)
                amounts.append(sign * amount)
        at = (np.array(resource_rows, dtype=np.intp), np.array(node_rows, dtype=np.intp))
        change = np.array(amounts, dtype=np.int64)
        np.add.at(self._requested, at, change)
        np.subtract.at(self._free, at, change)

    def pods_on_node(self, name: str) -> Mapping[str, PodInfo]:
        """Pods placed on node ``name`` by key (read only)."""
        return self._pods_by_node.get(name, {})

    def lowest_priority(self) -> int | None:
        """The lowest priority of any placed pod, ``None`` without pods."""
        return min(self._priorities) if self._priorities else None

    def matching_per_node(
        self, term: AntiAffinityTerm, skip_terminating: bool = False
    ) -> NDArray[np.int64]:
        """Per node row, the placed pods ``term`` matches (without terminating ones when
        ``skip_terminating``). Kept current as pods come and go, rebuilt after a layout
        change; callers must not modify it. A namespace selector must have been resolved
        into ``term.namespaces`` (:meth:`NamespaceCatalog.matching`)."""
        if term.namespace_selector is not None:
            raise ValueError("matching_per_node needs a term with its namespaces resolved")
        key = (term, skip_terminating)
        counts = self._match_counts.get(key)
        if counts is None:
            counts = np.zeros(self._count, dtype=np.int64)
            for pod in self.pods_matching(term):
                row = self._rows.get(self._pods[pod.key].node)
                if row is not None and not (skip_terminating and pod.terminating):
                    counts[row] += 1
            self._match_counts.put(key, counts)
        return counts

    def hold_unreadable_pod(self, key: str, node: str) -> None:
        """A pod placed on ``node`` that does not parse: what it holds there is unknown,
        so the node takes no pod until it is readable again or gone (fail closed)."""
        if self._unreadable_pods.get(key) != node:
            self._unreadable_pods[key] = node
            self._bump_generation()

    def release_unreadable_pod(self, key: str) -> bool:
        """The pod parses again, finished or was deleted; True when it was held."""
        if self._unreadable_pods.pop(key, None) is None:
            return False
        self._bump_generation()
        return True

    def unreadable_pod_keys(self) -> Collection[str]:
        """Keys of the placed pods held as unreadable (read only)."""
        return self._unreadable_pods.keys()

    def holds_unreadable_pod(self) -> NDArray[np.bool_]:
        """Nodes holding a pod that does not parse (cached until the next change)."""
        return self.cached("constraints", "unreadable pods", self._find_unreadable_pods)

    def _find_unreadable_pods(self) -> NDArray[np.bool_]:
        mask = np.zeros(self._count, dtype=np.bool_)
        rows = [self._rows.get(node) for node in self._unreadable_pods.values()]
        mask[[row for row in rows if row is not None]] = True
        mask.setflags(write=False)
        return mask

    def set_signals(self, signals: SignalFrame | Mapping[str, NodeSignals]) -> None:
        """Replace all signals with a frame (nodes absent from it have none).

        A frame (or mapping) must not change after it is passed. Passing the same object
        again is free; a new frame costs a few numpy passes over the table's rows, whatever
        how many nodes changed, and only rows whose values changed count as changed. A
        mapping of :class:`NodeSignals` is turned into a frame first through each node's
        scheduling record, as the Redis follower reads it, with the default index
        references (:func:`scheduler.signals.records.frame_of_signals`; one Python pass per
        node: tests and small in-memory sources).
        """
        if signals is self._signals_source:
            return
        self._signals_source = signals
        frame = signals if isinstance(signals, SignalFrame) else frame_of_signals(signals)
        self._frame = frame
        n = self._count
        source = self._frame_rows_of(frame)
        has = source >= 0
        taken = np.maximum(source, 0)
        changed = np.zeros(n, np.bool_)
        for column in SIGNAL_COLUMNS:
            default = no_signal_value(column)
            values = (
                np.where(has, frame.columns[column][taken], default)
                if len(frame)
                else np.full(n, default)
            )
            target = self._vectors[column]
            changed |= values != target[:n]
            target[:n] = values
        rows = np.flatnonzero(changed)
        if len(rows) == 0:
            return
        if len(rows) > CHANGED_ROWS_LIMIT:
            self.caches.note_load_change(None)
        else:
            for changed_row in rows.tolist():
                self.caches.note_load_change(changed_row)
        for name in [name for name in self._recent if name in self._rows]:
            if changed[self._rows[name]]:
                self._forget_recent(self._rows[name], name)
        self.signals_generation += 1
        self.caches.clear("signals")

    def node_label(self, row: int, key: str) -> str | None:
        """Label ``key`` of the node at ``row`` (the Node's own labels only)."""
        return self._nodes[row].labels.get(key)

    def gpu_model_known(self) -> NDArray[np.bool_]:
        """Nodes with a GPU model (``nvidia.com/gpu.product``, labelled or reported)."""
        present: NDArray[np.bool_] = self.label_column(GPU_PRODUCT_LABEL).codes != ABSENT
        return present

    # ---- columns for filters and scores ------------------------------------------------

    def resource_row(self, resource: str) -> int | None:
        """Row of ``resource`` in :attr:`alloc`/:attr:`requested`/:attr:`free`, if known."""
        return self._resource_rows.get(resource)

    @property
    def load_generation(self) -> int:
        """Changes whenever a node's requests, signals or allocatable change."""
        return self.caches.load_generation

    def everyone(self) -> NDArray[np.bool_]:
        """A read-only all-True node mask (cached)."""
        return self.cached("constraints", "everyone", self._all_true)

    def _all_true(self) -> NDArray[np.bool_]:
        mask = np.ones(self._count, dtype=np.bool_)
        mask.setflags(write=False)
        return mask

    def inverse_allocatable(self, resource: str) -> NDArray[np.float64]:
        """``1 / allocatable`` per node for ``resource`` (0 where it has none), cached."""
        return self.cached("allocatable", ("inverse", resource), self._inverse, resource)

    def _inverse(self, resource: str) -> NDArray[np.float64]:
        row = self._resource_rows.get(resource)
        capacity = np.zeros(self._count) if row is None else self.alloc[row].astype(np.float64)
        inverse: NDArray[np.float64] = np.divide(
            1.0, capacity, out=np.zeros(self._count), where=capacity > 0
        )
        return inverse

    def label_column(self, key: str, field: bool = False) -> LabelColumn:
        """:func:`~scheduler.signals.node_columns.label_column` of this table's nodes (cached)."""
        cache_key = ("field" if field else "label", key)
        cached = self._derived.get(cache_key)
        if isinstance(cached, LabelColumn):
            return cached
        # a key no node carries (a pod may name thousands) costs no pass over the nodes
        # and no cache entry, so the cache holds only the keys the nodes bring
        carried = key == "metadata.name" if field else key in self._label_keys()
        if not carried:
            return LabelColumn(np.full(len(self._nodes), ABSENT, dtype=np.int32), ())
        column = label_column(self._nodes, key, field)
        self._derived[cache_key] = column
        return column

    def _label_keys(self) -> frozenset[str]:
        """Every label key some node carries (cached until a constraint change)."""
        cached = self._derived.get("label_keys")
        if isinstance(cached, frozenset):
            return cached
        keys = frozenset(key for node in self._nodes for key in node.labels)
        self._derived["label_keys"] = keys
        return keys

    def taint_columns(self) -> TaintColumns:
        """:func:`~scheduler.signals.node_columns.taint_columns` of this table's nodes (cached)."""
        cached = self._derived.get("taints")
        if isinstance(cached, TaintColumns):
            return cached
        columns = taint_columns(self._nodes)
        self._derived["taints"] = columns
        return columns

    def pods_matching(self, term: AntiAffinityTerm) -> Iterable[PodInfo]:
        """Placed pods that fall under ``term`` (label lookups first, then a full check)."""
        candidates = positive_candidates(term.selector, self._pods_by_label)
        if candidates is None:
            if term.namespaces is None:
                candidates = set(self._pods)
            else:
                candidates = set().union(
                    *(self._pods_by_namespace.get(ns, set()) for ns in term.namespaces)
                )
        for key in candidates:
            pod = self._pods[key].pod
            if term.matches(pod.namespace, pod.labels):
                yield pod

    def lookup(self, name: str, build: Callable[[], LookupT]) -> LookupT:
        """The placed-pod lookup registered under ``name`` (a plugin's name), built by
        ``build()`` and filled with every placed pod the first time it is asked for; from
        then on the table calls its :meth:`PlacedPodLookup.add` and
        :meth:`~PlacedPodLookup.remove` as pods are placed and removed."""
        found = self._lookups.get(name)
        if found is None:
            found = build()
            for placed in self._pods.values():
                found.add(placed.pod, placed.node)
            self._lookups[name] = found
        return cast(LookupT, found)

    # ---- internals ---------------------------------------------------------------------

    def _append_row(self, node: NodeInfo) -> int:
        if self._count == self._capacity:
            self._grow(self._capacity * 2)
        row = self._count
        self._count += 1
        self.names.append(node.name)
        self._nodes.append(node)
        self._rows[node.name] = row
        for name, vector in self._vectors.items():
            vector[row] = -np.inf if name in ("signals_at", "fresh_until") else 0
        self._refresh_views()
        return row

    def _grow(self, capacity: int) -> None:
        def widen(array: NDArray[Any]) -> NDArray[Any]:
            shape = (*array.shape[:-1], capacity)
            grown = np.zeros(shape, dtype=array.dtype)
            grown[..., : self._capacity] = array
            return grown

        self._alloc, self._requested, self._free = (
            widen(self._alloc),
            widen(self._requested),
            widen(self._free),
        )
        self._vectors = {name: widen(v) for name, v in self._vectors.items()}
        self._capacity = capacity

    def _ensure_resource(self, resource: str) -> int:
        row = self._resource_rows.get(resource)
        if row is None:
            row = len(self._resource_rows)
            self._resource_rows[resource] = row
            extra = np.zeros((1, self._capacity), dtype=np.int64)
            self._alloc = np.vstack([self._alloc, extra])
            self._requested = np.vstack([self._requested, extra])
            self._free = np.vstack([self._free, extra])
            self._refresh_views()
        return row

    def _account(self, row: int, pod: PodInfo, sign: int) -> None:
        self.caches.note_load_change(row)
        for resource, amount in pod.requests.items():
            r = self._resource_rows[resource]
            self._requested[r, row] += sign * amount
            self._free[r, row] -= sign * amount
        pods_row = self._resource_rows[PODS]
        self._requested[pods_row, row] += sign
        self._free[pods_row, row] -= sign
        self._vectors["nonzero_cpu_m"][row] += sign * pod.nonzero_cpu_m
        self._vectors["nonzero_memory"][row] += sign * pod.nonzero_memory
        self._set_recent_cpu(row, self.names[row])

    def _frame_rows_of(self, frame: SignalFrame) -> NDArray[np.intp]:
        """Frame row of each table row (-1 where the frame lacks the node)."""
        cached = self._frame_rows
        if cached is not None and cached[0] is frame.rows and cached[1] == self.generation:
            return cached[2]
        rows = np.fromiter(map(frame.rows.get, self.names, repeat(-1)), np.intp, self._count)
        self._frame_rows = (frame.rows, self.generation, rows)
        return rows

    def _signals_updated_at(self, name: str) -> float:
        """Unix time of ``name``'s record in the latest frame; -inf without one."""
        row = self._rows.get(name)
        if row is not None:
            return float(self._vectors["signals_at"][row])
        frame_row = self._frame.row(name)
        return -np.inf if frame_row is None else float(self._frame.columns["signals_at"][frame_row])

    def _apply_frame_row(self, row: int) -> None:
        """Copy the latest frame's values of the node at ``row`` (a node just added)."""
        self.caches.note_load_change(row)
        name = self.names[row]
        frame_row = self._frame.row(name)
        for column in SIGNAL_COLUMNS:
            self._vectors[column][row] = (
                no_signal_value(column)
                if frame_row is None
                else self._frame.columns[column][frame_row]
            )
        self._forget_recent(row, name)

    def _forget_recent(self, row: int, name: str) -> None:
        """Drop the node's placements its latest record already measured."""
        updated_at = self._vectors["signals_at"][row]
        recent = self._recent.get(name, {})
        for key in [k for k, (at, _) in recent.items() if at <= updated_at]:
            del recent[key]
        self._set_recent_cpu(row, name)

    def _set_recent_cpu(self, row: int, name: str) -> None:
        self._vectors["recent_cpu_m"][row] = sum(
            cpu for _, cpu in self._recent.get(name, {}).values()
        )

    def _bump_generation(self) -> None:
        self.generation += 1
        self.caches.clear_all()
        self._derived.clear()
        self._match_counts.clear()

    def _refresh_views(self) -> None:
        """Point the public columns at the live rows (views share memory with storage)."""
        n = self._count
        self.alloc: NDArray[np.int64] = self._alloc[:, :n]
        """Allocatable per resource row × node."""
        self.requested: NDArray[np.int64] = self._requested[:, :n]
        self.free: NDArray[np.int64] = self._free[:, :n]
        v = self._vectors
        self.ready: NDArray[np.bool_] = v["ready"][:n]
        self.unschedulable: NDArray[np.bool_] = v["unschedulable"][:n]
        self.nonzero_cpu_m: NDArray[np.float64] = v["nonzero_cpu_m"][:n]
        """CPU requested per node as counted for scoring (100m per container without one)."""
        self.nonzero_memory: NDArray[np.float64] = v["nonzero_memory"][:n]
        self.signals_at: NDArray[np.float64] = v["signals_at"][:n]
        """Unix time of each node's report; ``-inf`` without one."""
        self.fresh_until: NDArray[np.float64] = v["fresh_until"][:n]
        """Unix time until which each node's report is usable
        (:func:`interference.freshness.fresh_until`); ``-inf`` without a report or when
        it lacks a core signal family (degraded counts as stale)."""
        self.windows: dict[str, WindowColumns] = {
            window: WindowColumns(
                **{part: v[window_column(window, part)][:n] for part in WINDOW_PARTS}
            )
            for window in SIGNAL_WINDOWS
        }
        """Signal columns per window (:data:`SIGNAL_WINDOWS`)."""
        self.node_signals: dict[str, NDArray[np.float64]] = {
            part: v[part][:n] for part in NODE_PARTS
        }
        """The signal columns kept once per node, by their declared name
        (:data:`scheduler.signals.frame.COLUMNS`): ``signals_at``, ``fresh_until`` and the
        record's node signals (``psi_mem_some_avg10``)."""
        latest = self.windows[LATEST_WINDOW]
        self.runq_p99_us: NDArray[np.float64] = latest.runq_p99_us
        self.reclaim_stall_ms_per_s: NDArray[np.float64] = latest.reclaim_mean
        self.interference_index: NDArray[np.float64] = latest.index_mean
        """The interference index of the latest interval (0 = quiet)."""
        self.recent_cpu_m: NDArray[np.float64] = v["recent_cpu_m"][:n]
        """CPU requested by pods added since each node's last report, millicores."""
