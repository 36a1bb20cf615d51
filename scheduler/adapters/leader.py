"""Lease leader election (``coordination.k8s.io/v1``) with the client's ``leaderelection``.

The client's :class:`kubernetes.leaderelection.leaderelection.LeaderElection` holds the
algorithm (acquire when the Lease is absent, unheld or expired by our own clock; renew
every ``retry_period``; give up after ``renew_deadline`` without a renewal). Three small
adapters make it fit a long-running scheduler:

* its ``LeaseLock`` talks through the global default configuration, so
  :class:`_ApiLeaseLock` points it at our ``ApiClient``;
* it has no way to stop and lets client exceptions escape ``run()``, so
  :class:`_Election` checks ``stop`` before every attempt (raising :class:`_Stopped`)
  and turns any exception into a failed attempt;
* it only reports leadership after ``renew_deadline`` has passed without a renewal, so
  ``leading`` follows every attempt instead: set on a successful acquire/renew, cleared
  at once on a failed one. Binding therefore stops at the first renewal attempt after the
  lease was lost — within one ``retry_period`` — and a replica that merely failed one
  renewal (API blip) resumes binding on its next success.

On ``stop`` a leader hands the Lease back (empty holder) so the other replica takes over
at its next attempt instead of waiting ``lease_duration``.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.leaderelection import electionconfig
from kubernetes.leaderelection.leaderelection import LeaderElection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = logging.getLogger(__name__)

LEASE_PERMISSIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("coordination.k8s.io", "leases", ("get", "create", "update")),
)
"""(apiGroup, resource, verbs) the elector calls."""


@dataclass(frozen=True, slots=True)
class LeaderElectionSettings:
    """Lease election timing, in whole seconds as the client library needs.

    Constraints (checked by :mod:`scheduler.entry.config`): ``lease_duration_s`` >
    ``renew_deadline_s`` > 1.2 × ``retry_period_s`` ≥ 1.
    """

    enabled: bool = True
    """False: this replica leads unconditionally (one replica, tests, dry runs)."""
    lease_name: str = "interference-scheduler"
    """Name of the Lease the replicas compete for (one per scheduler name)."""
    namespace: str = ""
    """Namespace of the Lease; empty: ``$POD_NAMESPACE``, else ``kube-system``."""
    lease_duration_s: int = 15
    """How long followers wait after the last observed renewal before taking over."""
    renew_deadline_s: int = 10
    """How long the leader keeps retrying a failed renewal before giving up the loop."""
    retry_period_s: int = 2
    """Interval between acquire/renew attempts; binding stops within one of these."""

    def __post_init__(self) -> None:
        # The client library calls sys.exit() on these, so they are checked here first.
        if not self.lease_name:
            raise ValueError("lease_name: must not be empty, e.g. interference-scheduler")
        if self.retry_period_s < 1:
            raise ValueError(f"retry_period_s: {self.retry_period_s!r} must be an integer ≥ 1")
        if not self.renew_deadline_s > 1.2 * self.retry_period_s:
            raise ValueError(
                f"renew_deadline_s: {self.renew_deadline_s!r} must be greater than 1.2 ×"
                f" retry_period_s ({self.retry_period_s}); e.g. 10 with retry_period_s 2"
            )
        if not self.lease_duration_s > self.renew_deadline_s:
            raise ValueError(
                f"lease_duration_s: {self.lease_duration_s!r} must be greater than"
                f" renew_deadline_s ({self.renew_deadline_s}); e.g. 15 with renew_deadline_s 10"
            )


def default_identity() -> str:
    """``$POD_NAME`` (else the hostname) plus a random suffix, unique per process."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{secrets.token_hex(4)}"


def lease_namespace(settings: LeaderElectionSettings) -> str:
    return settings.namespace or os.environ.get("POD_NAMESPACE") or "kube-system"


class _Stopped(Exception):
    """Raised inside the library's loops to leave ``run()`` when ``stop`` is set."""


class _ApiLeaseLock(LeaseLock):
    """The client's LeaseLock, on an explicit ApiClient; it also carries the holder's
    annotations (:meth:`LeaderElector.publish`) and keeps the ones it last read."""

    def __init__(self, name: str, namespace: str, identity: str, api: client.ApiClient) -> None:
        super().__init__(name, namespace, identity)  # type: ignore[no-untyped-call]
        self.api_instance = client.CoordinationV1Api(api)
        self.published: dict[str, str] = {}
        self.observed: dict[str, str] = {}

    def get(self, name: str, namespace: str) -> Any:
        found = super().get(name, namespace)  # type: ignore[no-untyped-call]
        lease = self.lease_reference
        if found[0] and lease is not None and lease.metadata is not None:
            self.observed = dict(lease.metadata.annotations or {})
        return found

    def update(self, name: str, namespace: str, updated_record: Any) -> Any:
        # Called only to acquire or renew: the holder is the one writer of its annotations,
        # in the same write as the renewal (a separate write would race it).
        lease = self.lease_reference
        if self.published and lease is not None and lease.metadata is not None:
            lease.metadata.annotations = {**(lease.metadata.annotations or {}), **self.published}
        return super().update(name, namespace, updated_record)  # type: ignore[no-untyped-call]


