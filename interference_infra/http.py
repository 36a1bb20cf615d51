"""``/healthz``, ``/readyz`` and Prometheus ``/metrics`` on a stdlib ``ThreadingHTTPServer``.

The server runs on a daemon thread, so a slow scrape never delays the program's own
loops. What the checks mean is the program's business: each passes a :data:`Check` per
GET path. Extra ``POST`` routes (the scheduler's extender verbs) take the request body
and return status, body and content type; extra ``GET`` routes by path prefix (the
scheduler's ``/decisions/NS/POD`` page) take the whole path and return the same.

``keep_alive`` serves HTTP/1.1 with persistent connections and ``TCP_NODELAY``, for a
caller that posts many requests on one connection (kube-scheduler calling an extender);
without it every answer closes its connection (HTTP/1.0), which is all a probe needs.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
METRICS_PATH = "/metrics"
MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest POST body accepted (an extender request without ``nodeCacheCapable`` carries
every Node object)."""

Check = Callable[[], tuple[int, str]]
"""A GET handler: → (status, text body)."""
PostRoute = Callable[[bytes], tuple[int, bytes, str]]
"""A POST handler: request body → (status, body, content type)."""
GetRoute = Callable[[str], tuple[int, bytes, str]]
"""A GET handler for every path under a prefix: path → (status, body, content type)."""


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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    log = log

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that drops a kept-alive connection (kube-scheduler stopping) is routine;
        anything else is logged with its traceback, never printed to stderr."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            self.log.debug("http: client %s dropped the connection: %s", client_address, error)
        else:
            self.log.exception("http: request from %s failed", client_address)


class HealthEndpoint:
    """Serves ``/metrics`` from ``registry``, each of ``checks`` at its path (usually
    ``/healthz`` and ``/readyz``) and ``post_routes``, on ``address:port`` (port 0: any
    free port; :attr:`port` is the one bound).

    Raises :class:`EndpointBindError` when the address cannot be bound; its message ends
    with ``bind_fix``, which says how to choose another (each program names its own flag
    or setting). Requests and failures are logged to ``logger``, so they follow the
    program's own log level.
    """

    def __init__(
        self,
        address: str,
        port: int,
        registry: CollectorRegistry,
        checks: Mapping[str, Check],
        *,
        post_routes: Mapping[str, PostRoute] | None = None,
        get_routes: Mapping[str, GetRoute] | None = None,
        keep_alive: bool = False,
        thread_name: str = "http",
        bind_fix: str = "free the port or choose another",
        logger: logging.Logger = log,
    ) -> None:
        self._registry = registry
        self._log = logger
        self._checks = dict(checks)
        self._post_routes = dict(post_routes or {})
        self._get_routes = dict(get_routes or {})
        handler = self._handler_class(keep_alive)
        self._server = _Server((address, port), handler, bind_and_activate=False)
        self._server.log = logger
        try:
            self._server.server_bind()
            self._server.server_activate()
        except OSError as exc:
            self._server.server_close()
            paths = ", ".join([*self._checks, METRICS_PATH])
            raise EndpointBindError(exc, address, port, paths, bind_fix) from exc
        self.port = int(self._server.server_address[1])
        """The port listened on (the chosen one when constructed with 0)."""
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

    def _handler_class(self, keep_alive: bool) -> type[BaseHTTPRequestHandler]:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            if keep_alive:
                protocol_version = "HTTP/1.1"
                # headers and body go out in two writes: without TCP_NODELAY the body
                # waits for the client's delayed ACK (~40 ms per kept-alive request)
                disable_nagle_algorithm = True

            def do_POST(self) -> None:
                route = endpoint._post_routes.get(self.path.split("?", 1)[0])
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
                path = self.path.split("?", 1)[0]
                if path == METRICS_PATH:
                    self._send(200, generate_latest(endpoint._registry), CONTENT_TYPE_LATEST)
                    return
                check = endpoint._checks.get(path)
                if check is None:
                    for prefix, route in endpoint._get_routes.items():
                        if path.startswith(prefix):
                            self._get_route(route, path)
                            return
                    known = ", ".join(
                        [*endpoint._checks, METRICS_PATH, *(f"{p}*" for p in endpoint._get_routes)]
                    )
                    self._send(404, f"not found: try {known}\n".encode())
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

            def _send(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                endpoint._log.debug("http: %s " + format, self.address_string(), *args)

        return Handler
