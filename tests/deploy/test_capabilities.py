"""Every privilege the agent keeps is one it needs (docs/operations.md, "The agent's
privileges"): the real ``interference-agent`` runs as uid 0 with exactly the capabilities the
rendered DaemonSet adds (everything else dropped, as the container runtime does) under the
shipped seccomp profile (loaded with libseccomp, as runc loads a Localhost profile), and its
BPF probes work; without any one of those privileges — a capability dropped, a syscall left
out of the profile, another uid, a host path or a host namespace missing — the probe that
needs it stops, saying why. The legacy-kernel overlay's set (``SYS_ADMIN``, ``SYS_RESOURCE``)
loads them as well, not without ``SYS_ADMIN``; from kernel 5.11 ``RLIMIT_MEMLOCK`` does not
limit them (so the base needs no ``SYS_RESOURCE``)."""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from node_agent.probes.base import ProbeContext, ProbeUnavailable
from node_agent.probes.bpf.compiler import thread_ids
from node_agent.probes.bpf.prerequisites import HostPaths, check_tracepoints
from node_agent.probes.cpu_throttle import CpuThrottleProbe
from node_agent.probes.runqlat import RunqlatProbe
from tests.deploy.manifests import REPO, container, find, kustomizations, render

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

AGENT = Path(sys.executable).parent / "interference-agent"
PROFILE = REPO / "deploy" / "base" / "agent" / "seccomp-profile.json"
SECCOMP_EXEC = Path(__file__).with_name("seccomp_exec.py")
PYTHON = (sys.executable, "-c")


def daemonset_capabilities(kustomization: str = "base") -> set[str]:
    agent = container(
        find(render(kustomizations()[kustomization]), "DaemonSet", "interference-agent"), "agent"
    )
    assert agent["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert agent["securityContext"]["seccompProfile"]["type"] == "Localhost"
    return set(agent["securityContext"]["capabilities"]["add"])


def run_agent(
    capabilities: set[str],
    probes: str,
    *,
    leave_out_syscalls: Sequence[str] = (),
    namespaces: Sequence[str] = (),
    host_proc: bool = False,
    memlock_bytes: int | None = None,
) -> dict[str, Any]:
    """One ``--once`` report of the real agent as uid 0 with only ``capabilities``, under
    the shipped seccomp profile (less ``leave_out_syscalls``); ``namespaces``: unshare(1)
    flags for namespaces of its own; ``host_proc``: the host's /proc bound where PROC_ROOT
    points, as the DaemonSet mounts it (with a PID namespace of its own); ``memlock_bytes``:
    its ``RLIMIT_MEMLOCK``, soft and hard (raising it back needs ``SYS_RESOURCE``)."""
    if shutil.which("setpriv") is None or shutil.which("unshare") is None:
        pytest.fail("setpriv and unshare (util-linux) are needed")
    agent = [
        "setpriv",
        "--reuid=0",
        "--inh-caps=-all",
        f"--bounding-set={_bounding(capabilities)}",
        sys.executable,
        str(SECCOMP_EXEC),
        str(PROFILE),
        ",".join(leave_out_syscalls),
        str(AGENT),
        "--once",
        "--no-kubernetes",
        "--interval",
        "1",
        "--probes",
        probes,
    ]
    command = agent
    with tempfile.TemporaryDirectory(prefix="host-proc-") as host:
        if host_proc:
            # A mount namespace of its own (private): the binds vanish with it.
            script = 'mount --rbind /proc "$0" && mount -t proc proc /proc && exec "$@"'
            command = ["unshare", "-m", "-p", "-f", "sh", "-c", script, host, *agent]
            command = [*command, "--proc-root", host]
        elif namespaces:
            command = ["unshare", *namespaces, *agent]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=240,
            preexec_fn=None if memlock_bytes is None else _memlock_limit(memlock_bytes),
        )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _bounding(capabilities: set[str]) -> str:
    """setpriv's ``--bounding-set``: only ``capabilities`` (uid 0 keeps the bounding set)."""
    return ",".join(["-all", *(f"+{c.lower()}" for c in sorted(capabilities))])


def _memlock_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))

    return apply


def test_bpf_probes_load_with_exactly_the_daemonset_capabilities() -> None:
    report = run_agent(daemonset_capabilities(), "runqlat,reclaim")
    assert report["disabled_probes"] == {}
    assert report["metrics"]["runq_p99_us"] > 0
    assert report["histograms"]["runq_us"]


def test_without_bpf_the_bpf_probes_stop_with_a_reason() -> None:
    report = run_agent(daemonset_capabilities() - {"BPF"}, "runqlat,reclaim")
    assert set(report["disabled_probes"]) == {"runqlat", "reclaim"}
    assert "CAP_BPF" in report["disabled_probes"]["runqlat"]


