"""What the degrader changed survives its agent (node_agent/degrade.py,
node_agent/degrade_state.py), on real cgroups with real processes killed.

An agent's degrader runs in a child process (degrade_crash_child.py) that SIGKILLs itself
at one step of degrading or restoring; the next start is the real agent
(``python -m node_agent.cli --once``), degrading or not. After a kill at any step the
original value is on disk or still in the cgroup file, the next agent puts it back, and
the agent after that records the true original, never the degraded value. A crash-looping
agent degrades no more often than the rate limit allows. The state file's format is
checked as the untrusted input it is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from node_agent.cgroup_knobs import Knob, PodCgroups, read_knob, write_knob
from node_agent.degrade import (
    REASON_DEGRADE_FAILED,
    REASON_DEGRADED,
    REASON_RESTORED,
    DegradeMetrics,
    Degrader,
    DegradeSettings,
)
from node_agent.degrade_state import (
    DegradeState,
    Entry,
    StateUnreadable,
    left_degraded,
    load_state,
    parse_state,
    save_state,
)
from node_agent.probes.base import ProbeContext
from tests.node_agent.bpf_workloads import require_root
from tests.node_agent.degrade_cgroups import NS, RecordedEvents, Tree, contended, pod_cgroups

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree() -> Iterator[Tree]:
    require_root()
    with pod_cgroups() as made:
        yield made


def hog_knob(tree: Tree) -> Knob:
    knob = PodCgroups(ProbeContext(cgroup_root=tree.root)).knob(tree.uids["hog"], "cpu")
    assert knob is not None, "no cpu knob: neither v2 cpu.weight nor v1 cpu.shares"
    return knob


def lowered(knob: Knob) -> str:
    return "1" if knob.file == "cpu.weight" else "10"


def crashing_agent(
    tree: Tree, state: Path, kill: str = "", contended: int = 5, quiet: int = 0, **settings: Any
) -> subprocess.CompletedProcess[str]:
    """degrade_crash_child.py killing itself at ``kill`` (none: it stops cleanly)."""
    config = {
        "root": tree.root,
        "uids": tree.uids,
        "qos": tree.qos,
        "state_file": str(state),
        "kill": kill,
        "contended": contended,
        "quiet": quiet,
        "settings": settings,
    }
    return subprocess.run(
        [sys.executable, "-m", "tests.node_agent.degrade_crash_child", json.dumps(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def printed_reasons(child: subprocess.CompletedProcess[str]) -> list[str]:
    return [json.loads(line)[1] for line in child.stdout.splitlines()]


def real_agent_starts(tree: Tree, state: Path, degrade: str) -> str:
    """The agent itself, once (start, one interval, clean stop); returns its log."""
    agent = subprocess.run(
        [
            sys.executable,
            "-m",
            "node_agent.cli",
            "--once",
            "--no-kubernetes",
            "--probes",
            "psi",
            "--interval",
            "0.1",
            "--cgroup-root",
            tree.root,
            "--degrade",
            degrade,
            "--degrade-state-file",
            str(state),
        ],
        cwd=REPO,
        env={**os.environ, "NODE_NAME": "n1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert agent.returncode == 0, agent.stderr
    return agent.stderr


def listed(state: Path) -> list[dict[str, Any]]:
    """The state file's entries, read without the code under test (either format)."""
    if not state.exists():
        return []
    raw = json.loads(state.read_text())
    return list(raw if isinstance(raw, list) else raw["degraded"])


CRASHES = [
    # (the step it dies at, the cgroup file holds the degraded value, the state lists it)
    ("recording", False, False),
    ("recorded", False, True),
    ("written", True, True),
    ("restoring", False, True),
    ("restore-recording", False, True),
]


