"""Interference signals from Redis: :class:`RedisSignalCache`, the follower of the
nodes' scheduling records (docs/design.md §4).

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
  the cycle's stale policy.
* Every ``ranking_interval_s`` the cache has the ranking people read rewritten from its
  frame (:mod:`scheduler.adapters.ranking`).
* Redis unreachable: :meth:`~RedisSignalCache.healthy` turns False (the scheduler runs
  interference-blind), ``interference_scheduler_redis_errors_total`` counts it, one
  warning is logged per outage, the last data stay (ageing into staleness), and the
  cache retries with capped backoff.

The settings and the connection are in :mod:`scheduler.adapters.redis_settings`, the
decision records in :mod:`scheduler.adapters.decision_sink`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray
from redis.cluster import RedisCluster

from interference import keys, sched_record
from interference_infra.redis_client import (
    REDIS_ERRORS,
    RedisConnection,
    credentials_refused,
    refused_credentials_reason,
)
from scheduler.adapters.ranking import RankingWriter
from scheduler.adapters.rate_limited_log import RateLimitedLog
from scheduler.adapters.redis_settings import RedisSettings
from scheduler.adapters.signal_metrics import UNKNOWN_NODE, SignalMetrics
from scheduler.signals.frame import SIGNAL_COLUMNS, SignalFrame, no_signal_value
from scheduler.signals.records import (
    MAX_CLOCK_SKEW_S,
    REJECT_REASONS,
    decode_records,
    signal_columns,
)

log = logging.getLogger(__name__)


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
        self._rows_by_name: Mapping[str, int] = MappingProxyType({})
        self._keys: list[str] = []
        self._ids: NDArray[np.uint64] = np.zeros(0, np.uint64)
        self._columns: dict[str, NDArray[np.float64]] = _empty_columns(0)
        self._measured: NDArray[np.uint16] = np.zeros(0, np.uint16)
        self._record_ts: NDArray[np.float64] = np.zeros(0, np.float64)
        """Each row's last accepted record's own ``ts`` (``signals_at`` may be earlier)."""
        self._snapshot = SignalFrame.empty()
        self._reject_logs = {
            reason: RateLimitedLog(log, settings.log_interval_s)
            for reason in (*REJECT_REASONS, UNKNOWN_NODE)
        }
        self._ranking = RankingWriter(connection, metrics, settings.log_interval_s)
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
        """Rewrite the node ranking from the latest frame (:meth:`RankingWriter.write`);
        False when it failed, never raises."""
        now = self._clock() if now is None else now
        return self._ranking.write(self.snapshot(), now)

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
            if node not in self._rows_by_name:
                strays.append(node)
        if strays:
            self._rejected(UNKNOWN_NODE, len(strays), strays[0])
        return len(strays)

    def _follow(self, names: tuple[str, ...]) -> None:
        """Follow ``names`` from now on, keeping what is known of the nodes still there."""
        old_rows_by_name, old_columns = self._rows_by_name, self._columns
        old_measured = self._measured
        rows_by_name = {name: row for row, name in enumerate(names)}
        columns = _empty_columns(len(names))
        measured = np.zeros(len(names), np.uint16)
        record_ts = np.full(len(names), -np.inf)
        kept = [
            (row, old_rows_by_name[name])
            for name, row in rows_by_name.items()
            if name in old_rows_by_name
        ]
        if kept:
            new_rows, old_rows = (np.array(rows, np.intp) for rows in zip(*kept, strict=True))
            for column in SIGNAL_COLUMNS:
                columns[column][new_rows] = old_columns[column][old_rows]
            measured[new_rows] = old_measured[old_rows]
            record_ts[new_rows] = self._record_ts[old_rows]
        self._record_ts = record_ts
        self._names, self._rows_by_name = names, MappingProxyType(rows_by_name)
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
            rows=self._rows_by_name,
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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
