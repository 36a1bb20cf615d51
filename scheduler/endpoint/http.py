"""The scheduler's ``/healthz``, ``/readyz`` and ``/metrics``: what they check, served by
the shared endpoint (:mod:`interference_infra.http`).

Default port 10251: kube-scheduler's former plain-HTTP health/metrics port (it now
serves HTTPS on 10259), so this plain-HTTP endpoint neither clashes with a
kube-scheduler on the same host nor pretends to be TLS.

* ``/healthz`` — 200 while the process is alive and no watched loop is wedged: every
  :class:`Heartbeat` has beaten within its ``max_silence_s`` and every essential thread
  is alive; 500 names the culprit.
  Point the liveness probe here.
* ``/readyz`` — 200 when the cluster cache has synced; the body says ``leader`` or
  ``follower`` (both are ready: a follower is a healthy standby) and, while the
  configuration file on disk is invalid, that the last valid configuration serves — a
  config typo never makes a replica unready (scheduler.entry.config_reload tells it in an
  Event, a metric and the log). 503 lists what is missing. Point the readiness probe
  here.
* ``/metrics`` — the Prometheus registry passed in.
* ``/decisions/NAMESPACE/POD`` — when the caller passes a decision source: the pod's
  latest decision record drawn as one self-contained HTML page
  (:func:`interference.decision_page.render_decision_page`: the funnel with the failing
  filter, the finalists' score parts, the rejected nodes, the chosen node's recent
  interference index when the source can read it); 404 with a plain message for a pod
  without a record. Read-only, with no credential check of its own: served only with
  ``http.debug_pages`` (off by default), like ``/config``.
* ``POST`` routes given by the caller: each handler takes the request body and returns
  status, body and content type.

HTTP/1.1 with keep-alive and TCP_NODELAY, so a caller that posts many requests reuses its
connection.

Extender mode serves kube-scheduler's calls (``POST /filter``, ``/prioritize``) apart from
these, on :class:`ExtenderEndpoint`: HTTPS on its own port (default 10262), requiring a
client certificate signed by the install's CA, within :class:`ExtenderSettings`' limits.
The kubelet's probes and Prometheus, which hold no such certificate, stay on this port.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry

from interference.decision import Decision
from interference.decision_page import render_decision_page
from interference_infra.http import (
    HEALTHZ_PATH,
    READYZ_PATH,
    REFUSALS,
    GetRoute,
    HealthEndpoint,
    PostRoute,
    ServerLimits,
)
from interference_infra.server_tls import ServerTls

log = logging.getLogger(__name__)

DEFAULT_PORT = 10251
EXTENDER_PORT = 10262
"""The extender verbs' HTTPS port: beside 10251, clear of kube-scheduler's 10259 and the
kubelet's and kube-proxy's ports."""
EXTENDER_TLS_DIR = "/etc/interference-extender-tls"
"""Where deploy/components/extender mounts the Secret interference-extender-serving."""
MIB = 1024 * 1024
EXTENDER_MAX_BODY_BYTES = 6 * MIB
"""The largest legitimate ``ExtenderArgs`` with ``NodeNames`` for 5,000 nodes, rounded up:
the Pod as JSON (the API server takes at most 3 MiB per request body, so no stored Pod is
larger) plus 5,000 node names at the longest a name may be (253 characters, 256 bytes
quoted with a comma: 1.28 MB) and the envelope. Without ``nodeCacheCapable`` the request
carries every Node object instead, and the limit must be raised."""

DECISIONS_PATH = "/decisions/"
"""Prefix of the decision pages: ``/decisions/NAMESPACE/POD``."""

__all__ = [
    "DECISIONS_PATH",
    "DEFAULT_PORT",
    "EXTENDER_PORT",
    "REFUSALS",
    "DecisionPages",
    "ExtenderEndpoint",
    "ExtenderSettings",
    "HealthServer",
    "Heartbeat",
    "HttpSettings",
    "PostRoute",
    "Status",
    "decision_page_route",
]


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Where the health and metrics endpoints listen."""

    port: int = DEFAULT_PORT
    """TCP port of /healthz, /readyz and /metrics (0: any free port, for tests)."""
    host: str = "0.0.0.0"
    """Address to bind; 0.0.0.0 so the kubelet and Prometheus can reach the pod."""
    debug_pages: bool = False
    """Also serve ``/config`` and ``/decisions/NAMESPACE/POD``. They carry no credential
    check: turn them on only where the port's NetworkPolicy admits nobody but trusted
    scrapers (deploy/ admits pods labelled ``interference.io/metrics-scraper=true`` in a
    namespace labelled the same). ``interference explain`` reads the same records with
    the viewer's Redis user."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port!r} must be an integer in 0–65535, e.g. 10251")
        if not self.host:
            raise ValueError("host: must not be empty, e.g. 0.0.0.0")


@dataclass(frozen=True, slots=True)
class ExtenderSettings:
    """How ``interference-scheduler extender`` serves kube-scheduler's calls: HTTPS with
    client authentication on its own port, within limits (docs/operations.md, "Extender
    mode"). A restart applies a change; renewed certificate files are picked up live."""

    port: int = EXTENDER_PORT
    """TCP port of POST /filter and /prioritize (0: any free port, for tests)."""
    host: str = "0.0.0.0"
    """Address to bind."""
    tls_cert_file: str = f"{EXTENDER_TLS_DIR}/tls.crt"
    """The serving certificate (PEM), for the Service name kube-scheduler calls."""
    tls_key_file: str = f"{EXTENDER_TLS_DIR}/tls.key"
    """Its private key (PEM)."""
    client_ca_file: str = f"{EXTENDER_TLS_DIR}/ca.crt"
    """The CA (PEM) that signed kube-scheduler's client certificate: a client without a
    certificate it signed fails the TLS handshake."""
    plaintext: bool = False
    """Serve plain HTTP with no client authentication instead: only for a test on
    loopback, never where anything but kube-scheduler can reach the port."""
    max_connections: int = 8
    """Connections served at once (one thread each; kube-scheduler calls one at a time);
    more wait up to 2 s, then get 503."""
    max_body_bytes: int = EXTENDER_MAX_BODY_BYTES
    """Largest request body; a larger one gets 413. The default fits the largest Pod with
    NodeNames for 5,000 nodes (raise it only for nodeCacheCapable: false)."""
    request_timeout_s: float = 30.0
    """A kept-alive connection idle this long is closed; also the longest wait for each
    write of an answer. A request must arrive whole within 10 s of its first byte and a
    TLS handshake finish within 5 s, however slowly the bytes come."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port!r} must be an integer in 0–65535, e.g. 10262")
        if not self.host:
            raise ValueError("host: must not be empty, e.g. 0.0.0.0")
        if not self.plaintext:
            for name in ("tls_cert_file", "tls_key_file", "client_ca_file"):
                if not getattr(self, name):
                    raise ValueError(
                        f"{name}: must name a PEM file (scripts/create-extender-certs.sh makes"
                        " them); plaintext: true serves without TLS, for a loopback test only"
                    )
        self.limits()  # the ranges of max_connections, max_body_bytes, request_timeout_s

    def limits(self) -> ServerLimits:
        """The endpoint's :class:`ServerLimits`."""
        return ServerLimits(
            max_connections=self.max_connections,
            max_body_bytes=self.max_body_bytes,
            request_timeout_s=self.request_timeout_s,
        )

    def tls(self) -> ServerTls | None:
        """The certificate files loaded (``None`` with ``plaintext``); ``ValueError`` naming
        the files and the fix when they cannot be used."""
        if self.plaintext:
            return None
        try:
            return ServerTls(self.tls_cert_file, self.tls_key_file, self.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"cannot load the extender's TLS files {self.tls_cert_file},"
                f" {self.tls_key_file}, {self.client_ca_file} ({exc}); create them with"
                " scripts/create-extender-certs.sh or cert-manager (docs/operations.md,"
                " Extender mode)"
            ) from exc


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
    """Why the configuration file is invalid (empty when it is valid); shown by
    ``/readyz``, never a reason to be unready."""
    leading: Callable[[], bool]
    heartbeats: tuple[Heartbeat, ...] = ()
    threads: tuple[threading.Thread, ...] = ()
    """Threads that must run for the whole life of the process (a dead one is unhealthy)."""
    role: Callable[[], str] | None = None
    """What ``/readyz`` names this replica; ``None``: ``leader`` or ``follower`` from
    :attr:`leading` (extender mode, where every replica answers, says ``extender``)."""


class DecisionPages(Protocol):
    """What the decision page reads (:class:`scheduler.cycle.ports.DecisionSource`)."""

    def read(self, namespace: str, pod: str) -> Decision | None:
        """The pod's latest decision record, ``None`` when there is none."""

    def index_history(self, node: str) -> Sequence[tuple[float, float]] | None:
        """The node's recent interference index as ``(unix time, index)``, ``None`` when
        it cannot be read."""


def decision_page_route(source: DecisionPages) -> GetRoute:
    """The GET handler of ``/decisions/NAMESPACE/POD``."""

    def route(path: str) -> tuple[int, bytes, str]:
        parts = [urllib.parse.unquote(p) for p in path[len(DECISIONS_PATH) :].split("/")]
        if len(parts) != 2 or not all(parts):
            return 404, b"not found: ask for /decisions/NAMESPACE/POD\n", "text/plain"
        namespace, pod = parts
        try:
            decision = source.read(namespace, pod)
        except Exception as exc:
            log.warning("cannot read the decision record of %s/%s: %s", namespace, pod, exc)
            return 503, f"cannot read the decision record: {exc}\n".encode(), "text/plain"
        if decision is None:
            text = (
                f"no decision record for pod {namespace}/{pod}: not scheduled by this "
                "scheduler, or its record has expired\n"
            )
            return 404, text.encode(), "text/plain; charset=utf-8"
        history = source.index_history(decision.node) if decision.node else None
        note = (
            f"The node's last {len(history)} report(s) from its report stream."
            if history
            else "Not available: the scheduler could not read the node's report stream "
            "(interference explain NS/POD --html draws it with the viewer user)."
        )
        page = render_decision_page(decision, history, history_note=note)
        return 200, page.encode(), "text/html; charset=utf-8"

    return route


class ExtenderEndpoint(HealthEndpoint):
    """kube-scheduler's side: ``routes`` (``POST /filter``, ``/prioritize``) alone, over
    HTTPS with ``tls`` (``settings.tls()``: a client certificate required; ``None`` only
    with ``settings.plaintext``), kept alive, within ``settings``' limits; ``on_refused``
    counts each refusal by reason (:data:`interference_infra.http.REFUSALS`).
    :class:`EndpointBindError` when the port is taken."""

    def __init__(
        self,
        settings: ExtenderSettings,
        routes: Mapping[str, PostRoute],
        tls: ServerTls | None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        if tls is None and not settings.plaintext:
            raise ValueError("extender: TLS is required unless extender.plaintext is true")
        self.settings = settings
        super().__init__(
            settings.host,
            settings.port,
            None,
            {},
            post_routes=routes,
            keep_alive=True,
            limits=settings.limits(),
            tls=tls,
            on_refused=on_refused,
            thread_name="extender-http",
            bind_fix="free the port or set extender.port",
            logger=log,
        )


class HealthServer(HealthEndpoint):
    """The shared endpoint (:mod:`interference_infra.http`) with the scheduler's checks,
    kept-alive connections and ``post_routes``; ``port`` is the bound port. ``decisions``
    and ``get_routes`` (``/config``) are served only with ``settings.debug_pages``."""

    def __init__(
        self,
        settings: HttpSettings,
        registry: CollectorRegistry,
        status: Status,
        post_routes: Mapping[str, PostRoute] | None = None,
        decisions: DecisionPages | None = None,
        get_routes: Mapping[str, GetRoute] | None = None,
    ):
        self._status = status
        if not settings.debug_pages:  # what a pod admitted for /metrics should not read
            decisions, get_routes = None, None
        self.decisions = decisions
        routes = dict(get_routes or {})
        if decisions is not None:
            routes[DECISIONS_PATH] = decision_page_route(decisions)
        super().__init__(
            settings.host,
            settings.port,
            registry,
            {HEALTHZ_PATH: self.healthz, READYZ_PATH: self.readyz},
            post_routes=post_routes,
            get_routes=routes,
            keep_alive=True,
            bind_fix="free the port or set http.port",
            logger=log,
        )

    def start(self) -> None:
        super().start()
        log.info(
            "serving /healthz, /readyz, /metrics%s on port %d",
            f" and {DECISIONS_PATH}NS/POD" if self.decisions is not None else "",
            self.port,
        )

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
        if missing:
            return 503, f"not ready ({role}): " + "; ".join(missing) + "\n"
        config_error = self._status.config_error()
        if config_error:
            return 200, (
                f"ok ({role}); the configuration file is invalid, the last valid configuration"
                f" serves: {config_error}\n"
            )
        return 200, f"ok ({role})\n"