@pytest.mark.slow
@pytest.mark.parametrize("next_start", ["off", "enforce"])
@pytest.mark.parametrize(("kill", "left_degraded", "left_listed"), CRASHES)
def test_a_kill_at_any_step_loses_nothing(
    tree: Tree,
    tmp_path: Path,
    kill: str,
    left_degraded: bool,
    left_listed: bool,
    next_start: str,
) -> None:
    knob = hog_knob(tree)
    original, degraded = read_knob(knob), lowered(knob)
    state = tmp_path / "degraded.json"

    first = crashing_agent(tree, state, kill=kill, quiet=10)
    assert first.returncode == -signal.SIGKILL, f"never reached {kill}: {first.stderr}"
    assert read_knob(knob) == (degraded if left_degraded else original)
    temporary = [n for n in os.listdir(tmp_path) if n != "degraded.json"]
    assert bool(temporary) == kill.endswith("recording"), temporary
    expected = [{"path": knob.path, "original": original, "written": degraded}]
    assert [{k: e[k] for k in ("path", "original", "written")} for e in listed(state)] == (
        expected if left_listed else []
    )

    # The next agent, degrading or not, puts back what is left and clears the record.
    log = real_agent_starts(tree, state, next_start)
    assert read_knob(knob) == original
    assert listed(state) == []
    assert [n for n in os.listdir(tmp_path) if n != "degraded.json"] == []
    restored = f"restored what a previous run degraded: {NS}/hog" in log
    assert restored == left_degraded, log

    # The one after that records the true original before it writes, never the degraded
    # value (killed once the record is on disk).
    after = crashing_agent(tree, state, kill="recorded")
    assert after.returncode == -signal.SIGKILL, after.stderr
    assert [(e["original"], e["written"]) for e in listed(state)] == [(original, degraded)]
    assert read_knob(knob) == original


@pytest.mark.slow
def test_a_crash_looping_agent_degrades_no_more_than_the_rate_limit(
    tree: Tree, tmp_path: Path
) -> None:
    """Six agents in a row, each killed right after it degrades: two per window, as
    ``max_degrades_per_window`` says, and each next one puts the last one's write back."""
    knob = hog_knob(tree)
    original = read_knob(knob)
    state = tmp_path / "degraded.json"
    killed = 0
    for _ in range(6):
        child = crashing_agent(tree, state, kill="written", contended=20, max_degrades_per_window=2)
        assert child.returncode in (0, -signal.SIGKILL), child.stderr
        killed += child.returncode == -signal.SIGKILL
        assert REASON_DEGRADED not in printed_reasons(child)  # killed before its Event
    assert killed == 2
    assert len(json.loads(state.read_text())["recent"]) == 2
    assert read_knob(knob) == original and listed(state) == []


def degrader(
    tree: Tree, state: str, events: RecordedEvents, **settings: Any
) -> tuple[Degrader, CollectorRegistry]:
    registry = CollectorRegistry()
    chosen = DegradeSettings(enabled=True, dry_run=False, state_file=state, **settings)
    cgroups = PodCgroups(ProbeContext(cgroup_root=tree.root))
    return Degrader(chosen, cgroups, events, DegradeMetrics(registry)), registry


def run(d: Degrader, intervals: int, tree: Tree) -> None:
    for i in range(intervals):
        d.observe(contended(tree), 1000.0 + i)


def test_the_write_is_refused_when_the_original_cannot_be_recorded(
    tree: Tree, tmp_path: Path
) -> None:
    knob = hog_knob(tree)
    original = read_knob(knob)
    (tmp_path / "a-file").write_text("")
    events = RecordedEvents()
    d, registry = degrader(tree, str(tmp_path / "a-file" / "degraded.json"), events)
    run(d, 5, tree)
    assert read_knob(knob) == original
    [(key, reason, message, warning)] = events.events
    assert (key, reason, warning) == (f"{NS}/hog", REASON_DEGRADE_FAILED, True)
    assert "could not be recorded" in message and "nothing was written" in message
    labels = {"action": "failed", "resource": "cpu"}
    assert registry.get_sample_value("interference_agent_degrade_actions_total", labels) == 1
    assert not d.held


def test_an_unreadable_state_file_is_kept_and_nothing_is_degraded(
    tree: Tree, tmp_path: Path
) -> None:
    knob = hog_knob(tree)
    original = read_knob(knob)
    state = tmp_path / "degraded.json"
    state.write_text('{"version": 2, "degraded": [')
    events = RecordedEvents()
    d, _ = degrader(tree, str(state), events)
    assert d.restore_saved() == []
    run(d, 5, tree)
    assert read_knob(knob) == original
    assert events.reasons() == [(f"{NS}/hog", REASON_DEGRADE_FAILED)]
    assert "unreadable" in events.events[0][2]
    assert state.read_text() == '{"version": 2, "degraded": ['


def entry(knob: Knob, original: str, written: str) -> Entry:
    return Entry("u", NS, "hog", knob.resource, knob.path, original, written)


