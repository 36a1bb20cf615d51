"""The agent's metrics and the checks behind ``/healthz`` and ``/readyz``, served by the
shared endpoint (:mod:`interference_infra.http`) on its own thread, so a slow scrape never
delays the measure loop and the loop never waits on a request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from interference.freshness import MISSED_INTERVALS
from interference_infra.http import HEALTHZ_PATH, READYZ_PATH, HealthEndpoint, problem_check

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
        self.credentials = Counter(
            "interference_agent_credentials",
            "Enrolment with the credential issuer: issued (credentials obtained), failed (no"
            " answer, refused or rate-limited), refused_by_redis (WRONGPASS/NOAUTH/NOPERM).",
            ["event"],
            registry=registry,
        )
        for event in ("issued", "failed", "refused_by_redis"):
            self.credentials.labels(event=event)
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
    loop is alive when ``now − since ≤ MISSED_INTERVALS · interval_s`` (the intervals a
    report stays fresh for, :mod:`interference.freshness`). Before the loop
    starts (probes still loading, BCC compiling) it is not alive yet: a startup probe,
    not the liveness probe, covers that time. All times are ``time.monotonic()`` seconds.
    """
    if loop_started is None:
        return "starting: the probes are loading and the measure loop has not begun"
    since = last_measured if last_measured is not None else loop_started
    limit = MISSED_INTERVALS * interval_s
    if now - since <= limit:
        return ""
    what = "no interval measured" if last_measured is not None else "no interval measured yet"
    return f"{what} for {now - since:.1f} s (limit {MISSED_INTERVALS} × {interval_s:g} s)"


class AgentHttpServer(HealthEndpoint):
    """Serves ``/healthz`` and ``/readyz`` (200 "ok", else 503 with the reason) and
    ``/metrics`` from ``registry`` on ``address:port`` (port 0: any free port).

    A port that cannot be bound raises :class:`~interference_infra.http.EndpointBindError`
    and the agent stops: with hostNetwork, kubelet's probes would reach whoever holds it.
    """

    def __init__(
        self,
        address: str,
        port: int,
        registry: CollectorRegistry,
        health: HealthCheck,
        ready: HealthCheck,
    ) -> None:
        super().__init__(
            address,
            port,
            registry,
            {HEALTHZ_PATH: problem_check(health), READYZ_PATH: problem_check(ready)},
            thread_name="agent-http",
            logger=logging.getLogger(__name__),
            bind_fix="pick another --http-port/--http-address, or --http-port 0 to serve nothing",
        )
