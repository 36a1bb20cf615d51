"""Host ports (kube-scheduler's ``NodePorts``).

``passed[i] = ∀ wanted port w, ∀ port u in use on node i: ¬conflict(w, u)`` where two host
ports conflict when protocol and port are equal and either binds ``0.0.0.0`` or both bind
the same address. Reason: ``node(s) didn't have free ports for the requested pod ports``.
"""

from __future__ import annotations

import numpy as np

from scheduler.filters.base import FilterResult, all_pass
from scheduler.model import PodInfo
from scheduler.table import NodeTable

PORTS_TAKEN = "node(s) didn't have free ports for the requested pod ports"


def host_ports(table: NodeTable, pod: PodInfo) -> FilterResult:
    """Nodes where none of the pod's host ports is already taken."""
    if not pod.host_ports:
        return all_pass("NodePorts", table)
    passed = np.ones(len(table), dtype=np.bool_)
    for wanted in pod.host_ports:
        for node, used in table.host_port_users(wanted.protocol, wanted.port).items():
            row = table.index_of(node)
            if row is not None and any(wanted.conflicts(u) for u in used):
                passed[row] = False
    return FilterResult("NodePorts", passed, (PORTS_TAKEN,))
