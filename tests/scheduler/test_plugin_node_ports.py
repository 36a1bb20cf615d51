"""NodePorts filter: protocol- and hostIP-aware conflicts."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.api.pods import parse_pod
from scheduler.plugins.node_ports import PORTS_TAKEN, node_ports
from tests.builders import container, node_obj, pod_obj, table_of
from tests.scheduler.filters import or_all_pass


def _with_port(
    name: str, port: int, protocol: str = "TCP", host_ip: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containerPort": port, "hostPort": port, "protocol": protocol}
    if host_ip is not None:
        spec["hostIP"] = host_ip
    return pod_obj(name, containers=[container({}, ports=[spec])])


@pytest.mark.parametrize(
    ("used", "wanted", "conflict"),
    [
        (_with_port("u", 8080), _with_port("w", 8080), True),
        (_with_port("u", 8080), _with_port("w", 8081), False),
        (_with_port("u", 53, "UDP"), _with_port("w", 53, "TCP"), False),
        (_with_port("u", 53, "UDP"), _with_port("w", 53, "UDP"), True),
        (_with_port("u", 80, host_ip="10.0.0.1"), _with_port("w", 80, host_ip="10.0.0.2"), False),
        (_with_port("u", 80, host_ip="10.0.0.1"), _with_port("w", 80, host_ip="10.0.0.1"), True),
        (_with_port("u", 80, host_ip="10.0.0.1"), _with_port("w", 80), True),
        (_with_port("u", 80, host_ip="0.0.0.0"), _with_port("w", 80, host_ip="10.0.0.2"), True),
        (
            pod_obj("u", containers=[container({}, ports=[{"containerPort": 80}])]),
            _with_port("w", 80),
            False,
        ),
    ],
    ids=[
        "same-port",
        "other-port",
        "other-protocol",
        "same-udp",
        "different-host-ips",
        "same-host-ip",
        "wanted-wildcard",
        "used-wildcard",
        "container-port-only",
    ],
)
def test_host_port_conflicts(used: dict[str, Any], wanted: dict[str, Any], conflict: bool) -> None:
    table = table_of([node_obj("busy"), node_obj("free")], [(used, "busy")])
    result = or_all_pass(node_ports(table, parse_pod(wanted)), table)
    assert result.passed.tolist() == [not conflict, True]
    assert result.reasons_for(0) == ([PORTS_TAKEN] if conflict else [])


def test_port_freed_when_pod_removed() -> None:
    used = _with_port("u", 9000)
    table = table_of([node_obj("n")], [(used, "n")])
    wanted = parse_pod(_with_port("w", 9000))
    assert not or_all_pass(node_ports(table, wanted), table).passed[0]
    table.remove_pod(parse_pod(used))
    assert or_all_pass(node_ports(table, wanted), table).passed[0]


def test_pod_without_host_ports_passes_everywhere() -> None:
    table = table_of([node_obj("n")], [(_with_port("u", 80), "n")])
    result = or_all_pass(node_ports(table, parse_pod(pod_obj())), table)
    assert result.passed.all() and result.reasons == ()
