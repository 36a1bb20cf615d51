"""Per-cgroup run-queue delay and on-CPU time from ``bpf/runqlat.bpf.c``.

A task's wait is measured from the moment it becomes runnable (wakeup, new task, or
switched out while still runnable) to its switch-in, and charged to the task's own
cgroup at its next switch-out (docs/design.md, "Signals"). A wait that ends by switching
in from the idle task is the CPU waking up, not contention: it is counted apart as
``idle_wakeup_*`` and published, never part of the index. Each interval yields per
cgroup v2 id: ``runq_count``, ``runq_ns``, ``idle_wakeup_count``, ``idle_wakeup_ns``,
``oncpu_ns`` and the ``runq_us`` log2 histogram, and ``bpf_missed_events`` and
``bpf_lost_entries`` for the node.

Culprits: each run-queue wait is also split over the cgroups whose tasks held the CPU
during it (the CPU's recent on-CPU stints; what they do not cover goes to the task that
ran last before the waiter's switch-in), in ``Sample.waits_by_culprit`` keyed by waiting
and culprit cgroup ids, for waiting cgroups in scope; a cgroup's pairs sum to its
``runq_ns`` and ``runq_count``.

The histogram has one entry per switch-in: a wake-up onto an idle CPU waited behind no
other task, so it is entered as a zero wait (slot 0). A percentile of ``runq_us`` is then
"of all wake-ups, the wait behind other tasks" — a quiet node whose few waits behind a
kworker are its only samples would otherwise report their maximum as its p99.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from node_agent.probes.base import (
    CULPRIT_WAIT_COUNT,
    CULPRIT_WAIT_NS,
    HIST_RUNQ_US,
    IDLE_WAKEUP_COUNT,
    IDLE_WAKEUP_NS,
    ONCPU_NS,
    RUNQ_COUNT,
    RUNQ_NS,
    ProbeContext,
    ProbeUnavailable,
    Sample,
    register,
)
from node_agent.probes.bpf.cgroup_probe import BpfCgroupProbe, CgroupTotals
from node_agent.probes.bpf.loaded_program import LoadedProgram
from node_agent.probes.bpf.prerequisites import HostPaths

CULPRITS_TABLE = "culprits"
"""The program's (waiting cgroup, culprit cgroup, generation) → waits map."""


@register("runqlat")
class RunqlatProbe(BpfCgroupProbe):
    """Run-queue delay per cgroup: count, sum ns, log2 µs histogram; on-CPU ns."""

    name = "runqlat"
    tracepoints = ("sched:sched_switch", "sched:sched_wakeup", "sched:sched_wakeup_new")
    counters: ClassVar[Mapping[str, str]] = {
        "runq_count": RUNQ_COUNT,
        "runq_ns": RUNQ_NS,
        "idle_wakeup_count": IDLE_WAKEUP_COUNT,
        "idle_wakeup_ns": IDLE_WAKEUP_NS,
        "oncpu_ns": ONCPU_NS,
    }
    histograms: ClassVar[Mapping[str, str]] = {"runq_us_slots": HIST_RUNQ_US}

    def __init__(
        self, ctx: ProbeContext, paths: HostPaths | None = None, cflags: Sequence[str] = ()
    ) -> None:
        super().__init__(ctx, paths, cflags)
        self._culprit_waits: dict[tuple[int, ...], dict[str, int]] = {}

    def start(self) -> None:
        super().start()
        assert self._program is not None
        if CULPRITS_TABLE not in self._program.tables:
            self.close()
            raise ProbeUnavailable(
                f"bpf/{self.name}.bpf.c has no {CULPRITS_TABLE} map: ship the bpf/ directory "
                "of the same release"
            )

    def collect(self) -> Sample:
        sample = super().collect()
        in_scope = set(sample.by_cgroup_id)
        for (waiting, culprit), wait in self._culprit_waits.items():
            if waiting in in_scope:
                sample.waits_by_culprit[(waiting, culprit)] = {
                    CULPRIT_WAIT_COUNT: float(wait.get("wait_count", 0)),
                    CULPRIT_WAIT_NS: float(wait.get("wait_ns", 0)),
                }
        return sample

    def drain(self, program: LoadedProgram) -> dict[int, CgroupTotals]:
        totals = super().drain(program)
        # The generation moved on and the grace period passed in super().drain().
        if CULPRITS_TABLE in program.tables:
            self._culprit_waits = program.drain_table(CULPRITS_TABLE, self._generation)
        for cgroup in totals.values():
            idle_wakeups = cgroup.counters.get("idle_wakeup_count", 0)
            if idle_wakeups:
                slots = cgroup.slots.setdefault("runq_us_slots", [0])
                slots[0] += idle_wakeups
        return totals
