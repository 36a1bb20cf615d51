"""Network drops and queue backlog from netlink (pyroute2), node level.

Links: ``rx_dropped + tx_dropped`` from ``IFLA_STATS64``; qdiscs: ``drops`` and
``backlog`` from ``TCA_STATS2``/``TCA_STATS_QUEUE`` (``TCA_STATS`` on old kernels).
``net_drops`` is the increase over the interval summed over every link and qdisc;
``net_backlog_bytes`` is the bytes queued in qdiscs right now (a gauge).
Reads the network namespace the agent runs in, so it runs only in the node's: a pod's own
namespace would report its one virtual interface as the node (see :func:`check_host_network`).
"""

from __future__ import annotations

import logging
import os
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


def check_host_network(proc_root: str) -> None:
    """Raise unless this process is in the network namespace of the host's PID 1.

    ``PROC_ROOT/self/net/dev`` and ``PROC_ROOT/1/net/dev`` are the same procfs entry only
    in the same network namespace (each namespace has its own). Needs the host's procfs
    at ``proc_root`` (the host PID namespace, or the host's ``/proc`` mounted there)."""
    try:
        own = os.stat(os.path.join(proc_root, "self/net/dev")).st_ino
        host = os.stat(os.path.join(proc_root, "1/net/dev")).st_ino
    except OSError as exc:
        raise ProbeUnavailable(
            f"cannot tell whether this is the node's network namespace ({exc}); mount the "
            "host's /proc (PROC_ROOT) or disable the network probe"
        ) from exc
    if own != host:
        raise ProbeUnavailable(
            "the agent runs in its pod's network namespace, not the node's, so it would "
            "count its own interface's drops as the node's: node-level drops need "
            "hostNetwork (deploy/components/host-namespaces)"
        )


@register("network")
class NetworkProbe:
    """Node-level link and qdisc drops (delta) and qdisc backlog (gauge)."""

    name = "network"

    def __init__(self, ctx: ProbeContext, netns: str | None = None) -> None:
        """``netns``: a named network namespace to read instead of the agent's own."""
        self._ctx = ctx
        self._netns = netns
        self._ipr: Any = None
        self._drops: CounterDeltas[tuple[str, int, str]] = CounterDeltas()

    def start(self) -> None:
        """Open the netlink socket and take the baseline."""
        try:
            from pyroute2 import IPRoute
        except ImportError as exc:
            raise ProbeUnavailable(f"pyroute2 is missing ({exc}); pip install pyroute2") from exc
        if not self._netns:
            check_host_network(self._ctx.proc_root)
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
