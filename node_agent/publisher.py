"""Writes each NodeReport to Redis in one pipelined round trip (DESIGN §4).

Per flush: the node hash and its TTL, both node sorted sets, one hash per pod with its
TTL, the node's pod set, the GPU hash, and one stream entry. When Redis cannot be
reached the report is dropped (never queued, so memory stays bounded), the outage is
logged once, and the next flush simply tries again on a fresh connection.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from interference import codec, keys
from interference.signals import SYSTEM_POD, NodeReport

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublisherSettings:
    """Where and how reports are written."""

    redis_url: str
    username: str | None = None
    password: str | None = None
    ttl_s: int = 5
    """TTL of every hash and of the node's pod set."""
    stream_maxlen: int = keys.STREAM_MAXLEN
    """Approximate cap of the stream (``MAXLEN ~``)."""
    socket_timeout_s: float = 0.5
    """Connect and read timeout of the Redis socket."""


class RedisPublisher:
    """Publishes reports; :meth:`publish` never raises for Redis being away or refusing."""

    def __init__(self, settings: PublisherSettings) -> None:
        """Raises ``ValueError`` for a URL redis-py cannot parse."""
        self._settings = settings
        self._client = redis.Redis.from_url(
            settings.redis_url,
            username=settings.username,
            password=settings.password,
            socket_timeout=settings.socket_timeout_s,
            socket_connect_timeout=settings.socket_timeout_s,
            # No retries inside a flush: a failed flush is dropped and the next interval
            # tries again, so a dead Redis never holds up measuring.
            retry=Retry(NoBackoff(), 0),
        )
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
        try:
            # The context manager resets the pipeline, so a failed flush keeps nothing.
            with self._client.pipeline(transaction=False) as pipe:
                pod_keys = self._queue_commands(pipe, report)
                pipe.execute()
        except redis.AuthenticationError as exc:
            return self._failed(
                report,
                "auth",
                f"Redis rejected the credentials ({exc}); check REDIS_USERNAME/REDIS_PASSWORD",
            )
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            return self._failed(
                report, "unreachable", f"Redis at {self._where()} is unreachable ({exc})"
            )
        except redis.ResponseError as exc:
            return self._failed(
                report,
                "refused",
                f"Redis refused a write ({exc}); the agent's ACL user needs HSET, EXPIRE, ZADD,"
                " SADD, SREM and XADD on keys intf:*",
            )
        except redis.RedisError as exc:
            return self._failed(report, "error", f"Redis error ({exc!r})")
        if self._failing_since is not None:
            log.warning(
                "Redis at %s is back after %.1f s; %d report(s) were dropped meanwhile",
                self._where(),
                time.monotonic() - self._failing_since,
                self._dropped_in_outage,
            )
            self._dropped_in_outage = 0
            self._failing_since = None
            self._failure = ""
        self._pod_keys = pod_keys
        self.published += 1
        return True

    def close(self) -> None:
        """Close the connection pool; safe to call twice."""
        self._client.close()

    def _queue_commands(self, pipe: redis.client.Pipeline[bytes], report: NodeReport) -> set[str]:
        """Queue the flush; returns the pod set's members once it is written."""
        node, ttl = report.node, self._settings.ttl_s
        node_key = keys.node_key(node)
        pipe.hset(node_key, mapping=codec.node_hash(report))  # type: ignore[arg-type]
        pipe.expire(node_key, ttl)
        pipe.zadd(keys.NODES_BY_SCORE, {node: report.metrics.score})
        pipe.zadd(keys.NODES_UPDATED, {node: report.ts})
        pods_key = keys.node_pods_key(node)
        # The system bucket is per node and has no pod key of its own; it stays in the stream.
        pods = [p for p in report.pods if p.uid or p.name != SYSTEM_POD]
        for pod in pods:
            pod_key = keys.pod_key(pod.namespace, pod.name)
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
        pipe.xadd(
            keys.STREAM,
            {keys.STREAM_FIELD: codec.encode_report(report)},
            maxlen=self._settings.stream_maxlen,
            approximate=True,
        )
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
        self._client.connection_pool.disconnect()
        return False

    def _where(self) -> str:
        kwargs = self._client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return str(kwargs["path"])
        return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
