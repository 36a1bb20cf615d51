"""The API server's objects for the scheduler's cache: each kind listed, then watched,
and handed to a :class:`~scheduler.cycle.ports.ClusterHandler`.

Informers: list nodes, namespaces (their labels, for namespace selectors), storage
classes, CSINodes, persistent volumes and claims (for the volume filters) and pods
(paged), then watch from the list's resourceVersion with bookmarks; 410 Gone (on the
watch or a list continue) relists at once; 429, 5xx and connection errors back off
(exponential, capped, jittered; ``Retry-After`` honoured); nothing stops an informer
thread but ``stop`` (the loop is :func:`interference_infra.kube_watch.list_and_watch`,
shared with the agent's pod watch). Every call passes ``_preload_content=False`` and the
body is parsed with ``json.loads`` (watch lines are split by
``kubernetes.watch.watch.iter_resp_lines``):
the client's model deserialisation is far too slow for lists of 50,000 pods.

Pods are watched with ``status.phase!=Succeeded,status.phase!=Failed`` as kube-scheduler
does: finished pods hold no resources. PodDisruptionBudgets
(:data:`~scheduler.cycle.ports.PREEMPTION_KINDS`), which preemption reads, are listed and
watched only when asked for.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from interference_infra.kube_watch import Backoff, Gone, list_and_watch
from scheduler.adapters.api_errors import status_message, translate_error
from scheduler.adapters.kubernetes_settings import KubernetesSettings
from scheduler.cycle.ports import (
    INFORMED_KINDS,
    ApiUnavailable,
    ClusterError,
    ClusterHandler,
    EventType,
    K8sObject,
    ObjectKind,
)

log = logging.getLogger(__name__)

POD_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"

_GONE_KEPT = 4096
"""Deleted pods' UIDs kept for :meth:`Informers.wait_gone` before pruning …"""
_GONE_KEPT_S = 60.0
"""… those seen longer ago than this."""
_WATCH_EVENTS: frozenset[str] = frozenset({"ADDED", "MODIFIED", "DELETED"})


