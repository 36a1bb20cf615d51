"""A Warning Event on a Node whose agent the warden cut off, so ``kubectl describe node``
says why that node's signals stopped (the log says it once, in a Pod few people read).

``events.k8s.io/v1`` Events in the ``default`` namespace, where the kubelet records its
Node Events, regarding the Node; reason ``InterferenceAgentCutOff``, reported by
``interference.io/credential-issuer``. Needs ``create`` on ``events`` there
(deploy/base/credentials/rbac.yaml). Written from a thread of its own through a bounded
queue: a slow or unreachable API server never holds the warden, which must go on cutting
off; an Event that cannot be queued or written is counted and logged once per streak.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import queue
import socket
import threading
import uuid
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger(__name__)

NAMESPACE = "default"
REASON = "InterferenceAgentCutOff"
REPORTING_CONTROLLER = "interference.io/credential-issuer"
QUEUE_SIZE = 64
"""Cut-offs waiting for their Event: each node is cut off at most once per cool-down, so
more waiting than this means the API server is not answering, not that many nodes are bad."""


def cut_off_message(node: str, detail: str, cooldown_s: float) -> str:
    return (
        f"the credential issuer's warden cut off node {node}'s agent: {detail}; its Redis "
        f"user is switched off and its keys deleted, so the scheduler sees this node without "
        f"interference signals; the agent gets a new password after {cooldown_s:.0f} s "
        f"(docs/operations.md, trust model)"
    )[:1024]


class NodeEventMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.written = Counter(
            "interference_credentials_node_events_written",
            "Warning Events written on Nodes whose agent the warden cut off.",
            registry=registry,
        )
        self.failed = Counter(
            "interference_credentials_node_events_failed",
            "Node Events not written (API server refused or unreachable, or the queue full).",
            registry=registry,
        )


class KubernetesNodeEvents:
    """Queues a cut-off's Event and writes it through ``EventsV1Api`` on its own thread."""

    def __init__(
        self, api_client: client.ApiClient, metrics: NodeEventMetrics, timeout_s: float
    ) -> None:
        self._api = client.EventsV1Api(api_client)
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._instance = socket.gethostname()
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue(QUEUE_SIZE)
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="node-events", daemon=True)
        self._thread.start()

    def cut_off(self, node: str, detail: str, cooldown_s: float) -> None:
        """Never blocks: a full queue drops the Event (counted)."""
        try:
            self._queue.put_nowait((node, cut_off_message(node, detail, cooldown_s)))
        except queue.Full:
            self._failed(node, "the queue of Events to write is full")

    def close(self) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._thread.join(self._timeout_s + 1)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            node, message = item
            try:
                self._api.create_namespaced_event(
                    NAMESPACE, self._event(node, message), _request_timeout=self._timeout_s
                )
            except Exception as exc:  # the client raises ApiException and urllib3 errors
                self._failed(node, str(exc).splitlines()[0] if str(exc) else repr(exc))
                continue
            self._metrics.written.inc()
            self._failing = False

    def _event(self, node: str, message: str) -> Any:
        return client.EventsV1Event(
            # NAME.<random hex>, as kubectl names Events.
            metadata=client.V1ObjectMeta(
                name=f"{node[:200]}.{uuid.uuid4().hex[:16]}", namespace=NAMESPACE
            ),
            event_time=datetime.datetime.now(datetime.UTC),
            action="CutOff",
            reason=REASON,
            note=message,
            type="Warning",
            regarding=client.V1ObjectReference(kind="Node", api_version="v1", name=node),
            reporting_controller=REPORTING_CONTROLLER,
            reporting_instance=self._instance,
        )

    def _failed(self, node: str, why: str) -> None:
        self._metrics.failed.inc()
        if not self._failing:
            log.warning(
                "cannot write the Event %s on Node %s (%s); the issuer needs create on "
                "events.k8s.io events in namespace %s (deploy/base/credentials/rbac.yaml)",
                REASON, node, why, NAMESPACE,
            )  # fmt: skip
        self._failing = True
