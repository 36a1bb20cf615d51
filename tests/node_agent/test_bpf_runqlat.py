"""Kernel tests of the runqlat probe against the kernel's own accounting.

Three busy loops pinned to one CPU in a test cgroup, a napping sibling in another. The
truth is ``/proc/PID/schedstat`` (on-CPU ns, run_delay ns, switch-ins), read over the
same window, with what it is known to get wrong:

- schedstat's run_delay is taken from the run-queue clock, which the kernel does not
  refresh when a wakeup preempted the running task or the idle task
  (``wakeup_preempt()`` → ``rq_clock_skip_update()``): a wait that ends by switching in
  from the idle task reads 0, a wait ended by a preempting wakeup reads short, and the
  missing time shows up as on-CPU time instead. The probe measures those waits with
  ``bpf_ktime_get_ns`` and files the from-idle ones apart (``idle_wakeup_*``: the CPU's
  wake-up latency, not contention). So for the napper the test checks: run-queue wait
  at most schedstat's plus a per-switch-in allowance, at least schedstat's (less what a
  from-idle switch-in may carry); wait + idle wake-up + on-CPU equal to schedstat's
  wait + on-CPU; and every switch-in counted once, as one or the other.
- The busy loops are mostly preempted by the tick (the clock is fresh), so their wait
  must match within ±2 % (less lost switch-ins, below) and their CPU is never idle. Their
  on-CPU time by the probe also holds the hard/soft IRQ and steal time of their CPU that
  fell while a loop was current, which schedstat leaves out: bounded by ``/proc/stat``.
- A few switch-ins never reach any tracing program: schedstat counts 1–3 more switch-ins
  per ~1,300 than a bare ``sched_switch`` counter does (seen with a six-line BCC program,
  windows closed with every task stopped), and more under heavy load; the kernel also
  skips a program's run when the CPU's BPF guard is held (a ``bpf(2)`` map call
  interrupted by the event's IRQ), reported as ``bpf_missed_events``. Each lost
  switch-in loses one wait: the lower bounds widen by one longest-seen wait per switch-in
  schedstat counted and the probe did not — and only by that.
- Windows open and close with every workload stopped (SIGSTOP): a stopped task's last
  wait has been filed and no new one has begun, so no wait straddles an edge.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from interference import hist
from node_agent.probes.base import (
    BPF_MISSED_EVENTS,
    HIST_RUNQ_US,
    IDLE_WAKEUP_COUNT,
    IDLE_WAKEUP_NS,
    ONCPU_NS,
    RUNQ_COUNT,
    RUNQ_NS,
    CollectFailed,
    ProbeContext,
    Sample,
)
from node_agent.probes.bpf.cgroup_probe import CgroupTotals
from node_agent.probes.bpf.loaded_program import LoadedProgram
from node_agent.probes.runqlat import RunqlatProbe
from tests.node_agent.bpf_workloads import (
    BUSY_LOOP,
    NAPPER,
    SchedStat,
    many_started_in,
    require_root,
    schedstat_totals,
    started_in,
    stopped,
    wrapped,
)
from tests.node_agent.own_cgroups import cgroup_tree, kernel_cgroup_id, unique_name

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

V2_MOUNT = ProbeContext().cgroup_v2_mount
WINDOW_S = 5.0
COLLECT_EVERY_S = 0.1
"""Many drains inside the window: counts arriving during a drain must not be lost."""
STALE_CLOCK_ALLOWANCE_NS = 200_000
"""Per switch-in: how much longer than schedstat's a preempting wakeup's wait may read
(schedstat's clock stands still from the wakeup to the switch)."""
EDGE_SWITCH_INS = 1
"""Per task: the SIGCONT wake-up at the window's opening may be filed on either side."""
UNSEEN_SWITCH_INS_MIN = 3
UNSEEN_SWITCH_IN_SHARE = 0.01
"""Switch-ins schedstat may count that no tracing program saw: max(3, 1 %) of them."""


def add_samples(into: dict[int, dict[str, float]], sample: Sample) -> float:
    """Add the per-cgroup counters into ``into``; returns the sample's missed BPF runs."""
    for cgid, metrics in sample.by_cgroup_id.items():
        row = into.setdefault(cgid, {})
        for name, value in metrics.items():
            row[name] = row.get(name, 0.0) + value
    return sample.node.get(BPF_MISSED_EVENTS, 0.0)


PROC_STAT_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def not_task_time_ns() -> dict[int, float]:
    """Per CPU, hard IRQ + soft IRQ + steal time so far (``/proc/stat``), ns.

    schedstat leaves these out of a task's on-CPU time; the probe, timing switch-in to
    switch-out, includes what fell while the task was current.
    """
    times: dict[int, float] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            irq, softirq, steal = (int(fields[i]) for i in (5, 6, 7))
            times[int(name[3:])] = (irq + softirq + steal) * PROC_STAT_TICK_NS
    return times


def add_histograms(into: dict[int, list[int]], sample: Sample) -> None:
    for cgid, by_name in sample.histograms_by_cgroup_id.items():
        into[cgid] = hist.add(into.get(cgid, []), by_name.get(HIST_RUNQ_US, []))


def longest_wait_ns(histogram: list[int]) -> float:
    """Upper bound of the highest non-empty log2 µs slot, ns (0 for an empty histogram)."""
    top = max((slot for slot, count in enumerate(histogram) if count), default=None)
    return 0.0 if top is None else (hist.slot_bounds(top)[1] + 1) * 1000.0


def lost_switch_ins(counted: float, truth: SchedStat, missed: float, tasks: int) -> float:
    """Switch-ins schedstat counted that the probe did not, checked against the bound."""
    lost = max(0.0, truth.timeslices - counted)
    bound = max(UNSEEN_SWITCH_INS_MIN, UNSEEN_SWITCH_IN_SHARE * truth.timeslices) + missed
    # The SIGCONT wake-up at the opening may be filed on either side of the window.
    assert -tasks * EDGE_SWITCH_INS <= truth.timeslices - counted <= bound + tasks * EDGE_SWITCH_INS
    return lost


@pytest.fixture
def probe_and_tree() -> Iterator[tuple[RunqlatProbe, Path]]:
    require_root()
    top = unique_name("intf-test-runqlat")
    with cgroup_tree(V2_MOUNT, top) as tree:
        probe = RunqlatProbe(ProbeContext(cgroup_root=f"/{top}"))
        probe.start()
        try:
            yield probe, tree
        finally:
            probe.close()


def test_run_queue_wait_matches_schedstat_and_idle_sibling_is_zero(
    probe_and_tree: tuple[RunqlatProbe, Path],
) -> None:
    probe, tree = probe_and_tree
    busy_dir, idle_dir = tree / "busy", tree / "idle"
    busy_dir.mkdir()
    idle_dir.mkdir()
    busy_id, idle_id = kernel_cgroup_id(str(busy_dir)), kernel_cgroup_id(str(idle_dir))
    cpus = sorted(os.sched_getaffinity(0))
    busy_cpu, idle_cpu = cpus[-1], cpus[0]

    with (
        many_started_in(3, [busy_dir / "cgroup.procs"], BUSY_LOOP, busy_cpu) as busy,
        started_in([idle_dir / "cgroup.procs"], NAPPER, idle_cpu) as idle,
    ):
        time.sleep(1.0)  # interpreters started, loops spinning
        busy_pids = [proc.pid for proc in busy]
        all_pids = [*busy_pids, idle.pid]
        with stopped(all_pids):  # window opens between two drains, no wait in flight
            probe.collect()  # discard everything before it
            before_busy, before_idle = schedstat_totals(busy_pids), schedstat_totals([idle.pid])
            before_cpu = not_task_time_ns()
        measured: dict[int, dict[str, float]] = {}
        missed = 0.0
        histograms: dict[int, list[int]] = {}
        deadline = time.monotonic() + WINDOW_S
        while time.monotonic() < deadline:
            time.sleep(COLLECT_EVERY_S)
            sample = probe.collect()
            missed += add_samples(measured, sample)
            add_histograms(histograms, sample)
        with stopped(all_pids):  # window closes: every wait schedstat saw has been filed
            after_busy, after_idle = schedstat_totals(busy_pids), schedstat_totals([idle.pid])
            after_cpu = not_task_time_ns()
            last = probe.collect()
        missed += add_samples(measured, last)
        add_histograms(histograms, last)

    busy_truth, idle_truth = after_busy - before_busy, after_idle - before_idle
    busy_row, idle_row = measured[busy_id], measured.get(idle_id, {})
    histogram = histograms.get(busy_id, [])
    # Three loops sharing one CPU each wait about 2/3 of the time.
    assert busy_truth.run_delay_ns > WINDOW_S * 1e9, f"loops did not contend: {busy_truth}"
    # Only the first loop to resume after the opening SIGCONT can find its CPU idle.
    assert busy_row.get(IDLE_WAKEUP_COUNT, 0) <= 1, "a CPU with three runnable loops went idle"
    busy_cpu_other = after_cpu[busy_cpu] - before_cpu[busy_cpu] + 3 * PROC_STAT_TICK_NS
    busy_lost = lost_switch_ins(busy_row[RUNQ_COUNT], busy_truth, missed, tasks=3)
    print(
        f"busy: {busy_row[RUNQ_COUNT]:.0f} switch-ins vs schedstat {busy_truth.timeslices}; "
        f"wait {busy_row[RUNQ_NS] / 1e6:.1f} ms vs {busy_truth.run_delay_ns / 1e6:.1f} ms"
    )
    assert busy_row[RUNQ_NS] <= busy_truth.run_delay_ns * 1.02
    assert busy_row[RUNQ_NS] >= (
        busy_truth.run_delay_ns * 0.98 - busy_lost * longest_wait_ns(histogram)
    )
    # On-CPU by the probe also holds the IRQ and steal time spent while a loop was current.
    assert busy_truth.on_cpu_ns * 0.98 <= busy_row[ONCPU_NS]
    assert busy_row[ONCPU_NS] <= busy_truth.on_cpu_ns * 1.02 + busy_cpu_other

    # The histogram holds exactly the counted waits, each in its log2 µs slot.
    # An idle wake-up is a zero wait (slot 0): one entry per switch-in.
    assert hist.total(histogram) == busy_row[RUNQ_COUNT] + busy_row[IDLE_WAKEUP_COUNT] > 0
    lowest_us = sum(hist.slot_bounds(s)[0] * n for s, n in enumerate(histogram))
    highest_us = sum((hist.slot_bounds(s)[1] + 1) * n for s, n in enumerate(histogram))
    assert lowest_us <= busy_row[RUNQ_NS] / 1000 <= highest_us

    waits = idle_row.get(RUNQ_NS, 0.0)
    idle_wakeups = idle_row.get(IDLE_WAKEUP_NS, 0.0)
    switch_ins = idle_row.get(RUNQ_COUNT, 0) + idle_row.get(IDLE_WAKEUP_COUNT, 0)
    print(
        f"napper: run-queue wait {waits / 1e6:.3f} ms, idle wake-up {idle_wakeups / 1e6:.3f} ms "
        f"over {switch_ins:.0f} switch-ins; schedstat run_delay "
        f"{idle_truth.run_delay_ns / 1e6:.3f} ms over {idle_truth.timeslices}; missed {missed:.0f}"
    )
    assert switch_ins > 0, "the napping sibling woke up but was not seen"
    # One histogram entry per switch-in, idle wake-ups as zero waits in slot 0.
    napper_histogram = histograms.get(idle_id, [])
    assert hist.total(napper_histogram) == switch_ins
    assert napper_histogram[0] >= idle_row.get(IDLE_WAKEUP_COUNT, 0)
    idle_lost = lost_switch_ins(switch_ins, idle_truth, missed, tasks=1)
    # An idle wake-up is at most a few hundred µs; a run-queue wait as long as any seen.
    lost_wait = idle_lost * max(longest_wait_ns(histograms.get(idle_id, [])), 1e6)
    # What the napper waits behind other work on its CPU, never the loops' waits.
    assert waits <= idle_truth.run_delay_ns + switch_ins * STALE_CLOCK_ALLOWANCE_NS + 2e6
    assert waits + idle_wakeups >= idle_truth.run_delay_ns * 0.98 - 2e6 - lost_wait
    # Time is conserved: what schedstat misses as wait it counts as on-CPU.
    assert waits + idle_wakeups + idle_row.get(ONCPU_NS, 0.0) == pytest.approx(
        idle_truth.run_delay_ns + idle_truth.on_cpu_ns,
        rel=0.05,
        abs=2e6 + lost_wait + after_cpu[idle_cpu] - before_cpu[idle_cpu],
    )
    assert set(measured) <= {busy_id, idle_id, kernel_cgroup_id(str(tree))}


def test_workloads_start_inside_their_cgroup_and_pinned() -> None:
    require_root()
    name = unique_name("intf-test-wrapper")
    cpu = sorted(os.sched_getaffinity(0))[-1]
    report = "import os; print(open('/proc/self/cgroup').read(), sorted(os.sched_getaffinity(0)))"
    with cgroup_tree(V2_MOUNT, name) as tree:
        argv = wrapped([tree / "cgroup.procs"], [sys.executable, "-c", report], cpu)
        out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    assert f"0::/{name}\n" in out
    assert out.rstrip().endswith(f"[{cpu}]")


class _DrainFailsOnDemand(RunqlatProbe):
    """The real probe, whose map reads fail once ``failing`` is set (as a bpf(2) call can)."""

    failing = False

    def drain(self, program: LoadedProgram) -> dict[int, CgroupTotals]:
        if self.failing:
            raise OSError(errno.EBADF, "bpf(2) map command 1: Bad file descriptor")
        return super().drain(program)


def test_a_failed_drain_is_an_interval_not_measured_never_a_quiet_one() -> None:
    require_root()
    probe = _DrainFailsOnDemand(ProbeContext())
    probe.start()
    try:
        probe.collect()
        probe.failing = True
        with pytest.raises(CollectFailed, match=r"draining the maps of bpf/runqlat\.bpf\.c"):
            probe.collect()
        probe.failing = False
        assert probe.collect().by_cgroup_id  # the next interval measures again
    finally:
        probe.close()