def test_without_perfmon_the_bpf_probes_stop_with_a_reason() -> None:
    report = run_agent(daemonset_capabilities() - {"PERFMON"}, "runqlat,reclaim")
    assert set(report["disabled_probes"]) == {"runqlat", "reclaim"}
    assert "CAP_PERFMON" in report["disabled_probes"]["runqlat"]


def test_the_legacy_kernel_capabilities_load_the_bpf_probes() -> None:
    """deploy/components/legacy-kernel gives ``SYS_ADMIN`` and ``SYS_RESOURCE`` in place of
    ``BPF`` and ``PERFMON`` (kernels before 5.8 have neither): with exactly its set the
    probes load, attach and measure, so the overlay really stands in for the base's two."""
    capabilities = daemonset_capabilities("legacy-kernel")
    base = daemonset_capabilities()
    assert capabilities == (base - {"BPF", "PERFMON"}) | {"SYS_ADMIN", "SYS_RESOURCE"}
    report = run_agent(capabilities, "runqlat,reclaim")
    assert report["disabled_probes"] == {}
    assert report["metrics"]["runq_p99_us"] > 0
    assert report["histograms"]["runq_us"]


def test_without_sys_admin_the_legacy_set_cannot_load_the_bpf_probes() -> None:
    """The legacy set less ``SYS_ADMIN`` (neither it nor ``BPF`` + ``PERFMON``): the probes
    stop, saying which capabilities they need — ``SYS_ADMIN`` is what loads them there."""
    capabilities = daemonset_capabilities("legacy-kernel") - {"SYS_ADMIN"}
    assert not capabilities & {"BPF", "PERFMON"}
    report = run_agent(capabilities, "runqlat,reclaim")
    assert set(report["disabled_probes"]) == {"runqlat", "reclaim"}
    reason = report["disabled_probes"]["runqlat"]
    assert "CAP_BPF+CAP_PERFMON (or root / CAP_SYS_ADMIN)" in reason


def test_from_5_11_bpf_maps_need_no_memlock_and_so_no_sys_resource() -> None:
    """Why the base has no ``SYS_RESOURCE``: from kernel 5.11 BPF maps are charged to the
    memory cgroup, not to ``RLIMIT_MEMLOCK``. With that limit at 0 (soft and hard: without
    ``SYS_RESOURCE`` nothing raises it), under which the agent cannot lock a single page,
    the probes still load and measure. Below 5.11 the maps would fail here, which is what
    the legacy-kernel overlay's ``SYS_RESOURCE`` is for: verifiable only on such a kernel."""
    release = tuple(int(part) for part in re.findall(r"\d+", os.uname().release)[:2])
    if release < (5, 11):
        pytest.skip(f"kernel {os.uname().release}: BPF maps count against RLIMIT_MEMLOCK")
    capabilities = daemonset_capabilities()
    assert not capabilities & {"SYS_RESOURCE", "IPC_LOCK"}
    assert _locks_a_page(capabilities, None)
    assert not _locks_a_page(capabilities, 0)  # the limit holds for the agent
    report = run_agent(capabilities, "runqlat,reclaim", memlock_bytes=0)
    assert report["disabled_probes"] == {}
    assert report["metrics"]["runq_p99_us"] > 0
    assert report["histograms"]["runq_us"]


