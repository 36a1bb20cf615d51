"""A stateful Kubernetes API emulator on top of kmock, for adapter tests over real HTTP.

kmock provides the aiohttp server, request recording, discovery and ``Status`` error
rendering (``kmock.KubernetesScaffold``). kmock's own ``KubernetesEmulator`` ignores
resourceVersions, subresources and PUT, which are exactly what the scheduler's adapter
must get right, so this subclass implements the calls the scheduler makes the way the
real API server answers them:

- list (``limit``/``continue``, field selectors ``a=b``/``a!=b``) with a resourceVersion;
  watch from a resourceVersion replaying the history after it, ``ERROR`` 410 Gone for a
  compacted one, DELETED/ADDED when an object leaves/enters the field selector;
- ``pods/binding`` (404 missing pod, 409 already bound, sets ``spec.nodeName`` and
  PodScheduled=True like the real registry), ``pods/status`` strategic-merge/merge PATCH
  (conditions merged by ``type``), ``events.k8s.io/v1`` Events, ``coordination.k8s.io/v1``
  Leases with optimistic concurrency (409 on a stale resourceVersion);
- cluster-scoped Namespaces (list and watch; kmock's path parser is patched for them);
- PersistentVolumeClaims, PersistentVolumes, StorageClasses, CSINodes and
  PodDisruptionBudgets (list and watch);
- DELETE of a named object (immediate, as for a pod no kubelet holds), honouring a UID
  precondition (409 on a mismatch);
- fault injection (``fail``) and closing every open watch (``drop_watches``).

Tests drive it from their own thread through :class:`EmulatorThread`.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import re
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp.web
import kmock
from kmock import KubernetesError, KubernetesScaffold, Request
from kmock._internal import parsing

from tests.builders import pod_obj

Obj = dict[str, Any]
Key = tuple[str, str, str]  # (resource plural, namespace or "", name)
T = TypeVar("T")

_STREAM_END = object()
_kmock_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    """kmock's path parser, except for the cluster-scoped ``/api/v1/namespaces[/name]``,
    which kmock reads as a namespace prefix with no resource after it."""
    parts = path.strip("/").split("/")
    if parts[:1] == ["api"] and len(parts) in (3, 4) and parts[2] == "namespaces":
        name = parts[3] if len(parts) == 4 else None
        return parsing.ParsedPath("", parts[1], "namespaces", None, name, None)
    return _kmock_parse_path(path)


parsing.parse_path = _parse_path


@dataclass
class _Fault:
    method: str
    path: re.Pattern[str]
    status: int
    remaining: int
    retry_after: int | None = None


@dataclass
class _Watcher:
    plural: str
    namespace: str | None
    selector: list[tuple[str, str, str]]
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)


def _field(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part, {}) if isinstance(value, dict) else {}
    return value if isinstance(value, str) else ""


def _parse_selector(text: str) -> list[tuple[str, str, str]]:
    terms = []
    for term in filter(None, text.split(",")):
        op = "!=" if "!=" in term else "="
        name, value = term.split(op, 1)
        terms.append((name.strip(), op, value.strip()))
    return terms


def _matches(obj: Obj, selector: list[tuple[str, str, str]]) -> bool:
    return all((_field(obj, name) == value) == (op == "=") for name, op, value in selector)


def _merge(target: Obj, patch: Obj, strategic: bool) -> None:
    """RFC 7386 merge patch; with ``strategic``, ``conditions`` lists merge by ``type``."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif strategic and key == "conditions" and isinstance(value, list):
            by_type = {c.get("type"): c for c in target.get(key, [])}
            for condition in value:
                by_type[condition.get("type")] = {
                    **by_type.get(condition.get("type"), {}),
                    **condition,
                }
            target[key] = list(by_type.values())
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value, strategic)
        else:
            target[key] = copy.deepcopy(value)


