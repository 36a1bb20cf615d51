"""NodePorts (kube-scheduler's plugin of that name): the pod's host ports are free.

``passed[i] = ∀ wanted port w, ∀ port u in use on node i: ¬conflict(w, u)`` where two host
ports conflict when protocol and port are equal and either binds ``0.0.0.0`` or both bind
the same address. Reason: ``node(s) didn't have free ports for the requested pod ports``.
"""

from __future__ import annotations

import numpy as np

from scheduler.api.objects import PodInfo
from scheduler.plugins.base import Filter, FilterResult, filter_by_table_and_pod
from scheduler.table import NodeTable

NAME = "NodePorts"
PORTS_TAKEN = "node(s) didn't have free ports for the requested pod ports"


def node_ports(table: NodeTable, pod: PodInfo) -> FilterResult | None:
    """Nodes where none of the pod's host ports is already taken; ``None`` without any."""
    if not pod.host_ports:
        return None
    passed = np.ones(len(table), dtype=np.bool_)
    for wanted in pod.host_ports:
        for node, used in table.host_port_users(wanted.protocol, wanted.port).items():
            row = table.index_of(node)
            if row is not None and any(wanted.conflicts(u) for u in used):
                passed[row] = False
    return FilterResult(NAME, passed, (PORTS_TAKEN,))


FILTER = Filter(
    name=NAME,
    explain="none of the pod's host ports is taken on the node",
    filter=filter_by_table_and_pod(node_ports),
    preemption_may_help=True,  # the pods holding the ports can be evicted
)
