"""The :class:`~scheduler.cycle.ports.Cluster` on a real API server, through the
``kubernetes`` client.

It reads through :class:`~scheduler.adapters.informers.Informers` (unless made with
``preemption=False`` — the extender, where kube-scheduler preempts — also the
PodDisruptionBudgets preemption reads) and writes through the kept-alive
:class:`~scheduler.adapters.json_writer.JsonWriter`. The preemption writes themselves are
in :mod:`scheduler.adapters.preemption`.

Writes:

* bind — ``POST /api/v1/namespaces/{ns}/pods/{name}/binding``;
* Events — ``events.k8s.io/v1`` (what kube-scheduler uses), in kube-scheduler's style
  (:mod:`scheduler.adapters.event_recorder`);
* PodScheduled=False/Unschedulable — strategic-merge PATCH of ``pods/status`` (conditions
  merge by ``type``, the other conditions stay).

Every API call goes through one method of :class:`KubernetesCluster`
(``list_page``, ``open_watch``, ``bind``, ``record_event``, ``record_object_event``,
``set_unschedulable``), and
:data:`REQUIRED_PERMISSIONS` lists the RBAC rules they need, so a test can check the
deploy manifests against the calls. Client exceptions never escape: they become
:class:`~scheduler.cycle.ports.ClusterError` subclasses that say what to do
(:mod:`scheduler.adapters.api_errors`).
"""

from __future__ import annotations

import datetime as dt
import random
import threading
from collections.abc import Collection
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.adapters.api_errors import status_message, translate_error
from scheduler.adapters.event_recorder import SCHEDULER_NAME, EventRecorder
from scheduler.adapters.informers import Informers
from scheduler.adapters.json_writer import JsonWriter, json_body, path_part
from scheduler.adapters.kubernetes_settings import KubernetesSettings
from scheduler.cycle.ports import (
    INFORMED_KINDS,
    PREEMPTION_KINDS,
    BindConflict,
    ClusterHandler,
    K8sObject,
    ObjectKind,
    PodRef,
)

REQUIRED_PERMISSIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "nodes", ("list", "watch")),
    ("", "pods", ("list", "watch")),
    ("", "namespaces", ("list", "watch")),
    ("", "persistentvolumeclaims", ("list", "watch")),
    ("", "persistentvolumes", ("list", "watch")),
    ("storage.k8s.io", "storageclasses", ("list", "watch")),
    ("storage.k8s.io", "csinodes", ("list", "watch")),
    ("policy", "poddisruptionbudgets", ("list", "watch")),
    ("", "pods/binding", ("create",)),
    ("", "pods/status", ("patch",)),
    ("events.k8s.io", "events", ("create", "patch")),
)
"""(apiGroup, resource, verbs) the cluster adapter calls (PodDisruptionBudgets only with
``preemption=True``); the elector adds its Lease rule, the preemptor its own
(:data:`scheduler.adapters.preemption.PREEMPTION_PERMISSIONS`)."""


def unschedulable_condition(message: str) -> dict[str, Any]:
    """``PodScheduled=False/Unschedulable`` with ``message``, as kube-scheduler writes it
    (conditions merge by type in a strategic-merge patch of ``pods/status``)."""
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastProbeTime": None,
        "lastTransitionTime": dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


