"""``/healthz``, ``/readyz``, Prometheus ``/metrics`` and a program's own routes over HTTP or
HTTPS, on a stdlib ``HTTPServer`` with a bounded pool of request threads.

The server runs on a daemon thread, so a slow scrape never delays the program's own
loops. What the checks mean is the program's business: each passes a :data:`Check` per
GET path. Extra ``POST`` routes (the scheduler's extender verbs) take the request body
and return status, body and content type; extra ``GET`` routes by path prefix (the
scheduler's ``/decisions/NS/POD`` page) take the whole path and return the same.

``keep_alive`` serves HTTP/1.1 with persistent connections and ``TCP_NODELAY``, for a
caller that posts many requests on one connection (kube-scheduler calling an extender);
without it every answer closes its connection (HTTP/1.0), which is all a probe needs.

Limits (:class:`ServerLimits`), so no client can make the process grow without bound:

* at most ``max_connections`` connections are served at once, one pool thread each; a
  further connection waits in a queue of ``max_waiting`` and is served when a thread
  frees (a kept-alive connection that is idle, or has just been answered, is closed
  while others wait); one that waited ``queue_wait_s`` is answered 503 with
  ``Retry-After``; when the queue is full it is closed at once. Threads never exceed
  ``max_connections``.
* a ``POST`` body larger than ``max_body_bytes`` is answered 413 without being read
  (and the connection closed); a body without ``Content-Length`` (chunked) 411.
* every read (each request line, header and body, the next request on a kept-alive
  connection) waits at most ``request_timeout_s``; a TLS handshake ``handshake_timeout_s``.

With ``tls`` (:class:`~interference_infra.server_tls.ServerTls`) the endpoint speaks
HTTPS; the handshake runs on the pool thread, never on the accepting one, and a client
that fails it (no client certificate where one is required, a certificate of another
CA) never reaches a handler. ``on_refused`` is told each refusal by reason (see
:data:`REFUSALS`), for the program's metrics.
"""

from __future__ import annotations

import logging
import queue
import select
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from interference_infra.server_tls import ServerTls

log = logging.getLogger(__name__)

HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
METRICS_PATH = "/metrics"

Check = Callable[[], tuple[int, str]]
"""A GET handler: → (status, text body)."""
PostRoute = Callable[[bytes], tuple[int, bytes, str]]
"""A POST handler: request body → (status, body, content type)."""
GetRoute = Callable[[str], tuple[int, bytes, str]]
"""A GET handler for every path under a prefix: path → (status, body, content type)."""
REFUSALS = ("busy", "queue_full", "too_large", "tls_handshake")
"""Why a connection or request was refused: it waited ``queue_wait_s`` for a thread (503),
the waiting queue was full (closed), its body was over ``max_body_bytes`` (413), or its
TLS handshake failed (no or an untrusted client certificate, not TLS, too slow)."""


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """How much one endpoint takes at once (see the module docstring)."""

    max_connections: int = 16
    """Connections served at once, one pool thread each."""
    max_waiting: int = 64
    """Accepted connections waiting for a thread; beyond this a new one is closed."""
    queue_wait_s: float = 2.0
    """A connection that waited this long for a thread is answered 503."""
    max_body_bytes: int = 1024 * 1024
    """Largest POST body read; a larger one is answered 413."""
    request_timeout_s: float = 30.0
    """Longest wait for each read of a request, and for the next one on a kept-alive
    connection (an idle connection is closed after it)."""
    handshake_timeout_s: float = 5.0
    """Longest wait for each read of a TLS handshake."""

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_waiting", "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: {value!r} must be a whole number of at least 1")
        for name in ("queue_wait_s", "request_timeout_s", "handshake_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name}: {value!r} must be a number of seconds above 0")


def problem_check(problem: Callable[[], str], failing_status: int = 503) -> Check:
    """A :data:`Check` from a function that returns "" when fine, else the reason it is
    not: 200 ``ok``, or ``failing_status`` with the reason."""

    def check() -> tuple[int, str]:
        reason = problem()
        return (failing_status, reason + "\n") if reason else (200, "ok\n")

    return check


