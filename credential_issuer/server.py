"""The issuer's HTTP(S) server: ``POST /v1/credentials``, ``/healthz``, ``/readyz``,
``/metrics``.

A stdlib ``ThreadingHTTPServer`` bounded to ``max_connections`` requests at once (a further
connection waits in the listen backlog, then is dropped); every connection must finish its
TLS handshake and request within ``request_timeout_s``, so slow clients cannot hold the
threads. TLS is done on the request's own thread, never on the accepting one; the
certificate and key are read again when either file changes (cert-manager renewals need no
restart: :class:`interference_infra.server_tls.ServerTls`).
"""

from __future__ import annotations

import logging
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from credential_issuer.issuer import Answer, Issuer
from credential_issuer.settings import CREDENTIALS_PATH
from interference_infra.server_tls import ServerTls

log = logging.getLogger(__name__)

HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
METRICS_PATH = "/metrics"
ACCEPT_WAIT_S = 5.0
"""How long an accepted connection waits for a free request thread before it is closed."""


class _BoundedServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        max_connections: int,
        timeout_s: float,
        tls: ServerTls | None,
    ) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self._timeout_s = timeout_s
        self._tls = tls
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler, bind_and_activate=False)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(timeout=ACCEPT_WAIT_S):
            log.warning("http: all request threads busy; dropped a connection from %s",
                        client_address)  # fmt: skip
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(self._timeout_s)
        if self._tls is None:
            super().finish_request(request, client_address)
            return
        try:
            wrapped = self._tls.context().wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as exc:  # includes a handshake that timed out
            log.debug("http: TLS handshake with %s failed: %s", client_address, exc)
            return
        try:
            super().finish_request(wrapped, client_address)
        finally:
            wrapped.close()

    def handle_error(self, request: object, client_address: object) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError, ssl.SSLError)):
            log.debug("http: client %s: %s", client_address, error)
        else:
            log.exception("http: request from %s failed", client_address)


class IssuerServer:
    """Serves ``issuer`` on ``address:port`` (port 0: any free port; :attr:`port` is the
    one bound); ``OSError`` when it cannot bind, ``ssl.SSLError``/``OSError`` for an
    unusable certificate."""

    def __init__(
        self,
        issuer: Issuer,
        address: str,
        port: int,
        *,
        ready: Callable[[], str],
        tls: ServerTls | None = None,
        max_connections: int = 64,
        request_timeout_s: float = 10.0,
    ) -> None:
        self._issuer = issuer
        self._ready = ready
        self._server = _BoundedServer(
            (address, port), self._handler_class(), max_connections, request_timeout_s, tls
        )
        try:
            self._server.server_bind()
            self._server.server_activate()
        except OSError:
            self._server.server_close()
            raise
        self.port = int(self._server.server_address[1])
        self.scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="credentials-http", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self
        issuer = self._issuer

        class Handler(BaseHTTPRequestHandler):
            server_version = "interference-credentials"
            sys_version = ""

            def do_POST(self) -> None:
                self.close_connection = True
                if self.path.split("?", 1)[0] != CREDENTIALS_PATH:
                    self._send(404, f"not found: POST {CREDENTIALS_PATH}\n".encode())
                    return
                if self.headers.get("Transfer-Encoding"):
                    self._send(411, b"send a Content-Length (the body is expected empty)\n")
                    return
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if length < 0:
                    self._send(400, b"bad Content-Length\n")
                    return
                answer = issuer.handle(self.headers.get("Authorization"), length)
                if answer.status != 413 and length:
                    self.rfile.read(length)  # at most max_body_bytes: bounded
                self._answer(answer)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == METRICS_PATH:
                    self._send(200, generate_latest(issuer.metrics.registry), CONTENT_TYPE_LATEST)
                elif path == HEALTHZ_PATH:
                    self._send(200, b"ok\n")
                elif path == READYZ_PATH:
                    try:
                        problem = server._ready()
                    except Exception as exc:  # a failing check is unready, not a crash
                        log.exception("readiness check failed")
                        problem = f"check failed: {exc!r}"
                    if problem:
                        self._send(503, problem.encode() + b"\n")
                    else:
                        self._send(200, b"ok\n")
                elif path == CREDENTIALS_PATH:
                    self._send(405, b"POST only\n", headers={"Allow": "POST"})
                else:
                    known = ", ".join((HEALTHZ_PATH, READYZ_PATH, METRICS_PATH))
                    self._send(404, f"not found: GET {known}, POST {CREDENTIALS_PATH}\n".encode())

            def _answer(self, answer: Answer) -> None:
                self._send(answer.status, answer.encoded(), "application/json", answer.headers)

            def _send(
                self,
                code: int,
                body: bytes,
                content_type: str = "text/plain",
                headers: dict[str, str] | None = None,
            ) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http: %s " + format, self.address_string(), *args)

        return Handler
