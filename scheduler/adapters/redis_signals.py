"""Interference signals from Redis (:class:`RedisSignalCache`) and decision records
(:class:`RedisDecisionSink`, and :class:`QueuedDecisionSink` which batches them off the
scheduling path), per docs/design.md §4.

The cache follows the scheduling records of the Nodes the scheduler knows
(``intf:node:{node}:sched``, :mod:`interference.sched_record`): every
``poll_interval_s`` it reads them all with ``MGET`` (``batch`` keys per command, one
round trip; on a Redis Cluster split per slot), decodes and checks them in bulk
(:mod:`scheduler.signals.records`) and publishes a :class:`~scheduler.signals.frame.SignalFrame`.
Every node reports every interval, so a poll costs O(nodes) = O(updates); pod rows and
histograms, which the scheduler never uses, are never read.

* A record that fails a check is ignored — never cached — counted
  (``interference_scheduler_signal_records_rejected_total{reason}``) and logged at most
  once per ``log_interval_s`` per reason; the node keeps its last accepted record, which
  ages into staleness. Records under keys of names that are no Node are never read; a
  ``SCAN`` every ``stray_scan_interval_s`` counts them (``reason="unknown_node"``).
* Freshness follows :mod:`interference.freshness`: a node whose latest record is older
  than 3 of its intervals (at least 5 s), or lacks a core family (degraded), is stale for
  the engine's stale policy.
* The ranking people read (``intf:nodes`` by interference index, ``intf:nodes:updated``)
  is written every ``ranking_interval_s`` from the accepted records, with the index the
  scheduler computed; nodes without a usable record leave it. Agents never write it.
* Redis unreachable: :meth:`~RedisSignalCache.healthy` turns False (the scheduler runs
  interference-blind), ``interference_scheduler_redis_errors_total`` counts it, one
  warning is logged per outage, the last data stay (ageing into staleness), and the
  cache retries with capped backoff.

Connection (:mod:`interference_infra.redis_client`): one server, a master found through
Redis Sentinel (``sentinels``), or a Redis Cluster (``cluster``); credentials: the URL's,
overridden by ``REDIS_USERNAME`` / ``REDIS_PASSWORD``. The scheduler's ACL user needs
exactly :data:`ACL_COMMANDS`: read ``%R~intf:node:*``, write ``~intf:nodes``,
``~intf:nodes:updated`` and ``~intf:decision:*`` (placement records), read and write
``~intf:rebalance:*`` (the rebalancer's journal and rebalancing records).

Size: over 500 lines because the follower, the ranking writer and the decision sink share
one connection, its failure handling and its metrics (standalone or Redis Cluster).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from redis.cluster import RedisCluster
from redis.exceptions import NoPermissionError, ResponseError

from interference import keys, sched_record
from interference.acl import CLUSTER_CLIENT_COMMANDS
from interference.codec import PayloadError, PayloadTooBig, index_history
from interference.decision import Decision, decision_hash, parse_decision_hash
from interference.index import IndexReferences
from interference_infra.redis_client import (
    DEFAULT_SENTINEL_MASTER,
    REDIS_ERRORS,
    RedisConnection,
    RedisTarget,
    credentials_from_env,
    credentials_refused,
    parse_sentinels,
    password_file_from_env,
    refused_credentials_reason,
)
from interference_infra.redis_tls import RedisTls
from interference_infra.strict import SettingsError
from scheduler.signals.frame import SIGNAL_COLUMNS, SignalFrame, no_signal_value
from scheduler.signals.records import (
    MAX_CLOCK_SKEW_S,
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    REJECT_REASONS,
    decode_records,
    signal_columns,
)

log = logging.getLogger(__name__)

ACL_COMMANDS = ("mget", "scan", "zadd", "zrem", "zrange", "hset", "expire", "info", "xrevrange")
"""Every Redis command the scheduler sends (its ACL user needs ``+`` each of them;
``xrevrange`` is the rebalancer's read of the nodes' report streams,
:mod:`scheduler.adapters.pod_reports`); on a Redis Cluster also :data:`CLUSTER_ACL_COMMANDS`."""
CLUSTER_ACL_COMMANDS = CLUSTER_CLIENT_COMMANDS
"""What the scheduler's Cluster client sends as it builds itself (slot map, command
table); granted only on a Cluster, neither reads nor changes data."""


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """Where the signals live and how the scheduler reads them."""

    url: str = "redis://127.0.0.1:6379/0"
    """``redis://`` or ``rediss://`` URL of the server, of one Redis Cluster node
    (``cluster``), or only the database and TLS choice (``sentinels``);
    ``REDIS_USERNAME``/``REDIS_PASSWORD`` (or ``REDIS_PASSWORD_FILE``) override its
    credentials."""
    sentinels: tuple[str, ...] = ()
    """Redis Sentinels as ``HOST:PORT`` (env ``REDIS_SENTINELS``, comma-separated); when
    set, the master comes from them and follows a failover."""
    sentinel_master: str = DEFAULT_SENTINEL_MASTER
    """Name of the master the sentinels monitor (env ``REDIS_SENTINEL_MASTER``)."""
    cluster: bool = False
    """``url`` names a node of a Redis Cluster (env ``REDIS_CLUSTER``)."""
    socket_timeout_s: float = 5.0
    """Timeout of every Redis call."""
    poll_interval_s: float = 0.5
    """How often every known node's scheduling record is read; adds at most this much to
    a signal's age (agents report every second)."""
    batch: int = 1000
    """Keys per MGET and per SCAN page."""
    ranking_interval_s: float = 5.0
    """How often ``intf:nodes`` / ``intf:nodes:updated`` are rewritten from the accepted
    records; 0 never (e.g. a read-only ACL user)."""
    stray_scan_interval_s: float = 60.0
    """How often records of names that are no Node are counted (a SCAN); 0 never."""
    max_clock_skew_s: float = MAX_CLOCK_SKEW_S
    """A record whose ``ts`` is further than this from the scheduler's clock is ignored."""
    max_agent_interval_s: float = 2.0
    """The longest report interval of the cluster's agents (their ``--interval``, 1 s by
    default): a record claiming a longer one is ignored (``reason="interval"``), so a node
    whose agent stops is stale within ``max(5, round(3 × this))`` seconds of its last
    record being read, whatever that record claimed (docs/design.md §7). At most 60."""
    index_references: IndexReferences = field(default_factory=IndexReferences)
    """The interference index's references, with which the scheduler computes every
    node's index from its record (set them like the agents' ``--index-ref``)."""
    retry_initial_s: float = 0.5
    """First reconnect delay after an error; doubles up to ``retry_max_s``."""
    retry_max_s: float = 10.0
    """Longest reconnect delay."""
    decision_ttl_s: int = keys.DECISION_TTL_S
    """Lifetime of the decision records: placement records (``intf:decision:{ns}/{pod}``)
    and rebalancing records (``intf:rebalance:decision:{ns}/{pod}``)."""
    log_interval_s: float = 30.0
    """At most one log line per this many seconds about malformed payloads."""
    decision_queue_size: int = 10_000
    """Decision records that may wait for the writer thread; when it is full (Redis slow
    or down) a write waits up to ``socket_timeout_s``, then the record is counted in
    ``interference_scheduler_decision_write_errors_total`` and skipped."""
    decision_memory_limit: float = 0.8
    """Decision records are not written (each counted as a write error) while Redis uses
    more than this share of its ``maxmemory`` (``INFO memory``, read at most every 5 s), so
    they never take the room the nodes' reports need (Redis never evicts: docs/design.md
    §4.3). 1: write until Redis refuses."""
    decision_batch: int = 500
    """Most decision records written in one pipeline."""
    decision_linger_s: float = 0.05
    """How long the writer waits for a batch to fill before writing what it has (records
    reach Redis at most this late; a pipeline per record would cost scheduling CPU)."""
    ca_file: str | None = None
    """CA certificate that signed the server's (``rediss://`` only; env ``REDIS_CA_FILE``);
    None trusts the system's CAs."""
    cert_file: str | None = None
    """Client certificate for TLS client authentication (env ``REDIS_CERT_FILE``)."""
    key_file: str | None = None
    """Its private key (env ``REDIS_KEY_FILE``)."""

    def __post_init__(self) -> None:
        try:
            parse_sentinels(",".join(self.sentinels), "sentinels")
        except SettingsError as exc:
            raise ValueError(str(exc)) from None
        if self.sentinels and self.cluster:
            raise ValueError("cluster: use either Redis Sentinel (sentinels) or Redis Cluster")
        try:
            self.target()
        except SettingsError as exc:
            raise ValueError(f"url: {exc}") from None
        for name in (
            "socket_timeout_s",
            "retry_initial_s",
            "retry_max_s",
            "decision_linger_s",
            "poll_interval_s",
            "max_clock_skew_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be a number > 0")
        if not MIN_INTERVAL_S <= self.max_agent_interval_s <= MAX_INTERVAL_S:
            raise ValueError(
                f"max_agent_interval_s: {self.max_agent_interval_s!r} must be the agents'"
                f" longest interval in seconds, {MIN_INTERVAL_S:g}–{MAX_INTERVAL_S:g}"
            )
        if not 0 < self.decision_memory_limit <= 1:
            raise ValueError(
                f"decision_memory_limit: {self.decision_memory_limit!r} must be a share of"
                " maxmemory, > 0 and ≤ 1 (e.g. 0.8)"
            )
        for name in ("ranking_interval_s", "stray_scan_interval_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be a number ≥ 0 (0: never)")
        for name in ("batch", "decision_ttl_s", "decision_queue_size", "decision_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be an integer ≥ 1")

    @property
    def tls(self) -> RedisTls:
        """The TLS options as the shared helper takes them."""
        return RedisTls(self.ca_file, self.cert_file, self.key_file)

    def target(self, env: Mapping[str, str] | None = None) -> RedisTarget:
        """Where Redis is, with the credentials of ``env`` (:class:`SettingsError` for a
        combination that cannot work)."""
        username, password = credentials_from_env(env or {})
        return RedisTarget(
            self.url,
            sentinels=parse_sentinels(",".join(self.sentinels), "sentinels"),
            sentinel_master=self.sentinel_master,
            cluster=self.cluster,
            tls=self.tls,
            username=username,
            password=password,
            password_file=password_file_from_env(env or {}),
        )


