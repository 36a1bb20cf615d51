"""Which running pods an eviction may move: only those that come back whole.

The descheduler's default evictor is the floor. A pod the rebalancer would move is
**refused** (a hold reason of ``interference_scheduler_rebalance_holds_total`` and of its
rebalancing record) when, checked in this order:

============================  ===============================================================
reason                        the pod
============================  ===============================================================
``mirror_pod``                is a mirror pod (annotation ``kubernetes.io/config.mirror``)
``static_pod``                is a static pod (``kubernetes.io/config.source`` not ``api``)
``daemonset_pod``             is controlled by a DaemonSet (its replacement comes back to the
                              same node)
``no_controller``             has no controlling owner (nothing recreates it)
``job_pod``                   is controlled by a Job (a CronJob's too): an evicted attempt
                              counts against ``backoffLimit``, its work is lost
``controller_kind``           is controlled by a kind not in ``controller_kinds``
``system_critical``           has priority ≥ 2000000000 (``system-cluster-critical``) or
                              ``priorityClassName`` ``system-cluster-critical`` /
                              ``system-node-critical``, in any namespace
``local_storage``             has an ``emptyDir`` or ``hostPath`` volume, or a claim bound to
                              a local (``spec.local`` / ``spec.hostPath``) PersistentVolume:
                              its data stay behind
============================  ===============================================================

The pod's owner may accept the last four (``interference.io/rebalance: "true"``, as the
descheduler's ``descheduler.alpha.kubernetes.io/evict``); the first four never, since no
eviction of such a pod moves it anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.api.objects import PodInfo

MIRROR_POD = "mirror_pod"
STATIC_POD = "static_pod"
DAEMONSET_POD = "daemonset_pod"
NO_CONTROLLER = "no_controller"
JOB_POD = "job_pod"
CONTROLLER_KIND = "controller_kind"
SYSTEM_CRITICAL = "system_critical"
LOCAL_STORAGE = "local_storage"
REFUSALS = (
    MIRROR_POD,
    STATIC_POD,
    DAEMONSET_POD,
    NO_CONTROLLER,
    JOB_POD,
    CONTROLLER_KIND,
    SYSTEM_CRITICAL,
    LOCAL_STORAGE,
)
"""Every reason :func:`refusal` gives, in the order it checks them."""
OPT_IN_OVERRIDES = frozenset({JOB_POD, CONTROLLER_KIND, SYSTEM_CRITICAL, LOCAL_STORAGE})
"""The refusals ``interference.io/rebalance: "true"`` lifts."""

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
"""``system-cluster-critical``'s value; ``system-node-critical`` is above it."""
CRITICAL_PRIORITY_CLASSES = frozenset({"system-cluster-critical", "system-node-critical"})
NEVER_RECREATED_KINDS = frozenset({"Job", "CronJob", "DaemonSet"})
"""Kinds ``controller_kinds`` may not list: their pods never come back whole elsewhere."""


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str
    """One of :data:`REFUSALS`."""
    text: str
    """Why, for Events and records (``it has local storage: emptyDir data``)."""


def refusal(
    pod: PodInfo,
    controller_kinds: tuple[str, ...],
    local_volume: Callable[[str, str], bool] = lambda namespace, claim: False,
) -> Refusal | None:
    """The first reason (module table) evicting ``pod`` would not move it whole, ``None``
    when it may be evicted. ``local_volume(namespace, claim)``: whether the claim is bound
    to a local PersistentVolume."""
    found = _first_refusal(pod, controller_kinds, local_volume)
    if found is not None and found.reason in OPT_IN_OVERRIDES and pod.rebalance_opt_in:
        return None
    return found


def _first_refusal(
    pod: PodInfo,
    controller_kinds: tuple[str, ...],
    local_volume: Callable[[str, str], bool],
) -> Refusal | None:
    controller = pod.controller
    if pod.mirror or (controller is not None and controller.kind == "Node"):
        return Refusal(MIRROR_POD, "it is a mirror pod (the kubelet recreates it in place)")
    if pod.static:
        return Refusal(STATIC_POD, "it is a static pod (the kubelet recreates it in place)")
    if controller is None:
        return Refusal(NO_CONTROLLER, "no controller recreates it")
    if controller.kind == "DaemonSet":
        return Refusal(DAEMONSET_POD, f"{controller} recreates it on the same node")
    if controller.kind in ("Job", "CronJob"):
        return Refusal(JOB_POD, f"evicting it fails an attempt of {controller}")
    if controller.kind not in controller_kinds:
        kinds = ", ".join(controller_kinds)
        return Refusal(CONTROLLER_KIND, f"its controller {controller} is not one of {kinds}")
    if pod.priority >= SYSTEM_CRITICAL_PRIORITY or pod.priority_class in CRITICAL_PRIORITY_CLASSES:
        named = pod.priority_class or f"priority {pod.priority}"
        return Refusal(SYSTEM_CRITICAL, f"it is system-critical ({named})")
    local = list(pod.local_storage)
    local += [
        f"claim {c.claim_name} (a local volume)"
        for c in pod.claims
        if local_volume(pod.namespace, c.claim_name)
    ]
    if local:
        return Refusal(LOCAL_STORAGE, f"its data stay on the node ({', '.join(local)})")
    return None
