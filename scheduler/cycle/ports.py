"""The scheduler's boundaries: small Protocols that adapters implement (docs/design.md §2, §5).

The cycle never talks to Kubernetes or Redis itself. Kubernetes objects cross this
boundary as plain JSON dicts exactly as the API server serialises them (camelCase keys),
never as the client's model classes, which are slow to build for large lists.

Implementations: ``scheduler.adapters.kubernetes`` (real API server),
``scheduler.adapters.memory`` (in-memory, for tests and simulation) and the demo's local
backend; ``scheduler.adapters.redis_signals`` for signals, ``scheduler.adapters.decision_sink``
(and ``queued_decision_sink``) for decisions.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from interference.decision import Decision
from scheduler.api.events import ObjectKind as ObjectKind
from scheduler.cycle.stage_trace import Attributes, StageRecorder
from scheduler.signals.frame import NodeSignals as NodeSignals
from scheduler.signals.frame import SignalFrame

INFORMED_KINDS: tuple[ObjectKind, ...] = (
    "Node",
    "Namespace",
    "StorageClass",
    "CSINode",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Pod",
)
"""What the informers list and watch, in the order a (re)list hands them over."""
CLUSTER_SCOPED_KINDS: frozenset[ObjectKind] = frozenset(
    {"Node", "Namespace", "PersistentVolume", "StorageClass", "CSINode"}
)
"""Kinds keyed by name alone (the others by ``namespace/name``)."""
PREEMPTION_KINDS: tuple[ObjectKind, ...] = ("PodDisruptionBudget",)
"""What an adapter that implements :class:`Preemptor` also lists and watches (after
:data:`INFORMED_KINDS`, through the same handler): preemption prefers victims whose
eviction violates no PodDisruptionBudget (``policy/v1``, namespaced)."""
EventType = Literal["ADDED", "MODIFIED", "DELETED"]
K8sObject = dict[str, Any]


class ClusterError(RuntimeError):
    """The cluster backend failed; the message says what and how to fix it."""


class ApiUnavailable(ClusterError):
    """The API server could not be reached or answered 5xx/429; retry with backoff."""


class BindConflict(ClusterError):
    """The pod is already bound or gone (HTTP 409/404): drop it, do not retry."""


class Forbidden(ClusterError):
    """RBAC denied a call (HTTP 401/403); the message names the verb and resource."""


@dataclass(frozen=True, slots=True)
class PodRef:
    """Enough to address a pod in write calls."""

    namespace: str
    name: str
    uid: str = ""


class ClusterHandler(Protocol):
    """Receives the informer stream; implemented by the scheduler's cluster cache."""

    def replace(self, kind: ObjectKind, objects: list[K8sObject]) -> None:
        """Full state of a kind after a (re)list; objects absent from it are gone."""

    def apply(self, kind: ObjectKind, event: EventType, obj: K8sObject) -> None:
        """One watch event."""


class Cluster(Protocol):
    """Reads and writes the cluster state the scheduler needs."""

    def run_informers(self, handler: ClusterHandler, stop: threading.Event) -> None:
        """List then watch each of :data:`INFORMED_KINDS` until ``stop`` is set, feeding
        ``handler``.

        Relists on 410 Gone and backs off on 429/5xx; never returns early on errors.
        """

    def bind(self, pod: PodRef, node: str) -> None:
        """Bind through the Binding subresource; :class:`BindConflict` on 409/404."""

    def record_event(self, pod: PodRef, event_type: str, reason: str, message: str) -> None:
        """Emit an Event (``Normal``/``Warning``) about the pod, reported by this scheduler."""

    def set_unschedulable(self, pod: PodRef, message: str) -> None:
        """Set the pod's ``PodScheduled`` condition to False / ``Unschedulable``."""


@dataclass(frozen=True, slots=True)
class Preemption:
    """One preemption the scheduling cycle decided (kube-scheduler's DefaultPreemption
    PostFilter): ``preemptor`` is nominated to ``node``, and ``victims`` must go for it to
    fit there."""

    preemptor: PodRef
    scheduler_name: str
    """The preemptor's ``spec.schedulerName`` (the DisruptionTarget message names it)."""
    node: str
    victims: tuple[PodRef, ...]
    """Pods to delete, each with its UID; pods already terminating are left out."""
    clear_nominated: tuple[PodRef, ...] = ()
    """Pods of lower priority than the preemptor nominated to ``node``: they may no longer
    fit there, so their ``status.nominatedNodeName`` is cleared."""


