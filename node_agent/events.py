"""Kubernetes Events the agent records on pods (the degrader's, node_agent/degrade.py).

``events.k8s.io/v1`` Events on the pod, reported by ``interference.io/agent`` as the
node's agent (``reportingInstance``: the node). Needs ``create`` on ``events`` in the
pods' namespaces (deploy/components/degrade). A failure is logged once per streak and
never raises: an Event not written must not stop the degrader from restoring.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from typing import Any

from interference.signals import PodMetrics

log = logging.getLogger(__name__)

REPORTING_CONTROLLER = "interference.io/agent"

EVENT_PERMISSIONS = (("events.k8s.io", "events", ("create",)),)
"""``(API group, resource, verbs)`` the Events need (deploy/components/degrade/rbac.yaml)."""


class KubernetesEvents:
    """Writes Events through ``kubernetes.client.EventsV1Api``."""

    def __init__(self, events_api: Any, node_name: str) -> None:
        self._api = events_api
        self._node = node_name
        self._failing = False
        self.written = 0
        self.failed = 0

    def emit(self, pod: PodMetrics, reason: str, message: str, warning: bool) -> None:
        from kubernetes import client

        now = datetime.datetime.now(datetime.UTC)
        body = client.EventsV1Event(
            # NAME.<random hex>, as kubectl names Events (a generateName ending in "." is
            # refused by the API server's name validation).
            metadata=client.V1ObjectMeta(
                name=f"{pod.name[:200]}.{uuid.uuid4().hex[:16]}", namespace=pod.namespace
            ),
            event_time=now,
            action=reason,
            reason=reason,
            note=message[:1024],
            type="Warning" if warning else "Normal",
            regarding=client.V1ObjectReference(
                kind="Pod",
                api_version="v1",
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
            ),
            reporting_controller=REPORTING_CONTROLLER,
            reporting_instance=self._node,
        )
        try:
            self._api.create_namespaced_event(pod.namespace, body)
        except Exception as exc:  # the client raises ApiException and urllib3 errors
            self.failed += 1
            if not self._failing:
                log.warning(
                    "cannot write the Event %s on %s (%s); the agent needs create on "
                    "events (deploy/components/degrade)",
                    reason,
                    pod.key,
                    exc,
                )
            self._failing = True
            return
        self.written += 1
        self._failing = False


class LoggedEvents:
    """Events as log lines, where the agent has no API access (demo, tests)."""

    def emit(self, pod: PodMetrics, reason: str, message: str, warning: bool) -> None:
        log.log(logging.WARNING if warning else logging.INFO, "%s %s: %s", reason, pod.key, message)