def connect(settings: RedisSettings, env: Mapping[str, str] | None = None) -> RedisConnection:
    """The connection to ``settings``' Redis, credentials from the environment when set;
    ``ValueError`` for a URL redis-py cannot parse."""
    env = os.environ if env is None else env
    return RedisConnection(settings.target(env), settings.socket_timeout_s)


class _RateLimitedLog:
    """Logs one line per interval and says how many were suppressed in between."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last = -float("inf")
        self._suppressed = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            self._suppressed += 1
            return
        if self._suppressed:
            message += f" ({self._suppressed} similar messages suppressed)"
        log.warning(message, *args)
        self._last, self._suppressed = now, 0


POLL_DURATION_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
SIGNAL_AGE_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


class BulkHistogram(Collector):
    """A Prometheus histogram fed a numpy array of observations at once, exposed through a
    custom collector. ``Histogram.observe`` costs ~3 µs a value: 15 ms of every poll at
    5,000 nodes (measured, cProfile), a third of the poll; this is one ``searchsorted``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name, self._documentation = name, documentation
        self._bounds = np.array([*buckets, np.inf])
        self._counts = np.zeros(len(self._bounds), np.int64)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: NDArray[np.float64]) -> None:
        """Count every value (a value equal to a bound falls in that bound's bucket)."""
        slots = np.searchsorted(self._bounds, values, side="left")
        counts = np.bincount(slots, minlength=len(self._bounds))
        with self._lock:
            self._counts += counts
            self._sum += float(values.sum())

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self._name, self._documentation)]

    def collect(self) -> list[HistogramMetricFamily]:
        with self._lock:
            cumulative = np.cumsum(self._counts).tolist()
            total = self._sum
        buckets = [
            (floatToGoString(bound), count)  # type: ignore[no-untyped-call]
            for bound, count in zip(self._bounds.tolist(), cumulative, strict=True)
        ]
        family = HistogramMetricFamily(self._name, self._documentation)
        family.add_metric([], buckets, total)
        return [family]


