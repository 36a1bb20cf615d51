"""The issuer's HTTP(S) server: ``POST /v1/credentials``, ``/healthz``, ``/readyz``,
``/metrics``, on the shared endpoint (:mod:`interference_infra.http`).

At most ``max_connections`` requests are served at once; every request must arrive whole
(and its TLS handshake finish) within ``request_timeout_s``, however its bytes trickle;
a client address holds at most a few connections; the probes have a thread of their own.
So slow or silent clients cannot keep an agent from enrolling or the kubelet's probes
from being answered. The certificate and key are read again when either file changes
(cert-manager renewals need no restart: :class:`interference_infra.server_tls.ServerTls`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from credential_issuer.issuer import Issuer
from credential_issuer.settings import CREDENTIALS_PATH
from interference_infra.http import (
    HEALTHZ_PATH,
    READYZ_PATH,
    HealthEndpoint,
    Reply,
    Request,
    ServerLimits,
)
from interference_infra.server_tls import ServerTls

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 5.0
"""A TLS handshake must finish within this (or ``request_timeout_s`` if shorter)."""
ENDPOINT_REFUSALS = {"too_large": "body_too_large"}
"""The endpoint's refusals that the issuer's own counter names."""


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
        max_body_bytes: int = 4096,
    ) -> None:
        self._issuer = issuer
        self._ready = ready
        limits = ServerLimits(
            max_connections=max_connections,
            max_body_bytes=max_body_bytes,
            request_deadline_s=request_timeout_s,
            handshake_timeout_s=min(HANDSHAKE_TIMEOUT_S, request_timeout_s),
            request_timeout_s=request_timeout_s,
        )
        self._endpoint = HealthEndpoint(
            address,
            port,
            issuer.metrics.registry,
            {HEALTHZ_PATH: lambda: (200, "ok\n"), READYZ_PATH: self._readyz},
            request_routes={CREDENTIALS_PATH: self._credentials},
            limits=limits,
            tls=tls,
            on_refused=self._refused,
            thread_name="credentials-http",
            bind_fix="free the port or set --port (HTTP_PORT)",
            logger=log,
        )
        self.port = self._endpoint.port
        self.scheme = self._endpoint.scheme

    def start(self) -> None:
        self._endpoint.start()

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        self._endpoint.stop()

    def _readyz(self) -> tuple[int, str]:
        try:
            problem = self._ready()
        except Exception as exc:  # a failing check is unready, not a crash
            log.exception("readiness check failed")
            problem = f"check failed: {exc!r}"
        return (503, problem + "\n") if problem else (200, "ok\n")

    def _credentials(self, request: Request) -> Reply:
        if request.method != "POST":
            return Reply(405, b"POST only\n", headers={"Allow": "POST"})
        answer = self._issuer.handle(request.header("Authorization"), len(request.body))
        return Reply(answer.status, answer.encoded(), "application/json", answer.headers)

    def _refused(self, reason: str) -> None:
        self._issuer.metrics.http_refused.labels(reason=reason).inc()
        counted = ENDPOINT_REFUSALS.get(reason)
        if counted is not None:
            self._issuer.metrics.refused.labels(reason=counted).inc()
