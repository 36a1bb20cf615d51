"""The BPF probes' machinery (node_agent/probes/bpf/): source lookup, prerequisite checks
and their messages, per-CPU sums, cgroup scoping, and the registry wiring of the two BPF
probes."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from interference import hist
from node_agent.probes import base, reclaim, runqlat
from node_agent.probes.base import ProbeContext, ProbeUnavailable
from node_agent.probes.bpf import compiler, loaded_program, prerequisites
from node_agent.probes.bpf.cgroup_probe import sum_per_cpu
from node_agent.probes.bpf.cgroup_scope import CgroupScope
from node_agent.probes.bpf.compiler import describe_u64_struct
from node_agent.probes.bpf.loaded_program import possible_cpus
from node_agent.probes.bpf.prerequisites import (
    CAP_BPF,
    CAP_PERFMON,
    CAP_SYS_ADMIN,
    HostPaths,
    check_kernel_headers,
    check_privileges,
    check_tracepoints,
    effective_capabilities,
)
from node_agent.probes.bpf.sources import (
    BPF_DIR_ENV,
    default_bpf_dir,
    read_program,
    resolve_source_dir,
)
from tests.node_agent.own_cgroups import cgroup_tree, kernel_cgroup_id, unique_name


def test_source_dir_prefers_context_then_environment_then_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(BPF_DIR_ENV, raising=False)
    assert resolve_source_dir(ProbeContext()) == default_bpf_dir()
    assert (default_bpf_dir() / "runqlat.bpf.c").is_file()
    monkeypatch.setenv(BPF_DIR_ENV, str(tmp_path / "env"))
    assert resolve_source_dir(ProbeContext()) == tmp_path / "env"
    ctx = ProbeContext(bpf_source_dir=str(tmp_path / "ctx"))
    assert resolve_source_dir(ctx) == tmp_path / "ctx"


@pytest.mark.parametrize("name", ["runqlat", "reclaim"])
def test_program_text_inlines_the_shared_header(name: str) -> None:
    text = read_program(default_bpf_dir(), name)
    assert '#include "intf.h"' not in text
    assert "struct cgroup_key" in text
    assert "BPF_ARRAY(drain_generation" in text
    assert text.count("#define HIST_SLOTS") == 1


def test_shared_header_histogram_matches_python_histograms() -> None:
    header = (default_bpf_dir() / "intf.h").read_text()
    assert f"#define HIST_SLOTS {hist.MAX_SLOTS}\n" in header


@pytest.mark.parametrize("name", ["runqlat", "reclaim"])
def test_every_map_the_loader_reads_is_declared_by_the_program(name: str) -> None:
    """The map names the loader looks up (``STATS_TABLE``, …) are spelled in the C too:
    a rename on one side only must fail here, not when the agent loads on a node."""
    text = read_program(default_bpf_dir(), name)
    needed = [compiler.STATS_TABLE, compiler.GENERATION_TABLE, compiler.LOST_TABLE]
    if name == "runqlat":  # the one program whose tasks map the loader seeds
        needed.append(compiler.SEEDED_TASKS_TABLE)
    for table in needed:
        assert re.search(rf"^BPF_\w+\(.*\b{table.decode()}\b", text, re.MULTILINE), table


def test_shared_header_lost_entry_kinds_match_the_loader() -> None:
    """The loader reads ``lost_entries`` slot ``parity * LOST_KINDS + kind`` by the same
    kind order as ``LOST_*_ENTRY`` in ``bpf/intf.h``."""
    header = (default_bpf_dir() / "intf.h").read_text()
    defined = dict(re.findall(r"^#define LOST_(\w+)_ENTRY (\d+)", header, re.MULTILINE))
    assert {kind.lower(): int(slot) for kind, slot in defined.items()} == {
        kind: slot for slot, kind in enumerate(loaded_program.LOST_ENTRY_KINDS)
    }
    assert f"#define LOST_KINDS {len(loaded_program.LOST_ENTRY_KINDS)}\n" in header


def test_thread_ids_lists_every_thread_of_every_process(tmp_path: Path) -> None:
    for pid, tids in {"1": ["1", "60"], "42": ["42"], "self": ["7"]}.items():
        for tid in tids:
            (tmp_path / pid / "task" / tid).mkdir(parents=True)
    (tmp_path / "99").mkdir()  # a process that exited while being listed: no task/
    assert sorted(compiler.thread_ids(str(tmp_path))) == [1, 42, 60]
    assert compiler.thread_ids(str(tmp_path / "missing")) == []


def test_a_program_without_a_tasks_map_is_not_seeded() -> None:
    class NoTasks:
        def get_table(self, name: bytes) -> None:
            raise KeyError(name)

    assert compiler.seed_tasks(NoTasks(), "/proc") == 0


@pytest.mark.parametrize("size", ["MAX_TASKS", "MAX_CGROUPS"])
def test_map_sizes_can_be_overridden_by_compiler_flags(size: str) -> None:
    header = (default_bpf_dir() / "intf.h").read_text()
    assert re.search(rf"#ifndef {size}\n(/\*.*\*/\n)?#define {size} \d+\n#endif", header)


def test_missing_source_names_the_directory_and_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ProbeUnavailable, match=f"{tmp_path}.*{BPF_DIR_ENV}"):
        read_program(tmp_path, "runqlat")


def test_missing_header_says_to_copy_the_whole_directory(tmp_path: Path) -> None:
    (tmp_path / "runqlat.bpf.c").write_text('#include "intf.h"\nint x;\n')
    with pytest.raises(ProbeUnavailable, match="whole bpf/ directory"):
        read_program(tmp_path, "runqlat")


@pytest.mark.parametrize(
    ("bits", "allowed"),
    [
        ((), False),
        ((CAP_BPF,), False),
        ((CAP_PERFMON,), False),
        ((CAP_BPF, CAP_PERFMON), True),
        ((CAP_SYS_ADMIN,), True),
    ],
)
def test_privileges(bits: tuple[int, ...], allowed: bool) -> None:
    mask = sum(1 << bit for bit in bits)
    if allowed:
        check_privileges(mask)
    else:
        with pytest.raises(ProbeUnavailable, match=r"CAP_BPF\+CAP_PERFMON \(or root"):
            check_privileges(mask)


def test_capabilities_are_read_from_proc_status(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text("Name:\tx\nCapEff:\t000000c000000000\n")
    assert effective_capabilities(str(tmp_path)) == (1 << CAP_BPF) | (1 << CAP_PERFMON)
    assert effective_capabilities(str(tmp_path / "absent")) == 0


def test_unmounted_tracefs_says_how_to_mount_it(tmp_path: Path) -> None:
    with pytest.raises(ProbeUnavailable, match=f"mount -t tracefs tracefs {tmp_path}"):
        check_tracepoints(str(tmp_path), ["sched:sched_switch"])


def test_missing_tracepoint_is_named(tmp_path: Path) -> None:
    (tmp_path / "events" / "sched" / "sched_switch").mkdir(parents=True)
    (tmp_path / "events" / "sched" / "sched_switch" / "format").write_text("name: x\n")
    check_tracepoints(str(tmp_path), ["sched:sched_switch"])
    with pytest.raises(ProbeUnavailable, match="vmscan:mm_vmscan_throttled is missing"):
        check_tracepoints(str(tmp_path), ["sched:sched_switch", "vmscan:mm_vmscan_throttled"])


def test_missing_kernel_headers_say_what_to_install_or_link(tmp_path: Path) -> None:
    paths = HostPaths(
        modules_root=str(tmp_path), kheaders=str(tmp_path / "none"), kernel_release="6.99-x"
    )
    with pytest.raises(ProbeUnavailable, match=r"install linux-headers-6\.99-x.*build"):
        check_kernel_headers(paths)
    (tmp_path / "6.99-x" / "build").mkdir(parents=True)
    check_kernel_headers(paths)


def test_missing_bcc_module_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bcc", None)  # makes `import bcc` raise ImportError
    with pytest.raises(ProbeUnavailable, match="install python3-bpfcc"):
        prerequisites.import_bcc()


class _Stats(ctypes.Structure):
    _fields_ = [
        ("runq_count", ctypes.c_uint64),
        ("runq_ns", ctypes.c_uint64),
        ("runq_us_slots", ctypes.c_uint64 * 4),
    ]


def test_per_cpu_values_are_summed_field_by_field() -> None:
    per_cpu = (_Stats * 3)()
    per_cpu[0].runq_count, per_cpu[0].runq_ns = 2, 300
    per_cpu[2].runq_count, per_cpu[2].runq_ns = 1, 50
    per_cpu[0].runq_us_slots[1] = 2
    per_cpu[2].runq_us_slots[1] = 1
    per_cpu[2].runq_us_slots[3] = 4
    totals = sum_per_cpu(per_cpu)
    assert totals.counters == {"runq_count": 3, "runq_ns": 350}
    assert totals.slots == {"runq_us_slots": [0, 3, 0, 4]}


class _Mixed(ctypes.Structure):
    _fields_ = [("count", ctypes.c_uint64), ("flag", ctypes.c_uint32)]


def test_stats_layout_is_described_and_non_u64_fields_are_refused() -> None:
    assert describe_u64_struct(_Stats) == [("runq_count", 0), ("runq_ns", 0), ("runq_us_slots", 4)]
    with pytest.raises(ValueError, match="flag is not u64"):
        describe_u64_struct(_Mixed)


@pytest.mark.parametrize(
    ("text", "count"), [("0\n", 1), ("0-1\n", 2), ("0-3,8-11\n", 8), ("0,2,4-5\n", 4)]
)
def test_possible_cpus(tmp_path: Path, text: str, count: int) -> None:
    (tmp_path / "possible").write_text(text)
    assert possible_cpus(str(tmp_path / "possible")) == count


def test_probes_are_registered_under_their_names() -> None:
    factories = base.registered()
    assert factories["runqlat"] is runqlat.RunqlatProbe
    assert factories["reclaim"] is reclaim.ReclaimProbe
    assert isinstance(factories["runqlat"](ProbeContext()), runqlat.RunqlatProbe)


def test_probe_without_tracefs_is_disabled_with_the_reason(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("without root the privilege check answers first")
    ctx = ProbeContext(tracefs=str(tmp_path))
    running, disabled = base.start_probes(["runqlat", "reclaim"], ctx)
    assert running == []
    assert set(disabled) == {"runqlat", "reclaim"}
    for reason in disabled.values():
        assert f"mount -t tracefs tracefs {tmp_path}" in reason


def test_unstarted_probe_collects_nothing_and_closes_twice() -> None:
    probe = runqlat.RunqlatProbe(ProbeContext())
    assert probe.collect() == base.Sample()
    probe.close()
    probe.close()


@pytest.mark.bpf
def test_scope_keeps_the_subtree_by_kernel_cgroup_id() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroups")
    ctx = ProbeContext()
    top = unique_name("intf-test-scope")
    with cgroup_tree(ctx.cgroup_v2_mount, f"{top}/a/b") as inner:
        inside = kernel_cgroup_id(str(inner))
        outside = kernel_cgroup_id(ctx.cgroup_v2_mount)
        scope = CgroupScope(ProbeContext(cgroup_root=f"/{top}/a"))
        assert scope.select([inside, outside]) == {inside}
        (inner / "c").mkdir()
        newer = kernel_cgroup_id(str(inner / "c"))
        assert scope.select([newer, outside]) == {newer}  # found by a rescan
        assert CgroupScope(ctx).select([inside, outside]) == {inside, outside}


@pytest.mark.bpf
def test_compile_error_is_reported_with_the_compiler_output(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to load BPF programs")
    shutil.copy(default_bpf_dir() / "intf.h", tmp_path / "intf.h")
    (tmp_path / "runqlat.bpf.c").write_text(
        '#include "intf.h"\nTRACEPOINT_PROBE(sched, sched_switch) { return undefined_name; }\n'
    )
    probe = runqlat.RunqlatProbe(ProbeContext(bpf_source_dir=str(tmp_path)))
    with pytest.raises(ProbeUnavailable, match=r"(?s)failed to compile.*undefined_name"):
        probe.start()


@pytest.mark.bpf
def test_unprivileged_agent_is_told_which_capabilities_it_needs() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop privileges")
    script = (
        "from node_agent.probes.base import ProbeContext, ProbeUnavailable\n"
        "from node_agent.probes.runqlat import RunqlatProbe\n"
        "try:\n"
        "    RunqlatProbe(ProbeContext()).start()\n"
        "except ProbeUnavailable as exc:\n"
        "    print(exc)\n"
    )
    dropped = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    dropped += ["--inh-caps=-all", "--bounding-set=-all", sys.executable, "-c", script]
    result = subprocess.run(
        dropped, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2]
    )
    assert "CAP_BPF+CAP_PERFMON (or root" in result.stdout, result.stderr


@pytest.mark.bpf
def test_agent_side_holds_the_programs_without_loading_bcc() -> None:
    """The compiler process loads LLVM; the agent keeps only descriptors and stays small."""
    if os.geteuid() != 0:
        pytest.skip("needs root to load BPF programs")
    script = (
        "import sys, time\n"
        "from node_agent.probes.base import ProbeContext\n"
        "from node_agent.probes.runqlat import RunqlatProbe\n"
        "probe = RunqlatProbe(ProbeContext())\n"
        "probe.start()\n"
        "time.sleep(0.3)\n"
        "sample = probe.collect()\n"
        "probe.close()\n"
        # every wake-up, from an idle CPU or not: on a quiet host all of them can be from idle
        "wakeups = sum(m['runq_count'] + m['idle_wakeup_count']\n"
        "              for m in sample.by_cgroup_id.values())\n"
        "print('bcc' in sys.modules, wakeups)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240
    )
    imported, wakeups = result.stdout.split()
    assert imported == "False", result.stderr
    assert float(wakeups) > 0
