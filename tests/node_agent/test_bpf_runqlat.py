"""Kernel test of the runqlat probe against the kernel's own accounting (acceptance 2).

Three busy loops pinned to one CPU in a test cgroup: the probe's run-queue wait for that
cgroup must be within ±2 % of the sum of ``/proc/PID/schedstat`` run_delay deltas over
the same window, its on-CPU time within ±2 % of the on-CPU deltas, and an idle sibling
cgroup must show (near) zero wait.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from interference import hist
from node_agent.probes.base import (
    HIST_RUNQ_US,
    ONCPU_NS,
    RUNQ_COUNT,
    RUNQ_NS,
    ProbeContext,
    Sample,
)
from node_agent.probes.runqlat import RunqlatProbe
from tests.node_agent.bpf_workloads import (
    BUSY_LOOP,
    NAPPER,
    many_started_in,
    schedstat_totals,
    started_in,
    wrapped,
)
from tests.node_agent.own_cgroups import cgroup_tree, kernel_cgroup_id, unique_name

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

V2_MOUNT = ProbeContext().cgroup_v2_mount
WINDOW_S = 5.0
COLLECT_EVERY_S = 0.1
"""Many drains inside the window: counts arriving during a drain must not be lost."""


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to load BPF programs and create cgroups")


def add_samples(into: dict[int, dict[str, float]], sample: Sample) -> None:
    for cgid, metrics in sample.by_cgroup_id.items():
        row = into.setdefault(cgid, {})
        for name, value in metrics.items():
            row[name] = row.get(name, 0.0) + value


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
        probe.collect()  # window opens: discard everything before it
        before_busy, before_idle = schedstat_totals(busy_pids), schedstat_totals([idle.pid])
        measured: dict[int, dict[str, float]] = {}
        histogram: list[int] = []
        deadline = time.monotonic() + WINDOW_S
        while time.monotonic() < deadline:
            time.sleep(COLLECT_EVERY_S)
            sample = probe.collect()
            add_samples(measured, sample)
            histogram = hist.add(
                histogram, sample.histograms_by_cgroup_id.get(busy_id, {}).get(HIST_RUNQ_US, [])
            )
        after_busy, after_idle = schedstat_totals(busy_pids), schedstat_totals([idle.pid])
        last = probe.collect()  # window closes
        add_samples(measured, last)
        histogram = hist.add(
            histogram, last.histograms_by_cgroup_id.get(busy_id, {}).get(HIST_RUNQ_US, [])
        )

    truth_wait = after_busy.run_delay_ns - before_busy.run_delay_ns
    truth_oncpu = after_busy.on_cpu_ns - before_busy.on_cpu_ns
    busy_row = measured[busy_id]
    # Three loops sharing one CPU each wait about 2/3 of the time.
    assert truth_wait > WINDOW_S * 1e9, f"loops did not contend: run_delay {truth_wait} ns"
    assert busy_row[RUNQ_NS] == pytest.approx(truth_wait, rel=0.02)
    assert busy_row[ONCPU_NS] == pytest.approx(truth_oncpu, rel=0.02)

    # The histogram holds exactly the counted waits, each in its log2 µs slot.
    assert hist.total(histogram) == busy_row[RUNQ_COUNT] > 0
    lowest_us = sum(hist.slot_bounds(s)[0] * n for s, n in enumerate(histogram))
    highest_us = sum((hist.slot_bounds(s)[1] + 1) * n for s, n in enumerate(histogram))
    assert lowest_us <= busy_row[RUNQ_NS] / 1000 <= highest_us

    idle_row = measured.get(idle_id, {})
    idle_truth = after_idle.run_delay_ns - before_idle.run_delay_ns
    assert idle_row.get(RUNQ_COUNT, 0) > 0, "the napping sibling woke up but was not seen"
    # Near zero: what the napper waits behind other work on its CPU, never the loops' waits.
    assert idle_row.get(RUNQ_NS, 0.0) < 0.05 * busy_row[RUNQ_NS]
    assert idle_row.get(RUNQ_NS, 0.0) == pytest.approx(idle_truth, rel=0.2, abs=2e6)
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