class SignalMetrics:
    """Counters of the Redis adapters (registered on the scheduler's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.records_rejected = Counter(
            "interference_scheduler_signal_records_rejected",
            "Scheduling records ignored, by reason (size, version, node, clock, interval,"
            " value, unknown_node).",
            ["reason"],
            registry=registry,
        )
        self.records_accepted = Counter(
            "interference_scheduler_signal_records",
            "New scheduling records accepted into the signal cache.",
            registry=registry,
        )
        self.ranking_errors = Counter(
            "interference_scheduler_ranking_write_errors",
            "Failed writes of the node ranking (intf:nodes).",
            registry=registry,
        )
        self.redis_errors = Counter(
            "interference_scheduler_redis_errors",
            "Failed Redis calls of the signal cache (each starts or prolongs an outage).",
            registry=registry,
        )
        self.decision_write_errors = Counter(
            "interference_scheduler_decision_write_errors",
            "Decision records that could not be written to Redis.",
            registry=registry,
        )
        self.signal_age = BulkHistogram(
            "interference_scheduler_signal_age_seconds",
            "Age of each new scheduling record when it reached the cache: now minus the end"
            " of its kernel measurement interval (the record's ts).",
            buckets=SIGNAL_AGE_BUCKETS_S,
            registry=registry,
        )
        self.poll_duration = Histogram(
            "interference_scheduler_signal_poll_seconds",
            "Duration of one poll of every known node's scheduling record: MGET, bulk decode"
            " and checks, the new frame (the follower thread holds the interpreter for most"
            " of it).",
            buckets=POLL_DURATION_BUCKETS_S,
            registry=registry,
        )
        for reason in (*REJECT_REASONS, UNKNOWN_NODE):
            self.records_rejected.labels(reason)
        self.reports_refused = Counter(
            "interference_scheduler_node_reports_refused",
            "Node report streams (the rebalancer's reads) or entries (the decision page's"
            " index chart) not used, by reason: too_big (over the size or msgpack length"
            " limits), undecodable, unreadable (Redis cut or failed the node's own read).",
            ["reason"],
            registry=registry,
        )
        for reason in ("too_big", "undecodable", "unreadable"):
            self.reports_refused.labels(reason)


MEMORY_CHECK_S = 5.0
"""How often the decision sink reads Redis' memory use."""
UNKNOWN_NODE = "unknown_node"
"""Rejection reason of a record under the key of a name that is no Node."""


