"""Kernel tests: BPF maps that fill up say so, and the interval reads degraded, not quiet.

The real ``runqlat`` program is compiled with shrunken maps (``-DMAX_TASKS``,
``-DMAX_CGROUPS``) and given more queued tasks, or more active cgroups, than the map
holds, in cgroups of the test's own. Every lost entry must show in ``bpf_lost_entries``,
and the interval's report must be degraded (``runq`` not measured, no per-pod rows) for
every reader: the aggregate, the msgpack stream entry and the Redis hash. With room in
the maps nothing is lost and the same report is ``ok``.

The workloads are busy loops at ``SCHED_IDLE`` (they take what the machine leaves
over), and the tests wait for outcomes, never for durations.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from interference import freshness
from interference.codec import decode_report, encode_report, node_hash, parse_node_signals
from interference.signals import NodeReport
from node_agent.aggregate import Owners, aggregate
from node_agent.probes.base import BPF_LOST_ENTRIES, RUNQ_COUNT, ProbeContext, Sample
from node_agent.probes.runqlat import RunqlatProbe
from tests.node_agent.bpf_workloads import require_root
from tests.node_agent.own_cgroups import (
    cgroup_tree,
    kernel_cgroup_id,
    process_in,
    unique_name,
)

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

V2_MOUNT = ProbeContext().cgroup_v2_mount
SMALL_TASK_MAP = 16
QUEUED_TASKS = 4 * SMALL_TASK_MAP
"""Busy loops: each waits behind the others long enough for the LRU to evict its entry."""
SMALL_CGROUP_MAP = 2
ACTIVE_CGROUPS = 4 * SMALL_CGROUP_MAP
ROOMY_TASKS = 8
COLLECT_EVERY_S = 0.5
GIVE_UP_AFTER_S = 120.0
"""Bound on waiting for an outcome on a loaded machine (not a timing assertion)."""

BUSY_IDLE_LOOP = "chrt --idle 0 sh -c 'while :; do :; done'"
NAPPER = "while :; do sleep 0.05; done"


def spawn(count: int, command: str) -> str:
    """A shell line starting ``count`` copies of ``command`` in the background."""
    return f"for i in $(seq {count}); do {command} & done; wait"


def await_members(procs: Path, at_least: int) -> None:
    """Wait until ``procs`` lists ``at_least`` processes (the shell's children started)."""
    deadline = time.monotonic() + GIVE_UP_AFTER_S
    while len(procs.read_text().split()) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{procs} holds fewer than {at_least} processes")
        time.sleep(0.05)


def collect_until(probe: RunqlatProbe, done: Callable[[Sample], bool]) -> Sample:
    """Collect every :data:`COLLECT_EVERY_S` until ``done(sample)``; the last sample."""
    deadline = time.monotonic() + GIVE_UP_AFTER_S
    while True:
        time.sleep(COLLECT_EVERY_S)
        sample = probe.collect()
        if done(sample) or time.monotonic() > deadline:
            return sample


def report_of(sample: Sample) -> NodeReport:
    """The agent's report for one runqlat-only interval (the real aggregate)."""
    result = aggregate({"runqlat": sample}, Owners(), COLLECT_EVERY_S, os.cpu_count() or 1)
    return NodeReport(
        node="lost-entries-node",
        ts=time.time(),
        interval_s=COLLECT_EVERY_S,
        metrics=result.metrics,
        histograms=result.histograms,
        pods=result.pods,
        measured=result.measured,
    )


def state_for_every_reader(report: NodeReport) -> set[str]:
    """:func:`freshness.node_state` of the report as the stream and the hash carry it."""
    streamed = decode_report(encode_report(report))
    hashed = parse_node_signals(node_hash(report))
    now = report.ts
    return {
        freshness.node_state(streamed.ts, streamed.interval_s, streamed.measured, now),
        freshness.node_state(hashed.updated_at, report.interval_s, hashed.measured, now),
    }


@pytest.fixture
def own_tree() -> Iterator[Path]:
    require_root()
    with cgroup_tree(V2_MOUNT, unique_name("intf-test-lost")) as tree:
        yield tree


def started_probe(stack: ExitStack, tree: Path, cflags: list[str]) -> RunqlatProbe:
    ctx = ProbeContext(cgroup_root=f"/{tree.name}", cgroup_v2_mount=V2_MOUNT)
    probe = RunqlatProbe(ctx, cflags=cflags)
    stack.callback(probe.close)
    probe.start()
    return probe


def test_more_queued_tasks_than_the_task_map_holds_are_counted_and_degrade_the_report(
    own_tree: Path,
) -> None:
    procs = own_tree / "cgroup.procs"
    with ExitStack() as stack:
        probe = started_probe(stack, own_tree, [f"-DMAX_TASKS={SMALL_TASK_MAP}"])
        stack.enter_context(process_in([procs], spawn(QUEUED_TASKS, BUSY_IDLE_LOOP)))
        await_members(procs, QUEUED_TASKS)
        sample = collect_until(probe, lambda s: s.node.get(BPF_LOST_ENTRIES, 0.0) > 0)
        lost_by_kind = dict(probe.lost_entries_by_kind)

    print(f"\nmap of {SMALL_TASK_MAP} tasks, {QUEUED_TASKS} queued: lost {lost_by_kind}")
    assert sample.node[BPF_LOST_ENTRIES] > 0, "a full task map lost nothing?"
    assert lost_by_kind["task"] > 0, lost_by_kind
    report = report_of(sample)
    assert report.metrics.bpf_lost_entries == sample.node[BPF_LOST_ENTRIES]
    assert "runq" not in report.measured
    assert report.pods == []
    assert state_for_every_reader(report) == {"degraded"}


def test_more_active_cgroups_than_the_cgroup_map_holds_are_counted_and_degrade_the_report(
    own_tree: Path,
) -> None:
    procs = []
    for index in range(ACTIVE_CGROUPS):
        child = own_tree / f"c{index}"
        child.mkdir()
        procs.append(child / "cgroup.procs")
    with ExitStack() as stack:
        probe = started_probe(stack, own_tree, [f"-DMAX_CGROUPS={SMALL_CGROUP_MAP}"])
        for path in procs:
            stack.enter_context(process_in([path], NAPPER))
        sample = collect_until(probe, lambda s: s.node.get(BPF_LOST_ENTRIES, 0.0) > 0)
        lost_by_kind = dict(probe.lost_entries_by_kind)

    print(f"\nmap of {SMALL_CGROUP_MAP} cgroups, {ACTIVE_CGROUPS} active: lost {lost_by_kind}")
    assert lost_by_kind["cgroup"] > 0, lost_by_kind
    report = report_of(sample)
    assert report.metrics.bpf_lost_entries > 0
    assert state_for_every_reader(report) == {"degraded"}


def test_with_room_in_the_maps_nothing_is_lost_and_the_report_is_ok(own_tree: Path) -> None:
    """From the first interval on: threads that slept (or queued) across the attach have
    seeded entries, so they do not read as lost."""
    procs = own_tree / "cgroup.procs"
    ours = kernel_cgroup_id(str(own_tree))
    samples: list[Sample] = []

    def seen_ours_in_a_few(sample: Sample) -> bool:
        samples.append(sample)
        runq_counts = (s.by_cgroup_id.get(ours, {}).get(RUNQ_COUNT, 0.0) for s in samples)
        return len(samples) >= 3 and any(count > 0 for count in runq_counts)

    with ExitStack() as stack:
        probe = started_probe(stack, own_tree, [])
        stack.enter_context(process_in([procs], spawn(ROOMY_TASKS, BUSY_IDLE_LOOP)))
        collect_until(probe, seen_ours_in_a_few)

    lost = [s.node[BPF_LOST_ENTRIES] for s in samples]
    assert any(s.by_cgroup_id.get(ours, {}).get(RUNQ_COUNT, 0.0) > 0 for s in samples), (
        "the workload was not seen at all"
    )
    assert lost == [0.0] * len(samples)
    report = report_of(samples[-1])
    assert report.metrics.bpf_lost_entries == 0
    assert "runq" in report.measured
    assert report.pods, "an interval that lost nothing publishes its pod rows"
    assert state_for_every_reader(report) == {"ok"}
