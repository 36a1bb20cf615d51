"""Kernel tests of culprit attribution and of telling a pod's own limit from neighbours.

Real cgroups laid out as the kubelet's cgroupfs driver lays out pods (``kubepods/
burstable/pod<uid>``, under a unique test root), real busy loops pinned to CPUs, the real
``runqlat`` and ``cpu_throttle`` probes, and the agent's own attribution and aggregation:

- ``victim``: one busy loop on CPU A; ``noisy``: two busy loops on CPU A; ``bystander``:
  one busy loop on another CPU; ``limited``: one busy loop on CPU A under a CFS quota of
  0.05 CPU (v1 ``cpu.cfs_quota_us`` on a hybrid host, v2 ``cpu.max`` where v2 has the
  cpu controller).
- Every run-queue wait is filed under exactly one culprit: per interval, a cgroup's
  pairs sum to its ``runq_ns`` and ``runq_count`` exactly.
- The victim's culprit is ``noisy`` (the pod holding most of its CPU), never the
  bystander on another CPU.
- ``limited`` waits long — its p99 looks like a victim's — and its waits end after
  neighbours' tasks, yet :func:`interference.contention.contention_shares` puts them on
  its own limit, while the victim's stay on its neighbours.

Other processes on the machine (outside the test root) run on CPU A too; their waits
and their share as culprits land in ``system``, which is why the bounds below are
shares, not exact figures.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from interference import hist
from interference.contention import contention_shares
from interference.signals import PodMetrics
from node_agent.aggregate import aggregate, resolve_owners
from node_agent.attribution import Attributor
from node_agent.pods import StaticPodDirectory
from node_agent.probes.base import (
    CULPRIT_WAIT_COUNT,
    CULPRIT_WAIT_NS,
    ONCPU_NS,
    RUNQ_COUNT,
    RUNQ_NS,
    ProbeContext,
    Sample,
)
from node_agent.probes.cpu_throttle import CpuThrottleProbe
from node_agent.probes.runqlat import RunqlatProbe
from tests.node_agent.bpf_workloads import (
    BUSY_LOOP,
    await_running,
    many_started_in,
    require_root,
    started_in,
)
from tests.node_agent.own_cgroups import cgroup_tree, kernel_cgroup_id, unique_name

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

CTX = ProbeContext()
WINDOW_S = 4.0
COLLECT_EVERY_S = 0.1
"""Many drains inside the window: pairs counted during a drain must not be lost."""
QUOTA_US, PERIOD_US = 5_000, 100_000
"""0.05 CPU: the limited pod is throttled most of every period."""
NAMESPACE = "culprits"


@dataclass(frozen=True)
class OwnPod:
    name: str
    uid: str
    v2: Path
    v1_cpu: Path | None

    @property
    def key(self) -> str:
        return f"{NAMESPACE}/{self.name}"


def cpu_quota_hierarchy() -> str:
    """Where a CFS quota can be set: ``v2`` (cpu in the v2 controllers) or ``v1``."""
    controllers = Path(CTX.cgroup_v2_mount, "cgroup.controllers")
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return "v2"
    if Path(CTX.cgroup_v1_mount, "cpu", "tasks").exists():
        return "v1"
    pytest.skip("no cgroup cpu controller (neither v2 nor a v1 cpu mount)")


@pytest.fixture
def pods() -> Iterator[tuple[str, dict[str, OwnPod]]]:
    require_root()
    hierarchy = cpu_quota_hierarchy()
    top = unique_name("intf-test-culprits")
    burstable = f"{top}/kubepods/burstable"
    made: dict[str, OwnPod] = {}
    with ExitStack() as stack:
        v2 = stack.enter_context(cgroup_tree(CTX.cgroup_v2_mount, burstable))
        v1 = (
            stack.enter_context(cgroup_tree(f"{CTX.cgroup_v1_mount}/cpu", burstable))
            if hierarchy == "v1"
            else None
        )
        if hierarchy == "v2":
            for level in (
                Path(CTX.cgroup_v2_mount, top),
                Path(CTX.cgroup_v2_mount, top, "kubepods"),
                v2,
            ):
                (level / "cgroup.subtree_control").write_text("+cpu")
        for name in ("victim", "noisy", "bystander", "limited"):
            uid = str(uuid.uuid4())
            (v2 / f"pod{uid}").mkdir()
            # Only the limited pod gets a v1 cpu group: the others compete as plain tasks
            # (as on v2 without the cpu controller), not as one group of the test tree.
            v1_pod = v1 / f"pod{uid}" if v1 is not None and name == "limited" else None
            if v1_pod is not None:
                v1_pod.mkdir()
            made[name] = OwnPod(name, uid, v2 / f"pod{uid}", v1_pod)
        limited = made["limited"]
        if limited.v1_cpu is not None:
            (limited.v1_cpu / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (limited.v1_cpu / "cpu.cfs_quota_us").write_text(str(QUOTA_US))
        else:
            (limited.v2 / "cpu.max").write_text(f"{QUOTA_US} {PERIOD_US}")
        yield f"/{top}", made


def procs_files(pod: OwnPod) -> list[Path]:
    return [pod.v2 / "cgroup.procs", *([pod.v1_cpu / "cgroup.procs"] if pod.v1_cpu else [])]


def add_sample(into: Sample, sample: Sample) -> None:
    """Sum ``sample`` into ``into`` (one sample standing for the whole window)."""
    for source, target in (
        (sample.by_cgroup_id, into.by_cgroup_id),
        (sample.by_cgroup_path, into.by_cgroup_path),
        (sample.waits_by_culprit, into.waits_by_culprit),
    ):
        for key, values in source.items():
            row = target.setdefault(key, {})  # type: ignore[attr-defined]
            for name, value in values.items():
                row[name] = row.get(name, 0.0) + value
    for cgid, by_name in sample.histograms_by_cgroup_id.items():
        row_h = into.histograms_by_cgroup_id.setdefault(cgid, {})
        for name, buckets in by_name.items():
            row_h[name] = hist.add(row_h.get(name, []), buckets)
    for name, value in sample.node.items():
        into.node[name] = into.node.get(name, 0.0) + value


def assert_every_wait_has_one_culprit(sample: Sample) -> None:
    """Per waiting cgroup, its pairs add up to its run-queue figures exactly."""
    by_waiting: dict[int, list[float]] = {}
    for (waiting, _culprit), wait in sample.waits_by_culprit.items():
        row = by_waiting.setdefault(waiting, [0.0, 0.0])
        row[0] += wait[CULPRIT_WAIT_NS]
        row[1] += wait[CULPRIT_WAIT_COUNT]
    for cgid, values in sample.by_cgroup_id.items():
        assert by_waiting.get(cgid, [0.0, 0.0]) == [values[RUNQ_NS], values[RUNQ_COUNT]], cgid
    assert set(by_waiting) <= set(sample.by_cgroup_id)


def test_culprit_named_and_own_limit_told_apart(pods: tuple[str, dict[str, OwnPod]]) -> None:
    root, made = pods
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: one shared by the pods, one for the bystander")
    shared_cpu, other_cpu = cpus[0], cpus[-1]
    ctx = ProbeContext(cgroup_root=root)
    runqlat, throttle = RunqlatProbe(ctx), CpuThrottleProbe(ctx)
    runqlat.start()
    throttle.start()
    attributor = Attributor(
        ctx, StaticPodDirectory({p.uid: (NAMESPACE, p.name) for p in made.values()})
    )
    window = {"runqlat": Sample(), "cpu_throttle": Sample()}
    try:
        with (
            started_in(procs_files(made["victim"]), BUSY_LOOP, shared_cpu),
            many_started_in(2, procs_files(made["noisy"]), BUSY_LOOP, shared_cpu),
            started_in(procs_files(made["limited"]), BUSY_LOOP, shared_cpu),
            started_in(procs_files(made["bystander"]), BUSY_LOOP, other_cpu),
        ):
            for pod in made.values():
                await_running(pod.v2 / "cgroup.procs", BUSY_LOOP)
            time.sleep(1.0)  # loops spinning
            runqlat.collect()
            throttle.collect()
            started = time.monotonic()
            while time.monotonic() - started < WINDOW_S:
                time.sleep(COLLECT_EVERY_S)
                sample = runqlat.collect()
                assert_every_wait_has_one_culprit(sample)
                add_sample(window["runqlat"], sample)
                add_sample(window["cpu_throttle"], throttle.collect())
            elapsed = time.monotonic() - started
    finally:
        runqlat.close()
        throttle.close()

    ids = {name: kernel_cgroup_id(str(pod.v2)) for name, pod in made.items()}
    victim_waits = {
        culprit: wait[CULPRIT_WAIT_NS]
        for (waiting, culprit), wait in window["runqlat"].waits_by_culprit.items()
        if waiting == ids["victim"]
    }
    assert ids["bystander"] not in victim_waits, "a pod on another CPU named as a culprit"
    # The victim is always runnable, so every stint of the noisy pod (pinned to the same
    # CPU) is time the victim waited behind it: its blame is its on-CPU time, less only
    # what falls outside the per-CPU ring of stints in waits that outlast it (on this
    # shared machine other workers' short tasks can fill it: 0.99 of it when quiet,
    # down to 0.7 seen under load).
    noisy_oncpu_ns = window["runqlat"].by_cgroup_id[ids["noisy"]][ONCPU_NS]
    print(f"victim's waits by culprit (ms): { {c: w / 1e6 for c, w in victim_waits.items()} }")
    assert 0.6 * noisy_oncpu_ns <= victim_waits[ids["noisy"]] <= 1.1 * noisy_oncpu_ns

    owners = resolve_owners(window.values(), attributor, root)
    result = aggregate(window, owners, elapsed, ncpu=len(cpus), cgroup_root=root)
    rows: dict[str, PodMetrics] = {pod.key: pod for pod in result.pods}
    victim, limited = rows[made["victim"].key], rows[made["limited"].key]
    print(f"victim: {victim}\nlimited: {limited}")

    # The victim's row names the noisy pod (others on this machine may be named too, as
    # system) and says all its waits were behind neighbours.
    noisy = rows[made["noisy"].key]
    assert (
        0.6 * noisy.cpu_ms_per_s
        <= dict(victim.culprits)[made["noisy"].key]
        <= 1.1 * noisy.cpu_ms_per_s
    )
    assert victim.own_wait_ms_per_s == 0  # one thread never waits behind itself
    assert victim.neighbour_wait_ms_per_s == pytest.approx(victim.runq_wait_ms_per_s)
    victim_shares = contention_shares(
        own_wait_ms_per_s=victim.own_wait_ms_per_s,
        neighbour_wait_ms_per_s=victim.neighbour_wait_ms_per_s,
        throttled_ms_per_s=victim.throttled_ms_per_s,
        cpu_ms_per_s=victim.cpu_ms_per_s,
    )
    assert victim_shares.cause == "neighbours", victim_shares

    # The limited pod looks like a victim by its waits alone ...
    assert limited.throttled_ms_per_s > 500, "the quota did not throttle"
    assert limited.runq_p99_us >= 16_000
    assert limited.neighbour_wait_ms_per_s > limited.own_wait_ms_per_s
    # ... but its own limit made most of them.
    limited_shares = contention_shares(
        own_wait_ms_per_s=limited.own_wait_ms_per_s,
        neighbour_wait_ms_per_s=limited.neighbour_wait_ms_per_s,
        throttled_ms_per_s=limited.throttled_ms_per_s,
        cpu_ms_per_s=limited.cpu_ms_per_s,
    )
    assert limited_shares.cause == "own_limit", limited_shares
