"""Probes: one module per BPF program or kernel reader, all behind ``base.Probe``.

Importing this package registers every probe in ``base``'s registry.
"""

from node_agent.probes import (
    cpu_throttle,
    memory_events,
    network,
    psi,
    reclaim,
    runqlat,
    taskstats,
)

__all__ = [
    "cpu_throttle",
    "memory_events",
    "network",
    "psi",
    "reclaim",
    "runqlat",
    "taskstats",
]
