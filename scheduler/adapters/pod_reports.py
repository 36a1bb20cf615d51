"""The agents' recent reports, read for the rebalancer: each node's report stream.

Each agent keeps its last :data:`interference.keys.NODE_REPORTS_MAXLEN` reports in
``intf:node:{node}:reports`` (one a second); reading the whole stream of a node at every
look (``XREVRANGE``, one pipelined round trip for all nodes) gives the rebalancer every
interval's per-pod rows between two looks ``interval_s`` ≤ 10 s apart — the pod hashes
hold only the latest interval. Only nodes hosting a pod with a tolerance are read. An
entry that does not decode is left out and counted (a forged or broken report never
reads as a quiet pod).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from interference import keys
from interference.codec import PayloadError, decode_report
from interference.signals import NodeReport
from interference_infra.redis_client import RedisConnection

log = logging.getLogger(__name__)


class RedisPodReports:
    """:class:`scheduler.rebalance_ports.PodReports` on Redis."""

    def __init__(self, connection: RedisConnection) -> None:
        self._redis = connection
        self.undecodable = 0
        """Stream entries that did not decode, since start."""

    def recent(self, nodes: Sequence[str]) -> dict[str, list[NodeReport]]:
        if not nodes:
            return {}
        try:
            pipe = self._redis.client().pipeline(transaction=False)
            for node in nodes:
                pipe.xrevrange(keys.reports_key(node), count=keys.NODE_REPORTS_MAXLEN)
            replies = pipe.execute()
        except Exception:
            self._redis.reset()
            raise
        found: dict[str, list[NodeReport]] = {}
        for node, entries in zip(nodes, replies, strict=True):
            reports: list[NodeReport] = []
            for _, fields in entries or ():
                payload = fields.get(keys.REPORTS_FIELD.encode(), fields.get(keys.REPORTS_FIELD))
                try:
                    reports.append(decode_report(payload))
                except (PayloadError, TypeError) as exc:
                    self.undecodable += 1
                    log.warning("a report of node %s does not decode: %s", node, exc)
            if reports:
                found[node] = reports
        return found
