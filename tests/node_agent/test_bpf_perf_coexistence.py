"""Kernel test: the agent's tracepoint programs leave other perf users' samples intact.

A perf-attached tracepoint program that returns 0 makes the kernel drop that event for
every perf user of the tracepoint, so SREs' ``perf stat`` / ``perf sched record`` would
see nothing on a node running the agent. With the runqlat and reclaim programs attached,
``perf stat -e sched:sched_switch`` must still count every switch of a napper that
switches ``NAPS_PER_S`` times a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from node_agent.probes.base import ProbeContext
from node_agent.probes.reclaim import ReclaimProbe
from node_agent.probes.runqlat import RunqlatProbe
from tests.node_agent.bpf_workloads import started_in

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

NAPS_PER_S = 200
NAPPER = [sys.executable, "-c", f"import time\nwhile True: time.sleep({1 / NAPS_PER_S})"]
PERF_WINDOW_S = 2.0


def perf_switch_count(seconds: float) -> int:
    """``sched:sched_switch`` events on all CPUs over ``seconds``, as ``perf stat`` counts."""
    out = subprocess.run(
        ["perf", "stat", "-e", "sched:sched_switch", "-a", "-x,", "--", "sleep", str(seconds)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stderr
    line = next(line for line in out.splitlines() if "sched:sched_switch" in line)
    return int(line.split(",", 1)[0])


@pytest.fixture
def agent_programs() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("needs root to load BPF programs")
    if shutil.which("perf") is None:
        pytest.skip("perf is not installed (make setup installs linux-perf)")
    probes = [RunqlatProbe(ProbeContext()), ReclaimProbe(ProbeContext())]
    try:
        for probe in probes:
            probe.start()
        yield
    finally:
        for probe in probes:
            probe.close()


def test_perf_stat_still_counts_sched_switch_while_the_agent_runs(agent_programs: None) -> None:
    with started_in([], NAPPER):
        counted = perf_switch_count(PERF_WINDOW_S)
    # The napper alone switches out and back in NAPS_PER_S times a second.
    assert counted >= NAPS_PER_S * PERF_WINDOW_S, (
        f"perf counted {counted} sched_switch events in {PERF_WINDOW_S} s with the agent's "
        f"programs attached: they are dropping other perf users' samples"
    )
