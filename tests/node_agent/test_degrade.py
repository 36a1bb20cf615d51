"""The degrader (node_agent.degrade) on real cgroups: who is degraded, when, how far, when
it is put back, dry run, rate limit, opt-in, and restoring after a restart.

The pods' cgroups are real (a unique ``kubepods/<qos>/pod<uid>`` tree in the v2 hierarchy
and in the v1 ``cpu`` and ``memory`` hierarchies where those are mounted, as on this
hybrid host), so the knobs found and the values written are the kernel's; the reports
are built here, interval by interval. ``test_degrading_relieves_the_victim`` closes the
loop with real workloads and probes.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from interference.signals import NodeReport
from interference_infra.strict import SettingsError
from node_agent import cli
from node_agent.agent import Agent
from node_agent.cgroup_knobs import PodCgroups, read_knob
from node_agent.degrade import (
    REASON_DEGRADED,
    REASON_RESTORED,
    REASON_WOULD_DEGRADE,
    REASON_WOULD_RESTORE,
    DegradeMetrics,
    Degrader,
    DegradeSettings,
)
from node_agent.kubelet_pods import degradable_of_node
from node_agent.pods import StaticPodDirectory
from node_agent.probes.base import ProbeContext
from node_agent.settings import AgentSettings
from tests.node_agent.bpf_workloads import BUSY_LOOP, many_started_in, require_root, started_in
from tests.node_agent.degrade_cgroups import (
    CTX,
    NS,
    RecordedEvents,
    Tree,
    contended,
    pod_cgroups,
    quiet,
)
from tests.node_agent.own_cgroups import cgroup_tree, unique_name


@pytest.fixture
def tree() -> Iterator[Tree]:
    require_root()
    with pod_cgroups() as made:
        yield made


def degrader(
    tree: Tree, tmp_path: Path, events: RecordedEvents, **settings: object
) -> tuple[Degrader, CollectorRegistry]:
    registry = CollectorRegistry()
    chosen = DegradeSettings(
        **{  # type: ignore[arg-type]
            "enabled": True,
            "dry_run": False,
            "min_degraded_s": 30.0,
            "state_file": str(tmp_path / "degraded.json"),
            **settings,
        }
    )
    cgroups = PodCgroups(ProbeContext(cgroup_root=tree.root))
    return Degrader(chosen, cgroups, events, DegradeMetrics(registry)), registry


def run(d: Degrader, report: NodeReport, intervals: int, start: float) -> float:
    for i in range(intervals):
        d.observe(report, start + i)
    return start + intervals


def actions(registry: CollectorRegistry, action: str, resource: str) -> float:
    value = registry.get_sample_value(
        "interference_agent_degrade_actions_total", {"action": action, "resource": resource}
    )
    return value or 0.0


def test_cpu_antagonist_degraded_after_sustained_contention_and_restored(
    tree: Tree, tmp_path: Path
) -> None:
    events = RecordedEvents()
    d, registry = degrader(tree, tmp_path, events)
    knob = PodCgroups(ProbeContext(cgroup_root=tree.root)).knob(tree.uids["hog"], "cpu")
    assert knob is not None, "no cpu knob: neither v2 cpu.weight nor v1 cpu.shares"
    original = read_knob(knob)

    now = run(d, contended(tree), 4, 1000.0)
    assert read_knob(knob) == original and not events.events  # not yet sustained
    now = run(d, contended(tree), 1, now)
    lowered = "1" if knob.file == "cpu.weight" else "10"
    assert read_knob(knob) == lowered
    [(key, reason, message, warning)] = events.events
    assert (key, reason, warning) == (f"{NS}/hog", REASON_DEGRADED, True)
    assert f"{knob.file} {original} → {lowered}" in message
    assert "degrade/victim 600 ms/s" in message and "5 intervals" in message
    assert actions(registry, "degraded", "cpu") == 1
    assert registry.get_sample_value("interference_agent_degraded_pods", {"resource": "cpu"}) == 1

    # Contention ends: restored only after 10 quiet intervals and the least hold time.
    now = run(d, quiet(tree), 10, now)
    assert read_knob(knob) == lowered, "restored before min_degraded_s"
    now = run(d, quiet(tree), 20, now + 20)
    assert read_knob(knob) == original
    assert events.reasons()[-1] == (f"{NS}/hog", REASON_RESTORED)
    assert actions(registry, "restored", "cpu") == 1
    assert registry.get_sample_value("interference_agent_degraded_pods", {"resource": "cpu"}) == 0


def test_dry_run_writes_nothing_and_says_what_it_would_do(tree: Tree, tmp_path: Path) -> None:
    events = RecordedEvents()
    d, registry = degrader(tree, tmp_path, events, dry_run=True)
    knob = PodCgroups(ProbeContext(cgroup_root=tree.root)).knob(tree.uids["hog"], "cpu")
    assert knob is not None
    original = read_knob(knob)
    now = run(d, contended(tree), 8, 0.0)
    run(d, quiet(tree), 40, now + 60)
    assert read_knob(knob) == original
    assert [r for _, r in events.reasons()] == [REASON_WOULD_DEGRADE, REASON_WOULD_RESTORE]
    assert "dry run: would set" in events.events[0][2]
    assert actions(registry, "would_degrade", "cpu") == 1
    assert actions(registry, "degraded", "cpu") == 0
    assert not (tmp_path / "degraded.json").exists()


def test_only_opted_in_pods_are_degraded(tree: Tree, tmp_path: Path) -> None:
    """A Burstable culprit is left alone unless annotated degradable."""
    events = RecordedEvents()
    d, _ = degrader(tree, tmp_path, events)
    run(d, contended(tree, culprit="batch"), 20, 0.0)
    assert events.events == []
    d.opted_in = lambda uid: uid == tree.uids["batch"]
    run(d, contended(tree, culprit="batch"), 5, 100.0)
    assert events.reasons() == [(f"{NS}/batch", REASON_DEGRADED)]


def test_a_pod_throttled_by_its_own_limit_is_no_victim(tree: Tree, tmp_path: Path) -> None:
    events = RecordedEvents()
    d, _ = degrader(tree, tmp_path, events)
    report = contended(tree)
    throttled = replace(report.pods[0], throttled_ms_per_s=900.0, cpu_ms_per_s=50.0)
    run(d, replace(report, pods=[throttled, *report.pods[1:]]), 20, 0.0)
    assert events.events == []


def test_rate_limit_holds_the_second_antagonist(tree: Tree, tmp_path: Path) -> None:
    events = RecordedEvents()
    d, _ = degrader(tree, tmp_path, events, max_degrades_per_window=1, window_s=120.0)
    now = run(d, contended(tree, culprit="hog"), 5, 0.0)
    assert events.reasons() == [(f"{NS}/hog", REASON_DEGRADED)]
    # hog2 becomes the antagonist at once; it waits for the window to pass.
    now = run(d, contended(tree, culprit="hog2"), 30, now)
    assert [key for key, _ in events.reasons()].count(f"{NS}/hog2") == 0
    run(d, contended(tree, culprit="hog2"), 100, now)
    assert (f"{NS}/hog2", REASON_DEGRADED) in events.reasons()


def test_memory_antagonist_gets_a_ceiling_under_reclaim_stall(tree: Tree, tmp_path: Path) -> None:
    events = RecordedEvents()
    d, registry = degrader(tree, tmp_path, events)
    knob = PodCgroups(ProbeContext(cgroup_root=tree.root)).knob(tree.uids["hog"], "memory")
    if knob is None:
        pytest.skip("no memory controller in v2 or v1 here")
    original = read_knob(knob)
    run(d, contended(tree, culprit="system", reclaim_stall=4.9), 10, 0.0)
    assert read_knob(knob) == original  # below the 5 ms/s threshold
    run(d, contended(tree, culprit="system", reclaim_stall=12.0), 5, 20.0)
    # Empty test cgroups use no memory: the ceiling is the floor.
    assert int(read_knob(knob)) == 64 * 1024 * 1024
    assert events.reasons() == [(f"{NS}/hog", REASON_DEGRADED)]
    assert "stalled in reclaim 12.0 ms/s" in events.events[0][2]
    assert actions(registry, "degraded", "memory") == 1


def test_a_restarted_agent_restores_what_it_wrote(tree: Tree, tmp_path: Path) -> None:
    events = RecordedEvents()
    d, _ = degrader(tree, tmp_path, events)
    knob = PodCgroups(ProbeContext(cgroup_root=tree.root)).knob(tree.uids["hog"], "cpu")
    assert knob is not None
    original = read_knob(knob)
    run(d, contended(tree), 5, 0.0)
    assert read_knob(knob) != original
    # The agent dies here; the next one finds the state file.
    after, _ = degrader(tree, tmp_path, RecordedEvents())
    assert after.restore_saved() == [f"{NS}/hog"]
    assert read_knob(knob) == original
    assert after.restore_saved() == []


def test_settings_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="cpu weight"):
        DegradeSettings(cpu_weight=0)
    with pytest.raises(ValueError, match="memory ratio"):
        DegradeSettings(memory_ratio=1.5)
    with pytest.raises(ValueError, match="sustain intervals"):
        DegradeSettings(sustain_intervals=0)
    assert DegradeSettings().enabled is False and DegradeSettings().dry_run is True
    assert os.path.basename(DegradeSettings().state_file) == "degraded.json"


def test_opt_in_is_read_from_the_kubelets_pod_list() -> None:
    def item(uid: str, node: str, annotations: dict[str, str] | None) -> dict[str, object]:
        metadata: dict[str, object] = {"uid": uid, "namespace": NS, "name": uid}
        if annotations is not None:
            metadata["annotations"] = annotations
        return {"metadata": metadata, "spec": {"nodeName": node}}

    body = {
        "items": [
            item("a", "n1", {"interference.io/degradable": "true"}),
            item("b", "n1", {"interference.io/degradable": " TRUE "}),
            item("c", "n1", {"interference.io/degradable": "false"}),
            item("d", "n1", None),
            item("e", "n2", {"interference.io/degradable": "true"}),
            item("f", "n1", {"interference.io/degradable": "yes"}),  # as the scheduler reads it
            item("g", "n1", {"interference.io/degradable": "1"}),
            item("h", "n1", {"interference.io/degradable": "si"}),  # the scheduler warns
            "not a pod",
        ]
    }
    assert degradable_of_node(body, "n1") == {"a", "b", "f", "g"}
    assert degradable_of_node({"items": "x"}, "n1") == frozenset()
    static = StaticPodDirectory({"A": (NS, "a")}, degradable=frozenset({"A"}))
    assert static.degradable("a") and not static.degradable("b")


def test_degrade_flag(tmp_path: Path) -> None:
    environ = {"NODE_NAME": "n1"}
    args = cli.parser(environ).parse_args([])
    assert cli.degrade_settings(args, environ) == DegradeSettings()
    args = cli.parser(environ).parse_args(["--degrade", "enforce", "--degrade-victim-wait", "50"])
    chosen = cli.degrade_settings(args, {"DEGRADE_RECLAIM_STALL_MS_PER_S": "8"})
    assert (chosen.enabled, chosen.dry_run) == (True, False)
    assert (chosen.victim_wait_ms_per_s, chosen.reclaim_stall_ms_per_s) == (50.0, 8.0)
    dry = cli.degrade_settings(cli.parser({"DEGRADE": "dry-run"}).parse_args([]), {})
    assert (dry.enabled, dry.dry_run) == (True, True)
    with pytest.raises(SettingsError, match="--degrade/DEGRADE must be one of"):
        cli.degrade_settings(cli.parser(environ).parse_args(["--degrade", "yes"]), environ)
    with pytest.raises(SettingsError, match="DEGRADE_RECLAIM_STALL_MS_PER_S"):
        cli.degrade_settings(args, {"DEGRADE_RECLAIM_STALL_MS_PER_S": "-1"})


@pytest.mark.bpf
@pytest.mark.slow
def test_degrading_relieves_the_victim(tmp_path: Path) -> None:
    """Real agent, real probes, real workloads: an opted-in pod's two busy loops share a
    CPU with a sibling victim's; the agent names the culprit, lowers its CPU share, and
    the victim's wait behind it and the hog's CPU time fall.

    Siblings: a CPU share weighs a pod against the other pods of its parent (its QoS
    class's cgroup), so both are Burstable pods here, and the hog opted in."""
    require_root()
    cpus = sorted(os.sched_getaffinity(0))
    v1_cpu = Path(CTX.cgroup_v1_mount, "cpu")
    v2_has_cpu = "cpu" in Path(CTX.cgroup_v2_mount, "cgroup.controllers").read_text().split()
    if not (v1_cpu / "tasks").exists() and not v2_has_cpu:
        pytest.skip("no cpu controller to degrade with")
    top = unique_name("intf-test-degrade-loop")
    uids = {"hog": str(uuid.uuid4()), "victim": str(uuid.uuid4())}
    with ExitStack() as stack:
        v2 = stack.enter_context(cgroup_tree(CTX.cgroup_v2_mount, f"{top}/kubepods/burstable"))
        procs: dict[str, list[Path]] = {name: [] for name in uids}
        if v2_has_cpu:
            for level in (v2.parent.parent, v2.parent, v2):
                (level / "cgroup.subtree_control").write_text("+cpu")
        else:
            v1 = stack.enter_context(cgroup_tree(str(v1_cpu), f"{top}/kubepods/burstable"))
            for name, uid in uids.items():
                (v1 / f"pod{uid}").mkdir()
                procs[name].append(v1 / f"pod{uid}" / "cgroup.procs")
        for name, uid in uids.items():
            (v2 / f"pod{uid}").mkdir()
            procs[name].append(v2 / f"pod{uid}" / "cgroup.procs")
        settings = AgentSettings(
            node_name="n1",
            probes=("runqlat", "cpu_throttle"),
            cgroup_root=f"/{top}",
            kubernetes=False,
            ncpu=len(cpus),
            http_port=0,
            degrade=DegradeSettings(
                enabled=True,
                dry_run=False,
                sustain_intervals=3,
                state_file=str(tmp_path / "degraded.json"),
            ),
        )
        events = RecordedEvents()
        directory = StaticPodDirectory(
            {uid: (NS, name) for name, uid in uids.items()}, degradable=frozenset({uids["hog"]})
        )
        agent = Agent(settings, directory, events=events)
        agent.start()
        stack.callback(agent.close)
        assert agent.degrader is not None
        stack.enter_context(many_started_in(2, procs["hog"], BUSY_LOOP, cpus[0]))
        stack.enter_context(started_in(procs["victim"], BUSY_LOOP, cpus[0]))
        time.sleep(1.0)
        agent.measure()
        before: list[tuple[float, float]] = []
        after: list[tuple[float, float]] = []
        for _ in range(14):
            time.sleep(0.5)
            report = agent.measure()
            degraded = bool(agent.degrader.held)  # during this report's interval
            agent.degrade(report)
            rows = {p.key: p for p in report.pods}
            if f"{NS}/hog" in rows and f"{NS}/victim" in rows:
                blamed = dict(rows[f"{NS}/victim"].culprits).get(f"{NS}/hog", 0.0)
                sample = (blamed, rows[f"{NS}/hog"].cpu_ms_per_s)
                (after if degraded else before).append(sample)
        print(f"before {before}\nafter {after}\nevents {events.events}")
        assert (f"{NS}/hog", REASON_DEGRADED) in events.reasons()
        assert len(before) >= 3 and len(after) >= 4

        def mean(samples: list[tuple[float, float]], i: int) -> float:
            return sum(s[i] for s in samples) / len(samples)

        # The first interval after the write holds a little of the old share: left out.
        assert mean(after[1:], 0) < mean(before, 0) / 4, "the victim still waits behind it"
        assert mean(after[1:], 1) < mean(before, 1) / 4, "the hog kept its CPU"
        agent.close()
        knob = PodCgroups(ProbeContext(cgroup_root=f"/{top}")).knob(uids["hog"], "cpu")
        assert knob is not None and read_knob(knob) in ("100", "1024")  # restored at stop
