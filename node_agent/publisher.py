"""Writes each NodeReport to Redis in one pipelined round trip (docs/design.md §4).

Per flush, every key under the node's own prefix (:mod:`interference.keys`), so the
agent's ACL user can be limited to its node: the scheduling record (the only key the
scheduler reads), the node hash, one hash per pod and the node's pod set, the GPU hash
(each with the freshness TTL), and one entry of the node's capped report stream. When
Redis cannot be reached the report is dropped (never queued, so memory stays bounded),
the outage is logged once, and the next flush simply tries again on a fresh connection.

The ranking sorted sets (``intf:nodes``) are the scheduler's to write: an agent never
touches another node's data. On clean shutdown the agent deletes its own keys
(:meth:`RedisPublisher.withdraw`); a dead agent's keys expire with their TTL.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import TypeAlias

import redis
from redis.backoff import NoBackoff
from redis.client import Pipeline as SinglePipeline
from redis.cluster import ClusterPipeline
from redis.retry import Retry

from interference import codec, keys, sched_record
from interference.acl import AGENT_COMMANDS
from interference.signals import SYSTEM_POD, NodeReport
from interference_infra.redis_client import (
    DEFAULT_SENTINEL_MASTER,
    REDIS_ERRORS,
    RedisConnection,
    RedisTarget,
    unreachable_reason,
)
from interference_infra.redis_tls import RedisTls
from node_agent.credentials import Credentials, Enrolment

log = logging.getLogger(__name__)

ACL_COMMANDS = AGENT_COMMANDS
"""Every Redis command the agent sends, all on its own node's keys
(:data:`interference.acl.AGENT_COMMANDS`)."""


@dataclass(frozen=True)
class PublisherSettings:
    """Where and how reports are written."""

    redis_url: str
    """``redis://``/``rediss://`` URL of the server, of one cluster node (``cluster``), or
    only the database and TLS choice when ``sentinels`` are given."""
    username: str | None = None
    password: str | None = None
    ttl_s: int = 5
    """TTL of every hash and of the node's pod set."""
    stream_maxlen: int = keys.NODE_REPORTS_MAXLEN
    """Cap of the node's report stream (exact ``MAXLEN``)."""
    socket_timeout_s: float = 0.5
    """Connect and read timeout of the Redis socket."""
    sentinels: tuple[tuple[str, int], ...] = ()
    """Sentinel ``(host, port)`` pairs; when set, the master comes from them."""
    sentinel_master: str = DEFAULT_SENTINEL_MASTER
    """Name of the monitored master the sentinels are asked for."""
    cluster: bool = False
    """The URL points at a Redis Cluster node (pipelines are split per shard)."""
    tls: RedisTls = field(default_factory=RedisTls)
    """CA and client certificate for ``rediss://``."""

    @property
    def target(self) -> RedisTarget:
        """Where the reports go (``ValueError`` for a URL or combination that cannot work)."""
        return RedisTarget(
            self.redis_url,
            sentinels=self.sentinels,
            sentinel_master=self.sentinel_master,
            cluster=self.cluster,
            tls=self.tls,
            username=self.username,
            password=self.password,
        )


Pipeline: TypeAlias = "SinglePipeline[bytes] | ClusterPipeline[bytes]"