class KubernetesCluster:
    """Informers and writes against a real API server (see the module docstring)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        settings: KubernetesSettings | None = None,
        identity: str = SCHEDULER_NAME,
        rng: random.Random | None = None,
        preemption: bool = True,
    ) -> None:
        """``preemption``: also list and watch :data:`~scheduler.cycle.ports.PREEMPTION_KINDS`
        (the standalone scheduler, which preempts; the extender passes False)."""
        self.settings = settings or KubernetesSettings()
        self.kinds: tuple[ObjectKind, ...] = INFORMED_KINDS + (
            PREEMPTION_KINDS if preemption else ()
        )
        """What :meth:`run_informers` lists and watches."""
        self.identity = identity
        """``reportingInstance`` of our Events (the elector's identity)."""
        self.host = str(api_client.configuration.host)
        self._writer = JsonWriter(api_client, self.settings.request_timeout_s)
        self._informers = Informers(api_client, self.settings, self.kinds, rng or random.Random())
        self._events = EventRecorder(self._writer, identity, self.host)

    # --- the API calls (each one needs a rule in REQUIRED_PERMISSIONS) ---

    @property
    def writer(self) -> JsonWriter:
        """The kept-alive JSON writer (shared with :mod:`scheduler.adapters.preemption`)."""
        return self._writer

    def list_page(self, kind: ObjectKind, continue_token: str = "") -> K8sObject:
        """One page of a kind (pods: non-finished ones only), parsed with json.loads."""
        return self._informers.list_page(kind, continue_token)

    def open_watch(self, kind: ObjectKind, resource_version: str) -> urllib3.BaseHTTPResponse:
        """A streaming watch from ``resource_version`` (bookmarks on)."""
        return self._informers.open_watch(kind, resource_version)

    def bind(self, pod: PodRef, node: str) -> None:
        """POST the Binding; :class:`BindConflict` on 409/404."""
        metadata: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace}
        if pod.uid:
            metadata["uid"] = pod.uid
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = f"/api/v1/namespaces/{path_part(pod.namespace)}/pods/{path_part(pod.name)}/binding"
        try:
            self._writer.send("POST", path, json_body(body), "application/json")
        except ApiException as exc:
            if exc.status in (404, 409):
                raise BindConflict(
                    f"pod {pod.namespace}/{pod.name} cannot be bound to {node}:"
                    f" {status_message(exc.body) or exc.reason}"
                ) from exc
            raise translate_error(exc, "create", "pods/binding", self.host) from exc
        except Exception as exc:
            raise translate_error(exc, "create", "pods/binding", self.host) from exc

    def record_event(self, pod: PodRef, event_type: str, reason: str, message: str) -> None:
        """An ``events.k8s.io/v1`` Event about the pod, repeats as one series
        (:meth:`EventRecorder.record_event`)."""
        self._events.record_event(pod, event_type, reason, message)

    def record_object_event(
        self,
        kind: str,
        namespace: str,
        name: str,
        event_type: str,
        reason: str,
        action: str,
        message: str,
    ) -> None:
        """An ``events.k8s.io/v1`` Event about a core (``v1``) object other than a pod
        (:meth:`EventRecorder.record_object_event`)."""
        self._events.record_object_event(kind, namespace, name, event_type, reason, action, message)

    def set_unschedulable(self, pod: PodRef, message: str) -> None:
        """PodScheduled=False, reason Unschedulable, via a strategic-merge PATCH of pods/status."""
        body = {"status": {"conditions": [unschedulable_condition(message)]}}
        path = f"/api/v1/namespaces/{path_part(pod.namespace)}/pods/{path_part(pod.name)}/status"
        try:
            self._writer.send(
                "PATCH", path, json_body(body), "application/strategic-merge-patch+json"
            )
        except Exception as exc:
            raise translate_error(exc, "patch", "pods/status", self.host) from exc

    # --- informers ---

    def wait_gone(self, uids: Collection[str], timeout_s: float) -> bool:
        """Wait until the pod informer has handed a DELETED event for each of ``uids`` to
        its handler (so the cache no longer holds them); False after ``timeout_s``."""
        return self._informers.wait_gone(uids, timeout_s)

    def synced(self) -> bool:
        """True once every one of :data:`INFORMED_KINDS` has been listed (and handed to the
        handler); PodDisruptionBudgets are not waited for."""
        return self._informers.synced()

    def run_informers(self, handler: ClusterHandler, stop: threading.Event) -> None:
        """List then watch each of :attr:`kinds` until ``stop`` is set (blocks)."""
        self._informers.run(handler, stop)