class EndpointBindError(OSError):
    """The endpoint cannot listen on its address; ``strerror`` is the system's reason and
    ``str()`` the whole sentence, with what to do about it."""

    def __init__(self, error: OSError, address: str, port: int, paths: str, fix: str) -> None:
        super().__init__(error.errno, error.strerror or str(error))
        self.sentence = f"cannot serve {paths} on {address}:{port} ({error}); {fix}"

    def __str__(self) -> str:
        return self.sentence


IDLE_POLL_S = 0.1
"""How often an idle kept-alive connection checks whether others wait for its thread."""
BUSY_HANDSHAKE_S = 0.5
"""A connection that waited too long gets this long for its TLS handshake before its 503
(a client that does not start one is closed instead)."""
DISCARD_S = 1.0
"""How long a refused body is read and dropped before the connection closes."""

_Waiting = tuple[socket.socket, Any, float]
"""An accepted connection waiting for a pool thread: socket, client address, when queued."""


class _PooledServer(HTTPServer):
    """``HTTPServer`` whose accepted connections wait in a bounded queue for one of at most
    ``limits.max_connections`` pool threads (started as needed, kept for the server's
    life)."""

    log = log

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        busy_handler: type[BaseHTTPRequestHandler],
        limits: ServerLimits,
        tls: ServerTls | None,
        on_refused: Callable[[str], None],
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.request_queue_size = max(128, limits.max_waiting)  # the listen backlog
        super().__init__(address, handler, bind_and_activate=False)
        self.busy_handler = busy_handler
        self.limits = limits
        self.tls = tls
        self.on_refused = on_refused
        self._waiting: queue.Queue[_Waiting | None] = queue.Queue(limits.max_waiting)
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._unmatched = 0

    def crowded(self) -> bool:
        """True while connections wait for a thread (a kept-alive one should then close)."""
        return not self._waiting.empty()

    def pool_threads(self) -> int:
        """Pool threads started so far (never above ``limits.max_connections``)."""
        with self._lock:
            return self._threads

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            try:
                self._waiting.put_nowait((request, client_address, time.monotonic()))
            except queue.Full:
                full = True
            else:
                full = False
                # each queued connection is matched with an idle thread, a new one, or
                # (all taken) the next thread that finishes
                if self._idle > 0:
                    self._idle -= 1
                elif self._threads < self.limits.max_connections:
                    self._threads += 1
                    name = f"{threading.current_thread().name}-{self._threads}"
                    threading.Thread(target=self._work, name=name, daemon=True).start()
                else:
                    self._unmatched += 1
        if full:
            self.shutdown_request(request)
            self.refused("queue_full", client_address)

    def refused(self, reason: str, client_address: Any) -> None:
        self.log.debug("http: refused %s (%s)", client_address, reason)
        try:
            self.on_refused(reason)
        except Exception:  # a metrics callback never breaks serving
            self.log.exception("http: counting a refusal failed")

    def stop_pool(self) -> None:
        """Close every waiting connection and let idle pool threads end."""
        while True:
            try:
                item = self._waiting.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self.shutdown_request(item[0])
        with self._lock:
            threads = self._threads
        for _ in range(threads):
            try:
                self._waiting.put_nowait(None)
            except queue.Full:
                break

    def _work(self) -> None:
        while True:
            item = self._waiting.get()
            if item is None:
                return
            try:
                self._serve(*item)
            finally:
                with self._lock:
                    if self._unmatched > 0:
                        self._unmatched -= 1  # this thread takes a waiting connection next
                    else:
                        self._idle += 1

    def _serve(self, request: socket.socket, client_address: Any, queued_at: float) -> None:
        busy = time.monotonic() - queued_at > self.limits.queue_wait_s
        connection: socket.socket = request
        try:
            if self.tls is not None:
                request.settimeout(BUSY_HANDSHAKE_S if busy else self.limits.handshake_timeout_s)
                try:
                    connection = self.tls.context().wrap_socket(request, server_side=True)
                except (OSError, ssl.SSLError) as exc:  # includes a handshake that timed out
                    self.log.debug("http: TLS handshake with %s failed: %s", client_address, exc)
                    self.refused("tls_handshake", client_address)
                    return
            connection.settimeout(self.limits.request_timeout_s)
            if busy:
                self.busy_handler(connection, client_address, self)
            else:
                self.finish_request(connection, client_address)
        except Exception:
            self.handle_error(connection, client_address)
        finally:
            self.shutdown_request(connection)

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that drops a kept-alive connection (kube-scheduler stopping), times out
        or breaks TLS is routine; anything else is logged with its traceback, never
        printed to stderr."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError | ssl.SSLError):
            self.log.debug("http: client %s dropped the connection: %s", client_address, error)
        else:
            self.log.exception("http: request from %s failed", client_address)


