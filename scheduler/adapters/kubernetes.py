"""The :class:`~scheduler.cycle.ports.Cluster` on a real API server, through the
``kubernetes`` client.

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
does: finished pods hold no resources. Unless made with ``preemption=False`` (the
extender, where kube-scheduler preempts) it also lists and watches PodDisruptionBudgets
(:data:`~scheduler.cycle.ports.PREEMPTION_KINDS`), which preemption reads. The preemption writes
themselves are in :mod:`scheduler.adapters.preemption`.

Writes:

* bind — ``POST /api/v1/namespaces/{ns}/pods/{name}/binding``;
* Events — ``events.k8s.io/v1`` (what kube-scheduler uses), named ``<pod>.<hex ns>``,
  ``reportingController`` ``interference-scheduler``, action ``Binding`` for ``Scheduled``
  and ``Scheduling`` for everything else, ``note`` truncated to the API's 1 KiB; repeats
  PATCH one series per pod and reason (``series.count``, ``series.lastObservedTime``);
* PodScheduled=False/Unschedulable — strategic-merge PATCH of ``pods/status`` (conditions
  merge by ``type``, the other conditions stay).

The three writes are the per-pod cost of scheduling, so they skip the generated client:
:class:`JsonWriter` serialises each body once with ``json.dumps`` and sends it over a
kept-alive HTTP/1.1 connection per thread (:mod:`scheduler.adapters.http11`), built
from the client's ``Configuration`` (host and path prefix, CA, client certificate, ``verify_ssl``,
``assert_hostname``, default headers such as the User-Agent, and the bearer token read
through ``get_api_key_with_prefix`` on every request so its ``refresh_api_key_hook``
still rotates expiring tokens). That costs a small part of the CPU of the generated
client's call (its per-call parameter validation, serialisation and urllib3's pool and
retry layers); a ``Configuration`` with a proxy or ``tls_server_name`` uses the client's
own urllib3 pool manager instead. Answers go through the same error mapping as the
generated client's (:class:`~kubernetes.client.exceptions.ApiException`). Lists, watches
and the Lease stay on the real client.

Every API call goes through one method of :class:`KubernetesCluster`
(``list_page``, ``open_watch``, ``bind``, ``record_event``, ``record_object_event``,
``set_unschedulable``), and
:data:`REQUIRED_PERMISSIONS` lists the RBAC rules they need, so a test can check the
deploy manifests against the calls. Client exceptions never escape: they become
:class:`~scheduler.cycle.ports.ClusterError` subclasses that say what to do.

Size: over 500 lines because it is the one client of the API server: list and watch of
eight kinds, bind, Events and the ``PodScheduled`` condition, with their error mapping.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import logging
import os
import random
import ssl
import threading
import time
import urllib.parse
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.util.wait import wait_for_read

from interference_infra.kube_watch import Backoff, Gone, list_and_watch
from scheduler.adapters.http11 import Http11Connection
from scheduler.cycle.ports import (
    INFORMED_KINDS,
    PREEMPTION_KINDS,
    ApiUnavailable,
    BindConflict,
    ClusterError,
    ClusterHandler,
    EventType,
    Forbidden,
    K8sObject,
    ObjectKind,
    PodRef,
)

log = logging.getLogger(__name__)

SCHEDULER_NAME = "interference-scheduler"
"""``reportingController`` of our Events (also the default ``schedulerName``)."""

POD_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"

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

_NOTE_MAX = 1024
_GONE_KEPT = 4096
"""Deleted pods' UIDs kept for :meth:`KubernetesCluster.wait_gone` before pruning …"""
_GONE_KEPT_S = 60.0
"""… those seen longer ago than this."""
_WATCH_EVENTS: frozenset[str] = frozenset({"ADDED", "MODIFIED", "DELETED"})


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    """How to reach and follow the API server."""

    kubeconfig: str = ""
    """Path of a kubeconfig file; empty: in-cluster service account, else ``$KUBECONFIG``
    or ``~/.kube/config``."""
    context: str = ""
    """kubeconfig context; empty: the file's current context."""
    page_size: int = 500
    """Objects per list page (``limit``)."""
    watch_timeout_s: int = 300
    """Server-side watch timeout; each watch asks for a random value in [t, 2t) like client-go."""
    request_timeout_s: float = 30.0
    """Client-side timeout of non-watch calls (and of connecting)."""
    backoff_initial_s: float = 0.5
    """First retry delay after a 429/5xx/connection error; doubles per failure."""
    backoff_max_s: float = 30.0
    """Cap of the retry delay."""

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size: {self.page_size!r} must be an integer ≥ 1, e.g. 500")
        if self.watch_timeout_s < 1:
            raise ValueError(f"watch_timeout_s: {self.watch_timeout_s!r} must be an integer ≥ 1")
        for name in ("request_timeout_s", "backoff_initial_s", "backoff_max_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be a number > 0")