class Informers:
    """List then watch each of ``kinds`` until stopped (see the module docstring)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        settings: KubernetesSettings,
        kinds: tuple[ObjectKind, ...],
        rng: random.Random,
    ) -> None:
        self.settings = settings
        self.kinds = kinds
        """What :meth:`run` lists and watches."""
        self.host = str(api_client.configuration.host)
        self._core = client.CoreV1Api(api_client)
        self._storage = client.StorageV1Api(api_client)
        self._policy = client.PolicyV1Api(api_client)
        self._rng = rng
        self._lock = threading.Lock()
        self._open_watches: set[urllib3.response.BaseHTTPResponse] = set()
        self._synced: dict[ObjectKind, bool] = {kind: False for kind in INFORMED_KINDS}
        self._gone = threading.Condition(threading.Lock())
        self._gone_uids: dict[str, float] = {}
        """UID → when the pod watch's DELETED for it was handed to the handler (recent
        ones only): :meth:`wait_gone` waits on it."""

    def list_page(self, kind: ObjectKind, continue_token: str = "") -> K8sObject:
        """One page of a kind (pods: non-finished ones only), parsed with json.loads."""
        kwargs: dict[str, Any] = {
            "limit": self.settings.page_size,
            "_preload_content": False,
            "_request_timeout": self.settings.request_timeout_s,
        }
        if continue_token:
            kwargs["_continue"] = continue_token
        try:
            body = json.loads(_read(self._list_or_watch(kind, kwargs)))
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(status_message(exc.body)) from exc
            raise translate_error(exc, "list", _plural(kind), self.host) from exc
        except ValueError as exc:
            raise ApiUnavailable(f"list {_plural(kind)}: the answer is not JSON ({exc})") from exc
        except Exception as exc:
            raise translate_error(exc, "list", _plural(kind), self.host) from exc
        if not isinstance(body, dict) or not isinstance(body.get("items"), list):
            raise ApiUnavailable(f"list {_plural(kind)}: the answer is not a list object")
        return body

    def open_watch(self, kind: ObjectKind, resource_version: str) -> urllib3.BaseHTTPResponse:
        """A streaming watch from ``resource_version`` (bookmarks on)."""
        timeout = int(self.settings.watch_timeout_s * (1 + self._rng.random()))
        kwargs: dict[str, Any] = {
            "watch": True,
            "resource_version": resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout,
            "_preload_content": False,
            "_request_timeout": (self.settings.request_timeout_s, timeout + 30),
        }
        try:
            return self._list_or_watch(kind, kwargs)
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(status_message(exc.body)) from exc
            raise translate_error(exc, "watch", _plural(kind), self.host) from exc
        except Exception as exc:
            raise translate_error(exc, "watch", _plural(kind), self.host) from exc

    def _list_or_watch(self, kind: ObjectKind, kwargs: dict[str, Any]) -> urllib3.BaseHTTPResponse:
        if kind == "Node":
            return _raw(self._core.list_node(**kwargs))
        if kind == "Namespace":
            return _raw(self._core.list_namespace(**kwargs))
        if kind == "PersistentVolumeClaim":
            return _raw(self._core.list_persistent_volume_claim_for_all_namespaces(**kwargs))
        if kind == "PersistentVolume":
            return _raw(self._core.list_persistent_volume(**kwargs))
        if kind == "StorageClass":
            return _raw(self._storage.list_storage_class(**kwargs))
        if kind == "CSINode":
            return _raw(self._storage.list_csi_node(**kwargs))
        if kind == "PodDisruptionBudget":
            return _raw(self._policy.list_pod_disruption_budget_for_all_namespaces(**kwargs))
        return _raw(
            self._core.list_pod_for_all_namespaces(field_selector=POD_FIELD_SELECTOR, **kwargs)
        )

    def wait_gone(self, uids: Collection[str], timeout_s: float) -> bool:
        """Wait until the pod informer has handed a DELETED event for each of ``uids`` to
        its handler (so the cache no longer holds them); False after ``timeout_s``."""
        wanted = {uid for uid in uids if uid}
        with self._gone:
            return self._gone.wait_for(lambda: wanted <= self._gone_uids.keys(), timeout_s)

    def _handed_gone(self, obj: K8sObject) -> None:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        now = time.monotonic()
        with self._gone:
            self._gone_uids[uid] = now
            if len(self._gone_uids) > _GONE_KEPT:
                horizon = now - _GONE_KEPT_S
                self._gone_uids = {u: t for u, t in self._gone_uids.items() if t >= horizon}
            self._gone.notify_all()

    def synced(self) -> bool:
        """True once every one of :data:`INFORMED_KINDS` has been listed (and handed to the
        handler); PodDisruptionBudgets are not waited for."""
        with self._lock:
            return all(self._synced.values())

    def run(self, handler: ClusterHandler, stop: threading.Event) -> None:
        """List then watch each of :attr:`kinds` until ``stop`` is set (blocks)."""
        threads = [
            threading.Thread(
                target=self._inform,
                args=(kind, handler, stop),
                name=f"informer-{kind.lower()}",
                daemon=True,
            )
            for kind in self.kinds
        ]
        for thread in threads:
            thread.start()
        stop.wait()
        with self._lock:
            for response in self._open_watches:  # unblocks a reader waiting for an event
                _interrupt(response)
        for thread in threads:
            thread.join(timeout=self.settings.request_timeout_s + 5)

    def _inform(self, kind: ObjectKind, handler: ClusterHandler, stop: threading.Event) -> None:
        list_and_watch(
            _KindInformer(self, kind, handler),
            stop,
            Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s, self._rng),
            name=f"{_plural(kind)} informer",
            expected=(ClusterError,),
            hint=f"check the API server address and RBAC (list/watch {_plural(kind)})",
            logger=log,
        )

    def _relist(self, kind: ObjectKind, handler: ClusterHandler) -> str:
        items: list[K8sObject] = []
        token = ""
        while True:
            page = self.list_page(kind, token)
            items.extend(page["items"])
            metadata = page.get("metadata") or {}
            token = str(metadata.get("continue") or "")
            if not token:
                break
        handler.replace(kind, items)
        if kind in self._synced:
            with self._lock:
                self._synced[kind] = True
        return str(metadata.get("resourceVersion") or "")

    def _follow(
        self,
        kind: ObjectKind,
        resource_version: str,
        handler: ClusterHandler,
        stop: threading.Event,
    ) -> tuple[str, int]:
        """Apply watch events until the stream ends: the resourceVersion to continue from
        and how many events arrived."""
        response = self.open_watch(kind, resource_version)
        events = 0
        with self._lock:  # run_informers shuts down what is registered once stop is set
            if stop.is_set():
                _interrupt(response)
            self._open_watches.add(response)
        try:
            for event_type, obj in self._events_of(kind, response):
                if stop.is_set():
                    break
                events += 1
                if event_type == "BOOKMARK":
                    resource_version = _resource_version(obj) or resource_version
                    continue
                handler.apply(kind, _watch_event(event_type), obj)
                if kind == "Pod" and event_type == "DELETED":
                    self._handed_gone(obj)
                resource_version = _resource_version(obj) or resource_version
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if not stop.is_set():
                raise translate_error(exc, "watch", _plural(kind), self.host) from exc
        finally:
            with self._lock:
                self._open_watches.discard(response)
            response.close()  # never return a half-read stream to the connection pool
            response.release_conn()
        return resource_version, events

    def _events_of(
        self, kind: ObjectKind, response: urllib3.BaseHTTPResponse
    ) -> Iterator[tuple[str, K8sObject]]:
        for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
            if not line:
                continue
            try:
                event = json.loads(line)
                event_type, obj = str(event["type"]), event["object"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ApiUnavailable(
                    f"watch {_plural(kind)}: unreadable event {line[:120]!r} ({exc}); rewatching"
                ) from exc
            if event_type == "ERROR":
                code = obj.get("code") if isinstance(obj, dict) else None
                message = obj.get("message", "") if isinstance(obj, dict) else str(obj)
                if code == 410:
                    raise Gone(message)
                raise ApiUnavailable(f"watch {_plural(kind)}: server error {code}: {message}")
            if event_type != "BOOKMARK" and event_type not in _WATCH_EVENTS:
                log.warning("watch %s: ignoring event type %r", _plural(kind), event_type)
                continue
            if not isinstance(obj, dict):
                raise ApiUnavailable(f"watch {_plural(kind)}: event object is not a map")
            yield event_type, obj


def _raw(response: object) -> urllib3.BaseHTTPResponse:
    """With ``_preload_content=False`` the client returns the urllib3 response, whatever
    its annotations say."""
    if not isinstance(response, urllib3.BaseHTTPResponse):
        raise TypeError(f"expected a raw urllib3 response, got {type(response).__name__}")
    return response


def _read(response: object) -> bytes:
    """The whole body of a non-streaming answer; its connection goes back to the pool
    (an unreleased ``_preload_content=False`` response would cost a new TCP connection
    per call)."""
    raw = _raw(response)
    try:
        return raw.data
    finally:
        raw.release_conn()


@dataclass(frozen=True, slots=True)
class _KindInformer:
    """One kind's list and watch, for :func:`~interference_infra.kube_watch.list_and_watch`."""

    informers: Informers
    kind: ObjectKind
    handler: ClusterHandler

    def relist(self) -> str:
        return self.informers._relist(self.kind, self.handler)

    def follow(self, resource_version: str, stop: threading.Event) -> tuple[str, int]:
        return self.informers._follow(self.kind, resource_version, self.handler, stop)


_PLURALS: dict[ObjectKind, str] = {
    "Node": "nodes",
    "Pod": "pods",
    "Namespace": "namespaces",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "PersistentVolume": "persistentvolumes",
    "StorageClass": "storageclasses",
    "CSINode": "csinodes",
    "PodDisruptionBudget": "poddisruptionbudgets",
}


def _plural(kind: ObjectKind) -> str:
    return _PLURALS[kind]


def _resource_version(obj: K8sObject) -> str:
    metadata = obj.get("metadata")
    return str(metadata.get("resourceVersion") or "") if isinstance(metadata, dict) else ""


def _watch_event(event_type: str) -> EventType:
    if event_type == "ADDED":
        return "ADDED"
    if event_type == "DELETED":
        return "DELETED"
    return "MODIFIED"


def _interrupt(response: Any) -> None:
    """Unblock a thread reading a watch response; the response may already be finished."""
    try:
        response.shutdown()
    except (ValueError, OSError, RuntimeError):  # urllib3: already released to the pool
        response.release_conn()
