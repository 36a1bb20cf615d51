"""Writes each NodeReport to Redis in one pipelined round trip (docs/design.md §4).

Per flush: the node hash and its TTL, both node sorted sets, one hash per pod with its
TTL, the node's pod set, the GPU hash, and one stream entry. When Redis cannot be
reached the report is dropped (never queued, so memory stays bounded), the outage is
logged once, and the next flush simply tries again on a fresh connection.

Dead nodes: the hashes expire by TTL, but sorted-set members cannot. On clean shutdown
the agent removes its own node (:meth:`RedisPublisher.withdraw`). For agents that die
without one, every agent sweeps every ``sweep_interval_s`` (default 30 s, after a
successful flush): ``ZRANGEBYSCORE intf:nodes:updated -inf (now − 5)`` lists the nodes
that have not reported for 5 s (O(log N + M), so a thousand agents sweeping cost Redis
little), ``EXISTS`` checks their hashes, and members whose hash has expired are removed
from both sorted sets. A dead node thus leaves ``intf:nodes`` within its TTL plus one
sweep interval as long as any agent runs. The sweep lives in the agent because the agent
already writes ``intf:*`` (the scheduler's ACL user only reads it), runs on every node,
and does not depend on a scheduler being leader or out of dry-run. A node that reports
between the ``EXISTS`` and the ``ZREM`` is removed for one interval and re-added by its
next flush.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TypeAlias

import redis
from redis.backoff import NoBackoff
from redis.client import Pipeline as SinglePipeline
from redis.cluster import ClusterPipeline
from redis.retry import Retry

from interference import codec, freshness, keys
from interference.signals import SYSTEM_POD, NodeReport
from interference_infra.redis_client import (
    DEFAULT_SENTINEL_MASTER,
    REDIS_ERRORS,
    RedisConnection,
    RedisTarget,
)
from interference_infra.redis_tls import RedisTls

log = logging.getLogger(__name__)


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
    stream_maxlen: int = keys.STREAM_MAXLEN
    """Approximate cap of the stream (``MAXLEN ~``)."""
    socket_timeout_s: float = 0.5
    """Connect and read timeout of the Redis socket."""
    sentinels: tuple[tuple[str, int], ...] = ()
    """Sentinel ``(host, port)`` pairs; when set, the master comes from them."""
    sentinel_master: str = DEFAULT_SENTINEL_MASTER
    """Name of the monitored master the sentinels are asked for."""
    cluster: bool = False
    """The URL points at a Redis Cluster node (pipelines are split per shard)."""
    sweep_interval_s: float = 30.0
    """Seconds between sweeps of dead nodes from the node sorted sets; 0 never sweeps."""
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
    """Publishes reports; :meth:`publish` never raises for Redis being away or refusing."""

    def __init__(self, settings: PublisherSettings) -> None:
        """Raises ``ValueError`` for a URL or combination that cannot work."""
        self._settings = settings
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
        self._next_sweep = time.monotonic() + settings.sweep_interval_s
        self.swept = 0
        """Dead nodes removed from the sorted sets by this publisher's sweeps."""
        self.dropped = 0
        """Reports dropped because Redis could not take them (since start)."""
        self.published = 0
        """Reports written (since start)."""

    def publish(self, report: NodeReport) -> bool:
        """Write one report in one round trip; False (report dropped) when that failed."""
        try:
            # The context manager resets the pipeline, so a failed flush keeps nothing.
            with self._redis.client().pipeline(transaction=False) as pipe:
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
                report, "unreachable", f"Redis at {self._where} is unreachable ({exc})"
            )
        except redis.ResponseError as exc:
            return self._failed(
                report,
                "refused",
                f"Redis refused a write ({exc}); the agent's ACL user needs HSET, EXPIRE, ZADD,"
                " SADD, SREM, XADD, ZRANGEBYSCORE, EXISTS, ZREM and DEL on keys intf:*",
            )
        except REDIS_ERRORS as exc:
            return self._failed(report, "error", f"Redis error at {self._where} ({exc!r})")
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
        if self._settings.sweep_interval_s > 0 and time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self._settings.sweep_interval_s
            self.sweep(report.ts)
        return True

    def sweep(self, now: float) -> list[str]:
        """Remove nodes whose hash has expired from both node sorted sets (see the module
        docstring); returns them. Never raises: a failed sweep is logged and retried at
        the next sweep interval."""
        try:
            client = self._redis.client()
            cutoff = now - freshness.MIN_STALE_AFTER_S
            quiet = [
                m.decode() if isinstance(m, bytes) else str(m)
                for m in client.zrangebyscore(keys.NODES_UPDATED, "-inf", f"({cutoff}")
            ]
            if not quiet:
                return []
            with client.pipeline(transaction=False) as pipe:
                for node in quiet:
                    pipe.exists(keys.node_key(node))
                exists = dict(zip(quiet, (bool(n) for n in pipe.execute()), strict=True))
            dead = freshness.expired_members(quiet, exists)
            if dead:
                with client.pipeline(transaction=False) as pipe:
                    pipe.zrem(keys.NODES_BY_SCORE, *dead)
                    pipe.zrem(keys.NODES_UPDATED, *dead)
                    pipe.execute()
                self.swept += len(dead)
                log.info(
                    "removed %d dead node(s) from %s: %s",
                    len(dead),
                    keys.NODES_BY_SCORE,
                    ", ".join(dead),
                )
            return dead
        except REDIS_ERRORS as exc:
            log.warning(
                "sweeping dead nodes from %s failed (%s); retrying later", keys.NODES_BY_SCORE, exc
            )
            return []

    def withdraw(self, node: str) -> bool:
        """Remove ``node`` from both sorted sets and delete its hashes and pod set (clean
        shutdown); False when Redis could not be reached. Never raises."""
        try:
            with self._redis.client().pipeline(transaction=False) as pipe:
                pipe.zrem(keys.NODES_BY_SCORE, node)
                pipe.zrem(keys.NODES_UPDATED, node)
                pipe.delete(keys.node_key(node), keys.node_pods_key(node), keys.gpu_key(node))
                for pod_key in self._pod_keys:
                    namespace, sep, name = pod_key.partition("/")
                    pipe.delete(keys.pod_key(namespace, name) if sep else keys.pod_key("", pod_key))
                pipe.execute()
        except REDIS_ERRORS as exc:
            log.warning(
                "could not remove node %s from Redis at shutdown (%s); its hashes "
                "expire with their TTL and a sweep drops it from %s",
                node,
                exc,
                keys.NODES_BY_SCORE,
            )
            return False
        self._pod_keys = set()
        return True

    def close(self) -> None:
        """Close the connections; safe to call twice."""
        self._redis.close()

    def _queue_commands(self, pipe: Pipeline, report: NodeReport) -> set[str]:
        """Queue the flush; returns the pod set's members once it is written."""
        node, ttl = report.node, self._settings.ttl_s
        node_key = keys.node_key(node)
        pipe.hset(node_key, mapping=codec.node_hash(report))  # type: ignore[arg-type]
        pipe.expire(node_key, ttl)
        pipe.zadd(keys.NODES_BY_SCORE, {node: report.metrics.interference_index})
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
        self._redis.reset()
        return False
