"""Per-cgroup memory reclaim stalls from ``bpf/reclaim.bpf.c``.

memcg reclaim (a cgroup at its limit or high mark) and direct reclaim (the node short
of memory) are timed begin → end in the reclaiming task, which is current, and charged
to its cgroup; ``mm_vmscan_throttled`` is counted. Each interval yields per cgroup v2
id: ``reclaim_count``, ``reclaim_ns``, ``vmscan_throttled`` and the ``reclaim_us``
log2 histogram.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from node_agent.probes.base import (
    HIST_RECLAIM_US,
    RECLAIM_COUNT,
    RECLAIM_NS,
    VMSCAN_THROTTLED,
    register,
)
from node_agent.probes.bpf.cgroup_probe import BpfCgroupProbe


@register("reclaim")
class ReclaimProbe(BpfCgroupProbe):
    """Reclaim stalls per cgroup: count, stall ns, log2 µs histogram; throttle events."""

    name = "reclaim"
    tracepoints = (
        "vmscan:mm_vmscan_memcg_reclaim_begin",
        "vmscan:mm_vmscan_memcg_reclaim_end",
        "vmscan:mm_vmscan_direct_reclaim_begin",
        "vmscan:mm_vmscan_direct_reclaim_end",
        "vmscan:mm_vmscan_throttled",
    )
    counters: ClassVar[Mapping[str, str]] = {
        "reclaim_count": RECLAIM_COUNT,
        "reclaim_ns": RECLAIM_NS,
        "vmscan_throttled": VMSCAN_THROTTLED,
    }
    histograms: ClassVar[Mapping[str, str]] = {"reclaim_us_slots": HIST_RECLAIM_US}
