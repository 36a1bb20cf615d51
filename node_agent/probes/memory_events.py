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

from node_agent.probes.base import (
    MEM_HIGH_EVENTS,
    MEM_MAX_EVENTS,
    MEM_OOM_EVENTS,
    ProbeContext,
    ProbeUnavailable,
    Sample,
    register,
)
from node_agent.probes.cgroup_files import (
    CgroupCounters,
    read_flat_keyed,
    read_text,
    v1_hierarchy,
    v2_hierarchy,
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
class MemoryEventsProbe:
    """Per-cgroup memory.high/max/OOM event deltas, keyed by path in ``by_cgroup_path``."""

    name = "memory_events"

    def __init__(self, ctx: ProbeContext) -> None:
        self._ctx = ctx
        self._counters: CgroupCounters | None = None

    def start(self) -> None:
        """Pick the hierarchy that has the memory controller and take the baseline."""
        v2 = v2_hierarchy(self._ctx, "memory")
        v1 = v1_hierarchy(self._ctx, "memory")
        if v2 is not None:
            self._counters = CgroupCounters(v2, self._ctx.cgroup_root, read_v2_memory_events)
        elif v1 is not None:
            self._counters = CgroupCounters(v1, self._ctx.cgroup_root, read_v1_memory_events)
        else:
            raise ProbeUnavailable(
                f"no memory-limit counters: the cgroup v2 hierarchy at "
                f"{self._ctx.cgroup_v2_mount} lacks the memory controller and no v1 memory "
                f"controller is mounted at {os.path.join(self._ctx.cgroup_v1_mount, 'memory')}; "
                "mount the host's /sys/fs/cgroup into the agent"
            )
        self._counters.collect()

    def collect(self) -> Sample:
        """Events since the previous call, per cgroup that had any."""
        if self._counters is None:
            return Sample()
        return Sample(by_cgroup_path=self._counters.collect())

    def close(self) -> None:
        """Nothing to release."""
        self._counters = None
