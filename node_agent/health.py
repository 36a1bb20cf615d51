"""The agent's HTTP endpoint: ``/healthz``, ``/readyz`` and Prometheus ``/metrics``.

A stdlib ``ThreadingHTTPServer`` on a daemon thread; a slow scrape never delays the
measure loop, and the loop never waits on a request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

log = logging.getLogger(__name__)

HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
METRICS_PATH = "/metrics"
STALE_INTERVALS = 3
"""``/healthz`` fails once no interval completed for this many intervals."""

HealthCheck = Callable[[], str]
"""Returns "" when fine, else the reason it is not (sent with the 503)."""


class AgentMetrics:
    """The agent's Prometheus metrics, registered in the registry passed in."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.intervals_measured = Counter(
            "interference_agent_intervals_measured",
            "Intervals measured into a report.",
            registry=registry,
        )
        self.publish_failures = Counter(
            "interference_agent_publish_failures",
            "Reports the sink dropped (Redis unreachable, rejected credentials, …).",
            registry=registry,
        )
        self.probes_running = Gauge(
            "interference_agent_probes_running",
            "Probes collecting every interval.",
            registry=registry,
        )
        self.probe_disabled = Gauge(
            "interference_agent_probe_disabled",
            "1 for each probe that could not start, with the reason.",
            ["probe", "reason"],
            registry=registry,
        )
        self.collect_duration = Histogram(
            "interference_agent_collect_duration_seconds",
            "Time one probe takes to collect one interval.",
            ["probe"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )

    def set_probes(self, running: list[str], disabled: dict[str, str]) -> None:
        """Record which probes run and which could not start (and why)."""
        self.probes_running.set(len(running))
        self.probe_disabled.clear()
        for probe, reason in disabled.items():
            self.probe_disabled.labels(probe=probe, reason=reason).set(1)


def liveness_problem(
    now: float, loop_started: float | None, last_measured: float | None, interval_s: float
) -> str:
    """Why the measure loop is not alive, or "" when it is.

    With ``since = last_measured`` (else ``loop_started`` before the first interval), the
    loop is alive when ``now − since ≤ STALE_INTERVALS · interval_s``. Before the loop
    starts (probes still loading, BCC compiling) it is not alive yet: a startup probe,
    not the liveness probe, covers that time. All times are ``time.monotonic()`` seconds.
    """
    if loop_started is None:
        return "starting: the probes are loading and the measure loop has not begun"
    since = last_measured if last_measured is not None else loop_started
    limit = STALE_INTERVALS * interval_s
    if now - since <= limit:
        return ""
    what = "no interval measured" if last_measured is not None else "no interval measured yet"
    return f"{what} for {now - since:.1f} s (limit {STALE_INTERVALS} × {interval_s:g} s)"


class AgentHttpServer:
    """Serves ``/healthz``, ``/readyz`` (200 "ok", else 503 with the reason) and
    ``/metrics`` from ``registry`` on ``address:port`` (port 0: any free port)."""

    def __init__(
        self,
        address: str,
        port: int,
        registry: CollectorRegistry,
        health: HealthCheck,
        ready: HealthCheck,
    ) -> None:
        checks = {HEALTHZ_PATH: health, READYZ_PATH: ready}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.partition("?")[0]
                if path == METRICS_PATH:
                    self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path in checks:
                    problem = checks[path]()
                    body = (problem or "ok") + "\n"
                    self._reply(503 if problem else 200, body.encode(), "text/plain")
                else:
                    self._reply(404, b"not found: try /healthz, /readyz or /metrics\n")

            def _reply(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("%s " + format, self.address_string(), *args)

        try:
            self._server = ThreadingHTTPServer((address, port), Handler)
        except OSError as exc:
            raise OSError(
                f"cannot serve {HEALTHZ_PATH}, {READYZ_PATH} and {METRICS_PATH} on "
                f"{address}:{port} ({exc}); pick another --http-port/--http-address, "
                "or --http-port 0 to serve nothing"
            ) from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="agent-http", daemon=True
        )

    @property
    def port(self) -> int:
        """The port listened on (the chosen one when constructed with 0)."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Serve on a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
