"""Memory-limit events per cgroup: v2 ``memory.events.local``, v1 ``failcnt``/``oom_control``.

============================  ===========================  ==============================
metric                        cgroup v2                    cgroup v1
============================  ===========================  ==============================
``memory_high_events``        ``high`` (throttled over     — (v1 has no memory.high)
                              memory.high)
``memory_max_events``         ``max`` (hit memory.max)     ``memory.failcnt`` (charges
                                                           that hit the limit)
``memory_oom_events``         ``oom`` (OOM killer          ``oom_kill`` in
                              invoked for the cgroup)      ``memory.oom_control``
============================  ===========================  ==============================

v2 prefers ``memory.events.local`` (this cgroup only, so container and pod rows can be
summed) over the hierarchical ``memory.events`` on kernels before 5.2. Only cgroups
with at least one event in the interval are reported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import ClassVar

from node_agent.probes.base import MEM_HIGH_EVENTS, MEM_MAX_EVENTS, MEM_OOM_EVENTS, register
from node_agent.probes.cgroup_files import (
    CgroupCounterProbe,
    CounterReader,
    read_flat_keyed,
    read_text,
)


def read_v2_memory_events(directory: str) -> dict[str, int] | None:
    """Counters from ``memory.events.local`` (or ``memory.events``) of a v2 cgroup."""
    events = read_flat_keyed(os.path.join(directory, "memory.events.local"))
    if events is None:
        events = read_flat_keyed(os.path.join(directory, "memory.events"))
    if events is None:
        return None
    return {
        MEM_HIGH_EVENTS: events.get("high", 0),
        MEM_MAX_EVENTS: events.get("max", 0),
        MEM_OOM_EVENTS: events.get("oom", 0),
    }


def read_v1_memory_events(directory: str) -> dict[str, int] | None:
    """``memory.failcnt`` and ``oom_kill`` of a v1 memory cgroup."""
    failcnt = read_text(os.path.join(directory, "memory.failcnt"))
    if failcnt is None or not failcnt.strip().isdigit():
        return None
    oom_control = read_flat_keyed(os.path.join(directory, "memory.oom_control")) or {}
    return {MEM_MAX_EVENTS: int(failcnt), MEM_OOM_EVENTS: oom_control.get("oom_kill", 0)}


@register("memory_events")
class MemoryEventsProbe(CgroupCounterProbe):
    """Per-cgroup memory.high/max/OOM event deltas, keyed by path in ``by_cgroup_path``."""

    name = "memory_events"
    controller = "memory"
    counters_description = "memory-limit counters"
    readers: ClassVar[Mapping[int, CounterReader]] = {
        2: read_v2_memory_events,
        1: read_v1_memory_events,
    }
