"""The ranking people read (``intf:nodes`` by interference index, ``intf:nodes:updated``),
rewritten from the follower's frame with the index the scheduler computed; nodes without
a usable record leave it. Agents never write it."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from interference import keys
from interference_infra.redis_client import (
    REDIS_ERRORS,
    RedisConnection,
    credentials_refused,
    refused_credentials_reason,
)
from scheduler.adapters.rate_limited_log import RateLimitedLog
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.signals.frame import SignalFrame

log = logging.getLogger(__name__)


class RankingWriter:
    """Writes the node ranking; failures are counted and logged, never raised."""

    def __init__(
        self, connection: RedisConnection, metrics: SignalMetrics, log_interval_s: float
    ) -> None:
        self._redis = connection
        self._metrics = metrics
        self._log = RateLimitedLog(log, log_interval_s)

    def write(self, frame: SignalFrame, now: float) -> bool:
        """Rewrite ``intf:nodes`` (index of the latest interval) and ``intf:nodes:updated``
        from ``frame``'s records usable at ``now``; members without one are removed. False
        when it failed (counted, logged once per interval); never raises."""
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
            self._metrics.ranking_errors.inc()
            if credentials_refused(exc):
                self._log.warning(
                    "could not write the node ranking %s: %s (%s)",
                    keys.NODES_BY_INDEX,
                    refused_credentials_reason(self._redis.target),
                    exc,
                )
                return False
            self._log.warning(
                "could not write the node ranking %s (%s): Redis is unreachable, or the"
                " scheduler's ACL user lacks ZRANGE, ZADD or ZREM on it (or set"
                " redis.ranking_interval_s: 0)",
                keys.NODES_BY_INDEX,
                exc,
            )
            return False
        return True


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
