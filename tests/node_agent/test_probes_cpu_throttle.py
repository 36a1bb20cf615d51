"""cpu_throttle probe: v2/v1 cpu.stat parsing over a fake tree, and real v1 CFS throttling."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from node_agent.probes.base import (
    THROTTLED_NS,
    THROTTLED_PERIODS,
    ProbeContext,
    ProbeUnavailable,
    registered,
)
from node_agent.probes.cgroup_files import CgroupCounters, Hierarchy
from node_agent.probes.cpu_throttle import CpuThrottleProbe, read_v2_throttling
from tests.node_agent.own_cgroups import cgroup_tree, fake_v2_mount, process_in, unique_name

V2_STAT = (
    "usage_usec {u}\nuser_usec 1\nsystem_usec 1\n"
    "nr_periods 9\nnr_throttled {n}\nthrottled_usec {t}\n"
)


def fake_v2(tmp_path: Path) -> Path:
    return fake_v2_mount(tmp_path, "cpuset cpu io memory pids")


def test_registered() -> None:
    assert registered()["cpu_throttle"] is CpuThrottleProbe


def test_v2_deltas_per_cgroup_only_when_throttled(tmp_path: Path) -> None:
    mount = fake_v2(tmp_path)
    pod = mount / "demo/kubepods/burstable/podA"
    quiet = mount / "demo/kubepods/besteffort/podB"
    outside = mount / "elsewhere"
    for d in (pod, quiet, outside):
        d.mkdir(parents=True)
        (d / "cpu.stat").write_text(V2_STAT.format(u=5, n=2, t=1500))
    (mount / "demo/kubepods/cpu.stat").write_text("usage_usec 5\n")  # root-like: no quota
    probe = CpuThrottleProbe(ProbeContext(cgroup_root="/demo", cgroup_v2_mount=str(mount)))
    probe.start()
    (pod / "cpu.stat").write_text(V2_STAT.format(u=9, n=5, t=4000))
    (outside / "cpu.stat").write_text(V2_STAT.format(u=9, n=50, t=90000))
    sample = probe.collect()
    assert sample.by_cgroup_path == {
        "/demo/kubepods/burstable/podA": {THROTTLED_NS: 2_500_000.0, THROTTLED_PERIODS: 3.0}
    }
    assert probe.collect().by_cgroup_path == {}  # nothing new since


def test_recreated_cgroup_counts_from_zero(tmp_path: Path) -> None:
    mount = fake_v2(tmp_path)
    pod = mount / "podA"
    pod.mkdir()
    (pod / "cpu.stat").write_text(V2_STAT.format(u=5, n=10, t=10000))
    probe = CpuThrottleProbe(ProbeContext(cgroup_v2_mount=str(mount)))
    probe.start()
    (pod / "cpu.stat").write_text(V2_STAT.format(u=1, n=1, t=300))  # counters went back
    assert probe.collect().by_cgroup_path["/podA"] == {
        THROTTLED_NS: 300_000.0,
        THROTTLED_PERIODS: 1.0,
    }


def test_cgroup_vanishing_mid_walk_is_skipped(tmp_path: Path) -> None:
    mount = fake_v2(tmp_path)
    for name in ("a", "b"):
        (mount / name).mkdir()
        (mount / name / "cpu.stat").write_text(V2_STAT.format(u=1, n=1, t=1))

    def read_and_remove_b(directory: str) -> dict[str, int] | None:
        b = mount / "b"
        if b.exists():  # the first read removes "b" before the walk reaches it
            (b / "cpu.stat").unlink()
            b.rmdir()
        return read_v2_throttling(directory)

    counters = CgroupCounters(Hierarchy(str(mount), 2), "/", read_and_remove_b)
    assert counters.collect() == {}  # baseline; "/b" vanished during it without an error
    (mount / "a" / "cpu.stat").write_text(V2_STAT.format(u=1, n=2, t=3))
    assert counters.collect() == {"/a": {THROTTLED_NS: 2000.0, THROTTLED_PERIODS: 1.0}}


def test_unavailable_without_cpu_controller(tmp_path: Path) -> None:
    mount = fake_v2_mount(tmp_path, "hugetlb")
    ctx = ProbeContext(cgroup_v2_mount=str(mount), cgroup_v1_mount=str(tmp_path / "none"))
    with pytest.raises(ProbeUnavailable, match="cpu controller"):
        CpuThrottleProbe(ctx).start()


V1_CPU = "/sys/fs/cgroup/cpu"


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(f"{V1_CPU}/tasks"),
    reason="needs root and the v1 cpu controller at /sys/fs/cgroup/cpu",
)
def test_real_v1_quota_throttling() -> None:
    """A busy loop under a 10 % CFS quota is throttled; its idle sibling is not."""
    top = unique_name()
    with cgroup_tree(V1_CPU, f"{top}/busy") as busy:
        (busy.parent / "idle").mkdir()
        (busy / "cpu.cfs_period_us").write_text("100000")
        (busy / "cpu.cfs_quota_us").write_text("10000")
        ctx = ProbeContext(cgroup_root=f"/{top}", cgroup_v2_mount="/nonexistent")
        probe = CpuThrottleProbe(ctx)
        probe.start()
        started = time.monotonic()
        with process_in([busy / "cgroup.procs"], "while :; do :; done"):
            time.sleep(2.0)
            sample = probe.collect()
        elapsed_ns = (time.monotonic() - started) * 1e9
        probe.close()
    row = sample.by_cgroup_path[f"/{top}/busy"]
    # ~20 periods of 100 ms in 2 s, each throttled for up to 90 ms once its 10 ms are used.
    assert row[THROTTLED_PERIODS] >= 3
    assert 0.2 * elapsed_ns <= row[THROTTLED_NS] <= 1.05 * elapsed_ns
    assert f"/{top}/idle" not in sample.by_cgroup_path