class _RetryLater(ApiUnavailable):
    """429/503 with a ``Retry-After`` header."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def make_api_client(kubeconfig: str = "", context: str = "") -> client.ApiClient:
    """An ApiClient from a kubeconfig path, the in-cluster service account, or the default
    kubeconfig; :class:`ClusterError` saying which sources were tried."""
    try:
        if kubeconfig:
            return _new_client(kubeconfig, context)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        return _new_client(None, context)
    except (ConfigException, OSError, TypeError, ValueError) as exc:
        raise ClusterError(
            f"no usable Kubernetes credentials ({exc}); pass --kubeconfig FILE, set KUBECONFIG,"
            " or run in a pod with a service account"
        ) from exc


def _new_client(kubeconfig: str | None, context: str) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=context or None
    )
    return api


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


def translate_error(exc: Exception, verb: str, resource: str, host: str) -> ClusterError:
    """A client exception as one of our errors, naming the call and the fix."""
    if isinstance(exc, ClusterError):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        detail = _status_message(exc.body) or exc.reason or ""
        what = f"{verb} {resource}"
        if status in (401, 403):
            return Forbidden(
                f"the API server refused {what} (HTTP {status}: {detail}); grant the scheduler's"
                f" ServiceAccount verb '{verb}' on '{resource}' in its ClusterRole"
                " (deploy/base/rbac.yaml)"
            )
        if status == 410:
            return ClusterError(f"{what}: 410 Gone ({detail})")
        if status == 429 or status >= 500:
            message = f"{what}: the API server answered HTTP {status} ({detail}); retrying"
            retry_after = _retry_after(exc)
            if retry_after is not None:
                return _RetryLater(message, retry_after)
            return ApiUnavailable(message)
        return ClusterError(f"{what} failed with HTTP {status}: {detail}")
    if isinstance(exc, ssl.SSLError | urllib3.exceptions.SSLError):
        return ApiUnavailable(
            f"TLS with the API server at {host} failed for {verb} {resource} ({exc}); check the"
            " kubeconfig's certificate-authority and client certificate"
        )
    if isinstance(exc, urllib3.exceptions.HTTPError | http.client.HTTPException | OSError):
        return ApiUnavailable(
            f"cannot reach the API server at {host} for {verb} {resource} ({exc}); check the"
            " kubeconfig server address and that the API server is up"
        )
    return ClusterError(f"{verb} {resource}: unexpected client error {exc!r}")


def _status_message(body: Any) -> str:
    if not body:
        return ""
    try:
        parsed = json.loads(body)
        return str(parsed.get("message", "")) if isinstance(parsed, dict) else ""
    except (ValueError, TypeError):
        return str(body)[:200]


def _retry_after(exc: ApiException) -> float | None:
    headers = exc.headers or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class JsonWriter:
    """Sends small pre-serialised JSON writes to the API server (see the module docstring).

    :meth:`send` is thread-safe: each thread keeps its own kept-alive connection. A
    connection the server has closed while idle is noticed before reuse (the socket is
    readable at EOF) and replaced, so no request is ever sent twice.
    """

    def __init__(self, api_client: client.ApiClient, timeout_s: float) -> None:
        configuration = api_client.configuration
        self._configuration = configuration
        self._timeout_s = timeout_s
        self._base = str(configuration.host).rstrip("/")
        url = urllib.parse.urlsplit(self._base)
        self._https = url.scheme == "https"
        self._hostname = url.hostname or "localhost"
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path
        self._headers: dict[str, str] = {
            **{str(k): str(v) for k, v in api_client.default_headers.items()},
            "Accept": "application/json",
        }
        self._pool: urllib3.PoolManager | None = None
        self._ssl: ssl.SSLContext | None = None
        if configuration.proxy or configuration.tls_server_name:
            self._pool = api_client.rest_client.pool_manager
        elif self._https:
            self._ssl = ssl_context(configuration)
        self._local = threading.local()

    def send(self, method: str, path: str, body: bytes, content_type: str) -> None:
        """``method`` ``path`` (below the host's path prefix) with a JSON ``body``.

        Raises :class:`~kubernetes.client.exceptions.ApiException` for a non-2xx answer
        and ``OSError``/``http.client.HTTPException``/``urllib3`` errors when the server
        cannot be reached or breaks the connection (nothing is retried here: the caller's
        backoff decides).
        """
        headers = dict(self._headers)
        headers["Content-Type"] = content_type
        token = self._configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        if self._pool is not None:
            answer = self._pool.urlopen(
                method,
                self._base + path,
                body=body,
                headers=headers,
                retries=False,
                timeout=urllib3.Timeout(total=self._timeout_s),
            )
            status, reason, data = answer.status, answer.reason, answer.data
            response_headers: Any = answer.headers
        else:
            status, reason, data, response_headers = self._send_direct(
                method, self._prefix + path, body, headers
            )
        if not 200 <= status < 300:
            error = ApiException(status=status, reason=reason or "")
            error.body = data.decode("utf-8", "replace")
            error.headers = response_headers
            raise error

    def _send_direct(
        self, method: str, target: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, str, bytes, dict[str, str]]:
        connection = self._connection()
        try:
            answer = connection.exchange(method, target, headers, body)
        except BaseException:
            connection.close()
            self._local.connection = None
            raise
        if answer.will_close:
            connection.close()
            self._local.connection = None
        return answer.status, answer.reason, answer.body, answer.headers

    def _connection(self) -> Http11Connection:
        connection: Http11Connection | None = getattr(self._local, "connection", None)
        if connection is not None and wait_for_read(connection.sock, timeout=0.0):
            connection.close()  # closed by the server while idle
            # Forget it before reconnecting: if the server is down the new connection
            # fails, and this thread must not be left holding a closed socket.
            self._local.connection = connection = None
        if connection is None:
            connection = Http11Connection(
                self._hostname, self._port, self._timeout_s, self._ssl if self._https else None
            )
            self._local.connection = connection
        return connection


def ssl_context(configuration: client.Configuration) -> ssl.SSLContext:
    """The TLS settings of a client ``Configuration`` as an ``ssl`` context."""
    context = ssl.create_default_context(
        cafile=configuration.ssl_ca_cert or None, cadata=configuration.ca_cert_data or None
    )
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif configuration.assert_hostname is False:
        context.check_hostname = False
    return context


def _json(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _path_part(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _micro_time(now: float) -> str:
    """RFC 3339 with microseconds (``MicroTime``), UTC."""
    stamp = dt.datetime.fromtimestamp(now, tz=dt.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
    return {"count": series.count, "lastObservedTime": _micro_time(series.last_at)}


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
        self._core = client.CoreV1Api(api_client)
        self._storage = client.StorageV1Api(api_client)
        self._policy = client.PolicyV1Api(api_client)
        self._writer = JsonWriter(api_client, self.settings.request_timeout_s)
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._open_watches: set[urllib3.response.BaseHTTPResponse] = set()
        self._synced: dict[ObjectKind, bool] = {kind: False for kind in INFORMED_KINDS}
        self._series: dict[tuple[str, ...], _EventSeries] = {}
        """Event series by (namespace, pod, uid, reason, action, type)."""
        self._series_swept_at = 0.0
        self._gone = threading.Condition(threading.Lock())
        self._gone_uids: dict[str, float] = {}
        """UID → when the pod watch's DELETED for it was handed to the handler (recent
        ones only): :meth:`wait_gone` waits on it."""

    # --- the API calls (each one needs a rule in REQUIRED_PERMISSIONS) ---

    @property
    def writer(self) -> JsonWriter:
        """The kept-alive JSON writer (shared with :mod:`scheduler.adapters.preemption`)."""
        return self._writer

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
                raise Gone(_status_message(exc.body)) from exc
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
                raise Gone(_status_message(exc.body)) from exc
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
        path = f"/api/v1/namespaces/{_path_part(pod.namespace)}/pods/{_path_part(pod.name)}/binding"
        try:
            self._writer.send("POST", path, _json(body), "application/json")
        except ApiException as exc:
            if exc.status in (404, 409):
                raise BindConflict(
                    f"pod {pod.namespace}/{pod.name} cannot be bound to {node}:"
                    f" {_status_message(exc.body) or exc.reason}"
                ) from exc
            raise translate_error(exc, "create", "pods/binding", self.host) from exc
        except Exception as exc:
            raise translate_error(exc, "create", "pods/binding", self.host) from exc

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
            "eventTime": _micro_time(series.first_at),
            "reportingController": SCHEDULER_NAME,
            "reportingInstance": self.identity[:128],
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
        path = f"/apis/events.k8s.io/v1/namespaces/{_path_part(pod.namespace)}/events"
        try:
            self._writer.send("POST", path, _json(body), "application/json")
        except Exception as exc:
            raise translate_error(exc, "create", "events.k8s.io/events", self.host) from exc
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
            "eventTime": _micro_time(now),
            "reportingController": SCHEDULER_NAME,
            "reportingInstance": self.identity[:128],
            "action": action,
            "reason": reason,
            "note": message[:_NOTE_MAX],
            "type": event_type,
            "regarding": {"apiVersion": "v1", "kind": kind, "namespace": namespace, "name": name},
        }
        path = f"/apis/events.k8s.io/v1/namespaces/{_path_part(namespace)}/events"
        try:
            self._writer.send("POST", path, _json(body), "application/json")
        except Exception as exc:
            raise translate_error(exc, "create", "events.k8s.io/events", self.host) from exc

    def _patch_series(self, pod: PodRef, series: _EventSeries) -> None:
        path = (
            f"/apis/events.k8s.io/v1/namespaces/{_path_part(pod.namespace)}"
            f"/events/{_path_part(series.name)}"
        )
        body = {"series": _series_body(series)}
        try:
            self._writer.send("PATCH", path, _json(body), "application/merge-patch+json")
        except ApiException as exc:
            if exc.status == 404:
                raise _EventGone() from exc
            raise translate_error(exc, "patch", "events.k8s.io/events", self.host) from exc
        except Exception as exc:
            raise translate_error(exc, "patch", "events.k8s.io/events", self.host) from exc
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

    def set_unschedulable(self, pod: PodRef, message: str) -> None:
        """PodScheduled=False, reason Unschedulable, via a strategic-merge PATCH of pods/status."""
        body = {"status": {"conditions": [unschedulable_condition(message)]}}
        path = f"/api/v1/namespaces/{_path_part(pod.namespace)}/pods/{_path_part(pod.name)}/status"
        try:
            self._writer.send("PATCH", path, _json(body), "application/strategic-merge-patch+json")
        except Exception as exc:
            raise translate_error(exc, "patch", "pods/status", self.host) from exc

    # --- informers ---

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

    def run_informers(self, handler: ClusterHandler, stop: threading.Event) -> None:
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


@dataclass(frozen=True, slots=True)
class _KindInformer:
    """One kind's list and watch, for :func:`~interference_infra.kube_watch.list_and_watch`."""

    cluster: KubernetesCluster
    kind: ObjectKind
    handler: ClusterHandler

    def relist(self) -> str:
        return self.cluster._relist(self.kind, self.handler)

    def follow(self, resource_version: str, stop: threading.Event) -> tuple[str, int]:
        return self.cluster._follow(self.kind, resource_version, self.handler, stop)


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
