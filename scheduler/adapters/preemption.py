"""The :class:`~scheduler.cycle.ports.Preemptor` on a real API server: what kube-scheduler v1.36's
preemption executor writes (``pkg/scheduler/framework/preemption``), call for call.

* nominate — strategic-merge PATCH of ``pods/status`` setting
  ``status.nominatedNodeName`` (``null`` clears it, as the two-way patch kube-scheduler
  computes does) and the attempt's ``PodScheduled=False/Unschedulable`` condition, in one
  patch as kube-scheduler writes them; 404 is no error.
* preempt — first the nominations of lower-priority pods on the node are cleared
  (kube-scheduler clears them before deleting, so those pods look elsewhere sooner);
  then for each victim:

  1. PATCH ``pods/status`` with the ``DisruptionTarget`` condition (status ``True``,
     reason ``PreemptionByScheduler``, message ``"<schedulerName>: preempting to
     accommodate a higher priority pod"``; conditions merge by type); 404: gone, next;
  2. DELETE the pod with the default grace period and a UID precondition (kube-scheduler
     sends none; the precondition keeps a stale cache from deleting a new pod of the same
     name, e.g. a StatefulSet's replacement); 404 or a failed precondition (409): gone;
  3. an ``events.k8s.io/v1`` Event on the victim, ``Normal`` ``Preempted``, action
     ``Preempting``, ``related`` the preemptor, note ``"Preempted by pod <uid> on node
     <node>"``.

The scheduling loop calls both on its preemption threads (kube-scheduler's asynchronous
preemption; ``loop.preemption_workers``), so neither the scheduling thread nor a bind waits
for them; a preemption's victims go in parallel on
the preemptor's own pool of threads (8 by default). ``preempt`` returns once the pod
informer has handed each deleted victim's DELETED event to the cache (at most
``gone_timeout_s``): the loop does not attempt the preemptor while the call runs, and an
attempt that still saw its victims placed would preempt for it again.

A victim that could not be preempted fails the call after the others were tried
(:class:`~scheduler.cycle.ports.ClusterError`, logged and counted by the loop); an Event or a
cleared nomination that fails does not, since the victims are gone either way. Every
failure is counted in ``interference_scheduler_preemption_call_errors_total{call}``, and a
failing call is logged once per streak (again after it has succeeded), not once per pod.
:data:`PREEMPTION_PERMISSIONS` is the RBAC it needs beyond the cluster adapter's
(deploy/base/scheduler/rbac.yaml).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter

from scheduler.adapters.api_errors import translate_error
from scheduler.adapters.event_recorder import SCHEDULER_NAME, event_name, micro_time
from scheduler.adapters.json_writer import json_body, path_part
from scheduler.adapters.kubernetes import KubernetesCluster, unschedulable_condition
from scheduler.cycle.ports import ClusterError, PodRef, Preemption

log = logging.getLogger(__name__)

PREEMPTION_PERMISSIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "pods", ("delete",)),
    ("", "pods/status", ("patch",)),
    ("events.k8s.io", "events", ("create",)),
)
"""(apiGroup, resource, verbs) :class:`KubernetesPreemptor` calls."""

CALLS = ("nominate", "condition", "delete", "event", "clear_nominated")
"""Values of the ``call`` label of ``interference_scheduler_preemption_call_errors_total``."""
DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
_NOTE_MAX = 1024


def disruption_message(scheduler_name: str) -> str:
    """kube-scheduler's message of the victim's ``DisruptionTarget`` condition."""
    return f"{scheduler_name}: preempting to accommodate a higher priority pod"


def preempted_note(preemptor_uid: str, node: str) -> str:
    """kube-scheduler's note of the ``Preempted`` Event on a victim."""
    return f"Preempted by pod {preemptor_uid} on node {node}"


