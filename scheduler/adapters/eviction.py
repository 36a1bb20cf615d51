"""The Eviction API for the rebalancer (``policy/v1`` Eviction, ``pods/eviction``).

The API server honours PodDisruptionBudgets: it answers 429 while a budget allows no
disruption (the rebalancer waits and tries later), 404 or 409 when the pod (this UID: a
precondition) is gone. ``dry_run`` sends ``dryRun=All``: the same checks, nothing evicted,
which is how the rebalancer's dry run knows whether a budget would have blocked it.
:data:`EVICTION_PERMISSIONS` is the RBAC rule it needs (deploy/base/rebalancer/rbac.yaml).
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.adapters.api_errors import translate_error
from scheduler.cycle.ports import PodRef
from scheduler.rebalancing.ports import EvictionAnswer, EvictionStatus

EVICTION_PERMISSIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "pods/eviction", ("create",)),
)
"""(apiGroup, resource, verbs) :class:`KubernetesEvictor` calls."""


class KubernetesEvictor:
    """:class:`scheduler.rebalancing.ports.Evictor` on the real API server."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)
        self._host = str(api.configuration.host)

    def evict(self, pod: PodRef, dry_run: bool) -> EvictionAnswer:
        delete_options: dict[str, Any] = {}
        if pod.uid:
            delete_options["preconditions"] = {"uid": pod.uid}
        if dry_run:
            delete_options["dryRun"] = ["All"]
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
            "deleteOptions": delete_options,
        }
        extra: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
        try:
            # a dict body and the raw answer: the client's models are not needed here
            response: Any = self._core.create_namespaced_pod_eviction(
                pod.name,
                pod.namespace,
                body,  # type: ignore[arg-type]
                _preload_content=False,
                **extra,
            )
            response.release_conn()
        except ApiException as exc:
            message = _message(exc)
            if exc.status == 429:
                return EvictionAnswer(EvictionStatus.BLOCKED, message)
            if exc.status in (404, 409):
                return EvictionAnswer(EvictionStatus.GONE, message)
            raise translate_error(exc, "create", "pods/eviction", self._host) from exc
        except Exception as exc:
            raise translate_error(exc, "create", "pods/eviction", self._host) from exc
        return EvictionAnswer(EvictionStatus.EVICTED)


def _message(exc: ApiException) -> str:
    """The Status message of an error answer (which budget blocked, …)."""
    try:
        status = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return str(exc.reason or "")
    message = status.get("message") if isinstance(status, dict) else None
    return str(message or exc.reason or "")