class RedisPublisher:
    """Publishes reports; :meth:`publish` never raises for Redis being away or refusing.

    With an ``enrolment`` (``--credentials-url``) it logs in as the node's own user from
    the credential issuer instead of ``settings.username``/``password``: reports are
    dropped while it has none, and credentials Redis refuses (``WRONGPASS``, ``NOAUTH``,
    ``NOPERM``) are handed back so the enrolment gets new ones."""

    def __init__(self, settings: PublisherSettings, enrolment: Enrolment | None = None) -> None:
        """Raises ``ValueError`` for a URL or combination that cannot work."""
        self._settings = settings
        self._enrolment = enrolment
        self._logged_in: Credentials | None = None
        """The issued credentials :attr:`_redis` logs in with (None: the settings')."""
        # No retries inside a flush: a failed flush is dropped and the next interval tries
        # again, so a dead Redis never holds up measuring. The client is built on the first
        # flush (a cluster client asks for the slot map as it is built).
        self._redis = RedisConnection(
            settings.target, settings.socket_timeout_s, retry=Retry(NoBackoff(), 0)
        )
        self._where = self._redis.target.describe()
        self._failing_since: float | None = None
        self._failure: str = ""
        self._dropped_in_outage = 0
        self._pod_keys: set[str] = set()
        self.dropped = 0
        """Reports dropped because Redis could not take them (since start)."""
        self.published = 0
        """Reports written (since start)."""

    def publish(self, report: NodeReport) -> bool:
        """Write one report in one round trip; False (report dropped) when that failed."""
        issued: Credentials | None = None
        if self._enrolment is not None:
            issued = self._enrolment.credentials()
            if issued is None:
                return self._failed(report, "credentials", self._enrolment.problem())
            if issued != self._logged_in:
                self._log_in(issued)
        try:
            # The context manager resets the pipeline, so a failed flush keeps nothing.
            with self._redis.client().pipeline(transaction=False) as pipe:
                pod_keys = self.queue_report(pipe, report)
                pipe.execute()
        except redis.AuthenticationError as exc:
            if issued is not None:
                return self._refused(report, issued, exc)
            return self._failed(
                report,
                "auth",
                f"Redis rejected the credentials ({exc}); check REDIS_USERNAME/REDIS_PASSWORD",
            )
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # Explained once per outage (only its first line is logged): the look at a
            # rediss:// server that may speak plaintext costs a connection.
            first = self._failure != "unreachable"
            why = unreachable_reason(self._redis.target, exc) if first else str(exc)
            return self._failed(
                report, "unreachable", f"Redis at {self._where} is unreachable ({why})"
            )
        except redis.ResponseError as exc:
            if issued is not None and refuses_credentials(exc):
                return self._refused(report, issued, exc)
            return self._failed(
                report,
                "refused",
                f"Redis refused a write ({exc}); the agent's ACL user needs"
                f" {', '.join(c.upper() for c in ACL_COMMANDS)} on the keys of its node"
                f" ({' '.join(keys.node_key_patterns(report.node))})",
            )
        except REDIS_ERRORS as exc:
            if issued is not None and refuses_credentials(exc):
                return self._refused(report, issued, exc)
            return self._failed(report, "error", f"Redis error at {self._where} ({exc!r})")
        if self._enrolment is not None:
            self._enrolment.confirm()
        if self._failing_since is not None:
            log.warning(
                "Redis at %s is back after %.1f s; %d report(s) were dropped meanwhile",
                self._where,
                time.monotonic() - self._failing_since,
                self._dropped_in_outage,
            )
            self._dropped_in_outage = 0
            self._failing_since = None
            self._failure = ""
        self._pod_keys = pod_keys
        self.published += 1
        return True

    def withdraw(self, node: str) -> bool:
        """Delete the node's keys (clean shutdown); False when Redis could not be reached.
        Never raises."""
        if self._enrolment is not None and self._logged_in is None:
            return False  # never enrolled: nothing written, and no user to delete with
        try:
            with self._redis.client().pipeline(transaction=False) as pipe:
                pipe.delete(keys.sched_key(node), keys.node_key(node))
                pipe.delete(keys.node_pods_key(node), keys.gpu_key(node), keys.reports_key(node))
                for pod_key in self._pod_keys:
                    pipe.delete(keys.pod_key(node, *_pod_key_parts(pod_key)))
                pipe.execute()
        except REDIS_ERRORS as exc:
            log.warning(
                "could not remove node %s from Redis at shutdown (%s); its keys expire with"
                " their TTL",
                node,
                exc,
            )
            return False
        self._pod_keys = set()
        return True

    def close(self) -> None:
        """Close the connections; safe to call twice."""
        self._redis.close()

    def _log_in(self, issued: Credentials) -> None:
        """From now on connect as ``issued`` (the old connections are closed)."""
        target = replace(self._settings.target, username=issued.username, password=issued.password)
        old, self._redis = (
            self._redis,
            RedisConnection(target, self._settings.socket_timeout_s, retry=Retry(NoBackoff(), 0)),
        )
        old.close()
        self._logged_in = issued

    def _refused(self, report: NodeReport, issued: Credentials, exc: Exception) -> bool:
        """Redis refused the issued credentials: hand them back for new ones."""
        assert self._enrolment is not None
        self._enrolment.refused(issued, str(exc) or type(exc).__name__)
        return self._failed(
            report,
            "auth",
            f"Redis at {self._where} refused the credentials of {issued.username} ({exc});"
            " enrolling again",
        )

    def queue_report(self, pipe: Pipeline, report: NodeReport) -> set[str]:
        """Queue the flush on ``pipe`` (no I/O); returns the pod set's members once it is
        written. Benchmarks use it to encode what an agent writes ahead of time."""
        node, ttl = report.node, self._settings.ttl_s
        pipe.set(keys.sched_key(node), sched_record.encode(report), ex=ttl)
        node_key = keys.node_key(node)
        pipe.hset(node_key, mapping=codec.node_hash(report))  # type: ignore[arg-type]
        pipe.expire(node_key, ttl)
        pods_key = keys.node_pods_key(node)
        # The system bucket is per node and has no pod key of its own; it stays in the stream.
        pods = [p for p in report.pods if p.uid or p.name != SYSTEM_POD]
        for pod in pods:
            pod_key = keys.pod_key(node, pod.namespace, pod.name)
            pipe.hset(pod_key, mapping=codec.pod_hash(pod, node, report.ts))  # type: ignore[arg-type]
            pipe.expire(pod_key, ttl)
        # SADD the current pods and SREM the departed ones rather than DEL + SADD, so a
        # reader never sees the set empty for a moment.
        current = {p.key for p in pods}
        if current:
            pipe.sadd(pods_key, *current)
            pipe.expire(pods_key, ttl)
        if departed := self._pod_keys - current:
            pipe.srem(pods_key, *departed)
        gpu_key = keys.gpu_key(node)
        pipe.hset(gpu_key, mapping=codec.gpu_hash(report.gpus))  # type: ignore[arg-type]
        pipe.expire(gpu_key, ttl)
        reports_key = keys.reports_key(node)
        pipe.xadd(
            reports_key,
            {keys.REPORTS_FIELD: codec.encode_report(report)},
            maxlen=self._settings.stream_maxlen,
            approximate=False,  # exact: ~ trims only whole 100-entry stream nodes
        )
        pipe.expire(reports_key, ttl)
        return current

    def _failed(self, report: NodeReport, kind: str, reason: str) -> bool:
        """Count a dropped report; log only when an outage starts or its kind changes."""
        log.debug("dropped the report of %s at ts=%.3f", report.node, report.ts)
        self.dropped += 1
        self._dropped_in_outage += 1
        if kind != self._failure:
            log.error("%s; dropping reports and retrying every interval", reason)
            self._failure = kind
            if self._failing_since is None:
                self._failing_since = time.monotonic()
        # A half-read reply must not poison the next round trip.
        self._redis.reset()
        return False


CREDENTIAL_ERRORS = ("WRONGPASS", "NOAUTH", "NOPERM")
"""Redis' answers meaning the user is gone, has another password, or other rules."""


def refuses_credentials(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it wraps: a Cluster client built on a refused login)
    is Redis refusing the credentials (:data:`CREDENTIAL_ERRORS`)."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, (redis.AuthenticationError, redis.exceptions.NoPermissionError)):
            return True
        if any(code in str(seen) for code in CREDENTIAL_ERRORS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _pod_key_parts(pod_key: str) -> tuple[str, str]:
    """``ns/name`` (or a bare name) as (namespace, name)."""
    namespace, sep, name = pod_key.partition("/")
    return (namespace, name) if sep else ("", pod_key)