class Preemptor(Protocol):
    """Acts on a preemption (kube-scheduler's preemption executor). The scheduling loop
    never calls it on the scheduling thread: it hands both calls to its writer threads and
    goes on with the next pod (kube-scheduler's asynchronous preemption); the preemptor
    waits in backoff, its room held by the loop's nomination, until the victims are gone.

    Implementations: ``scheduler.adapters.kubernetes`` (real API server; it also lists and
    watches :data:`PREEMPTION_KINDS`), ``scheduler.adapters.memory``. In dry-run mode the
    loop calls neither method and only records the decision.
    """

    def nominate(self, pod: PodRef, node: str, unschedulable: str = "") -> None:
        """Set the pod's ``status.nominatedNodeName`` to ``node`` (``""`` clears it) and,
        with ``unschedulable`` (the attempt's FailedScheduling message), its
        ``PodScheduled=False/Unschedulable`` condition: one patch of the status
        subresource, as kube-scheduler writes both. A pod that is gone (404) is no error.
        Raises :class:`ClusterError` for any other failure."""

    def preempt(self, preemption: Preemption) -> None:
        """Evict ``preemption.victims`` as kube-scheduler v1.36 does, each victim in turn:

        1. patch its status with the condition ``type: DisruptionTarget``,
           ``status: "True"``, ``reason: PreemptionByScheduler``, ``message:
           "<scheduler_name>: preempting to accommodate a higher priority pod"`` (a 404
           means it is gone already: skip to the next victim);
        2. DELETE it (default grace period; a UID precondition is allowed; 404 is done);
        3. emit an Event about the victim: ``type: Normal``, ``reason: Preempted``,
           ``action: Preempting``, ``related``: the preemptor, ``note: "Preempted by pod
           <preemptor uid> on node <node>"``, reported by the scheduler.

        Then clear ``status.nominatedNodeName`` of each pod in
        ``preemption.clear_nominated`` (as :meth:`nominate` with ``""``; failures there
        are logged, not raised). Any other failure raises :class:`ClusterError` after the
        remaining victims were tried; the loop then retries the preemptor at once.
        """


class SignalSource(Protocol):
    """Latest per-node signals (the Redis signal cache, or a recorded trace)."""

    def snapshot(self) -> SignalFrame | Mapping[str, NodeSignals]:
        """The latest signals: a frame (the Redis follower), or node name → signals (an
        in-process source, tests), which the table reads through each node's scheduling
        record as the follower would (:func:`scheduler.signals.records.frame_of_signals`);
        nodes without any report are absent or hold none."""

    def healthy(self) -> bool:
        """False while the source cannot be read (the scheduler then runs interference-blind)."""


class DecisionSink(Protocol):
    """Where decision records go: placement records (``intf:decision:{ns}/{pod}`` in
    Redis) from the scheduling loop, rebalancing records
    (``intf:rebalance:decision:{ns}/{pod}``) from the rebalancer, each its own sink."""

    def write(self, decision: Decision) -> None:
        """Store a decision; must not raise (log and count failures instead)."""


class DecisionSource(Protocol):
    """Where the decision page (``/decisions/NS/POD``, :mod:`scheduler.endpoint.http`) reads
    records back: the Redis adapter's queued sink."""

    def read(self, namespace: str, pod: str) -> Decision | None:
        """The pod's latest decision record, ``None`` when there is none; may raise when
        the store cannot be read."""

    def index_history(self, node: str) -> Sequence[tuple[float, float]] | None:
        """The node's recent interference index as ``(unix time, 0–100)`` pairs, oldest
        first; ``None`` when it cannot be read. Never raises."""


class DecisionTracer(Protocol):
    """Traces of scheduling attempts: a root span per attempt, a span per stage
    (:mod:`scheduler.cycle.stage_trace`). Implemented by :mod:`scheduler.adapters.tracing`."""

    def start(self) -> StageRecorder | None:
        """A recorder for a new attempt's trace, ``None`` when this attempt is not sampled
        (or tracing is off): the cycle then notes nothing."""

    def finish(
        self,
        recorder: StageRecorder,
        name: str,
        start_ns: int,
        attributes: Attributes,
        end_ns: int | None = None,
    ) -> None:
        """The attempt ended at ``end_ns`` (default: now): export its root span and its
        stages (a bind, which outlasts the attempt, is noted before this is called)."""


class NoTracer:
    """Tracing off: nothing is sampled."""

    def start(self) -> StageRecorder | None:
        return None

    def finish(
        self,
        recorder: StageRecorder,
        name: str,
        start_ns: int,
        attributes: Attributes,
        end_ns: int | None = None,
    ) -> None:
        return None
