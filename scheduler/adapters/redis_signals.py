"""Interference signals from Redis (:class:`RedisSignalCache`) and decision records
(:class:`RedisDecisionSink`, and :class:`QueuedDecisionSink` which batches them off the
scheduling path), per docs/design.md §4.

The cache bootstraps from the ``intf:node:*`` and ``intf:gpu:*`` hashes (SCAN +
pipelined HGETALL), then follows ``intf:stream`` with XREAD from the last id, so its
cost is O(updates), not O(nodes). The stream's last id is read *before* the scan: a
report published during the scan arrives again through the stream and the newer ``ts``
wins, so nothing is missed.

* A malformed hash or stream entry (:class:`~interference.codec.PayloadError`) is
  counted (``interference_scheduler_signal_payload_errors_total{source}``), logged at
  most once per ``log_interval_s`` and skipped.
* Freshness follows :mod:`interference.freshness`: a node whose latest report is older
  than 3 of its intervals (at least 5 s, the hashes' TTL), or whose report lacks a core
  signal family (degraded), is stale: :meth:`RedisSignalCache.stale_nodes` lists it; its
  entry stays in the snapshot with its real ``updated_at``, ``interval_s`` and
  ``measured`` so the engine applies its stale policy. A node silent for
  ``forget_after_s`` (default 10 min: its agent is gone, its hash long expired) leaves the
  cache, which the engine treats the same as stale, so the cache stays bounded while
  nodes come and go.
* Redis unreachable: :meth:`~RedisSignalCache.healthy` turns False (the scheduler runs
  interference-blind), ``interference_scheduler_redis_errors_total`` counts it, one
  warning is logged per outage, the last data stay (ageing into staleness), and the
  cache retries with capped backoff and re-bootstraps once Redis answers again (a
  restarted Redis has a new stream whose ids start over).

Connection (:mod:`interference_infra.redis_client`): one server, a master found through
Redis Sentinel (``sentinels``), or a Redis Cluster (``cluster``); credentials: the URL's,
overridden by ``REDIS_USERNAME`` / ``REDIS_PASSWORD``. The scheduler's ACL user needs
exactly :data:`ACL_COMMANDS`: read ``%R~intf:*``, write ``~intf:decision:*``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from interference import freshness, keys
from interference.codec import (
    PayloadError,
    decode_report,
    parse_gpu_hash,
    parse_node_signals,
)
from interference.decision import Decision, decision_hash
from interference.strict import SettingError
from interference_infra.redis_client import (
    DEFAULT_SENTINEL_MASTER,
    REDIS_ERRORS,
    RedisConnection,
    RedisTarget,
    credentials_from_env,
    parse_sentinels,
)
from interference_infra.redis_tls import RedisTls
from scheduler.ports import NodeSignals

log = logging.getLogger(__name__)

ACL_COMMANDS = ("scan", "hgetall", "xread", "xrevrange", "hset", "expire")
"""Every Redis command the scheduler sends (its ACL user needs ``+`` each of them)."""


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """Where the signals live and how the scheduler reads them."""

    url: str = "redis://127.0.0.1:6379/0"
    """``redis://`` or ``rediss://`` URL of the server, of one Redis Cluster node
    (``cluster``), or only the database and TLS choice (``sentinels``);
    ``REDIS_USERNAME``/``REDIS_PASSWORD`` override its credentials."""
    sentinels: tuple[str, ...] = ()
    """Redis Sentinels as ``HOST:PORT`` (env ``REDIS_SENTINELS``, comma-separated); when
    set, the master comes from them and follows a failover."""
    sentinel_master: str = DEFAULT_SENTINEL_MASTER
    """Name of the master the sentinels monitor (env ``REDIS_SENTINEL_MASTER``)."""
    cluster: bool = False
    """``url`` names a node of a Redis Cluster (env ``REDIS_CLUSTER``)."""
    socket_timeout_s: float = 5.0
    """Timeout of every Redis call (XREAD's block is kept below it)."""
    block_ms: int = 1000
    """How long one XREAD waits for new reports; also how fast ``stop`` is noticed."""
    batch: int = 1000
    """Stream entries per XREAD and keys per SCAN page."""
    report_interval_s: float = 1.0
    """The agents' interval, used for the TTL of nodes whose report does not carry it."""
    retry_initial_s: float = 0.5
    """First reconnect delay after an error; doubles up to ``retry_max_s``."""
    retry_max_s: float = 10.0
    decision_ttl_s: int = keys.DECISION_TTL_S
    """Lifetime of ``intf:decision:{ns}/{pod}`` records."""
    log_interval_s: float = 30.0
    """At most one log line per this many seconds about malformed payloads."""
    forget_after_s: float = 600.0
    """A node whose latest report is this old is dropped from the cache (missing and stale
    are treated alike; this only bounds memory)."""
    decision_queue_size: int = 10_000
    """Decision records that may wait for the writer thread; when it is full (Redis slow
    or down) a write waits up to ``socket_timeout_s``, then the record is counted in
    ``interference_scheduler_decision_write_errors_total`` and skipped."""
    decision_batch: int = 500
    """Most decision records written in one pipeline."""
    decision_linger_s: float = 0.05
    """How long the writer waits for a batch to fill before writing what it has (records
    reach Redis at most this late; a pipeline per record would cost scheduling CPU)."""
    snapshot_interval_s: float = 0.2
    """Shortest time between two snapshots handed to the scheduler. 5,000 agents send
    5,000 reports a second; a new snapshot per scheduling attempt would make every
    attempt diff the node table and drop its signal caches (measured on a real
    apiserver: 28 ms CPU per GPU pod instead of 2). Signals are per-second data: this
    adds at most this much age. 0: a new snapshot whenever a report arrived."""
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
        except SettingError as exc:
            raise ValueError(str(exc)) from None
        if self.sentinels and self.cluster:
            raise ValueError("cluster: use either Redis Sentinel (sentinels) or Redis Cluster")
        try:
            self.target()
        except SettingError as exc:
            raise ValueError(f"url: {exc}") from None
        for name in (
            "socket_timeout_s",
            "report_interval_s",
            "retry_initial_s",
            "retry_max_s",
            "decision_linger_s",
            "forget_after_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be a number > 0")
        if not 0 < self.block_ms < self.socket_timeout_s * 1000:
            raise ValueError(
                f"block_ms: {self.block_ms!r} must be > 0 and below socket_timeout_s × 1000"
                f" ({self.socket_timeout_s * 1000:.0f})"
            )
        if not self.snapshot_interval_s >= 0:
            raise ValueError(
                f"snapshot_interval_s: {self.snapshot_interval_s!r} must be a number ≥ 0, e.g. 0.2"
            )
        for name in ("batch", "decision_ttl_s", "decision_queue_size", "decision_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be an integer ≥ 1")

    @property
    def tls(self) -> RedisTls:
        """The TLS options as the shared helper takes them."""
        return RedisTls(self.ca_file, self.cert_file, self.key_file)

    def target(self, env: Mapping[str, str] | None = None) -> RedisTarget:
        """Where Redis is, with the credentials of ``env`` (:class:`SettingError` for a
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


SIGNAL_AGE_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


class SignalMetrics:
    """Counters of the Redis adapters (registered on the scheduler's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.payload_errors = Counter(
            "interference_scheduler_signal_payload_errors",
            "Malformed node hashes or stream entries skipped, by source (hash, gpu, stream).",
            ["source"],
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
        self.signal_age = Histogram(
            "interference_scheduler_signal_age_seconds",
            "Age of each streamed node report when it reached the cache: now minus the end"
            " of its kernel measurement interval (the report's ts).",
            buckets=SIGNAL_AGE_BUCKETS_S,
            registry=registry,
        )
        for source in ("hash", "gpu", "stream"):
            self.payload_errors.labels(source)


@dataclass(frozen=True, slots=True)
class _Entry:
    signals: NodeSignals


class RedisSignalCache:
    """The :class:`~scheduler.ports.SignalSource` on Redis; run :meth:`run` in a thread."""

    def __init__(
        self,
        connection: RedisConnection,
        settings: RedisSettings,
        metrics: SignalMetrics,
        clock: Any = time.time,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._redis = connection
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._snapshot: Mapping[str, NodeSignals] = MappingProxyType({})
        self._dirty = False
        self._snapshot_at = -float("inf")
        self._healthy = False
        self._last_id = "0-0"
        self._payload_log = _RateLimitedLog(settings.log_interval_s)
        self.bootstraps = 0
        """How many times the cache (re)loaded the hashes; for tests and logs."""

    # --- SignalSource ---

    def snapshot(self) -> Mapping[str, NodeSignals]:
        """Node → latest signals; a read-only copy rebuilt only after updates, at most
        every ``settings.snapshot_interval_s``."""
        with self._lock:
            now = time.monotonic()
            if self._dirty and now - self._snapshot_at >= self.settings.snapshot_interval_s:
                self._snapshot = MappingProxyType({n: e.signals for n, e in self._entries.items()})
                self._dirty = False
                self._snapshot_at = now
            return self._snapshot

    def healthy(self) -> bool:
        with self._lock:
            return self._healthy

    def stale_nodes(self, now: float | None = None) -> list[str]:
        """Nodes whose latest report is stale or degraded (:mod:`interference.freshness`)."""
        now = self._clock() if now is None else now
        with self._lock:
            return sorted(
                node
                for node, entry in self._entries.items()
                if freshness.node_state(
                    entry.signals.updated_at,
                    entry.signals.interval_s,
                    entry.signals.measured,
                    now,
                )
                != "ok"
            )

    # --- the follower ---

    def run(self, stop: threading.Event, on_iteration: Callable[[], None] | None = None) -> None:
        """Bootstrap then follow the stream until ``stop``; survives any Redis outage.

        ``on_iteration`` is called once per XREAD or retry (a liveness heartbeat).
        """
        delay = self.settings.retry_initial_s
        bootstrapped = False
        while not stop.is_set():
            if on_iteration is not None:
                on_iteration()
            try:
                if not bootstrapped:
                    self.bootstrap()
                    bootstrapped = True
                    delay = self.settings.retry_initial_s
                self.follow_once()
            except REDIS_ERRORS as exc:
                self.metrics.redis_errors.inc()
                bootstrapped = False
                self._redis.reset()  # no half-read reply on the next call; a fresh slot map
                if self._set_healthy(False):
                    log.warning(
                        "Redis at %s is unavailable (%s); scheduling interference-blind until it"
                        " is back (retrying every ≤ %g s)",
                        self._redis.target.describe(),
                        exc,
                        self.settings.retry_max_s,
                    )
                stop.wait(delay)
                delay = min(delay * 2, self.settings.retry_max_s)

    def bootstrap(self) -> None:
        """Load every node and GPU hash; the stream is then followed from its current end."""
        last = self._redis.client().xrevrange(keys.STREAM, count=1)
        last_id = _text(last[0][0]) if last else "0-0"
        nodes = self._load_hashes(keys.node_key("*"), "hash")
        gpus = self._load_hashes(keys.gpu_key("*"), "gpu")
        loaded: dict[str, _Entry] = {}
        for key, raw in nodes.items():
            try:
                node = keys.node_from_key(key)
            except ValueError:
                continue  # intf:node:{node}:pods sets
            try:
                parsed = parse_node_signals(raw)
            except PayloadError as exc:
                self._malformed("hash", f"{key}: {exc}")
                continue
            interval = parsed.interval_s or self.settings.report_interval_s
            loaded[node] = _Entry(
                NodeSignals(
                    parsed.metrics,
                    parsed.updated_at,
                    interval_s=interval,
                    measured=parsed.measured,
                    windows=parsed.windows,
                )
            )
        prefix = keys.gpu_key("")
        for key, raw in gpus.items():
            node = key[len(prefix) :]
            try:
                devices = tuple(parse_gpu_hash(raw))
            except PayloadError as exc:
                self._malformed("gpu", f"{key}: {exc}")
                continue
            if node in loaded:
                loaded[node] = _Entry(dataclasses.replace(loaded[node].signals, gpus=devices))
        with self._lock:
            for node, entry in loaded.items():
                current = self._entries.get(node)
                if current is None or current.signals.updated_at <= entry.signals.updated_at:
                    self._entries[node] = entry
            self._dirty = True
            self._last_id = last_id
        self.bootstraps += 1
        if self._set_healthy(True):
            log.info(
                "signal cache loaded %d nodes from Redis; following %s", len(loaded), keys.STREAM
            )

    def follow_once(self) -> int:
        """One XREAD from the last id; applies and returns how many entries arrived."""
        reply = self._redis.client().xread(
            {keys.STREAM: self._last_id}, count=self.settings.batch, block=self.settings.block_ms
        )
        applied = 0
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                self._last_id = _text(entry_id)
                applied += self._apply_entry(fields)
        self.forget_silent()
        return applied

    def forget_silent(self, now: float | None = None) -> list[str]:
        """Drop nodes whose latest report is older than ``forget_after_s``; returns them."""
        now = self._clock() if now is None else now
        cutoff = now - self.settings.forget_after_s
        with self._lock:
            gone = [n for n, e in self._entries.items() if e.signals.updated_at < cutoff]
            for node in gone:
                del self._entries[node]
            if gone:
                self._dirty = True
        return sorted(gone)

    def _apply_entry(self, fields: Mapping[Any, Any]) -> int:
        payload = fields.get(keys.STREAM_FIELD.encode(), fields.get(keys.STREAM_FIELD))
        if not isinstance(payload, bytes):
            self._malformed("stream", f"entry lacks the {keys.STREAM_FIELD!r} field")
            return 0
        try:
            report = decode_report(payload)
        except PayloadError as exc:
            self._malformed("stream", str(exc))
            return 0
        self.metrics.signal_age.observe(max(0.0, self._clock() - report.ts))
        signals = NodeSignals(
            report.metrics,
            report.ts,
            tuple(report.gpus),
            interval_s=report.interval_s,
            measured=report.measured,
            windows=report.windows,
        )
        entry = _Entry(signals)
        with self._lock:
            current = self._entries.get(report.node)
            if current is not None and current.signals.updated_at > report.ts:
                return 0  # an older report than the one we hold (e.g. replayed after bootstrap)
            self._entries[report.node] = entry
            self._dirty = True
        return 1

    def _load_hashes(self, pattern: str, source: str) -> dict[str, Mapping[bytes, bytes]]:
        found: dict[str, Mapping[bytes, bytes]] = {}
        batch: list[str] = []
        for key in self._redis.client().scan_iter(
            match=pattern, count=self.settings.batch, _type="hash"
        ):
            batch.append(_text(key))
            if len(batch) >= self.settings.batch:
                found.update(self._hgetall(batch))
                batch = []
        if batch:
            found.update(self._hgetall(batch))
        return found

    def _hgetall(self, names: list[str]) -> dict[str, Mapping[bytes, bytes]]:
        pipe = self._redis.client().pipeline(transaction=False)
        for name in names:
            pipe.hgetall(name)
        # An empty reply means the hash expired between SCAN and HGETALL: skip it.
        return {name: raw for name, raw in zip(names, pipe.execute(), strict=True) if raw}

    def _malformed(self, source: str, detail: str) -> None:
        self.metrics.payload_errors.labels(source).inc()
        self._payload_log.warning(
            "skipped a malformed %s payload from Redis: %s; check that agents and scheduler run"
            " the same release",
            source,
            detail,
        )

    def _set_healthy(self, healthy: bool) -> bool:
        """Set the health flag; True when it changed."""
        with self._lock:
            changed = self._healthy != healthy
            self._healthy = healthy
            return changed


class RedisDecisionSink:
    """The :class:`~scheduler.ports.DecisionSink`: HSET + EXPIRE per record, a whole batch
    in one round trip; never raises."""

    def __init__(
        self, connection: RedisConnection, settings: RedisSettings, metrics: SignalMetrics
    ) -> None:
        self._redis = connection
        self._ttl_s = settings.decision_ttl_s
        self._metrics = metrics
        self._log = _RateLimitedLog(settings.log_interval_s)

    def write(self, decision: Decision) -> None:
        self.write_many((decision,))

    def write_many(self, decisions: Iterable[Decision]) -> None:
        """Write every record in one pipeline; a failure counts each of them."""
        names: list[str] = []
        try:
            pipe = self._redis.client().pipeline(transaction=False)
            for decision in decisions:
                key = keys.decision_key(decision.namespace, decision.pod)
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

    def failed(self, count: int, reason: str) -> None:
        """Count ``count`` records that were not written, and say why (rate-limited)."""
        self._metrics.decision_write_errors.inc(count)
        self._log.warning("skipped %d decision records: %s", count, reason)


class QueuedDecisionSink:
    """A :class:`~scheduler.ports.DecisionSink` that queues records for a writer thread,
    which writes them in one pipeline per ``decision_batch`` records or per
    ``decision_linger_s``, whichever comes first.

    :meth:`write` costs the caller a lock and an append, not a Redis round trip. The queue
    is bounded (``decision_queue_size``): while it is full a write waits at most
    ``socket_timeout_s``, then the record is counted as a write error and skipped, so a
    slow or absent Redis never stalls scheduling for long. After :meth:`close`, records
    are written synchronously.
    """

    def __init__(self, sink: RedisDecisionSink, settings: RedisSettings) -> None:
        self._sink = sink
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
