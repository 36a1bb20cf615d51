"""The rebalancer's journal of moves in Redis (``intf:rebalance:moves``), so a new leader
keeps the cool-downs, the rate limits and the RebalancedAway departures of the old one.

One sorted set: member = a move as JSON, score = its unix time. :meth:`record` adds one
and removes those older than the longest window that still needs them (``ZADD``,
``ZRANGE … BYSCORE``, ``ZREM``, one round trip); :meth:`since` reads the recent ones back.
A member that does not read as a move is left out and logged (never taken for one).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from interference import keys
from interference_infra.redis_client import RedisConnection
from scheduler.plugins.rebalanced_away import Departure
from scheduler.rebalance import Moved

log = logging.getLogger(__name__)


class RedisMoveJournal:
    """:class:`scheduler.rebalance_ports.MoveJournal` on Redis."""

    def __init__(self, connection: RedisConnection) -> None:
        self._redis = connection

    def record(self, moved: Moved, departure: Departure | None, keep_s: float) -> None:
        member = json.dumps(
            {
                "at": moved.at,
                "node": moved.node,
                "namespace": moved.namespace,
                "workload_uid": moved.workload_uid,
                "workload": departure.workload if departure else "",
                "reason": departure.reason if departure else "",
                "departed": departure is not None,
            },
            sort_keys=True,
        )
        try:
            client = self._redis.client()
            old = _by_score(client, "-inf", f"({moved.at - keep_s!r}")
            pipe = client.pipeline(transaction=False)
            pipe.zadd(keys.REBALANCE_MOVES, {member: moved.at})
            if old:
                pipe.zrem(keys.REBALANCE_MOVES, *old)
            pipe.execute()
        except Exception:
            self._redis.reset()
            raise

    def since(self, at: float) -> list[tuple[Moved, Departure | None]]:
        try:
            members = _by_score(self._redis.client(), repr(at), "+inf")
        except Exception:
            self._redis.reset()
            raise
        found: list[tuple[Moved, Departure | None]] = []
        for member in members:
            try:
                found.append(_move(json.loads(member)))
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("a rebalancer journal entry does not read as a move: %s", exc)
        return found


def _by_score(client: Any, low: str, high: str) -> list[Any]:
    """``ZRANGE intf:rebalance:moves LOW HIGH BYSCORE`` (ZRANGE: the one command the
    scheduler's ACL user already has for ranges)."""
    found = client.execute_command("ZRANGE", keys.REBALANCE_MOVES, low, high, "BYSCORE")
    return list(found or [])


def _move(data: Any) -> tuple[Moved, Departure | None]:
    if not isinstance(data, dict):
        raise TypeError(f"expected an object, got {type(data).__name__}")
    at = float(data["at"])
    fields = ("node", "namespace", "workload_uid", "workload", "reason")
    if not all(isinstance(data[name], str) for name in fields):
        raise TypeError("node, namespace, workload_uid, workload and reason must be strings")
    moved = Moved(at, data["node"], data["namespace"], data["workload_uid"])
    if data["departed"] is not True:
        return moved, None
    return moved, Departure(
        data["workload_uid"], data["workload"], data["node"], at, data["reason"]
    )
