"""``/healthz``, ``/readyz``, Prometheus ``/metrics`` and a program's own routes over HTTP or
HTTPS, with a bounded pool of request threads behind one intake thread.

The server runs on daemon threads, so a slow scrape never delays the program's own loops.
What the checks mean is the program's business: each passes a :data:`Check` per GET path.
Extra ``POST`` routes (the scheduler's extender verbs) take the request body and return
status, body and content type; extra ``GET`` routes by path prefix (the scheduler's
``/decisions/NS/POD`` page) take the whole path and return the same; a
:data:`RequestRoute` (the credential issuer's) takes the whole :class:`Request`.

``keep_alive`` serves HTTP/1.1 with persistent connections and ``TCP_NODELAY``, for a
caller that posts many requests on one connection (kube-scheduler calling an extender);
without it every answer closes its connection (HTTP/1.0), which is all a probe needs.

Limits (:class:`ServerLimits`), so no client can make the process grow without bound or
hold the door shut for others:

* the intake (:mod:`interference_infra.http_intake`) accepts, finishes TLS handshakes and
  reads every request whole on one thread, within a whole-request deadline, a cap of
  connections per client address and in all, and a budget of buffered bytes; a slow or
  silent client holds a socket, never a request thread.
* whole requests wait in a queue of ``max_waiting`` for one of ``max_connections``
  request threads; one that waited ``queue_wait_s`` is answered 503 with ``Retry-After``,
  one beyond a full queue is closed. The checks (``/healthz``, ``/readyz``) have a thread
  of their own, so slow routes never delay a probe.
* a ``POST`` body larger than ``max_body_bytes`` is answered 413 without being read (and
  the connection closed); a body without ``Content-Length`` (chunked) 411.

With ``tls`` (:class:`~interference_infra.server_tls.ServerTls`) the endpoint speaks HTTPS;
a client that fails the handshake (no client certificate where one is required, a
certificate of another CA, too slow) never reaches a handler. ``on_refused`` is told each
refusal by reason (see :data:`REFUSALS`), for the program's metrics.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from interference_infra.http_intake import MAX_HEAD_BYTES, Arrived, Intake, SocketWriter, Workers
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
REFUSALS = (
    "busy",
    "queue_full",
    "too_large",
    "tls_handshake",
    "per_client",
    "crowded",
    "deadline",
)
"""Why a connection or request was refused: it waited ``queue_wait_s`` for a thread (503),
the waiting queue was full (closed), its body or headers were over the limit (413, 431),
its TLS handshake failed (no or an untrusted client certificate, not TLS, too slow), its
client had ``max_per_client`` connections open, ``max_open`` or ``max_buffered_bytes`` was
reached, or it did not arrive whole within ``request_deadline_s`` (408)."""


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """How much one endpoint takes at once (see the module docstring)."""

    max_connections: int = 16
    """Requests served at once, one pool thread each."""
    max_waiting: int = 64
    """Whole requests waiting for a thread; beyond this a new one is closed."""
    queue_wait_s: float = 2.0
    """A request that waited this long for a thread is answered 503."""
    max_body_bytes: int = 1024 * 1024
    """Largest POST body read; a larger one is answered 413."""
    request_timeout_s: float = 30.0
    """A kept-alive connection idle this long is closed; also the longest wait for each
    write of an answer."""
    handshake_timeout_s: float = 5.0
    """A TLS handshake must be finished within this, however its bytes trickle."""
    request_deadline_s: float = 10.0
    """A request (line, headers and body) must arrive whole within this of its first byte
    (408 and closed otherwise), however its bytes trickle."""
    max_per_client: int = 8
    """Open connections per client address; one more takes the place of that client's
    oldest connection that has not sent a whole request (else of its oldest idle one)."""
    max_open: int = 256
    """Open connections in all; one more takes the place of the oldest unfinished (else
    idle) one, so a probe always gets in."""
    max_buffered_bytes: int = 16 * 1024 * 1024
    """Bytes of unfinished requests held in all; beyond it the oldest is closed. At least
    ``max_body_bytes`` plus 64 KiB of headers, so one largest request fits."""

    def __post_init__(self) -> None:
        for name in (
            "max_connections",
            "max_waiting",
            "max_body_bytes",
            "max_per_client",
            "max_open",
            "max_buffered_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: {value!r} must be a whole number of at least 1")
        for name in (
            "queue_wait_s",
            "request_timeout_s",
            "handshake_timeout_s",
            "request_deadline_s",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name}: {value!r} must be a number of seconds above 0")
        if self.max_buffered_bytes < self.max_body_bytes + MAX_HEAD_BYTES:
            raise ValueError(
                f"max_buffered_bytes: {self.max_buffered_bytes} must hold one largest request"
                f" (max_body_bytes {self.max_body_bytes} + {MAX_HEAD_BYTES} bytes of headers)"
            )


@dataclass(frozen=True, slots=True)
class Request:
    """One request, whole, for a :data:`RequestRoute`."""

    method: str
    path: str
    """Without the query."""
    headers: Mapping[str, str]
    """By lower-case name (the last of repeated ones)."""
    body: bytes

    def header(self, name: str) -> str | None:
        """A header's value by name, in any case; ``None`` when absent."""
        return self.headers.get(name.lower())


