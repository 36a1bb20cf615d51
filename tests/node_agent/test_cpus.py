"""CPU count of the measured subtree: cpu-list parsing, the cpuset lookup over fake and
real cgroupfs, and the agent dividing the run-queue wait ratio by it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from node_agent.agent import Agent
from node_agent.cpus import V1_EFFECTIVE_CPUS, V2_EFFECTIVE_CPUS, parse_cpu_list, subtree_cpus
from node_agent.pods import StaticPodDirectory
from node_agent.settings import AgentSettings, detect_cgroup_v2_mount
from tests.node_agent.own_cgroups import process_in, remove_tree, unique_name


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0", {0}),
        ("0-3", {0, 1, 2, 3}),
        ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}),
        ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}),
        (" 1 , 3-4 ", {1, 3, 4}),
        ("2-2", {2}),
        ("0-1,1-2", {0, 1, 2}),
        ("", set()),
        ("\n", set()),
        ("5,", {5}),
    ],
)
def test_parse_cpu_list(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "1-2-3", "0x1", "1;2", "1 2"])
def test_parse_cpu_list_rejects_what_is_not_a_cpu_list(text: str) -> None:
    with pytest.raises(ValueError, match="cpu"):
        parse_cpu_list(text)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    ("files", "root", "count", "source"),
    [
        # v2: the root's own file, else the nearest ancestor's (controller not enabled below)
        ({f"v2/a/b/{V2_EFFECTIVE_CPUS}": "0-3,6"}, "/a/b", 5, f"v2/a/b/{V2_EFFECTIVE_CPUS}"),
        ({f"v2/a/{V2_EFFECTIVE_CPUS}": "1"}, "/a/b/c", 1, f"v2/a/{V2_EFFECTIVE_CPUS}"),
        ({f"v2/{V2_EFFECTIVE_CPUS}": "0-7"}, "/", 8, f"v2/{V2_EFFECTIVE_CPUS}"),
        # hybrid: no v2 cpuset, the v1 cpuset controller's file
        ({f"v1/cpuset/a/{V1_EFFECTIVE_CPUS}": "2-3"}, "/a", 2, f"v1/cpuset/a/{V1_EFFECTIVE_CPUS}"),
        (
            {f"v1/cpuset/{V1_EFFECTIVE_CPUS}": "0-15", f"v1/cpuset/a/{V1_EFFECTIVE_CPUS}": "4"},
            "/a/missing",
            1,
            f"v1/cpuset/a/{V1_EFFECTIVE_CPUS}",
        ),
        # an empty v1 cpuset (no CPUs assigned yet) defers to its parent
        (
            {f"v1/cpuset/{V1_EFFECTIVE_CPUS}": "0-1", f"v1/cpuset/a/{V1_EFFECTIVE_CPUS}": "\n"},
            "/a",
            2,
            f"v1/cpuset/{V1_EFFECTIVE_CPUS}",
        ),
        # v2 wins over v1 when both have a file
        (
            {f"v2/a/{V2_EFFECTIVE_CPUS}": "0-2", f"v1/cpuset/a/{V1_EFFECTIVE_CPUS}": "0"},
            "/a",
            3,
            f"v2/a/{V2_EFFECTIVE_CPUS}",
        ),
    ],
)
def test_subtree_cpus_reads_the_nearest_cpuset(
    tmp_path: Path, files: dict[str, str], root: str, count: int, source: str
) -> None:
    for name, text in files.items():
        write(tmp_path / name, text)
    found = subtree_cpus(root, str(tmp_path / "v2"), str(tmp_path / "v1"))
    assert found.count == count
    assert found.source.startswith(str(tmp_path / source))


def test_without_any_cpuset_file_the_host_count_is_used(tmp_path: Path) -> None:
    found = subtree_cpus("/a", str(tmp_path / "v2"), str(tmp_path / "v1"))
    assert found.count == os.cpu_count()
    assert "host" in found.source


def test_ncpu_setting_overrides_the_cpuset(tmp_path: Path) -> None:
    write(tmp_path / "v2" / V2_EFFECTIVE_CPUS, "0-7")
    mounts = {"cgroup_v2_mount": str(tmp_path / "v2"), "cgroup_v1_mount": str(tmp_path / "v1")}
    assert AgentSettings(node_name="n", **mounts).cpus().count == 8
    assert AgentSettings(node_name="n", ncpu=3, **mounts).cpus().count == 3
    with pytest.raises(ValueError, match="ncpu"):
        AgentSettings(node_name="n", ncpu=0)


V1_CPUSET = "/sys/fs/cgroup/cpuset"
V2_MOUNT = detect_cgroup_v2_mount()
needs_v1_cpuset = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(f"{V1_CPUSET}/{V1_EFFECTIVE_CPUS}"),
    reason="needs root and a cgroup v1 cpuset controller at /sys/fs/cgroup/cpuset",
)


@contextmanager
def one_cpu_partition() -> Iterator[str]:
    """A fresh v1 cpuset cgroup limited to CPU 0 and the v2 cgroup of the same path
    (as the demo's nodes are); yields the path, the agent's ``--cgroup-root``."""
    name = unique_name("intf-test-h")
    cpuset = Path(V1_CPUSET, name)
    v2 = Path(V2_MOUNT, name)
    try:
        cpuset.mkdir()
        (cpuset / "cpuset.cpus").write_text("0")
        (cpuset / "cpuset.mems").write_text(Path(V1_CPUSET, "cpuset.mems").read_text().strip())
        v2.mkdir()
        yield f"/{name}"
    finally:
        remove_tree(cpuset)
        remove_tree(v2)


@needs_v1_cpuset
def test_agent_divides_by_the_cpus_of_a_real_one_cpu_cpuset() -> None:
    """Two busy loops in a one-CPU cpuset: the agent (taskstats, no BPF needed) divides
    their wait by 1 CPU, so the ratio is their wait per second (≈ 1, one loop always
    waiting), not half of it as the host's 2 CPUs would give."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("the host must have more CPUs than the cpuset for this to tell")
    with one_cpu_partition() as root:
        settings = AgentSettings(node_name="n", cgroup_root=root, probes=("taskstats",))
        assert settings.cpus().count == 1
        name = root.strip("/")
        procs = [Path(V1_CPUSET, name, "cgroup.procs"), Path(V2_MOUNT, name, "cgroup.procs")]
        loops = "sh -c 'while :; do :; done' & sh -c 'while :; do :; done' & wait"
        with process_in(procs, loops):
            wait_for_tasks(Path(V2_MOUNT, name), 3)  # the two loops and their shell
            agent = Agent(settings, StaticPodDirectory())
            assert agent.ncpu == 1
            agent.start()
            try:
                assert agent.running_probes == ["taskstats"], agent.disabled_probes
                time.sleep(1.5)
                report = agent.measure()
            finally:
                agent.close()
    wait_ms_per_s = sum(p.runq_wait_ms_per_s for p in report.pods)
    assert report.metrics.runq_wait_ratio == pytest.approx(wait_ms_per_s / 1000 / 1)
    # One of the two loops waits whenever the other runs: ≈ 1 waiting task per CPU-second
    # (more when other work shares CPU 0); the host's 2 CPUs would halve it to ≈ 0.5.
    assert report.metrics.runq_wait_ratio > 0.75


def wait_for_tasks(cgroup: Path, at_least: int) -> None:
    deadline = time.monotonic() + 10
    while len((cgroup / "cgroup.procs").read_text().split()) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {at_least} processes joined {cgroup}")
        time.sleep(0.05)
