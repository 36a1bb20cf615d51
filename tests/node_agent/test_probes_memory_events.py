"""memory_events probe: v2 memory.events(.local) over a fake tree; real v1 limit hits."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from node_agent.probes.base import (
    MEM_HIGH_EVENTS,
    MEM_MAX_EVENTS,
    MEM_OOM_EVENTS,
    ProbeContext,
    ProbeUnavailable,
    registered,
)
from node_agent.probes.memory_events import MemoryEventsProbe
from tests.node_agent.own_cgroups import cgroup_tree, fake_v2_mount, process_in, unique_name

EVENTS = "low 0\nhigh {high}\nmax {max}\noom {oom}\noom_kill {oom}\noom_group_kill 0\n"


def test_registered() -> None:
    assert registered()["memory_events"] is MemoryEventsProbe


def test_v2_prefers_local_events_and_reports_changes(tmp_path: Path) -> None:
    mount = fake_v2_mount(tmp_path, "cpu io memory pids")
    pod = mount / "kubepods/burstable/podA"
    container = pod / "c1"
    container.mkdir(parents=True)
    # the pod's hierarchical file includes the container's events; the local one does not
    (pod / "memory.events").write_text(EVENTS.format(high=10, max=4, oom=1))
    (pod / "memory.events.local").write_text(EVENTS.format(high=0, max=0, oom=0))
    (container / "memory.events.local").write_text(EVENTS.format(high=10, max=4, oom=1))
    # an old kernel without memory.events.local
    legacy = mount / "kubepods/besteffort/podB"
    legacy.mkdir(parents=True)
    (legacy / "memory.events").write_text(EVENTS.format(high=0, max=0, oom=0))
    probe = MemoryEventsProbe(ProbeContext(cgroup_v2_mount=str(mount)))
    probe.start()
    (pod / "memory.events").write_text(EVENTS.format(high=25, max=6, oom=2))
    (container / "memory.events.local").write_text(EVENTS.format(high=25, max=6, oom=2))
    (legacy / "memory.events").write_text(EVENTS.format(high=0, max=3, oom=0))
    sample = probe.collect()
    assert sample.by_cgroup_path == {
        "/kubepods/burstable/podA/c1": {
            MEM_HIGH_EVENTS: 15.0,
            MEM_MAX_EVENTS: 2.0,
            MEM_OOM_EVENTS: 1.0,
        },
        "/kubepods/besteffort/podB": {MEM_MAX_EVENTS: 3.0},
    }


def test_unavailable_without_memory_controller(tmp_path: Path) -> None:
    ctx = ProbeContext(cgroup_v2_mount=str(tmp_path / "x"), cgroup_v1_mount=str(tmp_path / "y"))
    with pytest.raises(ProbeUnavailable, match="memory controller"):
        MemoryEventsProbe(ctx).start()


V1_MEMORY = "/sys/fs/cgroup/memory"


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(f"{V1_MEMORY}/tasks"),
    reason="needs root and the v1 memory controller at /sys/fs/cgroup/memory",
)
def test_real_v1_limit_hits(tmp_path: Path) -> None:
    """Writing 96 MiB of page cache under a 16 MiB limit hits the limit; a sibling does not."""
    top = unique_name()
    target = tmp_path / "filler"
    with cgroup_tree(V1_MEMORY, f"{top}/hog") as hog:
        (hog.parent / "quiet").mkdir()
        (hog / "memory.limit_in_bytes").write_text(str(16 << 20))
        probe = MemoryEventsProbe(
            ProbeContext(cgroup_root=f"/{top}", cgroup_v2_mount="/nonexistent")
        )
        probe.start()
        with process_in(
            [hog / "cgroup.procs"], f"exec dd if=/dev/zero of={target} bs=1M count=96 status=none"
        ) as proc:
            assert proc.wait(timeout=120) == 0
        failcnt = int((hog / "memory.failcnt").read_text())
        sample = probe.collect()
        probe.close()
        time.sleep(0.1)
        target.unlink()
    row = sample.by_cgroup_path[f"/{top}/hog"]
    assert row[MEM_MAX_EVENTS] == failcnt > 0  # the cgroup was new: every hit is in the delta
    assert MEM_OOM_EVENTS not in row  # page cache is reclaimable: no OOM kill
    assert f"/{top}/quiet" not in sample.by_cgroup_path
