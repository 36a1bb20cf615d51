"""The scheduler's view of the cluster, fed by the informers (docs/design.md §5).

:class:`ClusterCache` implements :class:`scheduler.cycle.ports.ClusterHandler`. It parses
every node and pod (a malformed object is logged, counted and skipped — it never stops
the informer), keeps the :class:`~scheduler.signals.table.NodeTable` the cycle reads, and the
set of **pending** pods: ``spec.schedulerName`` is ours, no ``spec.nodeName``, not
terminating, no scheduling gates, not in an ignored namespace.

A pod occupies a node in the table while it is bound there and not finished
(``Succeeded``/``Failed``), or while it is **assumed**: the scheduler picked the node and
the bind is in flight. An assumed pod is confirmed when the watch shows it bound and
forgotten when the bind fails.

In extender mode kube-scheduler binds, and its bind can reach our watch right behind the
pod's creation: :meth:`ClusterCache.vouches_for` answers for a pod pending here *or*
bound a moment after our watch saw it pending (:mod:`scheduler.cycle.recent_binds`), so
the extender's decision records and Events do not depend on which of the two events a
poll happens to fall between.

A pod of ours that does not parse (a malformed field, or one this scheduler cannot read,
such as a ``Gt`` toleration from an alpha feature gate) is not skipped silently: it
leaves the pending set and is kept in :meth:`ClusterCache.take_unparseable` until the loop
reports it (a ``Warning`` Event and ``PodScheduled=False`` with the parse error). Every
change of the pod parses it again, so a fixed pod is scheduled and a still-broken one is
reported again.

The cache tells the queue about pending pods and, as cluster events
(:class:`scheduler.api.events.ClusterEvent`), about changes that may make unschedulable pods
fit: a node added, deleted or changed in a
field the filters read (labels, taints or cordon, readiness, allocatable); a pod placed,
relabelled, scaled down, deleted or finished; a Namespace, PersistentVolumeClaim,
PersistentVolume, StorageClass or CSINode added, changed or deleted. The queue retries a
pod early only on the events of the plugins that rejected it; a relist, which the cache
cannot classify, retries every pod.

Nodes and pods are kept here; namespaces, volume objects and disruption budgets, which
take no row, in :mod:`scheduler.cycle.stored_objects`; what is read of a raw object
before and beside its parse, in :mod:`scheduler.cycle.informed_objects`.

Thread-safety: the informer thread calls :meth:`replace`/:meth:`apply`, the scheduling
thread reads the table and assumes, binder threads forget; all hold :attr:`lock`. The
scheduling thread holds it across one scheduling cycle and the assume, so the table
never changes under a decision.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Collection
from typing import TypeVar

from scheduler.api.budgets import DisruptionBudgetInfo
from scheduler.api.events import Action, ClusterEvent
from scheduler.api.nodes import parse_node
from scheduler.api.objects import NodeInfo, PodInfo
from scheduler.api.reader import ObjectError
from scheduler.cycle.informed_objects import (
    PodState,
    UnparseablePod,
    chosen,
    chosen_raw,
    object_key,
    parse_pod_state,
    placed_on,
    unparseable_pod,
)
from scheduler.cycle.listed_heap import freeze_listed_heap
from scheduler.cycle.nominated import RoomHolds
from scheduler.cycle.ports import INFORMED_KINDS, EventType, K8sObject, ObjectKind
from scheduler.cycle.queue import SchedulingQueue
from scheduler.cycle.recent_binds import RecentBinds
from scheduler.cycle.stored_objects import STORED_KINDS, StoredObjects
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.signals.table import NodeTable

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class ClusterCache:
    """Nodes, placed pods and pending pods, kept consistent with the informer stream."""

    def __init__(
        self,
        table: NodeTable,
        queue: SchedulingQueue,
        metrics: SchedulerMetrics,
        scheduler_name: str,
        ignore_namespaces: Collection[str] = (),
        clock: Callable[[], float] = time.time,
        freeze_after_list: bool = True,
    ) -> None:
        self.lock = threading.RLock()
        """Held while reading or changing the table (see the module docstring)."""
        self.table = table
        self._queue = queue
        self._metrics = metrics
        self._scheduler_name = scheduler_name
        self._ignore_namespaces = frozenset(ignore_namespaces)
        self._clock = clock
        self._freeze_after_list = freeze_after_list
        self._nodes: dict[str, NodeInfo] = {}
        self._placed: dict[str, PodInfo] = {}
        """Pods counted in the table by key; ``node_name`` is where (the assumed node for
        assumed pods)."""
        self._assumed: dict[str, str] = {}
        """Assumed pod key → node, until the watch confirms the bind."""
        self._unbound: dict[str, PodInfo] = {}
        """Every live pod without ``spec.nodeName``, whoever schedules it."""
        self._pending: dict[str, PodInfo] = {}
        """The unbound pods this scheduler should place (and has not assumed)."""
        self._bound_from_pending = RecentBinds(clock)
        """Pods that left the pending set by a bind (see :meth:`vouches_for`)."""
        self._synced: set[ObjectKind] = set()
        self._stored = StoredObjects(table, self._parse)
        self.holds = RoomHolds()
        """Room held for pods of ours nominated to a node (``status.nominatedNodeName``,
        or the loop's nomination before the API server has it)."""
        self._nominated: dict[str, str] = {}
        """Pod key → the ``status.nominatedNodeName`` last seen (only non-empty ones)."""
        self._placed_status: dict[str, tuple[float, bool]] = {}
        """Placed pod key → (``status.startTime`` as Unix time, ``inf`` when absent;
        terminating by preemption), for preemption (:meth:`start_time`)."""
        self._unparseable: dict[str, UnparseablePod] = {}
        """Pods of ours whose latest version does not parse, by key."""
        self._unreported: dict[str, UnparseablePod] = {}
        """Of those, the versions the loop has not reported yet."""

    # ---- settings --------------------------------------------------------------------

    def configure(self, scheduler_name: str, ignore_namespaces: Collection[str]) -> None:
        """Apply reloaded settings; unbound pods that change sides join or leave the queue."""
        with self.lock:
            self._scheduler_name = scheduler_name
            self._ignore_namespaces = frozenset(ignore_namespaces)
            for pod in list(self._unbound.values()):
                self._track_unbound(pod)

    # ---- ClusterHandler --------------------------------------------------------------

    def replace(self, kind: ObjectKind, objects: list[K8sObject]) -> None:
        """A full (re)list: objects missing from it are deleted."""
        with self.lock:
            if kind in STORED_KINDS:
                self._stored.replace(kind, objects)
            elif kind == "Node":
                nodes = {n.name: n for n in self._parse_each(objects, parse_node, kind)}
                for name in list(self._nodes):
                    if name not in nodes:
                        self._delete_node(name)
                for node in nodes.values():
                    self._upsert_node(node)
            else:
                held_before = set(self.table.unreadable_pod_keys())
                pods = {p.pod.key: p for p in self._parse_each(objects, parse_pod_state, kind)}
                listed = {object_key(kind, obj) for obj in objects}
                for key in held_before:  # parses now, or gone from the list
                    if key in pods or key not in listed:
                        self.table.release_unreadable_pod(key)
                for key in [k for k in self._unparseable if k not in listed or k in pods]:
                    self._forget_unparseable(key)
                known = self._placed.keys() | self._unbound.keys() | self._assumed.keys()
                for key in known - pods.keys():
                    self._delete_pod(key)
                for state in pods.values():
                    self._upsert_pod(state)
            self._synced.add(kind)
            self._queue.cluster_event(None)
            if self._freeze_after_list and self.synced():
                freeze_listed_heap()

    def apply(self, kind: ObjectKind, event: EventType, obj: K8sObject) -> None:
        """One watch event."""
        with self.lock:
            if event == "DELETED":
                # Only the name matters, so even an object that no longer parses is
                # removed (its last good version must not stay counted).
                key = object_key(kind, obj)
                if key is None:
                    self._metrics.malformed_objects.labels(kind).inc()
                    log.warning("skipping a %s deletion without metadata.name: %.200r", kind, obj)
                elif kind == "Node":
                    deleted = self._nodes.get(key)
                    if deleted is not None:
                        self._delete_node(key)
                        self._queue.cluster_event(ClusterEvent("Node", Action.DELETE, deleted))
                elif kind in STORED_KINDS:
                    if self._stored.delete(kind, key):
                        self._queue.cluster_event(ClusterEvent(kind, Action.DELETE))
                else:
                    self._forget_unparseable(key)
                    released = self.table.release_unreadable_pod(key)
                    placed = self._placed.get(key)
                    if self._delete_pod(key) or released:
                        self._queue.cluster_event(ClusterEvent("Pod", Action.DELETE, pod=placed))
                return
            if kind == "Node":
                node = self._parse(obj, parse_node, kind)
                if node is not None:
                    action = self._upsert_node(node)
                    if action:
                        self._queue.cluster_event(ClusterEvent("Node", action, node))
                return
            if kind in STORED_KINDS:
                if self._stored.upsert(kind, obj):
                    self._queue.cluster_event(ClusterEvent(kind, Action.ADD | Action.UPDATE))
                return
            state = self._parse(obj, parse_pod_state, kind)
            if state is not None:
                self._forget_unparseable(state.pod.key)
                released = self.table.release_unreadable_pod(state.pod.key)
                action = self._upsert_pod(state)
                if released:
                    action |= Action.UPDATE
                if action:
                    self._queue.cluster_event(ClusterEvent("Pod", action, pod=state.pod))

    # ---- used by the scheduling loop and the binder ------------------------------------

    def synced(self) -> bool:
        """True once every informed kind has been listed."""
        with self.lock:
            return self._synced >= set(INFORMED_KINDS)

    def start_time(self, pod: PodInfo) -> float:
        """When a placed pod started (``status.startTime``; ``inf`` when it has not, as
        kube counts such a pod as started now)."""
        found = self._placed_status.get(pod.key)
        return math.inf if found is None else found[0]

    def preempted(self, pod: PodInfo) -> bool:
        """Whether a placed pod terminates by preemption (deleting, with the
        ``DisruptionTarget`` condition a scheduler sets)."""
        found = self._placed_status.get(pod.key)
        return found is not None and found[1]

    def disruption_budgets(self) -> list[DisruptionBudgetInfo]:
        """The PodDisruptionBudgets listed so far (:data:`~scheduler.cycle.ports.PREEMPTION_KINDS`:
        none from an adapter that does not list them)."""
        with self.lock:
            return self._stored.budgets()

    def pending_pod(self, key: str) -> PodInfo | None:
        """The latest object of a pending pod, or None when it is no longer pending."""
        with self.lock:
            return self._pending.get(key)

    def vouches_for(self, key: str, uid: str) -> bool:
        """The informers have the pod ``key`` with this UID pending here, or had it pending
        until they saw it bound a moment ago (:class:`RecentBinds`). A pod our watch
        first delivered bound, another pod of that name, or one of another scheduler is
        not vouched for."""
        if not uid:
            return False
        with self.lock:
            pending = self._pending.get(key)
            if pending is not None:
                return pending.uid == uid
            return self._bound_from_pending.bound_lately(key, uid)

    def take_unparseable(self) -> list[UnparseablePod]:
        """Pods of ours that do not parse and were not reported yet (each version once)."""
        with self.lock:
            found = list(self._unreported.values())
            self._unreported.clear()
            return found

    def assume(self, pod: PodInfo, node: str) -> None:
        """Count the pod on ``node`` now, before the bind is confirmed."""
        with self.lock:
            self._pending.pop(pod.key, None)
            self._drop_nomination(pod.key)
            self._place(pod, node)
            self._assumed[pod.key] = node

    def forget(self, key: str) -> PodInfo | None:
        """Undo :meth:`assume` after a bind that did not happen.

        Returns the pod when it is pending again (the caller decides when to retry it);
        None when it is gone, bound meanwhile, or no longer ours.
        """
        with self.lock:
            if self._assumed.pop(key, None) is not None:
                self._unplace(key)
                pod = self._unbound.get(key)
                if pod is not None:
                    self._track_unbound(pod, enqueue=False)
            return self._pending.get(key)

    def assumed_node(self, key: str) -> str | None:
        """Where the pod is assumed, or None when it is not (or no longer) assumed."""
        with self.lock:
            return self._assumed.get(key)

    def placed_node(self, key: str) -> str | None:
        """The node the table counts the pod on (bound or assumed), or None."""
        with self.lock:
            pod = self._placed.get(key)
            return None if pod is None else pod.node_name

    def node_names(self) -> list[str]:
        """Every node in the cache."""
        with self.lock:
            return list(self._nodes)

    # ---- internals (caller holds the lock) ---------------------------------------------

    def _parse_each(
        self, objects: list[K8sObject], parse: Callable[[K8sObject], _T], kind: ObjectKind
    ) -> list[_T]:
        parsed = (self._parse(obj, parse, kind) for obj in objects)
        return [item for item in parsed if item is not None]

    def _parse(
        self, obj: K8sObject, parse: Callable[[K8sObject], _T], kind: ObjectKind
    ) -> _T | None:
        try:
            return parse(obj)
        except ObjectError as exc:
            self._metrics.malformed_objects.labels(kind).inc()
            if kind == "Pod" and (node := placed_on(obj)):
                log.warning(
                    "a pod placed on node %s does not parse, so what it holds there is "
                    "unknown: no pod goes to %s until it parses or is gone (fix or delete "
                    "it): %s",
                    node,
                    node,
                    exc,
                )
                key = object_key(kind, obj)
                if key is not None:
                    self.table.hold_unreadable_pod(key, node)
                return None
            log.warning("skipping malformed %s (fix or delete the object): %s", kind, exc)
            if kind == "Pod":
                self._note_unparseable(obj, str(exc))
            return None

    def _note_unparseable(self, obj: K8sObject, error: str) -> None:
        """Remember an unbound pod of ours that does not parse, and drop its last good
        version from the pending set (it must not be scheduled as it was)."""
        pod = unparseable_pod(obj, error)
        if pod is None or not chosen_raw(obj, self._scheduler_name, self._ignore_namespaces):
            return
        key = f"{pod.ref.namespace}/{pod.ref.name}"
        if key in self._assumed or key in self._placed:
            return  # bound or being bound: the last good version keeps counting
        if self._unparseable.get(key) != pod:  # changed (a relist or status write does not)
            self._unparseable[key] = pod
            self._unreported[key] = pod
        self._unbound.pop(key, None)
        self._pending.pop(key, None)
        self._queue.remove(key)

    def _forget_unparseable(self, key: str | None) -> None:
        if key is not None:
            self._unparseable.pop(key, None)
            self._unreported.pop(key, None)

    def _upsert_node(self, node: NodeInfo) -> Action:
        """Store the node; what changed in the fields the filters read (nothing: a
        heartbeat)."""
        previous = self._nodes.get(node.name)
        if previous == node:
            return Action(0)
        self._nodes[node.name] = node
        self.table.upsert_node(node)
        if previous is None:
            return Action.ADD
        action = Action(0)
        if node.labels != previous.labels:
            action |= Action.UPDATE_NODE_LABEL
        if node.taints != previous.taints or node.unschedulable != previous.unschedulable:
            action |= Action.UPDATE_NODE_TAINT
        if node.ready != previous.ready:
            action |= Action.UPDATE_NODE_CONDITION
        if node.allocatable != previous.allocatable:
            action |= Action.UPDATE_NODE_ALLOCATABLE
        return action or Action.UPDATE

    def _delete_node(self, name: str) -> None:
        if self._nodes.pop(name, None) is not None:
            self.table.remove_node(name)

    def _upsert_pod(self, state: PodState) -> Action:
        """Track the pod; what happened that may let a pending pod fit (nothing: none): it
        freed resources on a node (deleted, finished, scaled down), or a pod not placed
        by our own assume arrived on a node or changed labels there (pod affinity and
        topology spread count it, as kube-scheduler's InterPodAffinity and
        PodTopologySpread react to assigned pods)."""
        pod = state.pod
        key = pod.key
        if not pod.node_name:
            if state.finished:
                return Action.DELETE if self._delete_pod(key) else Action(0)
            self._unbound[key] = pod
            self._follow_nomination(pod, state.nominated)
            if key not in self._assumed:  # else the watch has not caught up with our bind
                self._track_unbound(pod)
            return Action(0)
        self._unbound.pop(key, None)
        self._drop_nomination(key)
        if state.finished:
            self._placed_status.pop(key, None)
        else:
            self._placed_status[key] = (state.start_time, state.preempted)
        was_pending = self._pending.pop(key, None)
        if was_pending is not None and was_pending.uid == pod.uid:
            self._bound_from_pending.remember(key, pod.uid)
        ours = self._assumed.pop(key, None) is not None
        self._queue.remove(key)
        if state.finished:
            return Action.DELETE if self._unplace(key) else Action(0)
        previous = self._placed.get(key)
        if previous == pod:
            return Action(0)
        self._place(pod, pod.node_name)
        if previous is None or previous.node_name != pod.node_name:
            return Action(0) if ours else Action.ADD
        action = Action(0)
        if previous.labels != pod.labels and not ours:
            action |= Action.UPDATE_POD_LABEL
        if any(pod.requests.get(r, 0) < amount for r, amount in previous.requests.items()):
            action |= Action.UPDATE_POD_SCALE_DOWN
        return action

    def _track_unbound(self, pod: PodInfo, enqueue: bool = True) -> None:
        if self._is_pending(pod):
            self._pending[pod.key] = pod
            if enqueue:
                self._queue.add(pod.key, pod.priority, pod.created_at)
        else:
            self._pending.pop(pod.key, None)
            self._queue.remove(pod.key)

    def _follow_nomination(self, pod: PodInfo, nominated: str) -> None:
        """Hold room as ``status.nominatedNodeName`` says when it changed; else keep the
        room held for the pod (the loop's nomination, not yet written back), as
        kube-scheduler's nominator does. Only for pods of ours."""
        key = pod.key
        if not self._is_pending(pod):
            self._drop_nomination(key)
            return
        if nominated != self._nominated.get(key, ""):
            if nominated:
                self._nominated[key] = nominated
                self.holds.hold(pod, nominated)
            else:
                self._nominated.pop(key, None)
                self.holds.release(key)
            return
        node = self.holds.node_of(key)
        if node is not None:
            self.holds.hold(pod, node)  # its latest version

    def _drop_nomination(self, key: str) -> None:
        self._nominated.pop(key, None)
        self.holds.release(key)

    def _delete_pod(self, key: str) -> bool:
        """Forget the pod; True when that freed resources on a node."""
        self._drop_nomination(key)
        self._placed_status.pop(key, None)
        self._unbound.pop(key, None)
        self._pending.pop(key, None)
        self._assumed.pop(key, None)
        self._queue.remove(key)
        return self._unplace(key)

    def _is_pending(self, pod: PodInfo) -> bool:
        return chosen(pod, self._scheduler_name, self._ignore_namespaces)

    def unbound_not_ours(
        self, scheduler_name: str, ignore_namespaces: Collection[str]
    ) -> list[str]:
        """Keys of the unbound pods ``scheduler_name`` with ``ignore_namespaces`` would
        place and this cache's settings do not (the pods a reload of those two settings
        stopped attempting; scheduler.standalone.reload_baseline). O(unbound pods)."""
        ignored = frozenset(ignore_namespaces)
        with self.lock:
            return [
                key
                for key, pod in self._unbound.items()
                if key not in self._pending
                and key not in self._assumed
                and chosen(pod, scheduler_name, ignored)
            ]

    def _place(self, pod: PodInfo, node: str) -> None:
        """Count the pod on ``node``, replacing any earlier placement of the same key.

        The table counts pods on nodes it does not know yet once the node arrives.
        """
        placed = pod if pod.node_name == node else dataclasses.replace(pod, node_name=node)
        self._placed[pod.key] = placed
        self.table.add_pod(placed, node, self._clock())

    def _unplace(self, key: str) -> bool:
        pod = self._placed.pop(key, None)
        if pod is None:
            return False
        self.table.remove_pod(pod)
        return True