@dataclass(frozen=True, slots=True)
class Reply:
    """A :data:`RequestRoute`'s answer."""

    status: int
    body: bytes
    content_type: str = "text/plain"
    headers: Mapping[str, str] = field(default_factory=dict)


RequestRoute = Callable[[Request], Reply]
"""A handler of every method on one exact path."""


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


DISCARD_S = 1.0
"""How long a refused body is read and dropped before the connection closes."""
CHECK_THREADS = 1
CHECK_WAITING = 32
"""The checks' own lane: one thread, and this many probes waiting for it."""


class HealthEndpoint:
    """Serves ``/metrics`` from ``registry`` (none: no ``/metrics``), each of ``checks`` at
    its path (usually ``/healthz`` and ``/readyz``), ``post_routes``, ``get_routes`` and
    ``request_routes``, on ``address:port`` (port 0: any free port; :attr:`port` is the one
    bound), over HTTPS with ``tls``, within ``limits``.

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
        request_routes: Mapping[str, RequestRoute] | None = None,
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
        self._request_routes = dict(request_routes or {})
        self._on_refused = on_refused or (lambda reason: None)
        self.limits = limits or ServerLimits()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((address, port))
            listener.listen(128)  # connections the intake has not accepted yet
        except OSError as exc:
            listener.close()
            raise EndpointBindError(exc, address, port, self._paths(), bind_fix) from exc
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        """The port listened on (the chosen one when constructed with 0)."""
        self.scheme = "https" if tls is not None else "http"
        self._handler = self._handler_class(keep_alive)
        self._busy_handler = self._handler_class(keep_alive, busy=True)
        self._keep_alive = keep_alive
        self._workers = Workers(
            thread_name, self.limits.max_connections, self.limits.max_waiting,
            self._serve, self._overflow,
        )  # fmt: skip
        self._check_workers = Workers(
            f"{thread_name}-checks", CHECK_THREADS, CHECK_WAITING, self._serve, self._overflow
        )
        self._intake = Intake(listener, self.limits, tls, self._deliver, self.refused, logger)
        self._thread = threading.Thread(target=self._intake.run, name=thread_name, daemon=True)

    def start(self) -> None:
        """Serve on background threads."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        self._intake.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._listener.close()
        self._workers.stop()
        self._check_workers.stop()

    def pool_threads(self) -> int:
        """Request threads started so far for routes other than the checks (at most
        ``limits.max_connections``)."""
        return self._workers.threads()

    def refused(self, reason: str, client_address: Any = None) -> None:
        """Count one refusal (the program's ``on_refused``)."""
        self._log.debug("http: refused %s (%s)", client_address, reason)
        try:
            self._on_refused(reason)
        except Exception:  # a metrics callback never breaks serving
            self._log.exception("http: counting a refusal failed")

    def _paths(self) -> str:
        paths = [*self._checks, *([METRICS_PATH] if self._registry is not None else [])]
        paths += list(self._request_routes)
        return ", ".join(paths + [f"POST {p}" for p in self._post_routes]) or "nothing"

    def _deliver(self, item: Arrived) -> None:
        """A whole request, from the intake: the checks to their own thread."""
        if item.path in self._checks and item.data.startswith(b"GET "):
            self._check_workers.submit(item)
        else:
            self._workers.submit(item)

    def _overflow(self, item: Arrived) -> None:
        self._intake.done(item.connection, keep=False)
        item.connection.sock.close()
        self.refused("queue_full", item.connection.client)

    def _serve(self, item: Arrived) -> None:
        """On a request thread: answer one request, then give the connection back."""
        connection = item.connection
        busy = time.monotonic() - item.at > self.limits.queue_wait_s
        handler_class = self._busy_handler if busy else self._handler
        keep = False
        try:
            connection.sock.settimeout(self.limits.request_timeout_s)
            handler = handler_class(item, connection.client, self)  # type: ignore[arg-type]
            keep = self._keep_alive and not handler.close_connection
        except Exception as exc:
            if isinstance(exc, ConnectionError | TimeoutError | ssl.SSLError):
                self._log.debug("http: client %s dropped the connection: %s",
                                connection.client, exc)  # fmt: skip
            else:
                self._log.exception("http: request from %s failed", connection.client)
        finally:
            if not keep:
                with contextlib.suppress(OSError):
                    connection.sock.close()
            self._intake.done(connection, keep)

    def _handler_class(self, keep_alive: bool, busy: bool = False) -> type[BaseHTTPRequestHandler]:
        endpoint = self
        limits = self.limits

        class Handler(BaseHTTPRequestHandler):
            if keep_alive:
                protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                arrived: Arrived = self.request
                self.connection = arrived.connection.sock
                self.rfile = io.BytesIO(arrived.data)
                self.wfile = SocketWriter(self.connection)

            def handle(self) -> None:
                self.close_connection = True
                self.handle_one_request()

            def finish(self) -> None:
                pass  # the writer is unbuffered; the endpoint keeps or closes the socket

            def do_POST(self) -> None:
                route = endpoint._request_routes.get(self.path.split("?", 1)[0])
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
                    endpoint.refused("too_large", self.client_address)
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
                if route is not None:
                    self._request_route(route, body)
                    return
                post = endpoint._post_routes.get(self.path.split("?", 1)[0])
                if post is None:
                    known = ", ".join(sorted(endpoint._post_routes)) or "none"
                    self._send(404, f"not found: POST routes here: {known}\n".encode())
                    return
                try:
                    code, answer, content_type = post(body)
                except Exception as exc:  # a failing handler is an error answer, not a crash
                    endpoint._log.exception("POST %s failed", self.path)
                    code, answer, content_type = 500, f"failed: {exc!r}\n".encode(), "text/plain"
                self._send(code, answer, content_type)

            def do_GET(self) -> None:
                if busy:
                    self._busy()
                    return
                path = self.path.split("?", 1)[0]
                route = endpoint._request_routes.get(path)
                if route is not None:
                    self._request_route(route, b"")
                    return
                if path == METRICS_PATH and endpoint._registry is not None:
                    self._send(200, generate_latest(endpoint._registry), CONTENT_TYPE_LATEST)
                    return
                check = endpoint._checks.get(path)
                if check is None:
                    for prefix, get in endpoint._get_routes.items():
                        if path.startswith(prefix):
                            self._get_route(get, path)
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

            def _request_route(self, route: RequestRoute, body: bytes) -> None:
                headers = {name.lower(): value for name, value in self.headers.items()}
                request = Request(self.command, self.path.split("?", 1)[0], headers, body)
                try:
                    reply = route(request)
                except Exception as exc:  # a failing handler is an error answer, not a crash
                    endpoint._log.exception("%s %s failed", self.command, self.path)
                    reply = Reply(500, f"failed: {exc!r}\n".encode())
                self._send(reply.status, reply.body, reply.content_type, reply.headers)

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
                        chunk = self.connection.recv(min(length, 65536))
                        if not chunk:
                            break
                        length -= len(chunk)
                except OSError:
                    pass

            def _busy(self) -> None:
                self.close_connection = True
                endpoint.refused("busy", self.client_address)
                self._send(
                    503,
                    f"busy: all {limits.max_connections} request threads were taken for"
                    f" {limits.queue_wait_s:g} s; retry\n".encode(),
                    headers={"Retry-After": "1"},
                )

            def _send(
                self,
                code: int,
                body: bytes,
                content_type: str = "text/plain",
                headers: Mapping[str, str] | None = None,
            ) -> None:
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
