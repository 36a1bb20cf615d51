"""Kernel test of the reclaim probe (acceptance 3).

``stress-ng --vm 1 --vm-bytes 256M`` runs in a v1 memory cgroup limited to 64M (and in a
v2 cgroup, whose id BPF reports): the probe must attribute reclaim stalls to that cgroup
and none to an idle sibling. The kernel's own ``memory.failcnt`` (charges that hit the
limit, each of which may start memcg reclaim) is the ground truth for "reclaim happened".
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from interference import hist
from node_agent.probes.base import (
    HIST_RECLAIM_US,
    RECLAIM_COUNT,
    RECLAIM_NS,
    ProbeContext,
)
from node_agent.probes.reclaim import ReclaimProbe
from tests.node_agent.bpf_workloads import NAPPER, require_root, started_in
from tests.node_agent.own_cgroups import cgroup_tree, kernel_cgroup_id, unique_name

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

CONTEXT = ProbeContext()
V1_MEMORY_MOUNT = f"{CONTEXT.cgroup_v1_mount}/memory"
LIMIT_BYTES = 64 << 20
STRESS_S = 6


@pytest.fixture
def trees() -> Iterator[tuple[str, Path, Path]]:
    """``(name, v2 dir, v1 memory dir)`` of a fresh test cgroup pair, removed afterwards."""
    require_root()
    if not Path(V1_MEMORY_MOUNT, "memory.limit_in_bytes").exists():
        pytest.skip(f"no cgroup v1 memory controller at {V1_MEMORY_MOUNT}")
    if shutil.which("stress-ng") is None:
        pytest.fail("stress-ng is not installed; run `make setup`")
    name = unique_name("intf-test-reclaim")
    with cgroup_tree(CONTEXT.cgroup_v2_mount, name) as v2, cgroup_tree(V1_MEMORY_MOUNT, name) as v1:
        yield name, v2, v1


def test_reclaim_stalls_are_charged_to_the_cgroup_over_its_limit(
    trees: tuple[str, Path, Path],
) -> None:
    name, v2, v1 = trees
    for tree in (v2, v1):
        (tree / "hog").mkdir()
        (tree / "quiet").mkdir()
    (v1 / "hog" / "memory.limit_in_bytes").write_text(str(LIMIT_BYTES))
    (v1 / "quiet" / "memory.limit_in_bytes").write_text(str(LIMIT_BYTES))
    hog_id, quiet_id = kernel_cgroup_id(str(v2 / "hog")), kernel_cgroup_id(str(v2 / "quiet"))
    stress = ["stress-ng", "--vm", "1", "--vm-bytes", "256M", "--timeout", f"{STRESS_S}s"]

    probe = ReclaimProbe(ProbeContext(cgroup_root=f"/{name}"))
    probe.start()
    try:
        with ExitStack() as processes:
            processes.enter_context(
                started_in([v2 / "quiet" / "cgroup.procs", v1 / "quiet" / "cgroup.procs"], NAPPER)
            )
            probe.collect()  # window opens
            hog = processes.enter_context(
                started_in([v2 / "hog" / "cgroup.procs", v1 / "hog" / "cgroup.procs"], stress)
            )
            hog.wait(timeout=STRESS_S + 60)
            time.sleep(0.2)
            sample = probe.collect()
    finally:
        probe.close()

    hog_row = sample.by_cgroup_id.get(hog_id, {})
    limit_hits = int((v1 / "hog" / "memory.failcnt").read_text())
    assert limit_hits > 0, "the limit was never hit"
    # Each memcg reclaim follows a charge that failed against the limit.
    assert 0 < hog_row.get(RECLAIM_COUNT, 0) <= limit_hits
    assert hog_row.get(RECLAIM_NS, 0) > 0
    histogram = sample.histograms_by_cgroup_id[hog_id][HIST_RECLAIM_US]
    assert hist.total(histogram) == hog_row[RECLAIM_COUNT]
    assert (
        hist.slot_bounds(max(s for s, n in enumerate(histogram) if n))[0] * 1000
        <= (hog_row[RECLAIM_NS])
    )

    assert int((v1 / "quiet" / "memory.failcnt").read_text()) == 0
    assert sample.by_cgroup_id.get(quiet_id, {}).get(RECLAIM_COUNT, 0) == 0
    assert sample.by_cgroup_id.get(quiet_id, {}).get(RECLAIM_NS, 0) == 0