LEASE_FAILURE_LOG_INTERVAL_S = 30.0
"""While the API server is away a lease call fails every ``retry_period_s``: one line per
this long says so, with how many failed since the last (then one when they succeed
again), not one line per attempt."""


class _Election(LeaderElection):
    def __init__(
        self,
        config: Any,
        on_attempt: Callable[[bool, str], None],
        stop: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(config)  # type: ignore[no-untyped-call]
        self._on_attempt = on_attempt
        self._stop = stop
        self._clock = clock
        self._failing_since: float | None = None
        self._failed_unlogged = 0
        self._logged_at = -math.inf

    def try_acquire_or_renew(self) -> bool:
        if self._stop.is_set():
            raise _Stopped
        try:
            ok = bool(super().try_acquire_or_renew())  # type: ignore[no-untyped-call]
        except Exception as exc:  # the library lets connection errors escape
            self._call_failed(exc)
            ok = False
        else:
            if self._failing_since is not None:
                log.warning(
                    "leader election: lease calls succeed again after %.0f s of failures",
                    self._clock() - self._failing_since,
                )
                self._failing_since, self._failed_unlogged = None, 0
                self._logged_at = -math.inf
        record = self.observed_record
        holder = str(record.holder_identity) if record and record.holder_identity else ""
        self._on_attempt(ok, holder)
        return ok

    def _call_failed(self, exc: Exception) -> None:
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
        if now - self._logged_at < LEASE_FAILURE_LOG_INTERVAL_S:
            self._failed_unlogged += 1
            return
        more = (
            f" ({self._failed_unlogged} more since the last line)" if self._failed_unlogged else ""
        )
        log.warning("leader election: lease call failed: %r%s", exc, more)
        self._logged_at, self._failed_unlogged = now, 0


class LeaderElector:
    """Runs the election until ``stop``; keeps ``leading`` set exactly while we may bind."""

    def __init__(
        self,
        api: client.ApiClient,
        settings: LeaderElectionSettings,
        leading: threading.Event,
        identity: str = "",
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.settings = settings
        self.leading = leading
        self.identity = identity or default_identity()
        self.namespace = lease_namespace(settings)
        self.holder = ""
        """The holder of the Lease as last observed (for /readyz and logs)."""
        self.renewals = 0
        """Successful acquire/renew attempts of this replica."""
        self._api = api
        self._on_change = on_change
        self._lock = _ApiLeaseLock(settings.lease_name, self.namespace, self.identity, api)

    def run(self, stop: threading.Event) -> None:
        """Blocks until ``stop`` is set; releases the Lease if this replica holds it."""
        if not self.settings.enabled:
            self._set_leading(True)
            stop.wait()
            self._set_leading(False)
            return
        config = electionconfig.Config(  # type: ignore[no-untyped-call]
            lock=self._lock,
            lease_duration=self.settings.lease_duration_s,
            renew_deadline=self.settings.renew_deadline_s,
            retry_period=self.settings.retry_period_s,
            onstarted_leading=lambda: log.info("%s started leading", self.identity),
            onstopped_leading=lambda: self._set_leading(False),
        )
        while not stop.is_set():
            try:
                _Election(config, self._attempted, stop).run()  # type: ignore[no-untyped-call]
            except _Stopped:
                break
            except Exception:  # never let the elector thread die; start over
                log.exception("leader election failed; restarting it")
                self._set_leading(False)
                stop.wait(self.settings.retry_period_s)
        was_leading = self.leading.is_set()
        self._set_leading(False)
        if was_leading:
            self._release()

    def publish(self, key: str, value: str) -> None:
        """Write annotation ``key`` on the Lease with every renewal while this replica
        leads (how the leader tells the standbys, e.g. a reload's verdict)."""
        self._lock.published = {**self._lock.published, key: value}

    def annotation(self, key: str) -> str | None:
        """Annotation ``key`` of the Lease as last read (every ``retry_period_s``)."""
        return self._lock.observed.get(key)

    def _attempted(self, ok: bool, holder: str) -> None:
        self.holder = holder
        if ok:
            self.renewals += 1
        self._set_leading(ok and holder == self.identity)

    def _set_leading(self, leading: bool) -> None:
        if leading == self.leading.is_set():
            return
        if leading:
            self.leading.set()
        else:
            self.leading.clear()
        log.info(
            "%s %s leading (lease %s/%s)",
            self.identity,
            "started" if leading else "stopped",
            self.namespace,
            self.settings.lease_name,
        )
        if self._on_change is not None:
            self._on_change(leading)

    def _release(self) -> None:
        """Hand the Lease back so the other replica need not wait for it to expire."""
        api = client.CoordinationV1Api(self._api)
        try:
            lease = api.read_namespaced_lease(self.settings.lease_name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = None
            api.replace_namespaced_lease(self.settings.lease_name, self.namespace, lease)
            log.info("%s released the lease", self.identity)
        except Exception as exc:
            log.warning("could not release the lease (it expires by itself): %r", exc)
