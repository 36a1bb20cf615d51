"""psi probe: pressure-file parsing, and real CPU pressure from pinned busy loops."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from node_agent.probes.base import (
    PSI_CPU_SOME_US,
    PSI_IO_SOME_US,
    PSI_MEM_FULL_US,
    PSI_MEM_SOME_US,
    ProbeContext,
    ProbeUnavailable,
    registered,
)
from node_agent.probes.cgroup_files import read_pressure_totals
from node_agent.probes.psi import PsiProbe
from tests.node_agent.own_cgroups import cgroup_tree, fake_v2_mount, process_in, unique_name

PRESSURE = (
    "some avg10=1.00 avg60=0.50 avg300=0.10 total={some}\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total={full}\n"
)


def write_pressure(directory: Path, suffix: str, cpu: int, mem: int, mem_full: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"cpu{suffix}").write_text(PRESSURE.format(some=cpu, full=0))
    (directory / f"memory{suffix}").write_text(PRESSURE.format(some=mem, full=mem_full))
    (directory / f"io{suffix}").write_text(PRESSURE.format(some=7, full=0))


def test_registered() -> None:
    assert registered()["psi"] is PsiProbe


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PRESSURE.format(some=12, full=3), {"some": 12, "full": 3}),
        # node-level cpu before 5.13 has no "full" line
        ("some avg10=0.00 avg60=0.00 avg300=0.00 total=99\n", {"some": 99}),
        ("garbage\n", {}),
    ],
)
def test_read_pressure_totals(tmp_path: Path, text: str, expected: dict[str, int]) -> None:
    (tmp_path / "cpu").write_text(text)
    assert read_pressure_totals(str(tmp_path / "cpu")) == expected


def test_node_and_cgroup_deltas(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_pressure(proc / "pressure", "", cpu=1000, mem=500, mem_full=100)
    mount = fake_v2_mount(tmp_path, "")
    write_pressure(mount / "demo/podA", ".pressure", cpu=10, mem=0, mem_full=0)
    probe = PsiProbe(
        ProbeContext(cgroup_root="/demo", cgroup_v2_mount=str(mount), proc_root=str(proc))
    )
    probe.start()
    write_pressure(proc / "pressure", "", cpu=1600, mem=800, mem_full=150)
    write_pressure(mount / "demo/podA", ".pressure", cpu=40, mem=5, mem_full=0)
    sample = probe.collect()
    assert sample.node == {
        PSI_CPU_SOME_US: 600.0,
        PSI_MEM_SOME_US: 300.0,
        PSI_MEM_FULL_US: 50.0,
        PSI_IO_SOME_US: 0.0,
    }
    assert sample.by_cgroup_path == {"/demo/podA": {PSI_CPU_SOME_US: 30.0, PSI_MEM_SOME_US: 5.0}}


def test_unavailable_without_psi(tmp_path: Path) -> None:
    with pytest.raises(ProbeUnavailable, match="psi=1"):
        PsiProbe(ProbeContext(proc_root=str(tmp_path))).start()


V2_MOUNT = "/sys/fs/cgroup/unified"


@pytest.mark.skipif(
    os.geteuid() != 0
    or not os.path.exists(f"{V2_MOUNT}/cpu.pressure")
    or not os.path.exists("/proc/pressure/cpu"),
    reason="needs root, PSI and cgroup v2 at /sys/fs/cgroup/unified",
)
def test_real_cpu_pressure_of_pinned_busy_loops() -> None:
    """Three busy loops on one CPU: some task of the cgroup waits nearly all the time."""
    top = unique_name()
    with cgroup_tree(V2_MOUNT, f"{top}/busy") as busy:
        (busy.parent / "idle").mkdir()
        probe = PsiProbe(ProbeContext(cgroup_root=f"/{top}", cgroup_v2_mount=V2_MOUNT))
        probe.start()
        started = time.monotonic()
        loops = "taskset -c 0 sh -c 'while :; do :; done' & " * 3 + "wait"
        with process_in([busy / "cgroup.procs"], loops):
            time.sleep(2.0)
            sample = probe.collect()
        elapsed_us = (time.monotonic() - started) * 1e6
        probe.close()
    cgroup_some = sample.by_cgroup_path[f"/{top}/busy"][PSI_CPU_SOME_US]
    assert 0.5 * elapsed_us <= cgroup_some <= 1.05 * elapsed_us
    assert f"/{top}/idle" not in sample.by_cgroup_path
    assert 0 < sample.node[PSI_CPU_SOME_US] <= 1.05 * elapsed_us
