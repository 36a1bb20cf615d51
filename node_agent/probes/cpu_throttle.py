"""CFS-quota throttling per cgroup, from ``cpu.stat`` (cgroup v2 or the v1 ``cpu`` controller).

v2: ``throttled_usec`` and ``nr_throttled``; v1: ``throttled_time`` (ns) and
``nr_throttled``. Each cgroup's own counters (a pod's cgroup and its containers' cgroups
each have their own quota and are throttled separately). Reported per cgroup path as
``throttled_ns`` and ``throttled_periods`` increases; cgroups that were not throttled in
the interval are left out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import ClassVar

from node_agent.probes.base import THROTTLED_NS, THROTTLED_PERIODS, register
from node_agent.probes.cgroup_files import CgroupCounterProbe, CounterReader, read_flat_keyed


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
class CpuThrottleProbe(CgroupCounterProbe):
    """Per-cgroup CFS throttling deltas, keyed by path in ``Sample.by_cgroup_path``."""

    name = "cpu_throttle"
    controller = "cpu"
    counters_description = "CFS throttling counters"
    readers: ClassVar[Mapping[int, CounterReader]] = {
        2: read_v2_throttling,
        1: read_v1_throttling,
    }