def test_what_cannot_be_put_back_stays_recorded_and_is_not_degraded_again(
    tree: Tree, tmp_path: Path
) -> None:
    """A write the kernel refuses (``max`` is no CPU share) while the cgroup is
    there: the entry stays, the knob is not degraded over it; a file someone else changed
    since (the kubelet) is left alone and dropped."""
    knob = hog_knob(tree)
    now = read_knob(knob)
    victim = PodCgroups(ProbeContext(cgroup_root=tree.root)).knob(tree.uids["victim"], "cpu")
    assert victim is not None
    write_knob(victim, "77" if knob.file == "cpu.weight" else "777")
    state = tmp_path / "degraded.json"
    refused = entry(knob, "max", now)
    save_state(str(state), DegradeState([refused, entry(victim, "100", "1")], [1.0]))
    events = RecordedEvents()
    d, _ = degrader(tree, str(state), events)
    assert d.restore_saved() == []
    assert read_knob(victim) in ("77", "777")
    loaded = load_state(str(state))
    assert loaded is not None and loaded.entries == [refused]
    run(d, 5, tree)
    assert read_knob(knob) == now
    assert events.reasons() == [(f"{NS}/hog", REASON_DEGRADE_FAILED)]
    assert "could not put it back" in events.events[0][2]


def test_a_restarted_degrader_takes_over_the_rate_limit(tree: Tree, tmp_path: Path) -> None:
    """In one process: the times kept with the state hold the next degrader back."""
    state = str(tmp_path / "degraded.json")
    first, _ = degrader(tree, state, RecordedEvents())
    run(first, 5, tree)
    events = RecordedEvents()
    second, _ = degrader(tree, state, events, max_degrades_per_window=1)
    assert second.restore_saved() == [f"{NS}/hog"]
    run(second, 30, tree)
    assert events.reasons() == [(f"{NS}/hog", REASON_RESTORED)]


GOOD = '{"uid": "u", "namespace": "ns", "name": "p", "resource": "cpu", "original": "100"'


def state_text(path: str, written: str = "1", recent: str = "[1.5]") -> str:
    return (
        f'{{"version": 2, "degraded": [{GOOD}, "path": "{path}", "written": "{written}"}}], '
        f'"recent": {recent}}}'
    )


V2_WEIGHT = "/sys/fs/cgroup/kubepods/podu/cpu.weight"


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        (state_text(V2_WEIGHT), ""),
        (f'[{GOOD}, "path": "{V2_WEIGHT}", "written": "1"}}]', ""),  # the first release's
        ("[]", ""),
        (state_text("/etc/passwd"), "not a pod's cpu or memory knob"),
        (state_text("/sys/fs/cgroup/../../etc/cpu.weight"), "not a pod's cpu or memory knob"),
        (state_text("cpu.weight"), "not a pod's cpu or memory knob"),
        (state_text("/sys/fs/cgroup/p/memory.high"), "does not hold 'cpu'"),
        (state_text(V2_WEIGHT, written="1; reboot"), "not a knob value"),
        (state_text(V2_WEIGHT, recent='["x"]'), "other than a time"),
        (state_text(V2_WEIGHT, recent="[NaN]"), "not finite"),
        ('{"version": 3, "degraded": []}', "neither a list nor a version 2"),
        ('{"version": 2, "degraded": [' + ", ".join(["{}"] * 5000) + "]}", "at most 4096"),
        ("x" * (1 << 21), "over"),
        ("{", "not JSON"),
    ],
)
def test_the_state_file_is_checked(text: str, refused: str) -> None:
    if refused:
        with pytest.raises(StateUnreadable, match=refused):
            parse_state(text)
    else:
        assert all(e.path == V2_WEIGHT for e in parse_state(text).entries)


def test_the_state_file_is_replaced_whole_and_stale_copies_removed(tmp_path: Path) -> None:
    path = str(tmp_path / "state" / "degraded.json")
    knob = Knob("memory", "/sys/fs/cgroup/kubepods/podu/memory.high")
    saved = DegradeState([entry(knob, "max", "67108864")], [10.0, 5.0])
    save_state(path, saved)
    stale = tmp_path / "state" / ".degraded.json.tmp.abc"
    stale.write_text("half")
    assert load_state(path) == DegradeState(saved.entries, [5.0, 10.0])
    assert os.listdir(tmp_path / "state") == ["degraded.json"]
    assert load_state(str(tmp_path / "none.json")) is None
    assert left_degraded(path) and not left_degraded(str(tmp_path / "none.json"))
    save_state(path, DegradeState([], [10.0]))
    assert not left_degraded(path)
