"""taskstats probe: real per-task CPU delay against /proc/PID/schedstat run_delay."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node_agent.probes.base import CPU_DELAY_NS, ProbeContext, registered
from node_agent.probes.taskstats import (
    _FREEPAGES_DELAY_OFFSET,
    TaskstatsProbe,
    delays_from_stats,
)
from tests.node_agent.own_cgroups import (
    cgroup_tree,
    process_in,
    schedstat_run_delay_ns,
    unique_name,
)

V2_MOUNT = "/sys/fs/cgroup/unified"
needs_root_v2 = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(f"{V2_MOUNT}/cgroup.threads"),
    reason="needs root (taskstats needs CAP_NET_ADMIN) and cgroup v2 at /sys/fs/cgroup/unified",
)


def test_registered() -> None:
    assert registered()["taskstats"] is TaskstatsProbe


@needs_root_v2
def test_raw_offsets_match_pyroute2_decoding() -> None:
    """The hand-computed struct offsets agree with the fields pyroute2 decodes itself."""
    from pyroute2 import TaskStats

    with TaskStats() as socket:
        socket.bind()
        (reply,) = socket.get_pid_stat(os.getpid())
    stats = reply.get_attr("TASKSTATS_TYPE_AGGR_PID").get_attr("TASKSTATS_TYPE_STATS")
    payload = stats.data[stats.offset + 4 : stats.offset + stats.length]
    if stats["version"] != 15:
        # cpu_scaled_run_real_total is the u64 just before freepages_count
        scaled = struct.unpack_from("=Q", payload, _FREEPAGES_DELAY_OFFSET - 16)[0]
        assert scaled == stats["cpu_scaled_run_real_total"]
    delays = delays_from_stats(stats)
    assert delays[CPU_DELAY_NS] == stats["cpu_delay_total"] > 0


@needs_root_v2
def test_real_cpu_delay_matches_schedstat() -> None:
    """Three busy loops pinned to one CPU: per-task delay deltas equal run_delay deltas."""
    top = unique_name()
    with cgroup_tree(V2_MOUNT, f"{top}/busy") as busy:
        (busy.parent / "idle").mkdir()
        loops = "taskset -c 0 sh -c 'while :; do :; done' & " * 3 + "wait"
        with process_in([busy / "cgroup.procs"], loops):
            loop_pids = wait_for_loops(busy, count=3)
            probe = TaskstatsProbe(ProbeContext(cgroup_root=f"/{top}", cgroup_v2_mount=V2_MOUNT))
            # Both read the same cumulative counter, the probe inside the schedstat reads, so
            # it can only see less: at most, per task, the wall time between the reads plus
            # one wait that ended in that window (run_delay grows when a wait ends).
            t0 = time.monotonic_ns()
            before = {pid: schedstat_run_delay_ns(pid) for pid in loop_pids}
            probe.start()
            skew_ns = time.monotonic_ns() - t0
            time.sleep(2.0)
            t1 = time.monotonic_ns()
            sample = probe.collect()
            after = {pid: schedstat_run_delay_ns(pid) for pid in loop_pids}
            skew_ns += time.monotonic_ns() - t1
            probe.close()
    expected = sum(after[pid] - before[pid] for pid in loop_pids)
    measured = sum(sample.by_pid[pid][CPU_DELAY_NS] for pid in loop_pids)
    assert expected > 0.5e9  # three loops sharing one CPU wait most of the time
    one_wait_ns = 100e6  # generous: CFS slices here are a few ms, even on a noisy host
    assert 0 <= expected - measured <= len(loop_pids) * (skew_ns + one_wait_ns)


def wait_for_loops(cgroup: Path, count: int) -> list[int]:
    """The busy-loop shells (pinned children) once all ``count`` are running."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
        loops = [p for p in pids if Path(f"/proc/{p}/cmdline").read_bytes().endswith(b"done\0")]
        if len(loops) == count:
            return loops
        time.sleep(0.05)
    raise TimeoutError(f"busy loops did not start in {cgroup}")


START_PROBE = """
from node_agent.probes.base import ProbeContext, ProbeUnavailable
from node_agent.probes.taskstats import TaskstatsProbe
probe = TaskstatsProbe(ProbeContext(cgroup_v2_mount={mount!r}))
try:
    probe.start()
except ProbeUnavailable as exc:
    print("unavailable:", exc)
else:
    print("started")
    probe.close()
"""


@needs_root_v2
@pytest.mark.parametrize(
    ("bounding_set", "expected"),
    [
        ("-all,+net_admin", "started"),
        ("-all", "unavailable: taskstats refused a query for the agent's own pid (EPERM): it "
         "needs CAP_NET_ADMIN"),
    ],
)  # fmt: skip
def test_start_fails_with_the_reason_without_net_admin(bounding_set: str, expected: str) -> None:
    """As uid 0 with every capability dropped but (or including) NET_ADMIN: the family
    binds either way, so ``start()`` itself must find out that queries are refused."""
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) is needed to drop capabilities"
    done = subprocess.run(
        [setpriv, "--reuid=0", "--inh-caps=-all", f"--bounding-set={bounding_set}", "--",
         sys.executable, "-c", START_PROBE.format(mount=V2_MOUNT)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(expected), done.stdout + done.stderr