class HealthEndpoint:
    """Serves ``/metrics`` from ``registry`` (none: no ``/metrics``), each of ``checks`` at
    its path (usually ``/healthz`` and ``/readyz``) and ``post_routes``, on
    ``address:port`` (port 0: any free port; :attr:`port` is the one bound), over HTTPS
    with ``tls``, within ``limits``.

    Raises :class:`EndpointBindError` when the address cannot be bound; its message ends
    with ``bind_fix``, which says how to choose another (each program names its own flag
    or setting). Requests and failures are logged to ``logger``, so they follow the
    program's own log level.
    """

    def __init__(
        self,
        address: str,
        port: int,
        registry: CollectorRegistry | None,
        checks: Mapping[str, Check],
        *,
        post_routes: Mapping[str, PostRoute] | None = None,
        get_routes: Mapping[str, GetRoute] | None = None,
        keep_alive: bool = False,
        limits: ServerLimits | None = None,
        tls: ServerTls | None = None,
        on_refused: Callable[[str], None] | None = None,
        thread_name: str = "http",
        bind_fix: str = "free the port or choose another",
        logger: logging.Logger = log,
    ) -> None:
        self._registry = registry
        self._log = logger
        self._checks = dict(checks)
        self._post_routes = dict(post_routes or {})
        self._get_routes = dict(get_routes or {})
        self.limits = limits or ServerLimits()
        self._server = _PooledServer(
            (address, port),
            self._handler_class(keep_alive),
            self._handler_class(keep_alive, busy=True),
            self.limits,
            tls,
            on_refused or (lambda reason: None),
        )
        self._server.log = logger
        try:
            self._server.server_bind()
            self._server.server_activate()
        except OSError as exc:
            self._server.server_close()
            raise EndpointBindError(exc, address, port, self._paths(), bind_fix) from exc
        self.port = int(self._server.server_address[1])
        """The port listened on (the chosen one when constructed with 0)."""
        self.scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=thread_name, daemon=True
        )

    def start(self) -> None:
        """Serve on a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()
        self._server.stop_pool()

    def pool_threads(self) -> int:
        """Request threads started so far (at most ``limits.max_connections``)."""
        return self._server.pool_threads()

    def _paths(self) -> str:
        paths = [*self._checks, *([METRICS_PATH] if self._registry is not None else [])]
        return ", ".join(paths + [f"POST {p}" for p in self._post_routes]) or "nothing"

    def _handler_class(self, keep_alive: bool, busy: bool = False) -> type[BaseHTTPRequestHandler]:
        endpoint = self
        limits = self.limits

        class Handler(BaseHTTPRequestHandler):
            if keep_alive:
                protocol_version = "HTTP/1.1"
                # headers and body go out in two writes: without TCP_NODELAY the body
                # waits for the client's delayed ACK (~40 ms per kept-alive request)
                disable_nagle_algorithm = True

            def handle(self) -> None:
                self.handle_one_request()
                while not self.close_connection and self._next_request_arrives():
                    self.handle_one_request()

            def _next_request_arrives(self) -> bool:
                """Wait for the next request on a kept-alive connection: False (close it)
                after ``request_timeout_s``, or at once while other connections wait for
                a thread. (A request already read into the buffer, which only pipelining
                clients send, is not seen here.)"""
                connection = self.connection
                deadline = time.monotonic() + limits.request_timeout_s
                while True:
                    if isinstance(connection, ssl.SSLSocket) and connection.pending():
                        return True
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    readable, _, _ = select.select(
                        [connection], [], [], min(IDLE_POLL_S, remaining)
                    )
                    if readable:
                        return True
                    server = self.server
                    if isinstance(server, _PooledServer) and server.crowded():
                        return False

            def do_POST(self) -> None:
                if self.headers.get("Transfer-Encoding"):
                    self.close_connection = True
                    self._send(411, b"send the body with a Content-Length (not chunked)\n")
                    return
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if length < 0:
                    self.close_connection = True
                    self._send(400, b"bad Content-Length\n")
                    return
                if length > limits.max_body_bytes:
                    self.close_connection = True
                    self._refused("too_large")
                    self._send(
                        413,
                        f"a body of {length} bytes is over this endpoint's limit of"
                        f" {limits.max_body_bytes} bytes\n".encode(),
                    )
                    self._discard(length)
                    return
                body = self.rfile.read(length)
                if busy:
                    self._busy()
                    return
                route = endpoint._post_routes.get(self.path.split("?", 1)[0])
                if route is None:
                    known = ", ".join(sorted(endpoint._post_routes)) or "none"
                    self._send(404, f"not found: POST routes here: {known}\n".encode())
                    return
                try:
                    code, answer, content_type = route(body)
                except Exception as exc:  # a failing handler is an error answer, not a crash
                    endpoint._log.exception("POST %s failed", self.path)
                    code, answer, content_type = 500, f"failed: {exc!r}\n".encode(), "text/plain"
                self._send(code, answer, content_type)

            def do_GET(self) -> None:
                if busy:
                    self._busy()
                    return
                path = self.path.split("?", 1)[0]
                if path == METRICS_PATH and endpoint._registry is not None:
                    self._send(200, generate_latest(endpoint._registry), CONTENT_TYPE_LATEST)
                    return
                check = endpoint._checks.get(path)
                if check is None:
                    for prefix, route in endpoint._get_routes.items():
                        if path.startswith(prefix):
                            self._get_route(route, path)
                            return
                    metrics = [METRICS_PATH] if endpoint._registry is not None else []
                    known = ", ".join(
                        [*endpoint._checks, *metrics, *(f"{p}*" for p in endpoint._get_routes)]
                    )
                    self._send(404, f"not found: try {known or 'POST'}\n".encode())
                    return
                try:
                    code, text = check()
                except Exception as exc:  # a failing check is an unhealthy answer, not a crash
                    endpoint._log.exception("%s check failed", path)
                    code, text = 500, f"check failed: {exc!r}\n"
                self._send(code, text.encode())

            def _get_route(self, route: GetRoute, path: str) -> None:
                try:
                    code, answer, content_type = route(path)
                except Exception as exc:  # a failing handler is an error answer, not a crash
                    endpoint._log.exception("GET %s failed", path)
                    code, answer, content_type = 500, f"failed: {exc!r}\n".encode(), "text/plain"
                self._send(code, answer, content_type)

            def _discard(self, length: int) -> None:
                """Read and drop what the client sends of a refused body, for at most
                ``DISCARD_S``: closing with unread data resets the connection, and the
                client may lose the answer with it."""
                deadline = time.monotonic() + DISCARD_S
                self.connection.settimeout(DISCARD_S)
                try:
                    while length > 0 and time.monotonic() < deadline:
                        chunk = self.rfile.read1(min(length, 65536))
                        if not chunk:
                            break
                        length -= len(chunk)
                except OSError:
                    pass

            def _busy(self) -> None:
                self.close_connection = True
                self._refused("busy")
                self._send(
                    503,
                    f"busy: all {limits.max_connections} request threads were taken for"
                    f" {limits.queue_wait_s:g} s; retry\n".encode(),
                    headers={"Retry-After": "1"},
                )

            def _refused(self, reason: str) -> None:
                server = self.server
                assert isinstance(server, _PooledServer)
                server.refused(reason, self.client_address)

            def _send(
                self,
                code: int,
                body: bytes,
                content_type: str = "text/plain",
                headers: Mapping[str, str] | None = None,
            ) -> None:
                server = self.server
                if keep_alive and isinstance(server, _PooledServer) and server.crowded():
                    self.close_connection = True  # free this thread for a waiting one
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                if keep_alive and self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                endpoint._log.debug("http: %s " + format, self.address_string(), *args)

        return Handler
