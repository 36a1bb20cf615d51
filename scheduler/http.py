"""``/healthz``, ``/readyz`` and ``/metrics`` on a stdlib ``ThreadingHTTPServer``.

Default port 10251: kube-scheduler's former plain-HTTP health/metrics port (it now
serves HTTPS on 10259), so this plain-HTTP endpoint neither clashes with a
kube-scheduler on the same host nor pretends to be TLS.

* ``/healthz`` — 200 while the process is alive and no watched loop is wedged: every
  :class:`Heartbeat` has beaten within its ``max_silence_s`` and every essential thread
  is alive; 500 names the culprit.
  Point the liveness probe here.
* ``/readyz`` — 200 when the cluster cache has synced and the configuration file is
  valid; the body says ``leader`` or ``follower`` (both are ready: a follower is a
  healthy standby). 503 lists what is missing. Point the readiness probe here.
* ``/metrics`` — the Prometheus registry passed in.
* ``POST`` routes given by the caller (extender mode's ``/filter`` and ``/prioritize``):
  each handler takes the request body and returns status, body and content type.

HTTP/1.1 with keep-alive, so a caller that posts many requests (kube-scheduler calling an
extender) reuses its connection.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

DEFAULT_PORT = 10251
MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest POST body accepted (an extender request without ``nodeCacheCapable`` carries
every Node object)."""

PostRoute = Callable[[bytes], tuple[int, bytes, str]]
"""A POST handler: request body → (status, body, content type)."""


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Where the health and metrics endpoints listen."""

    port: int = DEFAULT_PORT
    """TCP port of /healthz, /readyz and /metrics (0: any free port, for tests)."""
    host: str = "0.0.0.0"
    """Address to bind; 0.0.0.0 so the kubelet and Prometheus can reach the pod."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port!r} must be an integer in 0–65535, e.g. 10251")
        if not self.host:
            raise ValueError("host: must not be empty, e.g. 0.0.0.0")


class Heartbeat:
    """A loop calls :meth:`beat` each iteration, or publishes the ``clock`` time of its
    last iteration for ``last_beat`` to read; silent for longer than ``max_silence_s``
    means wedged."""

    def __init__(
        self,
        name: str,
        max_silence_s: float,
        clock: Callable[[], float] = time.monotonic,
        last_beat: Callable[[], float] | None = None,
    ):
        self.name = name
        self.max_silence_s = max_silence_s
        self._clock = clock
        self._last = clock()
        self._last_beat = last_beat

    def beat(self) -> None:
        self._last = self._clock()

    def silence_s(self) -> float:
        last = self._last if self._last_beat is None else self._last_beat()
        return self._clock() - last

    def alive(self) -> bool:
        return self.silence_s() <= self.max_silence_s


@dataclass
class Status:
    """What the endpoints report; the CLI fills in the callables."""

    synced: Callable[[], bool]
    """True once the cluster cache has listed nodes and pods."""
    config_error: Callable[[], str]
    """Why the configuration file is invalid (empty when it is valid)."""
    leading: Callable[[], bool]
    heartbeats: tuple[Heartbeat, ...] = ()
    threads: tuple[threading.Thread, ...] = ()
    """Threads that must run for the whole life of the process (a dead one is unhealthy)."""
    role: Callable[[], str] | None = None
    """What ``/readyz`` names this replica; ``None``: ``leader`` or ``follower`` from
    :attr:`leading` (extender mode, where every replica answers, says ``extender``)."""


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that drops a kept-alive connection (kube-scheduler stopping) is routine;
        anything else is logged with its traceback, never printed to stderr."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            log.debug("http: client %s dropped the connection: %s", client_address, error)
        else:
            log.exception("http: request from %s failed", client_address)


class HealthServer:
    """Serves the endpoints from a daemon thread; ``port`` is the bound port."""

    def __init__(
        self,
        settings: HttpSettings,
        registry: CollectorRegistry,
        status: Status,
        post_routes: Mapping[str, PostRoute] | None = None,
    ):
        self._registry = registry
        self._status = status
        self._post_routes = dict(post_routes or {})
        handler = self._handler_class()
        self._server = _Server((settings.host, settings.port), handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()
        log.info("serving /healthz, /readyz and /metrics on port %d", self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def healthz(self) -> tuple[int, str]:
        wedged = [
            f"{h.name} silent for {h.silence_s():.0f} s (limit {h.max_silence_s:.0f} s)"
            for h in self._status.heartbeats
            if not h.alive()
        ]
        wedged += [f"thread {t.name} has died" for t in self._status.threads if not t.is_alive()]
        if wedged:
            return 500, "unhealthy: " + "; ".join(wedged) + "\n"
        return 200, "ok\n"

    def readyz(self) -> tuple[int, str]:
        if self._status.role is not None:
            role = self._status.role()
        else:
            role = "leader" if self._status.leading() else "follower"
        missing = []
        if not self._status.synced():
            missing.append("cluster cache not synced yet (listing nodes and pods)")
        config_error = self._status.config_error()
        if config_error:
            missing.append(f"configuration invalid: {config_error}")
        if missing:
            return 503, f"not ready ({role}): " + "; ".join(missing) + "\n"
        return 200, f"ok ({role})\n"

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go out in two writes: without TCP_NODELAY the body waits
            # for the client's delayed ACK (~40 ms per kept-alive request)
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                route = server._post_routes.get(self.path.split("?", 1)[0])
                try:
                    length = int(self.headers.get("Content-Length", ""))
                except ValueError:
                    length = -1
                if not 0 <= length <= MAX_BODY_BYTES:
                    self.close_connection = True
                    self._send(411, b"POST needs a Content-Length of at most 64 MiB\n")
                    return
                body = self.rfile.read(length)
                if route is None:
                    known = ", ".join(sorted(server._post_routes)) or "none"
                    self._send(404, f"not found: POST routes here: {known}\n".encode())
                    return
                try:
                    code, answer, content_type = route(body)
                except Exception as exc:  # a failing handler is an error answer, not a crash
                    log.exception("POST %s failed", self.path)
                    code, answer, content_type = 500, f"failed: {exc!r}\n".encode(), "text/plain"
                self._send(code, answer, content_type)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(server._registry), CONTENT_TYPE_LATEST)
                    return
                routes = {"/healthz": server.healthz, "/readyz": server.readyz}
                if path not in routes:
                    self._send(404, b"not found: try /healthz, /readyz or /metrics\n")
                    return
                try:
                    code, body = routes[path]()
                except Exception as exc:  # a failing check is an unhealthy answer, not a crash
                    log.exception("%s check failed", path)
                    code, body = 500, f"check failed: {exc!r}\n"
                self._send(code, body.encode())

            def _send(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http: " + format, *args)

        return Handler
