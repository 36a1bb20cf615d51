"""Per-cgroup run-queue delay and on-CPU time from ``bpf/runqlat.bpf.c``.

A task's wait is measured from the moment it becomes runnable (wakeup, new task, or
switched out while still runnable) to its switch-in, and charged to the task's own
cgroup at its next switch-out (DESIGN §3). Each interval yields per cgroup v2 id:
``runq_count``, ``runq_ns``, ``oncpu_ns`` and the ``runq_us`` log2 histogram.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from node_agent.probes.base import (
    HIST_RUNQ_US,
    ONCPU_NS,
    RUNQ_COUNT,
    RUNQ_NS,
    register,
)
from node_agent.probes.bpf_loader import BpfCgroupProbe


@register("runqlat")
class RunqlatProbe(BpfCgroupProbe):
    """Run-queue delay per cgroup: count, sum ns, log2 µs histogram; on-CPU ns."""

    name = "runqlat"
    tracepoints = ("sched:sched_switch", "sched:sched_wakeup", "sched:sched_wakeup_new")
    counters: ClassVar[Mapping[str, str]] = {
        "runq_count": RUNQ_COUNT,
        "runq_ns": RUNQ_NS,
        "oncpu_ns": ONCPU_NS,
    }
    histograms: ClassVar[Mapping[str, str]] = {"runq_us_slots": HIST_RUNQ_US}
