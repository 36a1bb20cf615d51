"""``events.k8s.io/v1`` Events as kube-scheduler writes them: named ``<pod>.<hex ns>``,
``reportingController`` ``interference-scheduler``, action ``Binding`` for ``Scheduled``
and ``Scheduling`` for everything else, ``note`` truncated to the API's 1 KiB; repeats
PATCH one series per pod and reason (``series.count``, ``series.lastObservedTime``)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from scheduler.adapters.api_errors import translate_error
from scheduler.adapters.json_writer import JsonWriter, json_body, path_part
from scheduler.cycle.ports import PodRef

SCHEDULER_NAME = "interference-scheduler"
"""``reportingController`` of our Events (also the default ``schedulerName``)."""

_NOTE_MAX = 1024

SERIES_PATCH_INTERVAL_S = 30.0
"""Shortest time between two writes of one Event series after its second occurrence."""
SERIES_FORGET_AFTER_S = 360.0
"""A series not seen for this long is forgotten; the next occurrence starts a new Event
(client-go's events broadcaster uses the same 6 minutes)."""
_NAME_MAX = 253


def event_name(pod_name: str, now_ns: int) -> str:
    """kube-scheduler's Event name ``<pod>.<hex nanoseconds>``, the pod part shortened so
    the whole stays a valid DNS subdomain (at most 253 characters)."""
    suffix = f".{now_ns:x}"
    return pod_name[: _NAME_MAX - len(suffix)].rstrip(".-") + suffix


@dataclass(slots=True)
class _EventSeries:
    """One (pod, reason) Event and its repeats."""

    first_at: float
    count: int = 0
    last_at: float = 0.0
    name: str = ""
    """The Event's name once created."""
    written_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Serialises the writes of this series (a create must finish before its PATCH)."""


class _EventGone(Exception):
    """The Event of a series no longer exists (404)."""


def _series_body(series: _EventSeries) -> dict[str, Any]:
    return {"count": series.count, "lastObservedTime": micro_time(series.last_at)}


def micro_time(now: float) -> str:
    """RFC 3339 with microseconds (``MicroTime``), UTC."""
    stamp = dt.datetime.fromtimestamp(now, tz=dt.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventRecorder:
    """Writes the scheduler's Events through the kept-alive :class:`JsonWriter`."""

    def __init__(self, writer: JsonWriter, identity: str, host: str) -> None:
        """``identity``: ``reportingInstance`` of the Events; ``host``: the API server's
        address, for error messages."""
        self._writer = writer
        self._identity = identity
        self._host = host
        self._lock = threading.Lock()
        self._series: dict[tuple[str, ...], _EventSeries] = {}
        """Event series by (namespace, pod, uid, reason, action, type)."""
        self._series_swept_at = 0.0

    def record_event(self, pod: PodRef, event_type: str, reason: str, message: str) -> None:
        """An ``events.k8s.io/v1`` Event about the pod, in kube-scheduler's style.

        Repeats are one series, as client-go's events broadcaster does: the first
        occurrence of (pod, reason, action) is created as ``<pod>.<hex nanoseconds>``;
        the next ones PATCH that Event's ``series`` (``count``, ``lastObservedTime``) —
        at once for the second, then at most every :data:`SERIES_PATCH_INTERVAL_S`
        (the latest count goes out with the next repeat). The note of a series is the
        first occurrence's (the API keeps it immutable).
        """
        action = "Binding" if reason == "Scheduled" else "Scheduling"
        key = (pod.namespace, pod.name, pod.uid, reason, action, event_type)
        now = time.time()
        with self._lock:
            self._expire_series(now)
            series = self._series.get(key)
            if series is None:
                series = _EventSeries(first_at=now)
                self._series[key] = series
        with series.lock:
            series.count += 1
            series.last_at = now
            if (
                series.name
                and series.count > 2
                and now - series.written_at < SERIES_PATCH_INTERVAL_S
            ):
                return  # counted; written with the next repeat after the interval
            if series.name:
                try:
                    self._patch_series(pod, series)
                    return
                except _EventGone:
                    series.name = ""  # expired (Events live 1 h by default): start anew
            self._create_event(pod, event_type, reason, action, message, series)

    def _create_event(
        self,
        pod: PodRef,
        event_type: str,
        reason: str,
        action: str,
        message: str,
        series: _EventSeries,
    ) -> None:
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": event_name(pod.name, time.time_ns()), "namespace": pod.namespace},
            "eventTime": micro_time(series.first_at),
            "reportingController": SCHEDULER_NAME,
            "reportingInstance": self._identity[:128],
            "action": action,
            "reason": reason,
            "note": message[:_NOTE_MAX],
            "type": event_type,
            "regarding": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": pod.namespace,
                "name": pod.name,
                "uid": pod.uid,
            },
        }
        if series.count > 1:
            body["series"] = _series_body(series)
        path = f"/apis/events.k8s.io/v1/namespaces/{path_part(pod.namespace)}/events"
        try:
            self._writer.send("POST", path, json_body(body), "application/json")
        except Exception as exc:
            raise translate_error(exc, "create", "events.k8s.io/events", self._host) from exc
        series.name = body["metadata"]["name"]
        series.written_at = time.time()

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
        """An ``events.k8s.io/v1`` Event about a core (``v1``) object other than a pod,
        e.g. the ConfigMap a reload read; one Event per call (these are rare, no series)."""
        now = time.time()
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": event_name(name, time.time_ns()), "namespace": namespace},
            "eventTime": micro_time(now),
            "reportingController": SCHEDULER_NAME,
            "reportingInstance": self._identity[:128],
            "action": action,
            "reason": reason,
            "note": message[:_NOTE_MAX],
            "type": event_type,
            "regarding": {"apiVersion": "v1", "kind": kind, "namespace": namespace, "name": name},
        }
        path = f"/apis/events.k8s.io/v1/namespaces/{path_part(namespace)}/events"
        try:
            self._writer.send("POST", path, json_body(body), "application/json")
        except Exception as exc:
            raise translate_error(exc, "create", "events.k8s.io/events", self._host) from exc

    def _patch_series(self, pod: PodRef, series: _EventSeries) -> None:
        path = (
            f"/apis/events.k8s.io/v1/namespaces/{path_part(pod.namespace)}"
            f"/events/{path_part(series.name)}"
        )
        body = {"series": _series_body(series)}
        try:
            self._writer.send("PATCH", path, json_body(body), "application/merge-patch+json")
        except ApiException as exc:
            if exc.status == 404:
                raise _EventGone() from exc
            raise translate_error(exc, "patch", "events.k8s.io/events", self._host) from exc
        except Exception as exc:
            raise translate_error(exc, "patch", "events.k8s.io/events", self._host) from exc
        series.written_at = time.time()

    def _expire_series(self, now: float) -> None:
        """Forget series not seen for :data:`SERIES_FORGET_AFTER_S` (caller holds the lock);
        swept at most once a minute."""
        if now - self._series_swept_at < 60.0:
            return
        self._series_swept_at = now
        horizon = now - SERIES_FORGET_AFTER_S
        for key in [k for k, s in self._series.items() if s.last_at < horizon]:
            del self._series[key]