def _locks_a_page(capabilities: set[str], memlock_bytes: int | None) -> bool:
    """Whether a process set up as :func:`run_agent` sets up the agent can ``mlock`` a page."""
    script = (
        "import ctypes, mmap; page = mmap.mmap(-1, mmap.PAGESIZE);"
        " at = ctypes.addressof(ctypes.c_char.from_buffer(page));"
        " print(ctypes.CDLL(None).mlock(ctypes.c_void_p(at), mmap.PAGESIZE) == 0)"
    )
    done = subprocess.run(
        ["setpriv", "--reuid=0", "--inh-caps=-all", f"--bounding-set={_bounding(capabilities)}",
         *PYTHON, script],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=None if memlock_bytes is None else _memlock_limit(memlock_bytes),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() == "True"


@pytest.mark.parametrize(
    ("syscall", "failing"),
    [("bpf", "could not open bpf map"), ("perf_event_open", "perf_event_open")],
)
def test_the_seccomp_profile_needs_bpf_and_perf_event_open(syscall: str, failing: str) -> None:
    """The runtime default without these two (what a default profile gives a container
    without CAP_SYS_ADMIN): the programs neither load nor attach."""
    report = run_agent(daemonset_capabilities(), "runqlat", leave_out_syscalls=[syscall])
    reason = report["disabled_probes"]["runqlat"]
    assert failing in reason and "Operation not permitted" in reason


def test_seeding_needs_the_hosts_proc() -> None:
    """BPF sees the host's thread ids. In a PID namespace of its own the agent's /proc lists
    its own few threads, numbered there; the host's /proc (PROC_ROOT) lists this test's."""
    script = (
        "import json, sys; from node_agent.probes.bpf.compiler import thread_ids; "
        "print(json.dumps([thread_ids('/proc'), thread_ids(sys.argv[1])]))"
    )
    mounts = 'mount --rbind /proc "$0" && mount -t proc proc /proc && exec "$@"'
    with tempfile.TemporaryDirectory(prefix="host-proc-") as host:
        done = subprocess.run(
            ["unshare", "-m", "-p", "-f", "sh", "-c", mounts, host, *PYTHON, script, host],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    assert done.returncode == 0, done.stderr
    own, hosts = json.loads(done.stdout)
    assert os.getpid() not in own and len(own) < 20
    assert os.getpid() in hosts and set(thread_ids()) & set(hosts)


def test_tracefs_needs_uid_0() -> None:
    """With BPF and PERFMON but as uid 65534, tracefs (mode 0700, root's) is closed: the
    probe's tracepoints cannot be found; as uid 0 with the same two capabilities they can."""
    assert os.stat("/sys/kernel/tracing").st_mode & 0o077 == 0
    assert _tracepoint_check_as(0) == "found"
    assert "tracefs at /sys/kernel/tracing is not readable" in _tracepoint_check_as(65534)


def _tracepoint_check_as(uid: int) -> str:
    """The BPF probes' tracepoint check, in a child that is ``uid`` with BPF and PERFMON."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read)
        message = "found"
        try:
            _become(uid, {"BPF", "PERFMON"})
            check_tracepoints(ProbeContext().tracefs, RunqlatProbe.tracepoints)
        except ProbeUnavailable as exc:
            message = str(exc)
        except BaseException as exc:
            message = f"unexpected {exc!r}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(child, 0)
    return message


def _become(uid: int, keep: set[str]) -> None:
    """setuid(uid) keeping only the capabilities ``keep`` (prctl KEEPCAPS, then capset)."""
    bits = {"BPF": 39, "PERFMON": 38}
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(8, 1, 0, 0, 0) != 0:  # PR_SET_KEEPCAPS
        raise OSError(ctypes.get_errno(), "prctl")
    os.setgid(uid)
    os.setuid(uid)
    mask = sum(1 << bits[c] for c in keep)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    header = Header(0x20080522, 0)
    data = (Data * 2)(
        Data(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0), Data(mask >> 32, mask >> 32, 0)
    )
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def test_the_bpf_probes_need_tracefs(tmp_path: Path) -> None:
    with pytest.raises(ProbeUnavailable, match="tracefs is not mounted"):
        RunqlatProbe(ProbeContext(tracefs=str(tmp_path))).start()


def test_the_bpf_probes_need_kernel_headers(tmp_path: Path) -> None:
    paths = HostPaths(modules_root=str(tmp_path), kheaders=str(tmp_path / "none"))
    with pytest.raises(ProbeUnavailable, match="no kernel headers"):
        RunqlatProbe(ProbeContext(), paths).start()


def test_the_kernel_headers_live_in_usr_src() -> None:
    """``/lib/modules/$(uname -r)/build`` is a link into /usr/src (Debian, Ubuntu): without
    that mount the headers the probes compile against are a dangling link."""
    build = Path(HostPaths().modules_root) / os.uname().release / "build"
    assert build.is_symlink() and build.resolve().is_relative_to("/usr/src")


def test_the_cgroup_probes_need_cgroupfs(tmp_path: Path) -> None:
    ctx = ProbeContext(cgroup_v2_mount=str(tmp_path), cgroup_v1_mount=str(tmp_path))
    with pytest.raises(ProbeUnavailable):
        CpuThrottleProbe(ctx).start()


def test_the_taskstats_fallback_needs_net_admin() -> None:
    capabilities = daemonset_capabilities("host-namespaces")
    assert "NET_ADMIN" in capabilities
    with_it = run_agent(capabilities, "taskstats")
    without = run_agent(capabilities - {"NET_ADMIN"}, "taskstats")
    assert with_it["pods"] and with_it["metrics"]["runq_wait_ratio"] > 0
    assert without["pods"] == [] and without["metrics"]["runq_wait_ratio"] == 0
    assert "CAP_NET_ADMIN" in without["disabled_probes"]["taskstats"]


def test_the_taskstats_fallback_needs_the_host_pid_namespace() -> None:
    report = run_agent(daemonset_capabilities("host-namespaces"), "taskstats", host_proc=True)
    assert report["pods"] == [] and report["metrics"]["runq_wait_ratio"] == 0
    assert "hostPID" in report["disabled_probes"]["taskstats"]


def test_the_network_probe_needs_the_host_network_namespace() -> None:
    capabilities = daemonset_capabilities()
    on_the_host = run_agent(capabilities, "network")
    assert "network" not in on_the_host["disabled_probes"]
    assert "net" in on_the_host["measured"]
    own = run_agent(capabilities, "network", namespaces=["-n"])
    assert "hostNetwork" in own["disabled_probes"]["network"]
    assert "net" not in own["measured"]
