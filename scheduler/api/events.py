"""Cluster events: what changed in the cluster, as the queue and the plugins name it.

kube-scheduler's ``framework.ClusterEvent``: a resource kind and what happened to it. The
cache emits one per change it applies (:meth:`scheduler.cycle.cache.ClusterCache.apply`); each
filter plugin declares the events that can make a pod it rejected schedulable
(:attr:`scheduler.plugins.base.Filter.events`, kube's ``EventsToRegister``), optionally
with a hint that looks at the changed object (kube's ``QueueingHintFn``); the queue
retries a pod early only when an event some plugin that rejected it registered for
arrives and its hint, if any, says the pod may fit now.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Flag, auto
from typing import Literal

from scheduler.api.objects import NodeInfo, PodInfo

ObjectKind = Literal[
    "Node",
    "Pod",
    "Namespace",
    "PersistentVolumeClaim",
    "PersistentVolume",
    "StorageClass",
    "CSINode",
    "PodDisruptionBudget",
]


class Action(Flag):
    """What happened to the resource (kube-scheduler's ``ActionType``)."""

    ADD = auto()
    DELETE = auto()
    UPDATE_NODE_ALLOCATABLE = auto()
    UPDATE_NODE_LABEL = auto()
    UPDATE_NODE_TAINT = auto()
    """Taints, or ``spec.unschedulable`` (kube-scheduler files a cordon under taints)."""
    UPDATE_NODE_CONDITION = auto()
    """Readiness."""
    UPDATE_POD_LABEL = auto()
    UPDATE_POD_SCALE_DOWN = auto()
    """A placed pod's requests went down (a resize)."""
    UPDATE = auto()
    """Any other update (a claim bound, a StorageClass changed, …)."""
    ALL = (
        ADD
        | DELETE
        | UPDATE_NODE_ALLOCATABLE
        | UPDATE_NODE_LABEL
        | UPDATE_NODE_TAINT
        | UPDATE_NODE_CONDITION
        | UPDATE_POD_LABEL
        | UPDATE_POD_SCALE_DOWN
        | UPDATE
    )


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """One change the cache applied. ``node`` or ``pod`` is the changed object (its new
    version; the old one for a deletion) where the resource is a Node or a placed Pod."""

    resource: ObjectKind
    action: Action
    node: NodeInfo | None = None
    pod: PodInfo | None = None


QueueingHint = Callable[[PodInfo, ClusterEvent], bool]
"""``(rejected pod, event)`` → whether the event may make the pod schedulable (kube's
``Queue`` vs ``QueueSkip``); when unsure, True."""


@dataclass(frozen=True, slots=True)
class EventInterest:
    """An event a filter plugin registers for: any of ``actions`` on ``resource``, and
    ``hint`` (when given) says yes for the pod."""

    resource: ObjectKind
    actions: Action
    hint: QueueingHint | None = None

    def wants(self, pod: PodInfo, event: ClusterEvent) -> bool:
        if event.resource != self.resource or not (event.action & self.actions):
            return False
        return self.hint is None or self.hint(pod, event)
