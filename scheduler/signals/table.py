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

Every column moves together when a row moves (a removed node's row takes the last one),
so the row layout is this one class. What is not kept by row lives beside it: the placed
pods by key, node, label and priority with the plugins' lookups
(:mod:`scheduler.signals.placed_pods`), the label and taint columns' cache
(:mod:`scheduler.signals.node_columns`), the scoped caches (:mod:`scheduler.signals.table_caches`),
the namespaces and the volume objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from itertools import repeat
from typing import Any

import numpy as np
from numpy.typing import NDArray

from scheduler.api.namespaces import NamespaceCatalog
from scheduler.api.objects import (
    GPU_PRODUCT_LABEL,
    AntiAffinityTerm,
    NodeInfo,
    PodInfo,
)
from scheduler.api.quantity import CPU
from scheduler.api.term_lookup import MatchCounts
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
from scheduler.signals.node_columns import ABSENT, NodeColumnCache, WindowColumns
from scheduler.signals.placed_pods import PlacedPods
from scheduler.signals.records import frame_of_signals
from scheduler.signals.resource_columns import ResourceColumns, widened
from scheduler.signals.table_caches import CHANGED_ROWS_LIMIT, TableCaches

if tuple(f.name for f in fields(WindowColumns)) != WINDOW_PARTS:  # pragma: no cover
    raise ImportError("WindowColumns' fields are not scheduler.signals.frame.WINDOW_PARTS")


class NodeTable:
    """Nodes, the pods placed on them and their latest signals, as numpy columns."""

    def __init__(self, capacity: int = 64) -> None:
        self._capacity = max(1, capacity)
        self._count = 0
        self.names: list[str] = []
        """Node name of each row."""
        self._rows: dict[str, int] = {}
        self._nodes: list[NodeInfo] = []
        self.volumes = VolumeCatalog()
        """Claims, PersistentVolumes, StorageClasses, and the claims placed pods use."""
        cap = self._capacity
        self._resources = ResourceColumns(cap)
        """Allocatable, requested and free per resource × node (the public views:
        :attr:`alloc`, :attr:`requested`, :attr:`free`)."""
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
        self._node_columns = NodeColumnCache(self._nodes)
        """Label and taint columns, rebuilt after a constraint change."""
        self.label_column = self._node_columns.label_column
        """:meth:`NodeColumnCache.label_column` of this table's nodes (cached)."""
        self.taint_columns = self._node_columns.taint_columns
        """:meth:`NodeColumnCache.taint_columns` of this table's nodes (cached)."""
        self._placed = PlacedPods({"volumes": self.volumes})
        self.node_of = self._placed.node_of
        """:meth:`PlacedPods.node_of`: the node a pod is placed on."""
        self.pods_on_node = self._placed.on_node
        """:meth:`PlacedPods.on_node`: the pods placed on a node, by key (read only)."""
        self.lowest_priority = self._placed.lowest_priority
        """:meth:`PlacedPods.lowest_priority`: of any placed pod, ``None`` without pods."""
        self.pods_matching = self._placed.matching
        """:meth:`PlacedPods.matching`: the placed pods an affinity term matches."""
        self.lookup = self._placed.lookup
        """:meth:`PlacedPods.lookup`: a plugin's lookup of the placed pods, kept current as
        pods are placed and removed."""
        self.unreadable_pod_keys = self._placed.unreadable_keys
        """:meth:`PlacedPods.unreadable_keys`: the placed pods held as unreadable."""
        self.namespaces = NamespaceCatalog()
        """The Namespaces' labels (namespace selectors of pod affinity terms)."""
        self._match_counts = MatchCounts()
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
            for pod in self._placed.on_node(node.name).values():
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
        if self._resources.set_allocatable(row, node.allocatable):
            self._refresh_views()

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
            self._resources.move_row(row, last)
            for vector in self._vectors.values():
                vector[row] = vector[last]
        self.names.pop()
        self._nodes.pop()
        self._count = last
        self._resources.clear_row(last)
        self._refresh_views()
        self._bump_generation()

    # ---- pods --------------------------------------------------------------------------

    def add_pod(self, pod: PodInfo, node: str, now: float) -> None:
        """Count a pod bound or assumed on ``node`` (re-adding the same pod replaces it).

        ``now`` stamps its load for the interference index until the node reports again.
        """
        previous = self._placed.get(pod.key)
        added_at: float | None = now
        if previous is not None:
            if previous.node == node:  # a confirmation keeps the original stamp, if any
                entry = self._recent.get(node, {}).get(pod.key)
                added_at = entry[0] if entry else None
            self.remove_pod(previous.pod)
        self._placed.add(pod, node)
        added = [resource for resource in pod.requests if self._resources.ensure(resource)]
        if added:  # the resource matrices were reallocated
            self._refresh_views()
        if added_at is not None and added_at > self._signals_updated_at(node):
            self._recent.setdefault(node, {})[pod.key] = (added_at, pod.requests.get(CPU, 0))
        row = self._rows.get(node)
        if row is not None:
            self._account(row, pod, sign=1)
            self._match_counts.update(pod, row, 1)

    def remove_pod(self, pod: PodInfo) -> None:
        """Forget a pod (deleted, finished, or an assumption that failed to bind)."""
        placed = self._placed.remove(pod.key)
        if placed is None:
            return
        pod, node = placed.pod, placed.node
        recent = self._recent.get(node)
        if recent is not None:
            recent.pop(pod.key, None)
            if not recent:
                del self._recent[node]
        row = self._rows.get(node)
        if row is not None:
            self._account(row, pod, sign=-1)
            self._match_counts.update(pod, row, -1)

    def load_stamp(self, key: str) -> float:
        """When pod ``key``'s load was stamped on its node for the interference index
        (``-inf`` when it is not: the node reported since): :meth:`add_pod` with this
        ``now`` after a :meth:`remove_pod` puts the pod back as it was."""
        placed = self._placed.get(key)
        entry = None if placed is None else self._recent.get(placed.node, {}).get(key)
        return -float("inf") if entry is None else entry[0]

    def shift_load(self, loads: Mapping[int, Mapping[str, int]], sign: int) -> None:
        """Stop counting (``sign`` -1) or count again (+1) pods in the resource columns
        only: ``loads`` maps a node row to what those pods of it request together
        (``pods``: how many). The preemption dry run's light way to take pods away and put
        them back, for a pod whose filters read nothing else of the placed pods
        (scheduler.cycle.preemption). The caller puts back exactly what it took."""
        for row in loads:
            self.caches.note_load_change(row)
        self._resources.shift(loads, sign)

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
                row = self._rows.get(self._placed.node_of(pod.key) or "")
                if row is not None and not (skip_terminating and pod.terminating):
                    counts[row] += 1
            self._match_counts.put(key, counts)
        return counts

    def hold_unreadable_pod(self, key: str, node: str) -> None:
        """A pod placed on ``node`` that does not parse: what it holds there is unknown,
        so the node takes no pod until it is readable again or gone (fail closed)."""
        if self._placed.hold_unreadable(key, node):
            self._bump_generation()

    def release_unreadable_pod(self, key: str) -> bool:
        """The pod parses again, finished or was deleted; True when it was held."""
        if not self._placed.release_unreadable(key):
            return False
        self._bump_generation()
        return True

    def holds_unreadable_pod(self) -> NDArray[np.bool_]:
        """Nodes holding a pod that does not parse (cached until the next change)."""
        return self.cached("constraints", "unreadable pods", self._find_unreadable_pods)

    def _find_unreadable_pods(self) -> NDArray[np.bool_]:
        mask = np.zeros(self._count, dtype=np.bool_)
        rows = [self._rows.get(node) for node in self._placed.unreadable_nodes()]
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
        return self._resources.row(resource)

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
        row = self._resources.row(resource)
        capacity = np.zeros(self._count) if row is None else self.alloc[row].astype(np.float64)
        inverse: NDArray[np.float64] = np.divide(
            1.0, capacity, out=np.zeros(self._count), where=capacity > 0
        )
        return inverse

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
        self._resources.grow(capacity)
        self._vectors = {name: widened(v, capacity) for name, v in self._vectors.items()}
        self._capacity = capacity

    def _account(self, row: int, pod: PodInfo, sign: int) -> None:
        self.caches.note_load_change(row)
        self._resources.account(row, pod.requests, sign)
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
        self._node_columns.clear()
        self._match_counts.clear()

    def _refresh_views(self) -> None:
        """Point the public columns at the live rows (views share memory with storage)."""
        n = self._count
        alloc, requested, free = self._resources.views(n)
        self.alloc: NDArray[np.int64] = alloc
        """Allocatable per resource row × node."""
        self.requested: NDArray[np.int64] = requested
        self.free: NDArray[np.int64] = free
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
