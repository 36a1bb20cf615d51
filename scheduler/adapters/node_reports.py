"""The agents' recent reports, read for the rebalancer: each node's report stream.

Each agent keeps its last :data:`interference.keys.NODE_REPORTS_MAXLEN` reports in
``intf:node:{node}:reports`` (one a second); reading the whole stream of a node at every
look (``XREVRANGE`` with that ``COUNT``, pipelined) gives the rebalancer every interval's
per-pod rows between two looks ``interval_s`` ≤ 10 s apart — the pod hashes hold only the
latest interval. Only nodes hosting a pod with a tolerance are read.

The streams are written by the agents, so each is as untrusted as its node (issue 28,
docs/design.md §4.3). Every read is bounded and one node's stream cannot stop the others
being read:

* nodes are read :data:`NODES_PER_READ` at a time; when Redis cuts a read (a reply over its
  ``client-output-buffer-limit``: a stream of huge entries) or it fails otherwise, each
  node of that read is read alone, and a node whose own read fails is left out
  (``reason="unreadable"``) — unless Redis then fails a small read too: it is away, and
  the error is raised;
* an entry over :data:`interference.codec.MAX_REPORT_BYTES` or a msgpack length limit is
  refused before any object is built (``too_big``), one that does not decode is
  ``undecodable``; either way the node's older entries are not decoded in that look (a
  forged stream costs one refused entry a look, not ten) and the node's pods get no rows
  from it — a broken report never reads as a quiet pod.

Each is counted (``interference_scheduler_node_reports_refused_total{reason}``) and logged
at most once per minute per reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from interference import keys
from interference.codec import PayloadError, PayloadTooBig, decode_report
from interference.signals import NodeReport
from interference_infra.redis_client import REDIS_ERRORS, RedisConnection
from scheduler.adapters.signal_metrics import SignalMetrics

log = logging.getLogger(__name__)

NODES_PER_READ = 32
"""Streams read in one pipelined round trip: ~5 MB of replies for nodes of 30 pods, well
under the shipped Redis' 32 MB reply limit per client."""
REFUSAL_REASONS = ("too_big", "undecodable", "unreadable")
LOG_INTERVAL_S = 60.0


class RedisNodeReportSource:
    """:class:`scheduler.rebalancing.ports.NodeReportSource` on Redis."""

    def __init__(self, connection: RedisConnection, metrics: SignalMetrics | None = None) -> None:
        """``metrics``: where refusals are counted (their Prometheus counter); without it
        only :attr:`refused` counts them."""
        self._redis = connection
        self._metrics = metrics
        self._logged_at = dict.fromkeys(REFUSAL_REASONS, -float("inf"))
        self.refused = dict.fromkeys(REFUSAL_REASONS, 0)
        """Refusals by reason since start (a node's stream once per look)."""

    @property
    def undecodable(self) -> int:
        """Streams whose newest entries did not decode or were too big, since start."""
        return self.refused["undecodable"] + self.refused["too_big"]

    def recent(self, nodes: Sequence[str]) -> dict[str, list[NodeReport]]:
        found: dict[str, list[NodeReport]] = {}
        for start in range(0, len(nodes), NODES_PER_READ):
            part = nodes[start : start + NODES_PER_READ]
            for node, entries in zip(part, self._read_each(part), strict=True):
                if entries and (reports := self._decode(node, entries)):
                    found[node] = reports
        return found

    def _read(self, nodes: Sequence[str]) -> list[Any]:
        try:
            pipe = self._redis.client().pipeline(transaction=False)
            for node in nodes:
                pipe.xrevrange(keys.reports_key(node), count=keys.NODE_REPORTS_MAXLEN)
            return pipe.execute()
        except Exception:
            self._redis.reset()  # no half-read reply on the next call
            raise

    def _read_each(self, nodes: Sequence[str]) -> list[Any]:
        """The streams of ``nodes`` (``None`` for one that could not be read alone)."""
        try:
            return self._read(nodes)
        except REDIS_ERRORS:
            pass
        replies: list[Any] = []
        failed: list[tuple[str, Exception]] = []
        for node in nodes:
            try:
                replies.append(self._read([node])[0])
            except REDIS_ERRORS as exc:
                replies.append(None)
                failed.append((node, exc))
        if len(failed) == len(nodes):
            # Raises when Redis is away rather than one node's stream too big (the
            # scheduler's user may read the ranking, and has no PING).
            self._redis.client().zrange(keys.NODES_BY_INDEX, 0, 0)
        for node, error in failed:
            self._refuse(node, "unreadable", error)
        return replies

    def _decode(self, node: str, entries: Any) -> list[NodeReport]:
        reports: list[NodeReport] = []
        for _, fields in entries:
            payload = fields.get(keys.REPORTS_FIELD.encode(), fields.get(keys.REPORTS_FIELD))
            try:
                reports.append(decode_report(payload))
            except PayloadTooBig as exc:
                self._refuse(node, "too_big", exc)
                break
            except (PayloadError, TypeError) as exc:
                self._refuse(node, "undecodable", exc)
                break
        return reports

    def _refuse(self, node: str, reason: str, exc: Exception) -> None:
        self.refused[reason] += 1
        if self._metrics is not None:
            self._metrics.reports_refused.labels(reason).inc()
        now = time.monotonic()
        if now - self._logged_at[reason] >= LOG_INTERVAL_S:
            self._logged_at[reason] = now
            log.warning(
                "the report stream of node %s was not used (%s: %s); counted in"
                " interference_scheduler_node_reports_refused_total, next such line in %g s",
                node[:253],
                reason,
                str(exc)[:200],
                LOG_INTERVAL_S,
            )
