"""The scheduler's ``/healthz``, ``/readyz`` and ``/metrics``: what they check, served by
the shared endpoint (:mod:`interference_infra.http`).

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

HTTP/1.1 with keep-alive and TCP_NODELAY, so a caller that posts many requests
(kube-scheduler calling an extender) reuses its connection.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from interference_infra.http import (
    HEALTHZ_PATH,
    READYZ_PATH,
    HealthEndpoint,
    PostRoute,
)

log = logging.getLogger(__name__)

DEFAULT_PORT = 10251

__all__ = ["DEFAULT_PORT", "HealthServer", "Heartbeat", "HttpSettings", "PostRoute", "Status"]


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


class HealthServer(HealthEndpoint):
    """The shared endpoint (:mod:`interference_infra.http`) with the scheduler's checks,
    kept-alive connections and ``post_routes``; ``port`` is the bound port."""

    def __init__(
        self,
        settings: HttpSettings,
        registry: CollectorRegistry,
        status: Status,
        post_routes: Mapping[str, PostRoute] | None = None,
    ):
        self._status = status
        super().__init__(
            settings.host,
            settings.port,
            registry,
            {HEALTHZ_PATH: self.healthz, READYZ_PATH: self.readyz},
            post_routes=post_routes,
            keep_alive=True,
            bind_fix="free the port or set http.port",
            logger=log,
        )

    def start(self) -> None:
        super().start()
        log.info("serving /healthz, /readyz and /metrics on port %d", self.port)

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