class RedisSignalCache:
    """The :class:`~scheduler.cycle.ports.SignalSource` on Redis; run :meth:`run` in a thread."""

    def __init__(
        self,
        connection: RedisConnection,
        settings: RedisSettings,
        metrics: SignalMetrics,
        known_nodes: Callable[[], Sequence[str]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``known_nodes`` returns the names of the Nodes the scheduler knows (the only
        records it reads)."""
        self.settings = settings
        self.metrics = metrics
        self._redis = connection
        self._known_nodes = known_nodes
        self._clock = clock
        self._references = settings.index_references
        self._lock = threading.Lock()
        self._healthy = False
        self._names: tuple[str, ...] = ()
        self._index: Mapping[str, int] = MappingProxyType({})
        self._keys: list[str] = []
        self._ids: NDArray[np.uint64] = np.zeros(0, np.uint64)
        self._columns: dict[str, NDArray[np.float64]] = _empty_columns(0)
        self._measured: NDArray[np.uint16] = np.zeros(0, np.uint16)
        self._record_ts: NDArray[np.float64] = np.zeros(0, np.float64)
        """Each row's last accepted record's own ``ts`` (``signals_at`` may be earlier)."""
        self._snapshot = SignalFrame.empty()
        self._reject_logs = {
            reason: _RateLimitedLog(settings.log_interval_s)
            for reason in (*REJECT_REASONS, UNKNOWN_NODE)
        }
        self._ranking_log = _RateLimitedLog(settings.log_interval_s)
        self.polls = 0
        """Completed polls; for tests and logs."""

    # --- SignalSource ---

    def snapshot(self) -> SignalFrame:
        """The latest frame: every known node, with its last accepted record or none."""
        with self._lock:
            return self._snapshot

    def healthy(self) -> bool:
        with self._lock:
            return self._healthy

    def run(self, stop: threading.Event, on_iteration: Callable[[], None] | None = None) -> None:
        """Poll every ``poll_interval_s`` until ``stop``; survives any Redis outage.

        ``on_iteration`` is called once per poll or retry (a liveness heartbeat).
        """
        settings = self.settings
        delay = settings.retry_initial_s
        # The first stray count waits one interval: until the informer has listed the
        # Nodes, every record would look like one of an unknown name.
        next_ranking = time.monotonic()
        next_stray_scan = next_ranking + settings.stray_scan_interval_s
        while not stop.is_set():
            if on_iteration is not None:
                on_iteration()
            started = time.monotonic()
            try:
                self.poll_once()
            except REDIS_ERRORS as exc:
                self.metrics.redis_errors.inc()
                self._redis.reset()  # no half-read reply on the next call; a fresh slot map
                if self._set_healthy(False):
                    if credentials_refused(exc):  # it answers: not "unavailable"
                        why = f"{refused_credentials_reason(self._redis.target)} ({exc})"
                        until = "it accepts them"
                    else:
                        why = f"Redis at {self._redis.target.describe()} is unavailable ({exc})"
                        until = "it is back"
                    log.warning(
                        "%s; scheduling interference-blind until %s (retrying every ≤ %g s)",
                        why,
                        until,
                        settings.retry_max_s,
                    )
                stop.wait(delay)
                delay = min(delay * 2, settings.retry_max_s)
                continue
            delay = settings.retry_initial_s
            if self._set_healthy(True):
                log.info(
                    "following the scheduling records of %d nodes in Redis at %s",
                    len(self._names),
                    self._redis.target.describe(),
                )
            now = time.monotonic()
            if settings.ranking_interval_s > 0 and now >= next_ranking:
                next_ranking = now + settings.ranking_interval_s
                self.write_ranking()
            if settings.stray_scan_interval_s > 0 and now >= next_stray_scan:
                next_stray_scan = now + settings.stray_scan_interval_s
                self.count_strays()
            stop.wait(max(0.0, settings.poll_interval_s - (time.monotonic() - started)))

    def poll_once(self) -> int:
        """Read every known node's record once; returns how many new records were accepted.
        Raises the Redis client's errors."""
        started = time.perf_counter()
        names = tuple(self._known_nodes())
        if names != self._names:
            self._follow(names)
        payloads = self._fetch(self._keys)
        now = self._clock()
        settings = self.settings
        decoded = decode_records(
            payloads, self._ids, now, settings.max_clock_skew_s, settings.max_agent_interval_s
        )
        for reason, positions in decoded.rejected.items():
            self._rejected(reason, len(positions), self._names[int(positions[0])])
        positions, records = decoded.positions, decoded.records
        # Newer by the record's own ts; its freshness counts from when it was read, at the
        # latest, so one dated ahead does not outlive its agent (signal_columns).
        newer = records["ts"] > self._record_ts[positions]
        positions, records = positions[newer], records[newer]
        if len(positions):
            for column, values in signal_columns(records, self._references, now).items():
                self._columns[column][positions] = values
            self._record_ts[positions] = records["ts"]
            self._measured[positions] = records["measured"]
            self.metrics.signal_age.observe_many(np.maximum(now - records["ts"], 0.0))
            self.metrics.records_accepted.inc(len(positions))
            self._publish()
        self.polls += 1
        self.metrics.poll_duration.observe(time.perf_counter() - started)
        return len(positions)

    def write_ranking(self, now: float | None = None) -> bool:
        """Rewrite ``intf:nodes`` (index of the latest interval) and ``intf:nodes:updated``
        from the usable records; members without one are removed. False when it failed
        (counted, logged once per interval); never raises."""
        now = self._clock() if now is None else now
        frame = self.snapshot()
        usable = np.flatnonzero(frame.columns["fresh_until"] >= now)
        index = frame.columns["index_mean@latest"]
        at = frame.columns["signals_at"]
        by_index: dict[str | bytes, float] = {
            frame.names[i]: float(index[i]) for i in usable.tolist()
        }
        by_time: dict[str | bytes, float] = {frame.names[i]: float(at[i]) for i in usable.tolist()}
        try:
            client = self._redis.client()
            members = {_text(m) for m in client.zrange(keys.NODES_UPDATED, 0, -1)}
            members |= {_text(m) for m in client.zrange(keys.NODES_BY_INDEX, 0, -1)}
            gone = sorted(members - {str(name) for name in by_index})
            pipe = client.pipeline(transaction=False)
            if by_index:
                pipe.zadd(keys.NODES_BY_INDEX, by_index)
                pipe.zadd(keys.NODES_UPDATED, by_time)
            if gone:
                pipe.zrem(keys.NODES_BY_INDEX, *gone)
                pipe.zrem(keys.NODES_UPDATED, *gone)
            pipe.execute()
        except REDIS_ERRORS as exc:
            self.metrics.ranking_errors.inc()
            if credentials_refused(exc):
                self._ranking_log.warning(
                    "could not write the node ranking %s: %s (%s)",
                    keys.NODES_BY_INDEX,
                    refused_credentials_reason(self._redis.target),
                    exc,
                )
                return False
            self._ranking_log.warning(
                "could not write the node ranking %s (%s): Redis is unreachable, or the"
                " scheduler's ACL user lacks ZRANGE, ZADD or ZREM on it (or set"
                " redis.ranking_interval_s: 0)",
                keys.NODES_BY_INDEX,
                exc,
            )
            return False
        return True

    def count_strays(self) -> int:
        """Count records under keys of names that are no Node (``unknown_node``); never
        raises."""
        try:
            found = [
                _text(key)
                for key in self._redis.client().scan_iter(
                    match=keys.SCHED_KEY_PATTERN, count=self.settings.batch
                )
            ]
        except REDIS_ERRORS as exc:
            log.debug("could not scan for records of unknown nodes: %s", exc)
            return 0
        strays = []
        for key in found:
            try:
                node = keys.node_from_sched_key(key)
            except ValueError:
                node = key
            if node not in self._index:
                strays.append(node)
        if strays:
            self._rejected(UNKNOWN_NODE, len(strays), strays[0])
        return len(strays)

    def _follow(self, names: tuple[str, ...]) -> None:
        """Follow ``names`` from now on, keeping what is known of the nodes still there."""
        old_index, old_columns = self._index, self._columns
        old_measured = self._measured
        index = {name: row for row, name in enumerate(names)}
        columns = _empty_columns(len(names))
        measured = np.zeros(len(names), np.uint16)
        record_ts = np.full(len(names), -np.inf)
        kept = [(row, old_index[name]) for name, row in index.items() if name in old_index]
        if kept:
            new_rows, old_rows = (np.array(rows, np.intp) for rows in zip(*kept, strict=True))
            for column in SIGNAL_COLUMNS:
                columns[column][new_rows] = old_columns[column][old_rows]
            measured[new_rows] = old_measured[old_rows]
            record_ts[new_rows] = self._record_ts[old_rows]
        self._record_ts = record_ts
        self._names, self._index = names, MappingProxyType(index)
        self._keys = [keys.sched_key(name) for name in names]
        self._ids = np.fromiter(map(sched_record.node_id, names), np.uint64, len(names))
        self._columns, self._measured = columns, measured
        self._publish()

    def _fetch(self, names: list[str]) -> list[bytes | None]:
        """The value of every key in ``names`` (None where missing), in order.

        One server: ``MGET`` of ``batch`` keys at a time, all in one pipeline. A Cluster:
        one ``mget_nonatomic`` of every key, which sends one ``MGET`` per hash slot; record
        keys share :data:`~interference.keys.SCHED_KEY_GROUPS` hash tags, so that is 64
        commands, not one per node.
        """
        client = self._redis.client()
        if not names:  # nothing to read, but a poll must still find Redis there
            client.zrange(keys.NODES_BY_INDEX, 0, 0)
            return []
        if isinstance(client, RedisCluster):
            values: list[bytes | None] = client.mget_nonatomic(names)  # type: ignore[no-untyped-call]
            return values
        batch = self.settings.batch
        pipe = client.pipeline(transaction=False)
        for start in range(0, len(names), batch):
            pipe.mget(names[start : start + batch])
        return [value for reply in pipe.execute() for value in reply]

    def _publish(self) -> None:
        frame = SignalFrame.build(
            self._names,
            {column: values.copy() for column, values in self._columns.items()},
            self._measured.copy(),
            index=self._index,
        )
        with self._lock:
            self._snapshot = frame

    def _rejected(self, reason: str, count: int, example: str) -> None:
        self.metrics.records_rejected.labels(reason).inc(count)
        self._reject_logs[reason].warning(
            "ignored %d scheduling record(s) (%s), e.g. node %s: %s",
            count,
            reason,
            example[:253],
            _REJECT_EXPLANATIONS[reason],
        )

    def _set_healthy(self, healthy: bool) -> bool:
        """Set the health flag; True when it changed."""
        with self._lock:
            changed = self._healthy != healthy
            self._healthy = healthy
            return changed


_REJECT_EXPLANATIONS = {
    "size": "not one record long; run the same release of agent and scheduler",
    "version": "another record layout version; run the same release of agent and scheduler",
    "node": "the record names another node than the key holding it",
    "clock": f"its time is more than {MAX_CLOCK_SKEW_S:g} s from the scheduler's; check NTP",
    "interval": (
        "its interval is outside 0.1 s – redis.max_agent_interval_s (raise that setting to"
        " the agents' --interval)"
    ),
    "value": "a negative, NaN or infinite signal, or an unknown family",
    UNKNOWN_NODE: "no Node of that name exists",
}


def _empty_columns(n: int) -> dict[str, NDArray[np.float64]]:
    return {column: np.full(n, no_signal_value(column)) for column in SIGNAL_COLUMNS}


class RedisDecisionSink:
    """The :class:`~scheduler.cycle.ports.DecisionSink`: HSET + EXPIRE per record, a whole batch
    in one round trip, paused while Redis is fuller than ``decision_memory_limit``; never
    raises."""

    def __init__(
        self,
        connection: RedisConnection,
        settings: RedisSettings,
        metrics: SignalMetrics,
        clock: Callable[[], float] = time.monotonic,
        *,
        record_key: Callable[[str, str], str] = keys.decision_key,
    ) -> None:
        """``record_key``: the key of a pod's record from its namespace and name, the
        placement record's by default; the rebalancer's sink passes
        :func:`~interference.keys.rebalance_decision_key`."""
        self._redis = connection
        self._record_key = record_key
        self._ttl_s = settings.decision_ttl_s
        self._memory_limit = settings.decision_memory_limit
        self._metrics = metrics
        self._clock = clock
        self._log = _RateLimitedLog(settings.log_interval_s)
        self._memory_checked_at = -float("inf")
        self._memory_full = ""
        """Why decisions are paused (Redis' memory use), empty while they are not."""

    def write(self, decision: Decision) -> None:
        self.write_many((decision,))

    def write_many(self, decisions: Iterable[Decision]) -> None:
        """Write every record in one pipeline; a failure counts each of them."""
        names: list[str] = []
        try:
            if paused := self._memory_pause():
                self.failed(len(list(decisions)), paused)
                return
            pipe = self._redis.client().pipeline(transaction=False)
            for decision in decisions:
                key = self._record_key(decision.namespace, decision.pod)
                names.append(key)
                # Every record has the same fields, so HSET overwrites the previous one whole.
                fields: dict[str | bytes, bytes | float | int | str] = {}
                fields.update(decision_hash(decision))
                pipe.hset(key, mapping=fields)
                pipe.expire(key, self._ttl_s)
            if names:
                pipe.execute()
        except Exception as exc:
            self._metrics.decision_write_errors.inc(max(1, len(names)))
            what = names[0] if len(names) == 1 else f"{len(names)} decision records"
            self._log.warning("could not write %s: %s", what, exc)

    def _memory_pause(self) -> str:
        """Why decisions must wait (Redis above its share of ``maxmemory``), else ``""``;
        ``INFO memory`` at most every :data:`MEMORY_CHECK_S`."""
        if self._memory_limit >= 1:
            return ""
        now = self._clock()
        if now - self._memory_checked_at < MEMORY_CHECK_S:
            return self._memory_full
        self._memory_checked_at = now
        try:
            memory = self._redis.client().info("memory")
        except ResponseError as exc:  # e.g. an ACL user without INFO: write as before
            self._log.warning(
                "cannot read Redis' memory use (%s); decision records are written until Redis"
                " refuses them (the scheduler's ACL user needs +info)",
                exc,
            )
            return ""
        used, limit = int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0))
        if limit and used > self._memory_limit * limit:
            self._memory_full = (
                f"Redis uses {used / 2**20:.0f} of its {limit / 2**20:.0f} MiB, above"
                f" redis.decision_memory_limit ({self._memory_limit:g}); decisions wait so the"
                " nodes' reports keep their room"
            )
        else:
            self._memory_full = ""
        return self._memory_full

    def failed(self, count: int, reason: str) -> None:
        """Count ``count`` records that were not written, and say why (rate-limited)."""
        self._metrics.decision_write_errors.inc(count)
        self._log.warning("skipped %d decision records: %s", count, reason)

    def read(self, namespace: str, pod: str) -> Decision | None:
        """The pod's record in Redis (HGETALL), ``None`` when there is none or this user
        may not read it (the deployed scheduler user only writes records); raises on
        other Redis errors and on a malformed record."""
        key = self._record_key(namespace, pod)
        try:
            raw = self._redis.client().hgetall(key)
        except NoPermissionError as exc:
            self._log.warning(
                "cannot read %s (%s): only this replica's records are shown", key, exc
            )
            return None
        if not raw:
            return None
        try:
            return parse_decision_hash(raw)
        except PayloadError as exc:
            raise ValueError(f"{key} is malformed: {exc}") from exc

    def index_history(self, node: str) -> list[tuple[float, float]] | None:
        """The node's interference index in its report stream (its last
        ``NODE_REPORTS_MAXLEN`` reports), oldest first; ``None`` when unreadable."""
        try:
            entries = self._redis.client().xrevrange(
                keys.reports_key(node), count=keys.NODE_REPORTS_MAXLEN
            )
        except Exception as exc:  # no XREVRANGE for this user, or Redis cut a huge reply
            self._metrics.reports_refused.labels("unreadable").inc()
            self._log.warning("cannot read the report stream of %s: %s", node[:253], exc)
            return None

        def refused(exc: PayloadError) -> None:
            reason = "too_big" if isinstance(exc, PayloadTooBig) else "undecodable"
            self._metrics.reports_refused.labels(reason).inc()
            self._log.warning("a report of node %s was left out (%s): %s", node[:253], reason, exc)

        return index_history(entries, keys.REPORTS_FIELD, refused) or None


