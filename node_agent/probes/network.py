"""Network drops and queue backlog from netlink (pyroute2), node level.

Links: ``rx_dropped + tx_dropped`` from ``IFLA_STATS64``; qdiscs: ``drops`` and
``backlog`` from ``TCA_STATS2``/``TCA_STATS_QUEUE`` (``TCA_STATS`` on old kernels).
``net_drops`` is the increase over the interval summed over every link and qdisc;
``net_backlog_bytes`` is the bytes queued in qdiscs right now (a gauge).
Reads the network namespace the agent runs in (host network in the DaemonSet).
"""

from __future__ import annotations

import logging
from typing import Any

from node_agent.probes.base import (
    NET_BACKLOG_BYTES,
    NET_DROPS,
    CollectFailed,
    ProbeContext,
    ProbeUnavailable,
    Sample,
    register,
)
from node_agent.probes.cgroup_files import CounterDeltas

log = logging.getLogger(__name__)

_DROPS = "drops"


def link_drops(link: Any) -> tuple[tuple[str, int, str], int]:
    """``((kind, ifindex, ifname), rx_dropped + tx_dropped)`` of one RTM_NEWLINK message."""
    stats = link.get("IFLA_STATS64") or link.get("IFLA_STATS") or {}
    key = ("link", int(link["index"]), str(link.get("IFLA_IFNAME")))
    return key, int(stats.get("rx_dropped", 0)) + int(stats.get("tx_dropped", 0))


def qdisc_drops_backlog(qdisc: Any) -> tuple[tuple[str, int, str], int, int]:
    """``((kind, ifindex, handle:parent), drops, backlog_bytes)`` of one RTM_NEWQDISC."""
    key = ("qdisc", int(qdisc["index"]), f"{qdisc['handle']:x}:{qdisc['parent']:x}")
    stats2 = qdisc.get("TCA_STATS2")
    queue = stats2.get("TCA_STATS_QUEUE") if stats2 is not None else None
    if queue is not None:
        return key, int(queue["drops"]), int(queue["backlog"])
    legacy = qdisc.get("TCA_STATS") or {}
    return key, int(legacy.get("drop", 0)), int(legacy.get("backlog", 0))


@register("network")
class NetworkProbe:
    """Node-level link and qdisc drops (delta) and qdisc backlog (gauge)."""

    name = "network"

    def __init__(self, ctx: ProbeContext, netns: str | None = None) -> None:
        """``netns``: a named network namespace to read instead of the agent's own."""
        self._netns = netns
        self._ipr: Any = None
        self._drops: CounterDeltas[tuple[str, int, str]] = CounterDeltas()

    def start(self) -> None:
        """Open the netlink socket and take the baseline."""
        try:
            from pyroute2 import IPRoute
        except ImportError as exc:
            raise ProbeUnavailable(f"pyroute2 is missing ({exc}); pip install pyroute2") from exc
        try:
            self._ipr = IPRoute(netns=self._netns) if self._netns else IPRoute()
            self._read()
        except OSError as exc:
            self.close()
            raise ProbeUnavailable(
                f"cannot read links/qdiscs over rtnetlink ({exc}); run the agent with "
                "hostNetwork and NET_ADMIN, or disable the network probe"
            ) from exc

    def _read(self) -> tuple[dict[tuple[str, int, str], dict[str, int]], int]:
        drops: dict[tuple[str, int, str], dict[str, int]] = {}
        backlog = 0
        for link in self._ipr.get_links():
            key, dropped = link_drops(link)
            drops[key] = {_DROPS: dropped}
        for qdisc in self._ipr.get_qdiscs():
            key, dropped, queued = qdisc_drops_backlog(qdisc)
            drops[key] = {_DROPS: dropped}
            backlog += queued
        return self._drops.update(drops), backlog

    def collect(self) -> Sample:
        """Drops since the previous call and the current backlog."""
        if self._ipr is None:
            return Sample()
        try:
            deltas, backlog = self._read()
        except OSError as exc:
            raise CollectFailed(f"netlink read failed: {exc}") from exc
        dropped = sum(d[_DROPS] for d in deltas.values())
        return Sample(node={NET_DROPS: float(dropped), NET_BACKLOG_BYTES: float(backlog)})

    def close(self) -> None:
        """Close the netlink socket; safe to call twice."""
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None
