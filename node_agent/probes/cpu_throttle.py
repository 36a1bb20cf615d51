"""CFS-quota throttling per cgroup, from ``cpu.stat`` (cgroup v2 or the v1 ``cpu`` controller).

v2: ``throttled_usec`` and ``nr_throttled``; v1: ``throttled_time`` (ns) and
``nr_throttled``. Each cgroup's own counters (a pod's cgroup and its containers' cgroups
each have their own quota and are throttled separately). Reported per cgroup path as
``throttled_ns`` and ``throttled_periods`` increases; cgroups that were not throttled in
the interval are left out.
"""

from __future__ import annotations

import os

from node_agent.probes.base import (
    THROTTLED_NS,
    THROTTLED_PERIODS,
    ProbeContext,
    ProbeUnavailable,
    Sample,
    register,
)
from node_agent.probes.cgroup_files import (
    CgroupCounters,
    read_flat_keyed,
    v1_hierarchy,
    v2_hierarchy,
)


def read_v2_throttling(directory: str) -> dict[str, int] | None:
    """``throttled_ns``/``throttled_periods`` from a v2 ``cpu.stat`` (µs → ns)."""
    stat = read_flat_keyed(os.path.join(directory, "cpu.stat"))
    if stat is None or "throttled_usec" not in stat:
        return None
    return {
        THROTTLED_NS: stat["throttled_usec"] * 1000,
        THROTTLED_PERIODS: stat.get("nr_throttled", 0),
    }


def read_v1_throttling(directory: str) -> dict[str, int] | None:
    """``throttled_ns``/``throttled_periods`` from a v1 ``cpu.stat`` (already ns)."""
    stat = read_flat_keyed(os.path.join(directory, "cpu.stat"))
    if stat is None or "throttled_time" not in stat:
        return None
    return {THROTTLED_NS: stat["throttled_time"], THROTTLED_PERIODS: stat.get("nr_throttled", 0)}


@register("cpu_throttle")
class CpuThrottleProbe:
    """Per-cgroup CFS throttling deltas, keyed by path in ``Sample.by_cgroup_path``."""

    name = "cpu_throttle"

    def __init__(self, ctx: ProbeContext) -> None:
        self._ctx = ctx
        self._counters: CgroupCounters | None = None

    def start(self) -> None:
        """Pick the hierarchy that has the cpu controller and take the baseline."""
        v2 = v2_hierarchy(self._ctx, "cpu")
        v1 = v1_hierarchy(self._ctx, "cpu")
        if v2 is not None:
            self._counters = CgroupCounters(v2, self._ctx.cgroup_root, read_v2_throttling)
        elif v1 is not None:
            self._counters = CgroupCounters(v1, self._ctx.cgroup_root, read_v1_throttling)
        else:
            raise ProbeUnavailable(
                f"no CFS throttling counters: the cgroup v2 hierarchy at "
                f"{self._ctx.cgroup_v2_mount} lacks the cpu controller and no v1 cpu "
                f"controller is mounted at {os.path.join(self._ctx.cgroup_v1_mount, 'cpu')}; "
                "mount the host's /sys/fs/cgroup into the agent (or pass --cgroup-v2-mount/"
                "--cgroup-v1-mount)"
            )
        self._counters.collect()

    def collect(self) -> Sample:
        """Throttling since the previous call, per throttled cgroup."""
        if self._counters is None:
            return Sample()
        return Sample(by_cgroup_path=self._counters.collect())

    def close(self) -> None:
        """Nothing to release (files are opened and closed per read)."""
        self._counters = None
