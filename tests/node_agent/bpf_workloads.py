"""Workloads for the kernel (``bpf``) tests: processes that enter their cgroups before exec.

A child writes its own pid into every ``cgroup.procs`` and pins itself to a CPU between
fork and exec, so none of its work happens outside the test cgroups.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

BUSY_LOOP = [sys.executable, "-c", "while True: pass"]
NAPPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"]


def enter_cgroups_then_exec(procs_files: Sequence[Path], cpu: int | None) -> None:
    """Runs in the child between fork and exec: join the cgroups, pin to ``cpu``."""
    for procs in procs_files:
        procs.write_text(str(os.getpid()))
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


@contextmanager
def started_in(
    procs_files: Sequence[Path], argv: Sequence[str], cpu: int | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` inside the cgroups of ``procs_files``; kill it (by pid) afterwards."""
    proc = subprocess.Popen(
        list(argv),
        preexec_fn=lambda: enter_cgroups_then_exec(procs_files, cpu),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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


@dataclass(frozen=True)
class SchedStat:
    """``/proc/PID/schedstat``: the kernel's own per-task accounting (ns)."""

    on_cpu_ns: int
    run_delay_ns: int

    @classmethod
    def of(cls, pid: int) -> SchedStat:
        on_cpu, run_delay, _timeslices = Path(f"/proc/{pid}/schedstat").read_text().split()
        return cls(on_cpu_ns=int(on_cpu), run_delay_ns=int(run_delay))


def schedstat_totals(pids: Sequence[int]) -> SchedStat:
    """Sum of :class:`SchedStat` over ``pids``."""
    stats = [SchedStat.of(pid) for pid in pids]
    return SchedStat(
        on_cpu_ns=sum(s.on_cpu_ns for s in stats),
        run_delay_ns=sum(s.run_delay_ns for s in stats),
    )
