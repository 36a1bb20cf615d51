"""Workloads for the kernel (``bpf``) tests: processes that enter their cgroups before exec.

A tiny shell wrapper writes its own pid into every ``cgroup.procs`` and then execs the
workload (through ``taskset`` when pinned), so none of the workload's work happens
outside the test cgroups and its pid is the wrapper's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest


def require_root() -> None:
    """Skip the calling test unless it may load BPF programs and create cgroups."""
    if os.geteuid() != 0:
        pytest.skip("needs root to load BPF programs and create cgroups")


BUSY_LOOP = [sys.executable, "-c", "while True: pass"]
NAPPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"]

_ENTER_THEN_EXEC = 'while [ "$1" != -- ]; do echo $$ > "$1"; shift; done; shift; exec "$@"'


def wrapped(procs_files: Sequence[Path], argv: Sequence[str], cpu: int | None) -> list[str]:
    """``argv`` behind the wrapper that joins ``procs_files`` (and pins to ``cpu``) first."""
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    return ["sh", "-c", _ENTER_THEN_EXEC, "sh", *map(str, procs_files), "--", *pin, *argv]


@contextmanager
def started_in(
    procs_files: Sequence[Path], argv: Sequence[str], cpu: int | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` inside the cgroups of ``procs_files``; kill it (by pid) afterwards."""
    proc = subprocess.Popen(
        wrapped(procs_files, argv, cpu), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def many_started_in(
    count: int, procs_files: Sequence[Path], argv: Sequence[str], cpu: int | None = None
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` copies of :func:`started_in`."""
    with ExitStack() as stack:
        yield [stack.enter_context(started_in(procs_files, argv, cpu)) for _ in range(count)]


def await_running(procs_file: Path, argv: Sequence[str], timeout_s: float = 30.0) -> None:
    """Wait until a process of the cgroup ``procs_file`` runs ``argv`` (the wrapper joined
    the cgroup and exec'd it): on a loaded machine, or under a small CPU quota, that can
    take longer than the second a test would otherwise sleep."""
    wanted = "\0".join(argv)
    deadline = time.monotonic() + timeout_s
    while True:
        for pid in procs_file.read_text().split():
            with suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0") == wanted:
                    return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing in {procs_file} ran {argv} within {timeout_s} s")
        time.sleep(0.01)


def await_stopped(pids: Sequence[int], timeout_s: float = 10.0) -> None:
    """Wait until every pid is in the stopped state (``T`` in ``/proc/PID/stat``)."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            if time.monotonic() > deadline:
                raise TimeoutError(f"pid {pid} did not stop within {timeout_s} s")
            time.sleep(0.001)


@contextmanager
def stopped(pids: Sequence[int]) -> Iterator[None]:
    """SIGSTOP ``pids`` and wait until each has switched out stopped; SIGCONT afterwards.

    A stopped task's last wait has ended and been filed (a wait is filed at the task's
    next switch-out), and it starts no new one: kernel accounting read while all are
    stopped lines up exactly with the probe's drains, with no wait straddling the edge.
    """
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        await_stopped(pids)
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


@dataclass(frozen=True)
class SchedStat:
    """``/proc/PID/schedstat``: the kernel's own per-task accounting (ns)."""

    on_cpu_ns: int
    run_delay_ns: int
    timeslices: int
    """Switch-ins (``sched_info.pcount``): every wait that ended."""

    @classmethod
    def of(cls, pid: int) -> SchedStat:
        on_cpu, run_delay, timeslices = Path(f"/proc/{pid}/schedstat").read_text().split()
        return cls(on_cpu_ns=int(on_cpu), run_delay_ns=int(run_delay), timeslices=int(timeslices))

    def __sub__(self, before: SchedStat) -> SchedStat:
        return SchedStat(
            on_cpu_ns=self.on_cpu_ns - before.on_cpu_ns,
            run_delay_ns=self.run_delay_ns - before.run_delay_ns,
            timeslices=self.timeslices - before.timeslices,
        )


def schedstat_totals(pids: Sequence[int]) -> SchedStat:
    """Sum of :class:`SchedStat` over ``pids``."""
    stats = [SchedStat.of(pid) for pid in pids]
    return SchedStat(
        on_cpu_ns=sum(s.on_cpu_ns for s in stats),
        run_delay_ns=sum(s.run_delay_ns for s in stats),
        timeslices=sum(s.timeslices for s in stats),
    )
