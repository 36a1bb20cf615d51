"""Helpers for tests that create their own real cgroups (unique names, removed afterwards)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

AT_FDCWD = -100


class _FileHandle(ctypes.Structure):
    _fields_ = [
        ("handle_bytes", ctypes.c_uint),
        ("handle_type", ctypes.c_int),
        ("f_handle", ctypes.c_ubyte * 8),
    ]


def kernel_cgroup_id(directory: str) -> int:
    """The cgroup id the kernel (and ``bpf_get_current_cgroup_id``) uses for a v2 cgroup.

    Read with ``name_to_handle_at(2)``: on cgroupfs the file handle is the 64-bit kernfs
    node id, independent of how :mod:`node_agent.attribution` derives it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    handle = _FileHandle(handle_bytes=8)
    mount_id = ctypes.c_int()
    rc = libc.name_to_handle_at(
        AT_FDCWD, directory.encode(), ctypes.byref(handle), ctypes.byref(mount_id), 0
    )
    if rc != 0:
        raise OSError(ctypes.get_errno(), f"name_to_handle_at({directory})")
    return int(struct.unpack("<Q", bytes(handle.f_handle))[0])


def fake_v2_mount(tmp_path: Path, controllers: str) -> Path:
    """A directory standing in for the v2 mount in file-parsing tests: ``tmp_path/v2``
    whose ``cgroup.controllers`` lists ``controllers`` (space-separated)."""
    mount = tmp_path / "v2"
    mount.mkdir()
    (mount / "cgroup.controllers").write_text(controllers + "\n")
    return mount


def unique_name(prefix: str = "intf-test-b") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def remove_tree(top: Path) -> None:
    """Remove a cgroup subtree bottom-up (cgroup dirs are removed with rmdir, never rm -r)."""
    if not top.exists():
        return
    for directory, _subdirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
        os.rmdir(directory)


@contextmanager
def cgroup_tree(mount: str, relative: str) -> Iterator[Path]:
    """Create ``mount/relative`` (all levels); remove the first level and below afterwards."""
    first = Path(mount) / relative.strip("/").split("/")[0]
    path = Path(mount) / relative.strip("/")
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        remove_tree(first)


@contextmanager
def process_in(cgroup_procs: list[Path], shell: str) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``sh -c shell`` inside every given ``cgroup.procs``; kill it by pid afterwards.

    The command starts only after the move (it waits for a line on stdin first), so
    everything it does is charged to those cgroups.
    """
    proc = subprocess.Popen(["sh", "-c", f"read _go; {shell}"], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        for procs in cgroup_procs:
            procs.write_text(str(proc.pid))
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kill_members(cgroup_procs)


def kill_members(cgroup_procs: list[Path], timeout_s: float = 10.0) -> None:
    """Kill, by pid, what is left in our own cgroups (children the command started)."""
    deadline = time.monotonic() + timeout_s
    for procs in cgroup_procs:
        while pids := procs.read_text().split():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            if time.monotonic() > deadline:
                raise TimeoutError(f"processes {pids} stay in {procs}")
            time.sleep(0.02)


def schedstat_run_delay_ns(pid: int) -> int:
    """The kernel's own run-queue wait of a task (second field of /proc/PID/schedstat)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[1])