class ApiServerEmulator(KubernetesScaffold):
    """The API calls the scheduler makes, answered as the real API server does."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.objects: dict[Key, Obj] = {}
        self.resource_version = 100
        self.compacted_below = 0
        """Watches and continues from a resourceVersion below this get 410 Gone."""
        self.history: list[tuple[int, str, str, Obj, Obj | None]] = []
        """(rv, plural, event type, object, object before) per change."""
        self.watchers: list[_Watcher] = []
        self.faults: list[_Fault] = []
        self.names = itertools.count(1)

    # --- state changes (run on the emulator's loop) ---

    def put_object(self, plural: str, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        key = (plural, meta.get("namespace", ""), meta["name"])
        before = self.objects.get(key)
        self.resource_version += 1
        meta["resourceVersion"] = str(self.resource_version)
        meta.setdefault("uid", f"uid-{meta['name']}-{self.resource_version}")
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        self.objects[key] = obj
        self._publish(plural, "MODIFIED" if before else "ADDED", obj, before)
        return obj

    def delete_object(self, plural: str, namespace: str, name: str) -> None:
        obj = self.objects.pop((plural, namespace, name))
        self.resource_version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        self._publish(plural, "DELETED", obj, obj)

    def compact(self) -> None:
        """An unrelated write, then etcd compaction: every resourceVersion handed out so far
        answers 410 Gone to watches and continues; new lists get a valid one."""
        self.resource_version += 1
        self.compacted_below = self.resource_version
        self.history.clear()

    def drop_watches(self) -> None:
        for watcher in self.watchers:
            watcher.queue.put_nowait(_STREAM_END)

    def emit(self, plural: str, event: Obj) -> None:
        """Send a raw watch event (``BOOKMARK``, ``ERROR``) to every open watch of ``plural``."""
        for watcher in self.watchers:
            if watcher.plural == plural:
                watcher.queue.put_nowait(event)

    def bookmark(self, plural: str) -> str:
        """An unrelated write elsewhere, announced by a BOOKMARK; returns its resourceVersion."""
        self.resource_version += 1
        rv = str(self.resource_version)
        self.emit(plural, {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}})
        return rv

    def _publish(self, plural: str, kind: str, obj: Obj, before: Obj | None) -> None:
        snapshot = copy.deepcopy(obj)
        self.history.append((self.resource_version, plural, kind, snapshot, before))
        for watcher in self.watchers:
            if watcher.plural == plural:
                event = self._event_for(watcher, kind, snapshot, before)
                if event is not None:
                    watcher.queue.put_nowait(event)

    @staticmethod
    def _event_for(watcher: _Watcher, kind: str, obj: Obj, before: Obj | None) -> Obj | None:
        if watcher.namespace and obj["metadata"].get("namespace") != watcher.namespace:
            return None
        now = _matches(obj, watcher.selector) and kind != "DELETED"
        was = before is not None and _matches(before, watcher.selector)
        if now:
            return {"type": "MODIFIED" if was else "ADDED", "object": obj}
        if was:
            return {"type": "DELETED", "object": obj}
        return None

    # --- HTTP ---

    async def _handle(self, request: Request) -> aiohttp.web.StreamResponse:
        method = str(request.method.value).upper()
        for fault in self.faults:
            if (
                fault.remaining
                and fault.method == method
                and fault.path.search(request.url.path_qs)
            ):
                fault.remaining -= 1
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after else {}
                return aiohttp.web.json_response(
                    _status(fault.status, "Injected", f"injected HTTP {fault.status}"),
                    status=fault.status,
                    headers=headers,
                )
        resource = request.resource
        if resource is None or resource.plural not in _HANDLED:
            return await super()._handle(request)
        plural = str(resource.plural)
        if request.subresource == "binding" and method == "POST":
            return _json(self._bind(request), status=201)
        if request.subresource == "status" and method == "PATCH":
            return _json(self._patch_status(request))
        if request.name is None and method == "GET":
            if request.params.get("watch") in ("true", "1"):
                return await self._watch(request, plural)
            return _json(self._list(request, plural))
        if request.name is None and method == "POST":
            return _json(self._create(request, plural), status=201)
        if method == "GET":
            return _json(copy.deepcopy(self._get(plural, request)))
        if method == "PUT":
            return _json(self._replace(request, plural))
        if method == "PATCH" and plural == "events":
            return _json(self._patch_event(request))
        if method == "DELETE":
            return _json(self._delete(request, plural))
        raise KubernetesError(405, "MethodNotAllowed", f"{method} {request.url.path}")

    def _get(self, plural: str, request: Request) -> Obj:
        key = (plural, request.namespace or "", request.name or "")
        if key not in self.objects:
            raise KubernetesError(404, "NotFound", f'{plural} "{request.name}" not found')
        return self.objects[key]

    def _list(self, request: Request, plural: str) -> Obj:
        selector = _parse_selector(request.params.get("fieldSelector", ""))
        items = [
            obj
            for (p, ns, _), obj in sorted(self.objects.items())
            if p == plural
            and (request.namespace is None or ns == request.namespace)
            and _matches(obj, selector)
        ]
        list_rv, offset = self.resource_version, 0
        token = request.params.get("continue")
        if token:
            list_rv, offset = (int(x) for x in token.split(":"))
            if list_rv < self.compacted_below:
                raise KubernetesError(410, "Expired", "the continue token has expired")
        limit = int(request.params.get("limit", "0")) or len(items)
        page = items[offset : offset + limit]
        meta: Obj = {"resourceVersion": str(list_rv)}
        if offset + limit < len(items):
            meta["continue"] = f"{list_rv}:{offset + limit}"
        return {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": page}

    async def _watch(self, request: Request, plural: str) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        since = int(request.params.get("resourceVersion") or "0")
        watcher = _Watcher(
            plural, request.namespace, _parse_selector(request.params.get("fieldSelector", ""))
        )
        if since and since < self.compacted_below:
            gone = _status(410, "Expired", f"too old resource version: {since}")
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response
        for rv, p, kind, obj, before in self.history:
            if p == plural and rv > since:
                event = self._event_for(watcher, kind, obj, before)
                if event is not None:
                    watcher.queue.put_nowait(event)
        self.watchers.append(watcher)
        timeout = float(request.params.get("timeoutSeconds") or 3600)
        try:
            while True:
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), timeout)
                except TimeoutError:
                    break
                if event is _STREAM_END:
                    break
                await response.write(json.dumps(event).encode() + b"\n")
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self.watchers.remove(watcher)
        return response

    def _bind(self, request: Request) -> Obj:
        pod = self._get("pods", request)
        body = request.data or {}
        if body.get("kind") != "Binding" or not body.get("target", {}).get("name"):
            raise KubernetesError(400, "BadRequest", "body must be a Binding with a target")
        if pod["spec"].get("nodeName"):
            raise KubernetesError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{request.name}": pod '
                f'{request.name} is already assigned to node "{pod["spec"]["nodeName"]}"',
            )
        updated = copy.deepcopy(pod)
        updated["spec"]["nodeName"] = body["target"]["name"]
        _merge(
            updated.setdefault("status", {}),
            {"conditions": [{"type": "PodScheduled", "status": "True"}]},
            strategic=True,
        )
        self.put_object("pods", updated)
        return _status(201, "", "")  # the real server answers 201 with a Status of success

    def _patch_status(self, request: Request) -> Obj:
        pod = copy.deepcopy(self._get("pods", request))
        content_type = request.headers.get("Content-Type", "")
        if "merge-patch" not in content_type:
            raise KubernetesError(415, "UnsupportedMediaType", f"content type {content_type}")
        patch = request.data or {}
        _merge(pod.setdefault("status", {}), patch.get("status", {}), "strategic" in content_type)
        return copy.deepcopy(self.put_object("pods", pod))

    def _create(self, request: Request, plural: str) -> Obj:
        obj = copy.deepcopy(request.data or {})
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", request.namespace or "")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self.names):05d}"
        if not _DNS_SUBDOMAIN.fullmatch(meta.get("name", "")):
            # As the real registry: e.g. a generateName ending in "." is refused.
            raise KubernetesError(
                422, "Invalid", f'metadata.name: Invalid value: "{meta.get("name", "")}"'
            )
        if (plural, meta["namespace"], meta.get("name", "")) in self.objects:
            raise KubernetesError(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
        return copy.deepcopy(self.put_object(plural, obj))

    def _delete(self, request: Request, plural: str) -> Obj:
        current = copy.deepcopy(self._get(plural, request))
        wanted = ((request.data or {}).get("preconditions") or {}).get("uid")
        if wanted and wanted != current["metadata"]["uid"]:
            raise KubernetesError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {wanted}, UID in object meta:"
                f" {current['metadata']['uid']}",
            )
        self.delete_object(plural, request.namespace or "", request.name or "")
        return current

    def _patch_event(self, request: Request) -> Obj:
        event = copy.deepcopy(self._get("events", request))
        content_type = request.headers.get("Content-Type", "")
        if "merge-patch" not in content_type:
            raise KubernetesError(415, "UnsupportedMediaType", f"content type {content_type}")
        _merge(event, request.data or {}, False)
        return copy.deepcopy(self.put_object("events", event))

    def _replace(self, request: Request, plural: str) -> Obj:
        current = self._get(plural, request)
        obj = copy.deepcopy(request.data or {})
        sent_rv = obj.get("metadata", {}).get("resourceVersion")
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            raise KubernetesError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {plural} "{request.name}": the object has'
                " been modified; please apply your changes to the latest version and try again",
            )
        obj["metadata"]["uid"] = current["metadata"]["uid"]
        return copy.deepcopy(self.put_object(plural, obj))


_HANDLED = {
    "pods",
    "nodes",
    "namespaces",
    "persistentvolumeclaims",
    "persistentvolumes",
    "storageclasses",
    "csinodes",
    "poddisruptionbudgets",
    "events",
    "leases",
    "configmaps",
}
_DNS_SUBDOMAIN = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


def _status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


def _json(body: Obj, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.json_response(body, status=status)


class EmulatorThread:
    """Runs an :class:`ApiServerEmulator` on 127.0.0.1 in a thread with its own event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.emulator: ApiServerEmulator | None = None
        self.url = ""
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="k8s-emulator", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        async with ApiServerEmulator() as emulator, kmock.Server(emulator) as server:
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stopped.wait()
            emulator.drop_watches()
            await asyncio.sleep(0.05)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the Kubernetes API emulator did not start")

    def stop(self) -> None:
        assert self._stopped is not None
        self.loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(30)

    def call(self, fn: Callable[[ApiServerEmulator], T]) -> T:
        """Run ``fn(emulator)`` on the emulator's loop and return its result."""

        async def run() -> T:
            assert self.emulator is not None
            return fn(self.emulator)

        coro: Coroutine[Any, Any, T] = run()
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    # --- conveniences for tests ---

    def put(self, plural: str, obj: Obj) -> Obj:
        return self.call(lambda e: copy.deepcopy(e.put_object(plural, copy.deepcopy(obj))))

    def delete(self, plural: str, namespace: str, name: str) -> None:
        self.call(lambda e: e.delete_object(plural, namespace, name))

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        return self.call(lambda e: copy.deepcopy(e.objects.get((plural, namespace, name))))

    def all(self, plural: str) -> list[Obj]:
        return self.call(
            lambda e: [copy.deepcopy(o) for (p, _, _), o in e.objects.items() if p == plural]
        )

    def compact(self) -> None:
        self.call(lambda e: e.compact())

    def drop_watches(self) -> None:
        self.call(lambda e: e.drop_watches())

    def bookmark(self, plural: str) -> str:
        return self.call(lambda e: e.bookmark(plural))

    def emit(self, plural: str, event: Obj) -> None:
        self.call(lambda e: e.emit(plural, event))

    def fail(
        self, method: str, path: str, status: int, times: int = 1, retry_after: int | None = None
    ) -> None:
        """The next ``times`` requests ``method`` whose path and query match ``path`` get
        ``status``."""
        fault = _Fault(method.upper(), re.compile(path), status, times, retry_after)
        self.call(lambda e: e.faults.append(fault))

    def requests(self) -> list[tuple[str, str, dict[str, str], Any]]:
        """(method, path, query, JSON body) of every request served so far."""
        return self.call(
            lambda e: [
                (str(r.method.value).upper(), r.url.path, dict(r.params), copy.deepcopy(r.data))
                for r in e._requests
            ]
        )

    def user_agents(self, path: str) -> list[str]:
        """User-Agent of every request whose path matches ``path``, in order."""
        pattern = re.compile(path)
        return self.call(
            lambda e: [
                r.headers.get("User-Agent", "") for r in e._requests if pattern.search(r.url.path)
            ]
        )

    def watch_count(self, plural: str) -> int:
        return self.call(lambda e: sum(1 for w in e.watchers if w.plural == plural))


def rbac_rule(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str]:
    """(apiGroup, resource[/subresource], verb) of a request, as the API server authorises it."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {
        "GET": "watch" if query.get("watch") == "true" else ("get" if named else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete",
    }[method]
    return group, resource, verb


def observed_rbac_rules(server: EmulatorThread) -> set[tuple[str, str, str]]:
    """The RBAC rules every request served so far needed (for checking a ClusterRole)."""
    return {rbac_rule(method, path, query) for method, path, query, _ in server.requests()}


@contextmanager
def running_emulator() -> Iterator[EmulatorThread]:
    server = EmulatorThread()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def pod(name: str, namespace: str = "default", node: str = "", phase: str = "Pending") -> Obj:
    """A pod for the interference scheduler as a client creates it: tests/builders.py's,
    without the uid and creation time the API server assigns (:meth:`put_object`)."""
    obj = pod_obj(name, namespace, nodeName=node, phase=phase)
    del obj["metadata"]["uid"], obj["metadata"]["creationTimestamp"]
    return obj
