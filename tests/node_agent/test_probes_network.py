"""network probe: real qdisc drops and backlog in a private network namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from node_agent.probes.base import NET_BACKLOG_BYTES, NET_DROPS, ProbeContext, registered
from node_agent.probes.network import NetworkProbe, link_drops, qdisc_drops_backlog
from tests.node_agent.own_cgroups import unique_name

SEND_UDP = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
s.setblocking(False)
for _ in range({count}):
    try:
        s.sendto(b"x" * 1000, ("10.77.0.3", 9))
    except BlockingIOError:
        pass
"""


def test_registered() -> None:
    assert registered()["network"] is NetworkProbe


@pytest.mark.parametrize(
    ("qdisc", "expected"),
    [
        (
            {
                "index": 3,
                "handle": 0x10000,
                "parent": 0xFFFFFFFF,
                "TCA_STATS2": {"TCA_STATS_QUEUE": {"drops": 7, "backlog": 3000, "qlen": 3}},
            },
            (("qdisc", 3, "10000:ffffffff"), 7, 3000),
        ),
        (  # kernels without TCA_STATS2
            {"index": 3, "handle": 0, "parent": 1, "TCA_STATS": {"drop": 2, "backlog": 10}},
            (("qdisc", 3, "0:1"), 2, 10),
        ),
    ],
)
def test_qdisc_stats_parsing(qdisc: dict[str, object], expected: object) -> None:
    class Message(dict[str, object]):
        """pyroute2 messages answer get() for attributes and [] for header fields."""

    assert qdisc_drops_backlog(Message(qdisc)) == expected


def test_link_drops_parsing() -> None:
    link = {"index": 2, "IFLA_IFNAME": "eth0", "IFLA_STATS64": {"rx_dropped": 4, "tx_dropped": 1}}
    assert link_drops(link) == (("link", 2, "eth0"), 5)


def ip(*argv: str) -> str:
    return subprocess.run(["ip", *argv], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def netns_with_slow_qdisc() -> Iterator[str]:
    """A namespace with a veth pair; v0 sends through an 8 kbit/s tbf holding ~3 packets."""
    if os.geteuid() != 0 or shutil.which("tc") is None:
        pytest.skip("needs root and iproute2 (ip, tc)")
    name = unique_name("intf-test-b-net")
    ip("netns", "add", name)
    try:
        # No IPv6: its router/multicast solicitations would join the full queue at random
        # moments and be dropped between two reads.
        for scope in ("all", "default"):
            subprocess.run(
                ["ip", "netns", "exec", name, "sysctl", "-qw",
                 f"net.ipv6.conf.{scope}.disable_ipv6=1"],
                check=True,
            )  # fmt: skip
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        ip("-n", name, "addr", "add", "10.77.0.1/24", "dev", "v0")
        ip("-n", name, "link", "set", "v0", "up")
        ip("-n", name, "link", "set", "v1", "up")
        # a static neighbour behind v0 (not a local address): no ARP through the slow qdisc
        v1_mac = json.loads(ip("-n", name, "-j", "link", "show", "v1"))[0]["address"]
        ip("-n", name, "neigh", "replace", "10.77.0.3", "lladdr", v1_mac, "dev", "v0")
        subprocess.run(
            ["tc", "-n", name, "qdisc", "add", "dev", "v0", "root", "tbf",
             "rate", "8kbit", "burst", "1600", "limit", "3200"],
            check=True,
        )  # fmt: skip
        yield name
    finally:
        ip("netns", "del", name)


def iproute2_drops_backlog(netns: str) -> tuple[int, int]:
    """(drops on all links and qdiscs, qdisc backlog bytes) as iproute2 reports them."""

    def show(*argv: str) -> list[dict[str, Any]]:
        out = subprocess.run([*argv], check=True, capture_output=True, text=True).stdout
        return list(json.loads(out))

    links = show("ip", "-n", netns, "-s", "-j", "link", "show")
    qdiscs = show("tc", "-n", netns, "-s", "-j", "qdisc", "show")
    drops = sum(
        link["stats64"]["rx"]["dropped"] + link["stats64"]["tx"]["dropped"] for link in links
    )
    drops += sum(int(q.get("drops", 0)) for q in qdiscs)
    return drops, sum(int(q.get("backlog", 0)) for q in qdiscs)


def test_real_qdisc_drops_and_backlog(netns_with_slow_qdisc: str) -> None:
    netns = netns_with_slow_qdisc
    probe = NetworkProbe(ProbeContext(), netns=netns)
    probe.start()
    try:
        drops_before, _ = iproute2_drops_backlog(netns)
        subprocess.run(
            ["ip", "netns", "exec", netns, "python3", "-c", SEND_UDP.format(count=50)], check=True
        )
        drops_sent, _ = iproute2_drops_backlog(netns)
        sample = probe.collect()
        drops_after, backlog = iproute2_drops_backlog(netns)
    finally:
        probe.close()
    assert drops_sent - drops_before > 0
    # nothing drains at 8 kbit/s between the reads: the probe sees what iproute2 sees
    # (bracketed by a read on either side, should the kernel send a packet meanwhile)
    assert drops_sent - drops_before <= sample.node[NET_DROPS] <= drops_after - drops_before
    assert sample.node[NET_BACKLOG_BYTES] == backlog > 0
