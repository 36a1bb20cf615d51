"""NodePorts (kube-scheduler's plugin of that name): the pod's host ports are free.

``passed[i] = ∀ wanted port w, ∀ port u in use on node i: ¬conflict(w, u)`` where two host
ports conflict when protocol and port are equal and either binds ``0.0.0.0`` or both bind
the same address. Reason: ``node(s) didn't have free ports for the requested pod ports``.

The ports placed pods hold are this plugin's own lookup (:class:`HostPortLookup`), kept
current by the table's placed-pod hooks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np

from scheduler.api.events import Action, EventInterest
from scheduler.api.objects import HostPort, PodInfo
from scheduler.api.term_lookup import decrement
from scheduler.plugins.base import Code, Filter, FilterResult, filter_by_table_and_pod
from scheduler.signals.table import NodeTable

NAME = "NodePorts"
PORTS_TAKEN = "node(s) didn't have free ports for the requested pod ports"


class HostPortLookup:
    """Host ports in use: (protocol, port) → node → the placed pods' ports there."""

    def __init__(self) -> None:
        self._users: dict[tuple[str, int], dict[str, Counter[HostPort]]] = {}

    def add(self, pod: PodInfo, node: str) -> None:
        for port in pod.host_ports:
            self._users.setdefault((port.protocol, port.port), {}).setdefault(node, Counter())[
                port
            ] += 1

    def remove(self, pod: PodInfo, node: str) -> None:
        for port in pod.host_ports:
            users = self._users[(port.protocol, port.port)]
            decrement(users, node, port)
            if not users:
                del self._users[(port.protocol, port.port)]

    def users(self, protocol: str, port: int) -> Mapping[str, Counter[HostPort]]:
        """Node → host ports in use with this protocol and port number."""
        return self._users.get((protocol, port), {})


def node_ports(table: NodeTable, pod: PodInfo) -> FilterResult | None:
    """Nodes where none of the pod's host ports is already taken; ``None`` without any."""
    if not pod.host_ports:
        return None
    in_use = table.lookup(NAME, HostPortLookup)
    passed = np.ones(len(table), dtype=np.bool_)
    for wanted in pod.host_ports:
        for node, used in in_use.users(wanted.protocol, wanted.port).items():
            row = table.row_of(node)
            if row is not None and any(wanted.conflicts(u) for u in used):
                passed[row] = False
    return FilterResult(NAME, passed, (PORTS_TAKEN,))


FILTER = Filter(
    name=NAME,
    explain="none of the pod's host ports is taken on the node",
    filter=filter_by_table_and_pod(node_ports),
    events=(EventInterest("Pod", Action.DELETE), EventInterest("Node", Action.ADD)),
    status=Code.UNSCHEDULABLE,  # the pods holding the ports can be evicted
    lookup=HostPortLookup,
)
