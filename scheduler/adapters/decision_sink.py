"""Decision records written to Redis (HSET + EXPIRE, a batch in one round trip) and read
back for the decision page, paused while Redis' memory is needed for the nodes' reports
(docs/design.md §4.3)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from redis.exceptions import NoPermissionError, ResponseError

from interference import keys
from interference.codec import PayloadError, PayloadTooBig, index_history
from interference.decision import Decision, decision_hash, parse_decision_hash
from interference_infra.redis_client import RedisConnection
from scheduler.adapters.rate_limited_log import RateLimitedLog
from scheduler.adapters.redis_settings import RedisSettings
from scheduler.adapters.signal_metrics import SignalMetrics

log = logging.getLogger(__name__)

MEMORY_CHECK_S = 5.0
"""How often the decision sink reads Redis' memory use."""


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
        self._log = RateLimitedLog(log, settings.log_interval_s)
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
