"""Aggregation: one interval of samples → node summary, pod rows, histograms (table-driven)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from interference import hist
from interference.index import IndexReferences, interference_index
from interference.signals import NodeMetrics, PodMetrics
from node_agent.aggregate import (
    Owners,
    aggregate,
    is_below,
    measured_families,
    resolve_owners,
)
from node_agent.attribution import SYSTEM, Attributor, PodIdentity
from node_agent.pods import StaticPodDirectory
from node_agent.probes import base
from node_agent.probes.base import ProbeContext, Sample

TRAINER = PodIdentity(uid="u-trainer", namespace="ml", name="trainer-0", qos="guaranteed")
TRAINER_SIDECAR = PodIdentity(
    uid="u-trainer", namespace="ml", name="trainer-0", qos="guaranteed", container_id="c2"
)
BATCH = PodIdentity(uid="u-batch", namespace="batch", name="etl-7", qos="besteffort")
MS = 1_000_000  # ns


def runq_hist(**slots: int) -> list[int]:
    """Histogram with counts at named slots, e.g. ``runq_hist(s3=5)``."""
    buckets = [0] * hist.MAX_SLOTS
    for name, count in slots.items():
        buckets[int(name[1:])] = count
    return buckets


@dataclass
class Case:
    """One table row: samples by probe, their owners, and what must come out."""

    samples: dict[str, Sample]
    owners: Owners
    interval_s: float = 1.0
    ncpu: int = 2
    node: dict[str, float] = field(default_factory=dict)
    """Expected NodeMetrics fields (others must be 0, the index is checked separately)."""
    pods: dict[str, dict[str, float]] = field(default_factory=dict)
    """Expected rows by ``PodMetrics.key`` (fields not named must be 0); exactly these rows."""


CASES = {
    "bpf runqlat: containers of one pod merge, percentiles from merged histograms": Case(
        samples={
            "runqlat": Sample(
                by_cgroup_id={
                    11: {base.RUNQ_COUNT: 4, base.RUNQ_NS: 400 * MS, base.ONCPU_NS: 500 * MS},
                    12: {base.RUNQ_COUNT: 6, base.RUNQ_NS: 200 * MS, base.ONCPU_NS: 250 * MS},
                    20: {base.RUNQ_COUNT: 10, base.RUNQ_NS: 0.4 * MS, base.ONCPU_NS: 100 * MS},
                    99: {base.ONCPU_NS: 40 * MS},
                },
                histograms_by_cgroup_id={
                    11: {base.HIST_RUNQ_US: runq_hist(s10=4)},
                    12: {base.HIST_RUNQ_US: runq_hist(s10=6)},
                    20: {base.HIST_RUNQ_US: runq_hist(s5=10)},
                },
            )
        },
        owners=Owners(by_cgroup_id={11: TRAINER, 12: TRAINER_SIDECAR, 20: BATCH, 99: SYSTEM}),
        interval_s=2.0,
        ncpu=2,
        node={
            # 20 waits: 10 in slot 5 [32, 63], 10 in slot 10 [1024, 2047].
            "runq_p50_us": 63.0,
            "runq_p99_us": 1024 + 1023 * 9.8 / 10,
            # (400 + 200 + 0.4) ms over 2 s × 2 CPUs
            "runq_wait_ratio": 0.6004 / 4,
        },
        pods={
            "system": {"cpu_ms_per_s": 20.0},
            "ml/trainer-0": {
                "cpu_ms_per_s": 375.0,
                "runq_wait_ms_per_s": 300.0,
                "runq_p99_us": 1024 + 1023 * 9.9 / 10,
            },
            "batch/etl-7": {
                "cpu_ms_per_s": 50.0,
                "runq_wait_ms_per_s": 0.2,
                "runq_p99_us": 32 + 31 * 9.9 / 10,
            },
        },
    ),
    "reclaim, vmscan throttles and cpu.stat throttling; PSI and drops at node level": Case(
        samples={
            "reclaim": Sample(
                by_cgroup_id={
                    20: {base.RECLAIM_COUNT: 3, base.RECLAIM_NS: 6 * MS, base.VMSCAN_THROTTLED: 1}
                },
                histograms_by_cgroup_id={20: {base.HIST_RECLAIM_US: runq_hist(s11=3)}},
            ),
            "cpu_throttle": Sample(
                by_cgroup_path={
                    "/kubepods/besteffort/podu-batch": {
                        base.THROTTLED_NS: 50 * MS,
                        base.THROTTLED_PERIODS: 5,
                    },
                    "/kubepods/besteffort/podu-batch/c1": {base.THROTTLED_NS: 30 * MS},
                    "/kubepods/podu-trainer": {base.THROTTLED_NS: 0},
                }
            ),
            "psi": Sample(
                node={
                    base.PSI_CPU_SOME_US: 250_000,
                    base.PSI_MEM_SOME_US: 5_000_000,  # more than the interval: capped
                    base.PSI_MEM_FULL_US: 10_000,
                }
            ),
            "network": Sample(node={base.NET_DROPS: 40, base.NET_BACKLOG_BYTES: 1e6}),
        },
        owners=Owners(
            by_cgroup_id={20: BATCH},
            by_cgroup_path={
                "/kubepods/besteffort/podu-batch": BATCH,
                "/kubepods/besteffort/podu-batch/c1": BATCH,
                "/kubepods/podu-trainer": TRAINER,
            },
        ),
        interval_s=0.5,
        node={
            "reclaim_stall_ms_per_s": 12.0,
            "reclaim_events_per_s": 8.0,
            "throttled_ms_per_s": 160.0,
            "psi_cpu_some": 50.0,
            "psi_mem_some": 100.0,
            "psi_mem_full": 2.0,
            "net_drops_per_s": 80.0,
        },
        pods={
            "batch/etl-7": {"reclaim_stall_ms_per_s": 12.0, "throttled_ms_per_s": 160.0},
            "ml/trainer-0": {},
        },
    ),
    "taskstats fallback: run-queue and reclaim delay per pid, approximate histogram": Case(
        samples={
            "taskstats": Sample(
                by_pid={
                    100: {
                        base.CPU_DELAY_NS: 30 * MS,
                        base.CPU_DELAY_COUNT: 10,  # mean 3000 µs: slot 11 [2048, 4095]
                        base.RECLAIM_DELAY_NS: 2 * MS,
                    },
                    200: {base.CPU_DELAY_NS: 10 * MS, base.CPU_DELAY_COUNT: 10},  # slot 9
                }
            )
        },
        owners=Owners(by_pid={100: TRAINER, 200: SYSTEM}),
        node={
            "runq_p50_us": 1023.0,
            "runq_p99_us": 2048 + 2047 * 9.8 / 10,
            "runq_wait_ratio": 0.02,
            "reclaim_stall_ms_per_s": 2.0,
        },
        pods={
            "ml/trainer-0": {
                "runq_wait_ms_per_s": 30.0,
                "runq_p99_us": 2048 + 2047 * 9.9 / 10,
                "reclaim_stall_ms_per_s": 2.0,
            },
            "system": {"runq_wait_ms_per_s": 10.0, "runq_p99_us": 512 + 511 * 9.9 / 10},
        },
    ),
    "BPF wins over taskstats when both run: no double counting": Case(
        samples={
            "runqlat": Sample(
                by_cgroup_id={11: {base.RUNQ_COUNT: 1, base.RUNQ_NS: 8 * MS}},
                histograms_by_cgroup_id={11: {base.HIST_RUNQ_US: runq_hist(s12=1)}},
            ),
            "reclaim": Sample(by_cgroup_id={11: {base.RECLAIM_COUNT: 1, base.RECLAIM_NS: MS}}),
            "taskstats": Sample(
                by_pid={
                    100: {
                        base.CPU_DELAY_NS: 500 * MS,
                        base.CPU_DELAY_COUNT: 5,
                        base.RECLAIM_DELAY_NS: 90 * MS,
                    }
                }
            ),
        },
        owners=Owners(by_cgroup_id={11: TRAINER}, by_pid={100: TRAINER}),
        ncpu=1,
        node={
            "runq_p50_us": 4096 + 4095 * 0.5,
            "runq_p99_us": 4096 + 4095 * 0.99,
            "runq_wait_ratio": 0.008,
            "reclaim_stall_ms_per_s": 1.0,
            "reclaim_events_per_s": 1.0,
        },
        pods={
            "ml/trainer-0": {
                "runq_wait_ms_per_s": 8.0,
                "runq_p99_us": 4096 + 4095 * 0.99,
                "reclaim_stall_ms_per_s": 1.0,
            }
        },
    ),
    "keys outside the cgroup root are dropped; keys without an owner are system": Case(
        samples={
            "runqlat": Sample(
                by_cgroup_id={
                    1: {base.RUNQ_NS: 900 * MS, base.ONCPU_NS: 900 * MS},
                    2: {base.RUNQ_NS: 100 * MS},
                },
                histograms_by_cgroup_id={1: {base.HIST_RUNQ_US: runq_hist(s20=9)}},
            ),
            "cpu_throttle": Sample(by_cgroup_path={"/elsewhere": {base.THROTTLED_NS: MS}}),
        },
        owners=Owners(by_cgroup_id={1: None}, by_cgroup_path={"/elsewhere": None}),
        ncpu=4,
        node={"runq_wait_ratio": 0.025},
        pods={"system": {"runq_wait_ms_per_s": 100.0}},
    ),
    "nothing measured: a quiet node, no rows": Case(samples={}, owners=Owners()),
}


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_aggregate(case: Case) -> None:
    refs = IndexReferences(runq_p99_us=2000.0, runq_p99_us_quiet=200.0)
    result = aggregate(case.samples, case.owners, case.interval_s, case.ncpu, refs)

    expected = NodeMetrics(**case.node)
    for name in NodeMetrics.__dataclass_fields__:
        if name != "interference_index":
            assert getattr(result.metrics, name) == pytest.approx(getattr(expected, name)), name
    assert result.measured == measured_families(case.samples)
    assert result.metrics.interference_index == interference_index(
        asdict(expected), refs, result.measured
    )

    rows = {pod.key: pod for pod in result.pods}
    assert sorted(rows) == sorted(case.pods)
    for key, values in case.pods.items():
        row = rows[key]
        for name in ("cpu_ms_per_s", "runq_wait_ms_per_s", "runq_p99_us"):
            assert getattr(row, name) == pytest.approx(values.get(name, 0.0)), (key, name)
        for name in ("reclaim_stall_ms_per_s", "throttled_ms_per_s"):
            assert getattr(row, name) == pytest.approx(values.get(name, 0.0)), (key, name)

    assert set(result.histograms) == {base.HIST_RUNQ_US, base.HIST_RECLAIM_US}
    assert all(len(h) == hist.MAX_SLOTS for h in result.histograms.values())


def test_pod_rows_carry_identity_and_node_histograms_merge_every_cgroup() -> None:
    case = CASES["bpf runqlat: containers of one pod merge, percentiles from merged histograms"]
    result = aggregate(case.samples, case.owners, case.interval_s, case.ncpu)
    trainer = next(p for p in result.pods if p.name == "trainer-0")
    assert (trainer.namespace, trainer.uid, trainer.qos) == ("ml", "u-trainer", "guaranteed")
    assert result.pods[0] == PodMetrics(namespace="", name="system", cpu_ms_per_s=20.0)
    assert result.histograms[base.HIST_RUNQ_US] == runq_hist(s5=10, s10=10)


def test_index_uses_the_given_references() -> None:
    samples = {
        "runqlat": Sample(histograms_by_cgroup_id={1: {base.HIST_RUNQ_US: runq_hist(s9=100)}})
    }
    owners = Owners(by_cgroup_id={1: SYSTEM})
    lenient = aggregate(
        samples, owners, 1.0, 1, IndexReferences(runq_p99_us=100_000.0, runq_p99_us_quiet=500.0)
    )
    strict = aggregate(
        samples, owners, 1.0, 1, IndexReferences(runq_p99_us=800.0, runq_p99_us_quiet=100.0)
    )
    assert strict.metrics.interference_index == 100.0  # p99 ≈1018 µs saturates at 800 µs
    assert 0 < lenient.metrics.interference_index < 30
    assert strict.measured == ("runq",)


@pytest.mark.parametrize(
    ("case", "probes", "measured"),
    [
        ("BPF probes", ["runqlat", "reclaim", "psi"], ("psi", "reclaim", "runq")),
        ("taskstats stands in for both BPF probes", ["taskstats"], ("reclaim", "runq")),
        ("no probe delivered", [], ()),
        ("only kernel files", ["psi", "cpu_throttle", "network", "memory_events"],
         ("memory_events", "net", "psi", "throttle")),
    ],
)  # fmt: skip
def test_measured_families(case: str, probes: list[str], measured: tuple[str, ...]) -> None:
    assert measured_families(probes) == measured, case


def test_a_family_not_measured_is_left_out_of_the_index() -> None:
    """Saturating PSI with run-queue unmeasured still saturates; the run queue's zeros
    do not dilute it, and the report says run queue was not measured (degraded)."""
    samples = {"psi": Sample(node={base.PSI_CPU_SOME_US: 900_000.0})}
    result = aggregate(samples, Owners(), 1.0, 1)
    assert result.measured == ("psi",)
    assert result.metrics.psi_cpu_some == pytest.approx(90.0)
    assert result.metrics.interference_index == 100.0


def test_psi_below_a_narrower_cgroup_root_is_that_subtree_s_own() -> None:
    """Below ``/demo/node-a`` the node PSI is the subtree's, not the host's."""
    samples = {
        "psi": Sample(
            node={base.PSI_CPU_SOME_US: 900_000.0},
            by_cgroup_path={"/demo/node-a": {base.PSI_CPU_SOME_US: 50_000.0}},
        )
    }
    whole_host = aggregate(samples, Owners(), 1.0, 1)
    subtree = aggregate(samples, Owners(), 1.0, 1, cgroup_root="/demo/node-a/")
    assert whole_host.metrics.psi_cpu_some == pytest.approx(90.0)
    assert subtree.metrics.psi_cpu_some == pytest.approx(5.0)


@pytest.mark.parametrize(("interval_s", "ncpu"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_aggregate_rejects_impossible_intervals_and_cpu_counts(
    interval_s: float, ncpu: int
) -> None:
    with pytest.raises(ValueError):
        aggregate({}, Owners(), interval_s, ncpu)


@pytest.mark.parametrize(
    ("path", "root", "below"),
    [
        ("/a/b", "/", True),
        ("/a", "/a", True),
        ("/a/b", "/a", True),
        ("/a/b", "/a/", True),
        ("/ab", "/a", False),
        ("/b/a", "/a", False),
    ],
)
def test_is_below(path: str, root: str, below: bool) -> None:
    assert is_below(path, root) is below


POD_UID = "0b6f6d2e-6a43-4f8e-9c1a-1f2e3d4c5b6a"
CONTAINER = "a" * 64


def test_resolve_owners_over_a_cgroup_tree(tmp_path: Path) -> None:
    """Real Attributor over a directory tree standing in for the v2 mount and /proc."""
    v2, proc = tmp_path / "cgroup", tmp_path / "proc"
    pod_dir = v2 / "test" / "kubepods" / "besteffort" / f"pod{POD_UID}" / CONTAINER
    pod_dir.mkdir(parents=True)
    (v2 / "other").mkdir()
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cgroup").write_text(
        f"0::/test/kubepods/besteffort/pod{POD_UID}/{CONTAINER}\n"
    )
    ctx = ProbeContext(cgroup_root="/test", cgroup_v2_mount=str(v2), proc_root=str(proc))
    attributor = Attributor(ctx, StaticPodDirectory({POD_UID: ("ml", "trainer-0")}))
    inside, outside = os.stat(pod_dir).st_ino, os.stat(v2 / "other").st_ino
    sample = Sample(
        by_cgroup_id={inside: {base.RUNQ_NS: 1.0}, outside: {base.RUNQ_NS: 1.0}},
        by_cgroup_path={
            f"/test/kubepods/besteffort/pod{POD_UID}": {base.THROTTLED_NS: 1.0},
            "/test/system.slice": {base.THROTTLED_NS: 1.0},
            "/other": {base.THROTTLED_NS: 1.0},
        },
        by_pid={4242: {base.CPU_DELAY_NS: 1.0}, 4243: {base.CPU_DELAY_NS: 1.0}},
    )

    owners = resolve_owners([sample], attributor, "/test")

    pod = PodIdentity(POD_UID, "ml", "trainer-0", "besteffort", CONTAINER)
    assert owners.by_cgroup_id == {inside: pod, outside: None}
    assert owners.by_cgroup_path == {
        f"/test/kubepods/besteffort/pod{POD_UID}": PodIdentity(
            POD_UID, "ml", "trainer-0", "besteffort"
        ),
        "/test/system.slice": SYSTEM,
        "/other": None,
    }
    assert owners.by_pid == {4242: pod, 4243: SYSTEM}  # 4243 has exited


def test_resolve_owners_on_the_whole_host_keeps_unknown_ids_as_system(tmp_path: Path) -> None:
    ctx = ProbeContext(cgroup_root="/", cgroup_v2_mount=str(tmp_path))
    attributor = Attributor(ctx, StaticPodDirectory())
    owners = resolve_owners([Sample(by_cgroup_id={123456789: {}})], attributor, "/")
    assert owners.by_cgroup_id == {123456789: SYSTEM}


def test_idle_wakeups_are_published_apart_and_never_scored() -> None:
    """Waits that ended by switching in from the idle task are the CPU waking up: they
    are reported per pod and node, but change neither the run-queue figures nor the index."""
    runq = {base.RUNQ_COUNT: 10.0, base.RUNQ_NS: 2e6, base.ONCPU_NS: 1e8}
    woken = {**runq, base.IDLE_WAKEUP_COUNT: 50.0, base.IDLE_WAKEUP_NS: 3e6}
    histograms = {1: {base.HIST_RUNQ_US: runq_hist(s7=10)}}
    owners = Owners(by_cgroup_id={1: SYSTEM})

    def node(values: dict[str, float], missed: float) -> NodeMetrics:
        sample = Sample(
            node={base.BPF_MISSED_EVENTS: missed},
            by_cgroup_id={1: values},
            histograms_by_cgroup_id=histograms,
        )
        return aggregate({"runqlat": sample}, owners, 1.0, 1).metrics

    plain, with_wakeups = node(runq, 0.0), node(woken, 2.0)
    assert with_wakeups.idle_wakeup_ms_per_s == pytest.approx(3.0)
    assert with_wakeups.bpf_missed_events == 2.0
    assert plain.idle_wakeup_ms_per_s == 0.0
    for field_name in ("runq_p99_us", "runq_wait_ratio", "interference_index"):
        assert getattr(with_wakeups, field_name) == getattr(plain, field_name), field_name


def lost_entries_sample(lost: float) -> Sample:
    """A BPF probe's sample with one pod's counts and ``lost`` map entries lost."""
    return Sample(
        node={base.BPF_LOST_ENTRIES: lost},
        by_cgroup_id={1: {base.ONCPU_NS: 1e8, base.RUNQ_NS: 2e6, base.RECLAIM_NS: 1e6}},
        histograms_by_cgroup_id={1: {base.HIST_RUNQ_US: runq_hist(s7=10)}},
    )


@pytest.mark.parametrize(
    ("case", "lost_by_probe", "measured", "pod_rows"),
    [
        ("nothing lost", {"runqlat": 0.0, "reclaim": 0.0}, ("psi", "reclaim", "runq"), 1),
        ("runqlat lost entries: runq unmeasured", {"runqlat": 3.0, "reclaim": 0.0},
         ("psi", "reclaim"), 0),
        ("reclaim lost entries: reclaim unmeasured", {"runqlat": 0.0, "reclaim": 2.0},
         ("psi", "runq"), 0),
        ("both lost", {"runqlat": 1.0, "reclaim": 1.0}, ("psi",), 0),
        ("runqlat lost while taskstats ran too: runq still unmeasured",
         {"runqlat": 4.0, "taskstats": 0.0}, ("psi", "reclaim"), 0),
    ],
)  # fmt: skip
def test_an_interval_with_lost_map_entries_is_incomplete_and_publishes_no_pod_rows(
    case: str, lost_by_probe: dict[str, float], measured: tuple[str, ...], pod_rows: int
) -> None:
    """Lost entries may have been any pod's counts: the probe's families leave
    ``measured`` (a lossy run queue makes the report degraded) and no pod row is
    published as if complete; the node says how many entries were lost."""
    samples = {name: lost_entries_sample(lost) for name, lost in lost_by_probe.items()}
    samples["psi"] = Sample(node={base.PSI_CPU_SOME_US: 100_000.0})
    result = aggregate(samples, Owners(by_cgroup_id={1: TRAINER}), 1.0, 2)
    assert result.measured == measured, case
    assert len(result.pods) == pod_rows, case
    assert result.metrics.bpf_lost_entries == sum(lost_by_probe.values()), case
    assert result.metrics.interference_index == interference_index(
        asdict(result.metrics), IndexReferences(), measured
    ), case