RECENT_DECISIONS = 4096
"""Decision records a :class:`QueuedDecisionSink` remembers for the decision page."""


class QueuedDecisionSink:
    """A :class:`~scheduler.cycle.ports.DecisionSink` that queues records for a writer thread,
    which writes them in one pipeline per ``decision_batch`` records or per
    ``decision_linger_s``, whichever comes first.

    :meth:`write` costs the caller a lock and an append, not a Redis round trip. The queue
    is bounded (``decision_queue_size``): while it is full a write waits at most
    ``socket_timeout_s``, then the record is counted as a write error and skipped, so a
    slow or absent Redis never stalls scheduling for long. After :meth:`close`, records
    are written synchronously.
    """

    def __init__(
        self, sink: RedisDecisionSink, settings: RedisSettings, remember: int = RECENT_DECISIONS
    ) -> None:
        self._sink = sink
        self._remember = remember
        self._recent: OrderedDict[tuple[str, str], Decision] = OrderedDict()
        """The last ``remember`` records written here, for the decision page: the deployed
        scheduler user may write records but not read them back."""
        self._capacity = settings.decision_queue_size
        self._batch = settings.decision_batch
        self._linger_s = settings.decision_linger_s
        self._wait_s = settings.socket_timeout_s
        self._queue: deque[Decision] = deque()
        self._writing = 0
        self._flushing = 0
        self._closed = False
        self._changed = threading.Condition(threading.Lock())
        self._thread = threading.Thread(target=self._run, name="decision-writer", daemon=True)
        self._thread.start()

    def write(self, decision: Decision) -> None:
        with self._changed:
            if self._remember > 0:
                pod = (decision.namespace, decision.pod)
                self._recent.pop(pod, None)
                self._recent[pod] = decision
                if len(self._recent) > self._remember:
                    self._recent.popitem(last=False)
            if not self._closed:
                if not self._changed.wait_for(
                    lambda: len(self._queue) < self._capacity or self._closed, self._wait_s
                ):
                    self._sink.failed(
                        1,
                        f"the decision queue stayed full ({self._capacity} records) for"
                        f" {self._wait_s:.0f} s; is Redis slow or down?",
                    )
                    return
                if not self._closed:
                    self._queue.append(decision)
                    if len(self._queue) == self._batch:  # else the writer wakes by itself
                        self._changed.notify_all()
                    return
        self._sink.write(decision)

    def read(self, namespace: str, pod: str) -> Decision | None:
        """The pod's latest record: the one this replica wrote last when it still
        remembers it, else the one in Redis (see :meth:`RedisDecisionSink.read`)."""
        with self._changed:
            recent = self._recent.get((namespace, pod))
        return recent if recent is not None else self._sink.read(namespace, pod)

    def index_history(self, node: str) -> list[tuple[float, float]] | None:
        return self._sink.index_history(node)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued record has been written (or failed); False on timeout."""
        with self._changed:
            self._flushing += 1  # the writer stops lingering
            self._changed.notify_all()
            try:
                return self._changed.wait_for(
                    lambda: not self._queue and not self._writing, timeout_s
                )
            finally:
                self._flushing -= 1

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued and stop the writer thread."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(
                    lambda: (
                        len(self._queue) >= self._batch
                        or (self._flushing and self._queue)
                        or self._closed
                    ),
                    self._linger_s,
                )
                if not self._queue:
                    if self._closed:
                        return  # closed and drained
                    continue
                count = min(len(self._queue), self._batch)
                batch = [self._queue.popleft() for _ in range(count)]
                self._writing = count
                self._changed.notify_all()  # room for writers waiting on a full queue
            self._sink.write_many(batch)
            with self._changed:
                self._writing = 0
                self._changed.notify_all()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