class PreemptionMetrics:
    """What the preemptor counts (on the scheduler's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.victims = Counter(
            "interference_scheduler_preemption_victims",
            "Pods deleted by preemption (the API server accepted the DELETE).",
            registry=registry,
        )
        self.call_errors = Counter(
            "interference_scheduler_preemption_call_errors",
            "Preemption API calls that failed, by call (nominate, condition, delete, event,"
            " clear_nominated).",
            ["call"],
            registry=registry,
        )


class KubernetesPreemptor:
    """:class:`scheduler.cycle.ports.Preemptor` over a :class:`KubernetesCluster`'s connection."""

    def __init__(
        self,
        cluster: KubernetesCluster,
        metrics: PreemptionMetrics,
        workers: int = 8,
        gone_timeout_s: float = 5.0,
    ) -> None:
        """``workers``: threads preempting victims, shared by every preemption in flight;
        ``gone_timeout_s``: longest wait for the pod watch to show the victims gone."""
        if workers < 1:
            raise ValueError(f"preemption workers must be at least 1, got {workers}")
        self._cluster = cluster
        self._metrics = metrics
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="preemptor")
        self._gone_timeout_s = gone_timeout_s
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        """Calls whose last attempt failed (their next failure is not logged again)."""

    # --- the Preemptor Protocol ---

    def nominate(self, pod: PodRef, node: str, unschedulable: str = "") -> None:
        status: dict[str, Any] = {"nominatedNodeName": node or None}
        if unschedulable:
            status["conditions"] = [unschedulable_condition(unschedulable)]
        try:
            self._patch_status(pod, status)
        except ClusterError:
            self._failed("nominate")
            raise
        self._succeeded("nominate")

    def preempt(self, preemption: Preemption) -> None:
        for pod in preemption.clear_nominated:
            try:
                self._patch_status(pod, {"nominatedNodeName": None})
            except ClusterError as exc:
                self._failed("clear_nominated", exc)
            else:
                self._succeeded("clear_nominated")
        errors: list[str] = []
        # The victims in parallel, as kube-scheduler's Parallelizer does: a preemption's
        # latency is one victim's three calls, not three per victim.
        futures = [
            (victim, self._pool.submit(self._preempt_one, preemption, victim))
            for victim in preemption.victims
        ]
        gone: list[str] = []
        for victim, future in futures:
            try:
                future.result()
            except ClusterError as exc:
                errors.append(f"{victim.namespace}/{victim.name}: {exc}")
            else:
                gone.append(victim.uid)
        # Return only once the cache no longer holds the victims (kube-scheduler keeps the
        # preemptor out of the queue until its last victim is gone from the informer): the
        # loop does not attempt the preemptor while this call runs, and an attempt that
        # still saw the victims would preempt for it again.
        if gone and not self._cluster.wait_gone(gone, self._gone_timeout_s):
            log.debug("preemption: the watch has not shown every victim gone yet")
        if errors:
            raise ClusterError(
                f"preempting for {preemption.preemptor.namespace}/{preemption.preemptor.name}"
                f" on {preemption.node}: {len(errors)} of {len(preemption.victims)} victims"
                f" not preempted ({errors[0]})"
            )

    # --- one victim ---

    def _preempt_one(self, preemption: Preemption, victim: PodRef) -> None:
        condition = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": PREEMPTION_BY_SCHEDULER,
            "message": disruption_message(preemption.scheduler_name),
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            gone = not self._patch_status(victim, {"conditions": [condition]})
        except ClusterError:
            self._failed("condition")
            raise
        self._succeeded("condition")
        if gone:
            return
        try:
            gone = not self._delete(victim)
        except ClusterError:
            self._failed("delete")
            raise
        self._succeeded("delete")
        if gone:
            return
        self._metrics.victims.inc()
        try:
            self._event(preemption, victim)
        except ClusterError as exc:
            self._failed("event", exc)
        else:
            self._succeeded("event")

    # --- the API calls ---

    def _patch_status(self, pod: PodRef, status: dict[str, Any]) -> bool:
        """Strategic-merge PATCH of ``pods/status``; False when the pod is gone (404)."""
        path = f"/api/v1/namespaces/{path_part(pod.namespace)}/pods/{path_part(pod.name)}/status"
        try:
            self._cluster.writer.send(
                "PATCH",
                path,
                json_body({"status": status}),
                "application/strategic-merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise translate_error(exc, "patch", "pods/status", self._cluster.host) from exc
        except Exception as exc:
            raise translate_error(exc, "patch", "pods/status", self._cluster.host) from exc
        return True

    def _delete(self, pod: PodRef) -> bool:
        """DELETE with the default grace period; False when that pod (this UID) is gone."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if pod.uid:
            body["preconditions"] = {"uid": pod.uid}
        path = f"/api/v1/namespaces/{path_part(pod.namespace)}/pods/{path_part(pod.name)}"
        try:
            self._cluster.writer.send("DELETE", path, json_body(body), "application/json")
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise translate_error(exc, "delete", "pods", self._cluster.host) from exc
        except Exception as exc:
            raise translate_error(exc, "delete", "pods", self._cluster.host) from exc
        return True

    def _event(self, preemption: Preemption, victim: PodRef) -> None:
        preemptor = preemption.preemptor
        now = time.time()
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": event_name(victim.name, time.time_ns()),
                         "namespace": victim.namespace},
            "eventTime": micro_time(now),
            "reportingController": SCHEDULER_NAME,
            "reportingInstance": self._cluster.identity[:128],
            "action": "Preempting",
            "reason": "Preempted",
            "note": preempted_note(preemptor.uid, preemption.node)[:_NOTE_MAX],
            "type": "Normal",
            "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": victim.namespace,
                          "name": victim.name, "uid": victim.uid},
            "related": {"apiVersion": "v1", "kind": "Pod", "namespace": preemptor.namespace,
                        "name": preemptor.name, "uid": preemptor.uid},
        }  # fmt: skip
        path = f"/apis/events.k8s.io/v1/namespaces/{path_part(victim.namespace)}/events"
        try:
            self._cluster.writer.send("POST", path, json_body(body), "application/json")
        except Exception as exc:
            raise translate_error(
                exc, "create", "events.k8s.io/events", self._cluster.host
            ) from exc

    # --- failures: counted always, logged once per streak ---

    def _failed(self, call: str, exc: ClusterError | None = None) -> None:
        self._metrics.call_errors.labels(call).inc()
        if exc is None:
            return  # raised to the loop, which logs it
        with self._lock:
            first = call not in self._failing
            self._failing.add(call)
        if first:
            log.warning("preemption: %s failed (further failures counted, not logged): %s",
                        call, exc)  # fmt: skip

    def _succeeded(self, call: str) -> None:
        if call in self._failing:
            with self._lock:
                self._failing.discard(call)
