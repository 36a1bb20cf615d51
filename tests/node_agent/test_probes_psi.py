"""psi probe: pressure-file parsing, real CPU pressure from pinned busy loops, and the
kernel's own memory avg10 of a cgroup stalled on memory, into the scheduling record."""

from __future__ import annotations

import os
import shutil
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from interference import sched_record
from interference.signals import NodeReport
from node_agent.aggregate import Owners, aggregate
from node_agent.probes.base import (
    PSI_CPU_SOME_US,
    PSI_IO_SOME_US,
    PSI_MEM_FULL_US,
    PSI_MEM_SOME_AVG10,
    PSI_MEM_SOME_US,
    ProbeContext,
    ProbeUnavailable,
    registered,
)
from node_agent.probes.cgroup_files import (
    Hierarchy,
    read_pressure_average,
    read_pressure_totals,
)
from node_agent.probes.psi import PsiProbe, memory_pressure_file
from tests.node_agent.bpf_workloads import require_root
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


@pytest.mark.parametrize(
    ("text", "kind", "span", "expected"),
    [
        (PRESSURE.format(some=12, full=3), "some", "avg10", 1.0),
        (PRESSURE.format(some=12, full=3), "some", "avg60", 0.5),
        (PRESSURE.format(some=12, full=3), "full", "avg10", 0.0),
        ("some avg10=12.34 avg60=0.00 avg300=0.00 total=9\n", "some", "avg10", 12.34),
        ("some avg10=x avg60=0.00 avg300=0.00 total=9\n", "some", "avg10", None),
        ("some avg60=0.00 total=9\n", "some", "avg10", None),
        ("garbage\n", "some", "avg10", None),
    ],
)
def test_read_pressure_average(
    tmp_path: Path, text: str, kind: str, span: str, expected: float | None
) -> None:
    (tmp_path / "memory").write_text(text)
    assert read_pressure_average(str(tmp_path / "memory"), kind, span) == expected


def test_missing_pressure_file_has_no_average(tmp_path: Path) -> None:
    assert read_pressure_average(str(tmp_path / "memory")) is None


@pytest.mark.parametrize(
    ("root", "v2", "expected"),
    [
        ("/", Hierarchy("/v2", 2), "/proc/pressure/memory"),
        ("/", None, "/proc/pressure/memory"),
        ("/kubepods", Hierarchy("/v2", 2), "/v2/kubepods/memory.pressure"),
        ("/kubepods/", Hierarchy("/v2/", 2), "/v2/kubepods/memory.pressure"),
        ("/kubepods", None, None),  # no v2: no file covers just that subtree
    ],
)
def test_memory_pressure_file_is_the_watched_roots(
    root: str, v2: Hierarchy | None, expected: str | None
) -> None:
    ctx = ProbeContext(cgroup_root=root, proc_root="/proc")
    assert memory_pressure_file(ctx, v2) == expected


def test_the_roots_avg10_is_read_each_interval(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_pressure(proc / "pressure", "", cpu=0, mem=0, mem_full=0)
    mount = fake_v2_mount(tmp_path, "")
    root = mount / "kubepods"
    write_pressure(root, ".pressure", cpu=0, mem=0, mem_full=0)
    context = ProbeContext(cgroup_root="/kubepods", cgroup_v2_mount=str(mount), proc_root=str(proc))
    probe = PsiProbe(context)
    probe.start()
    (root / "memory.pressure").write_text(
        "some avg10=7.25 avg60=1.00 avg300=0.10 total=500\n"
        "full avg10=2.00 avg60=0.00 avg300=0.00 total=100\n"
    )
    assert probe.collect().node[PSI_MEM_SOME_AVG10] == 7.25


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


V1_MEMORY_MOUNT = "/sys/fs/cgroup/memory"
MEMORY_LIMIT_BYTES = 64 << 20
AVG10_DEADLINE_S = 30.0


@pytest.mark.slow
def test_real_memory_pressure_reaches_the_scheduling_record() -> None:
    """A cgroup reclaiming against its limit: the kernel's avg10 of its memory pressure,
    read by the probe for the watched root, is non-zero and is what the record carries.

    The hog (stress-ng, 256 MiB in a v1 memory cgroup limited to 64 MiB, as the reclaim
    probe's kernel test) stalls in reclaim; PSI charges those stalls to its v2 cgroup. The
    kernel refreshes avg10 every 2 s, so the probe is polled until it moves."""
    require_root()
    if not Path(V1_MEMORY_MOUNT, "memory.limit_in_bytes").exists():
        pytest.skip(f"no cgroup v1 memory controller at {V1_MEMORY_MOUNT}")
    if not Path(V2_MOUNT, "memory.pressure").exists():
        pytest.skip(f"no PSI in the cgroup v2 hierarchy at {V2_MOUNT}")
    if shutil.which("stress-ng") is None:
        pytest.fail("stress-ng is not installed; run `make setup`")
    name = unique_name("intf-test-psi")
    hog = "exec stress-ng --vm 1 --vm-bytes 256M --timeout 50s"
    with ExitStack() as stack:
        v2 = stack.enter_context(cgroup_tree(V2_MOUNT, f"{name}/hog"))
        v1 = stack.enter_context(cgroup_tree(V1_MEMORY_MOUNT, f"{name}/hog"))
        (v1 / "memory.limit_in_bytes").write_text(str(MEMORY_LIMIT_BYTES))
        probe = PsiProbe(ProbeContext(cgroup_root=f"/{name}", cgroup_v2_mount=V2_MOUNT))
        probe.start()
        stack.callback(probe.close)
        # process_in kills every member (stress-ng's workers too) before the rmdirs
        stack.enter_context(process_in([v2 / "cgroup.procs", v1 / "cgroup.procs"], hog))
        deadline = time.monotonic() + AVG10_DEADLINE_S
        sample = probe.collect()
        while sample.node.get(PSI_MEM_SOME_AVG10, 0.0) <= 0 and time.monotonic() < deadline:
            time.sleep(0.5)
            sample = probe.collect()
    avg10 = sample.node.get(PSI_MEM_SOME_AVG10, 0.0)
    assert 0 < avg10 <= 100, f"no memory pressure seen in {AVG10_DEADLINE_S:g} s"
    metrics = aggregate({"psi": sample}, Owners(), 1.0, 1, cgroup_root=f"/{name}").metrics
    report = NodeReport("n", ts=time.time(), interval_s=1.0, metrics=metrics, measured=("psi",))
    assert sched_record.decode(sched_record.encode(report))["psi_mem_some_avg10"] == avg10
