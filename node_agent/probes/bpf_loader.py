"""Compile, attach and drain the agent's BCC programs, with errors a person can act on.

Every BPF program in ``bpf/`` follows the contract of ``bpf/intf.h``: one per-CPU hash
named ``stats`` keyed by ``(cgroup_id, generation)`` whose value is a struct of ``u64``
counters and ``u64 NAME_slots[HIST_SLOTS]`` log2 histograms, and a one-slot array
``drain_generation``. :class:`BpfCgroupProbe` bumps the generation, waits a grace
period for programs already running, then reads and deletes the old generation: events
counted during the drain land in the new generation, so nothing is lost and the map
starts every interval empty. Entries a program could not keep (a map full, an LRU
eviction) are counted in the per-CPU array ``lost_entries`` under the generation's parity
and drained the same way: read, then zeroed, after the grace period.

BCC (with LLVM and clang, well over 100 MB resident) runs only in a short-lived compiler
process per program; it hands the map and tracepoint-attachment file descriptors to the
agent over a Unix socket, and the agent drains the maps with plain ``bpf(2)`` calls. So
the agent never imports ``bcc``, imports fine on machines without it, and stays small.

Size: over 500 lines because compiling, attaching and draining share the programs' map
layout (``bpf/intf.h``) and the loader process's protocol; each step stays next to the
error it turns into advice.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import importlib.util
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from interference import hist
from node_agent.probes.base import (
    BPF_LOST_ENTRIES,
    BPF_MISSED_EVENTS,
    CollectFailed,
    ProbeContext,
    ProbeUnavailable,
    Sample,
)

log = logging.getLogger(__name__)

BPF_DIR_ENV = "INTERFERENCE_BPF_DIR"
"""Environment variable naming the directory of ``*.bpf.c`` (set by the agent image)."""

DRAIN_GRACE_S = 0.002
"""Wait after bumping the generation: tracepoint programs run with preemption off and
finish within microseconds, so after this none still writes to the old generation."""

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39

STATS_TABLE = b"stats"
GENERATION_TABLE = b"drain_generation"
LOST_TABLE = b"lost_entries"

PAIR_TABLES = (b"culprits",)
"""Further generation-keyed maps a program may have (shared across CPUs, not per-CPU):
handed over with the others when present and drained by the probe that reads them
(:meth:`LoadedProgram.drain_table`)."""

SEEDED_TASKS_TABLE = b"tasks"
"""A program's per-task map keyed by pid (``runqlat``), seeded at attach (:func:`seed_tasks`)."""
BPF_NOEXIST = 1

LOST_ENTRY_KINDS = ("cgroup", "task")
"""Slots of ``lost_entries`` within one parity, in the order of ``LOST_*_ENTRY`` in
``bpf/intf.h``: per-cgroup ``stats`` entries not created, per-task entries not stored
(or evicted while the task was queued)."""

_LOCAL_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_.-]+)"[ \t]*$', re.MULTILINE)


@dataclass(frozen=True)
class HostPaths:
    """Where the kernel-side prerequisites of BCC live (overridable for tests)."""

    modules_root: str = "/lib/modules"
    """Holds ``$(uname -r)/build``: the kernel headers BCC compiles against."""
    kheaders: str = "/sys/kernel/kheaders.tar.xz"
    """In-kernel headers (CONFIG_IKHEADERS), which BCC uses when ``build`` is missing."""
    kernel_release: str = ""
    """``uname -r``; empty means the running kernel's."""


def default_bpf_dir() -> Path:
    """The ``bpf/`` folder shipped next to the ``node_agent`` package."""
    return Path(__file__).resolve().parents[2] / "bpf"


def resolve_source_dir(ctx: ProbeContext) -> Path:
    """``ctx.bpf_source_dir``, else ``$INTERFERENCE_BPF_DIR``, else :func:`default_bpf_dir`."""
    if ctx.bpf_source_dir:
        return Path(ctx.bpf_source_dir)
    from_env = os.environ.get(BPF_DIR_ENV, "")
    return Path(from_env) if from_env else default_bpf_dir()


def read_program(source_dir: Path, name: str) -> str:
    """The C text of ``NAME.bpf.c`` with its local ``#include "x.h"`` files inlined.

    BCC rewrites map accesses (``m.lookup(...)``) only in the main source text, never in
    included files, so shared helpers that touch maps must be part of that text.
    """
    path = source_dir / f"{name}.bpf.c"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProbeUnavailable(
            f"cannot read BPF source {path}: {exc.strerror}; point ProbeContext.bpf_source_dir "
            f"or ${BPF_DIR_ENV} at the directory holding {name}.bpf.c (the repository's bpf/)"
        ) from exc

    def inline(match: re.Match[str]) -> str:
        header = source_dir / match.group(1)
        try:
            return header.read_text()
        except OSError as exc:
            raise ProbeUnavailable(
                f"cannot read {header} (included by {path}): {exc.strerror}; "
                f"copy the whole bpf/ directory, headers included"
            ) from exc

    return _LOCAL_INCLUDE.sub(inline, text)


def effective_capabilities(proc_root: str = "/proc") -> int:
    """The ``CapEff`` bit mask of this process (0 when it cannot be read)."""
    try:
        with open(f"{proc_root}/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def check_privileges(capabilities: int) -> None:
    """Raise unless the capability mask allows loading tracing BPF programs."""
    sys_admin, bpf, perfmon = (
        (capabilities >> bit) & 1 == 1 for bit in (CAP_SYS_ADMIN, CAP_BPF, CAP_PERFMON)
    )
    if sys_admin or (bpf and perfmon):
        return
    raise ProbeUnavailable(
        "loading BPF programs needs CAP_BPF+CAP_PERFMON (or root / CAP_SYS_ADMIN): run the "
        "agent as root or add those capabilities (Kubernetes: securityContext.privileged "
        "or capabilities.add [BPF, PERFMON])"
    )


def check_tracepoints(tracefs: str, tracepoints: Sequence[str]) -> None:
    """Raise unless tracefs is mounted and holds every ``category:event`` tracepoint."""
    events = Path(tracefs) / "events"
    try:
        found = events.is_dir()
    except PermissionError as exc:
        raise ProbeUnavailable(
            f"tracefs at {tracefs} is not readable ({exc.strerror}): it is root's, run the "
            "agent as uid 0"
        ) from exc
    if not found:
        raise ProbeUnavailable(
            f"tracefs is not mounted at {tracefs}: mount tracefs: "
            f"mount -t tracefs tracefs {tracefs}"
        )
    for tracepoint in tracepoints:
        category, _, event = tracepoint.partition(":")
        if not (events / category / event / "format").is_file():
            raise ProbeUnavailable(
                f"tracepoint {tracepoint} is missing ({events / category / event}/format): "
                f"this kernel does not provide it"
            )


def check_kernel_headers(paths: HostPaths) -> None:
    """Raise unless BCC can find kernel headers to compile against."""
    release = paths.kernel_release or os.uname().release
    build = Path(paths.modules_root) / release / "build"
    if build.is_dir() or Path(paths.kheaders).exists():
        return
    raise ProbeUnavailable(
        f"no kernel headers at {build}: install linux-headers-{release}, or link "
        f"/lib/modules/{release}/build to the closest available headers (`make setup` links "
        f"Debian's linux-headers-cloud-amd64; our programs read only tracepoint arguments, "
        f"so a version mismatch is harmless), or load the kheaders module (modprobe kheaders)"
    )


def import_bcc() -> Any:
    """The ``bcc`` module, or :class:`ProbeUnavailable` saying how to install it."""
    try:
        import bcc
    except ImportError as exc:
        raise ProbeUnavailable(
            f"the bcc Python module cannot be imported ({exc}): install python3-bpfcc "
            f"(apt) and make it visible to this Python (`make setup` links it into the venv)"
        ) from exc
    return bcc


COMPILE_TIMEOUT_S = 180.0
"""Upper bound for one BCC compile + load + attach on a busy node."""

_COMPILER_ENTRY = "from node_agent.probes.bpf_loader import compiler_main; compiler_main()"


def describe_u64_struct(struct: Any) -> list[tuple[str, int]]:
    """``[(field, length)]`` of a ctypes struct of u64s (length 0) and u64 arrays."""
    fields: list[tuple[str, int]] = []
    for field_name, field_type, *_ in struct._fields_:
        length = getattr(field_type, "_length_", 0)
        element = field_type._type_ if length else field_type
        if ctypes.sizeof(element) != 8:
            raise ValueError(f"field {field_name} is not u64 (bpf/intf.h contract)")
        fields.append((field_name, length))
    return fields


def thread_ids(proc_root: str = "/proc") -> list[int]:
    """Every thread id under ``proc_root`` (``/proc/PID/task/TID``), the threads that
    exit meanwhile left out."""
    tids: list[int] = []
    with contextlib.suppress(OSError):
        for pid in os.listdir(proc_root):
            if pid.isdigit():
                with contextlib.suppress(OSError):
                    tids.extend(
                        int(t) for t in os.listdir(f"{proc_root}/{pid}/task") if t.isdigit()
                    )
    return tids


def seed_tasks(program: Any, proc_root: str) -> int:
    """Give every thread present at attach an empty entry in the program's ``tasks`` map
    (where it has one; never overwriting an entry the programs already made), up to half
    the map; returns how many were seeded.

    A switch-in of a task without an entry counts as a lost entry (``bpf/runqlat.bpf.c``).
    A thread that sleeps across the attach has none until its first wake-up, so a skipped
    first wake-up (``bpf_missed_events``), or a task queued before the attach, would
    otherwise read as a full map for the first minutes after every start.
    """
    try:
        tasks = program.get_table(SEEDED_TASKS_TABLE)
    except KeyError:
        return 0
    from bcc.libbcc import lib  # the compiler process only

    limit = int(tasks.max_entries) // 2
    seeded = 0
    empty = tasks.Leaf()
    for tid in thread_ids(proc_root):
        if seeded >= limit:
            break
        key = tasks.Key(tid)
        if (
            lib.bpf_update_elem(tasks.map_fd, ctypes.byref(key), ctypes.byref(empty), BPF_NOEXIST)
            == 0
        ):
            seeded += 1
    return seeded


def _present_tables(program: Any, names: Iterable[bytes]) -> Iterator[tuple[bytes, Any]]:
    """``(name, table)`` of each of ``names`` the compiled program has."""
    for name in names:
        try:
            yield name, program.get_table(name)
        except KeyError:
            continue


def compiler_main() -> None:
    """Entry point of the compiler process (see :func:`load_program`).

    Reads the program text on stdin, compiles, loads and attaches it with BCC, sends
    the map and attachment file descriptors plus the ``stats`` layout over the socket
    named by ``argv[1]``, then exits without BCC's clean-up (which would disable the
    attachments the agent now holds). Errors go to stderr with exit status 1.
    """
    sock = socket.socket(fileno=int(sys.argv[1]))
    try:
        bcc = import_bcc()
        cflags = json.loads(sys.argv[2]) if len(sys.argv) > 2 else []
        proc_root = sys.argv[3] if len(sys.argv) > 3 else "/proc"
        program = bcc.BPF(text=sys.stdin.buffer.read(), cflags=cflags)
        seed_tasks(program, proc_root)
        stats, generation = program[STATS_TABLE], program[GENERATION_TABLE]
        lost = program[LOST_TABLE]
        program_fds = [function.fd for function in program.funcs.values()]
        pair_tables = dict(_present_tables(program, PAIR_TABLES))
        layout = {
            "key": describe_u64_struct(stats.Key),
            "leaf": describe_u64_struct(stats.sLeaf),
            "max_entries": int(stats.max_entries),
            "lost_slots": int(lost.max_entries),
            "programs": len(program_fds),
            "tables": [
                {
                    "name": name.decode(),
                    "key": describe_u64_struct(table.Key),
                    "leaf": describe_u64_struct(table.Leaf),
                    "max_entries": int(table.max_entries),
                }
                for name, table in pair_tables.items()
            ],
        }
        fds = [
            stats.map_fd,
            generation.map_fd,
            lost.map_fd,
            *(table.map_fd for table in pair_tables.values()),
            *program_fds,
            *program.tracepoint_fds.values(),
        ]
        socket.send_fds(sock, [json.dumps(layout).encode()], fds)
    except Exception as exc:  # bcc raises bare Exception for compile, load and attach
        print(f"error: {exc}", file=sys.stderr, flush=True)
        os._exit(1)
    sys.stderr.flush()
    os._exit(0)


def _struct_type(name: str, fields: Sequence[Sequence[Any]]) -> type[ctypes.Structure]:
    members = [
        (str(field), ctypes.c_uint64 * int(length) if length else ctypes.c_uint64)
        for field, length in fields
    ]
    return type(name, (ctypes.Structure,), {"_fields_": members})


def possible_cpus(path: str = "/sys/devices/system/cpu/possible") -> int:
    """Number of possible CPUs (the length of every per-CPU map value), e.g. ``0-3`` → 4."""
    count = 0
    for part in Path(path).read_text().strip().split(","):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count


class _ElemAttr(ctypes.Structure):
    """``union bpf_attr`` as the BPF_MAP_*_ELEM and BPF_MAP_GET_NEXT_KEY commands read it."""

    _fields_ = (
        ("map_fd", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    )


PERF_EVENT_IOC_DISABLE = 0x2401
"""``_IO('$', 1)`` from ``linux/perf_event.h``."""


def quiet_perf_event(fd: int) -> None:
    """Take our tracepoint perf event out of the tracepoint's sample list; the BPF program
    attached to it keeps running.

    The programs return 1 so that other perf users (``perf stat``, ``perf record``) keep
    their samples of the same tracepoint; the kernel then also delivers each event to
    every *enabled* perf event on it, ours included, which costs an overflow per event
    (measured: ``perf bench sched pipe`` at 0.62 of unattached instead of 0.87). A
    disabled event is off that list while its program stays attached to the tracepoint,
    so only the other users' events are delivered to.
    """
    try:
        fcntl.ioctl(fd, PERF_EVENT_IOC_DISABLE, 0)
    except OSError as exc:
        log.debug("could not disable perf event %d (samples still delivered): %s", fd, exc)


def recursion_misses(fd: int, proc_root: str = "/proc") -> int:
    """``recursion_misses`` of the BPF program behind ``fd`` (0 where the kernel, < 5.12,
    does not report it)."""
    try:
        with open(f"{proc_root}/self/fdinfo/{fd}") as info:
            for line in info:
                if line.startswith("recursion_misses:"):
                    return int(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return 0


class PairTable:
    """One of a program's :data:`PAIR_TABLES`: its descriptor and key and value layout
    (u64 fields, the key's last one ``generation``)."""

    def __init__(self, fd: int, layout: Mapping[str, Any]) -> None:
        self.fd = fd
        self.key_type = _struct_type("pair_key", layout["key"])
        self.leaf_type = _struct_type("pair_value", layout["leaf"])
        self.max_entries = int(layout["max_entries"])


BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
_SYS_BPF = {"x86_64": 321, "aarch64": 280}


class LoadedProgram:
    """A program's maps and attachments, held as file descriptors by the agent.

    Compiling with BCC pulls LLVM and clang into a process (well over 100 MB), so a
    short-lived compiler process does it and hands over the descriptors; this side
    reads and writes the maps with plain ``bpf(2)`` calls. Closing the descriptors
    detaches the program.
    """

    def __init__(self, fds: Sequence[int], layout: Mapping[str, Any]) -> None:
        self._stats_fd, self._generation_fd, self._lost_fd, *rest = fds
        tables = list(layout.get("tables", []))
        table_fds, rest = rest[: len(tables)], rest[len(tables) :]
        self.tables: dict[str, PairTable] = {
            str(table["name"]): PairTable(fd, table)
            for fd, table in zip(table_fds, tables, strict=True)
        }
        """The program's :data:`PAIR_TABLES`, by name."""
        programs = int(layout.get("programs", 0))
        self._program_fds, self._attachment_fds = rest[:programs], rest[programs:]
        for fd in self._attachment_fds:
            quiet_perf_event(fd)
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._sys_bpf = _SYS_BPF[os.uname().machine]
        self.key_type = _struct_type("cgroup_key", layout["key"])
        self.leaf_type = _struct_type("stats", layout["leaf"])
        self.leaf_fields = tuple(str(field) for field, _length in layout["leaf"])
        self._max_entries = int(layout["max_entries"])
        self._per_cpu_type = self.leaf_type * possible_cpus()
        self._per_cpu_u64 = ctypes.c_uint64 * possible_cpus()
        self.lost_slots = int(layout.get("lost_slots", 0))
        self._closed = False

    def _call(self, command: int, fd: int, key: Any, value: Any = None, flags: int = 0) -> bool:
        """One ``bpf(2)`` map command; False for ENOENT (no such / no next key)."""
        attr = _ElemAttr(map_fd=fd, key=ctypes.addressof(key) if key is not None else 0)
        attr.value = ctypes.addressof(value) if value is not None else 0
        attr.flags = flags
        size = ctypes.c_uint(ctypes.sizeof(attr))
        if self._libc.syscall(self._sys_bpf, command, ctypes.byref(attr), size) == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.ENOENT:
            return False
        raise OSError(err, f"bpf(2) map command {command}: {os.strerror(err)}")

    def set_generation(self, generation: int) -> None:
        index, value = ctypes.c_uint32(0), ctypes.c_uint64(generation)
        self._call(BPF_MAP_UPDATE_ELEM, self._generation_fd, index, value)

    def stats_keys(self) -> list[Any]:
        """Every key of the ``stats`` map (bounded by its size, even while it changes)."""
        return self._keys(self._stats_fd, self.key_type, self._max_entries)

    def _keys(self, fd: int, key_type: Any, max_entries: int) -> list[Any]:
        found: list[Any] = []
        previous = None
        while len(found) <= max_entries:
            key = key_type()
            if not self._call(BPF_MAP_GET_NEXT_KEY, fd, previous, key):
                break
            found.append(key)
            previous = key
        return found

    def lookup_per_cpu(self, key: Any) -> Any:
        """The per-CPU values stored under ``key`` (None when it is gone)."""
        values = self._per_cpu_type()
        found = self._call(BPF_MAP_LOOKUP_ELEM, self._stats_fd, key, values)
        return values if found else None

    def delete(self, key: Any) -> None:
        self._call(BPF_MAP_DELETE_ELEM, self._stats_fd, key)

    def take_lost_entries(self, generation: int) -> dict[str, int]:
        """Entries lost under ``generation``'s parity, by kind, and zero them.

        Call only after the generation moved on and the grace period passed: programs then
        count into the other parity, so nothing arrives between this read and the reset.
        """
        lost: dict[str, int] = {}
        for kind_index, kind in enumerate(LOST_ENTRY_KINDS):
            slot = ctypes.c_uint32((generation & 1) * len(LOST_ENTRY_KINDS) + kind_index)
            values = self._per_cpu_u64()
            self._call(BPF_MAP_LOOKUP_ELEM, self._lost_fd, slot, values)
            lost[kind] = sum(int(v) for v in values)
            if lost[kind]:
                self._call(BPF_MAP_UPDATE_ELEM, self._lost_fd, slot, self._per_cpu_u64())
        return lost

    def missed_events(self) -> int:
        """Runs of this program's BPF programs the kernel skipped since they were loaded.

        The kernel runs at most one perf-attached tracing program per CPU at a time: an
        event that fires while that CPU's guard is held — by another such program, or by
        a ``bpf(2)`` map call (ours while draining, anyone's) interrupted by the event's
        hard IRQ — is skipped and counted in the program's ``recursion_misses``. Each
        skipped wakeup loses at most that task's next wait. The count makes such loss
        visible instead of silent.
        """
        return sum(recursion_misses(fd) for fd in self._program_fds)

    def drain_table(
        self, name: str, current_generation: int
    ) -> dict[tuple[int, ...], dict[str, int]]:
        """Every entry of pair table ``name`` from a generation before
        ``current_generation``, deleted as read: ``{key fields but the generation: {leaf
        field: sum}}`` (an entry seen under two old generations is summed). Call only
        after the generation moved on and the grace period passed."""
        table = self.tables[name]
        totals: dict[tuple[int, ...], dict[str, int]] = {}
        for key in self._keys(table.fd, table.key_type, table.max_entries):
            if key.generation == current_generation:
                continue
            value = table.leaf_type()
            found = self._call(BPF_MAP_LOOKUP_ELEM, table.fd, key, value)
            self._call(BPF_MAP_DELETE_ELEM, table.fd, key)
            if not found:
                continue
            ident = tuple(int(getattr(key, f)) for f, *_ in key._fields_ if f != "generation")
            into = totals.setdefault(ident, {})
            for field_name, *_ in value._fields_:
                into[field_name] = into.get(field_name, 0) + int(getattr(value, field_name))
        return totals

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in (
            *self._attachment_fds,
            *self._program_fds,
            self._stats_fd,
            self._generation_fd,
            self._lost_fd,
            *(table.fd for table in self.tables.values()),
        ):
            with contextlib.suppress(OSError):
                os.close(fd)


def load_program(
    name: str,
    ctx: ProbeContext,
    tracepoints: Sequence[str],
    paths: HostPaths | None = None,
    cflags: Sequence[str] = (),
) -> LoadedProgram:
    """Check prerequisites, then compile, load and attach ``NAME.bpf.c`` in a compiler
    process (:func:`compiler_main`) and take over its maps and attachments.

    ``cflags`` are extra compiler flags; tests shrink the maps with them
    (``-DMAX_TASKS=64``), the agent passes none.

    Every failure is a :class:`ProbeUnavailable` whose message says what to mount,
    install or grant; compiler and verifier output is included.
    """
    check_privileges(effective_capabilities(ctx.proc_root))
    check_tracepoints(ctx.tracefs, tracepoints)
    check_kernel_headers(paths or HostPaths())
    if importlib.util.find_spec("bcc") is None:
        import_bcc()  # raises with the installation hint
    source_dir = resolve_source_dir(ctx)
    text = read_program(source_dir, name)
    where = f"{source_dir / name}.bpf.c"
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours:
        with theirs:
            compiler = subprocess.Popen(
                # -P: no current directory on sys.path of a root process
                [
                    sys.executable,
                    "-P",
                    "-c",
                    _COMPILER_ENTRY,
                    str(theirs.fileno()),
                    json.dumps(list(cflags)),
                    ctx.proc_root,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
            )
        try:
            _, err = compiler.communicate(text.encode(), timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            compiler.kill()
            compiler.communicate()
            raise ProbeUnavailable(
                f"compiling {where} took over {COMPILE_TIMEOUT_S:.0f} s; the node is "
                f"overloaded or the compiler hangs"
            ) from exc
        output = err.decode(errors="replace").splitlines()
        if compiler.returncode != 0:
            reason = next(
                (line[len("error: ") :] for line in reversed(output) if line.startswith("error: ")),
                f"exit status {compiler.returncode}",
            )
            raise ProbeUnavailable(
                f"BPF program {where} failed to compile, load or attach ({reason}); check "
                f"the kernel headers at /lib/modules/$(uname -r)/build and that the kernel "
                f"allows BPF (lockdown=confidentiality blocks it). Output:\n"
                + "\n".join(output[-15:])
            )
        if output:
            log.debug("BCC output while loading %s:\n%s", name, "\n".join(output))
        ours.settimeout(5.0)
        message, fds, _flags, _address = socket.recv_fds(ours, 1 << 16, 64)
    return LoadedProgram(fds, json.loads(message))


@dataclass
class CgroupTotals:
    """Summed per-CPU values of one cgroup's ``stats`` entries."""

    counters: dict[str, int]
    slots: dict[str, list[int]]


def sum_per_cpu(per_cpu: Iterable[Any]) -> CgroupTotals:
    """Add up a per-CPU array of ctypes structs: scalars summed, arrays slot-wise."""
    counters: dict[str, int] = {}
    slots: dict[str, list[int]] = {}
    for value in per_cpu:
        for field_name, field_type, *_ in type(value)._fields_:
            field = getattr(value, field_name)
            if hasattr(field_type, "_length_"):
                into = slots.setdefault(field_name, [0] * field_type._length_)
                for i, count in enumerate(field):
                    into[i] += int(count)
            else:
                counters[field_name] = counters.get(field_name, 0) + int(field)
    return CgroupTotals(counters=counters, slots=slots)


def merge_totals(into: CgroupTotals, other: CgroupTotals) -> None:
    """Add ``other`` into ``into`` (same cgroup seen under two generations)."""
    for name, value in other.counters.items():
        into.counters[name] = into.counters.get(name, 0) + value
    for name, buckets in other.slots.items():
        into.slots[name] = hist.add(into.slots.get(name, []), buckets)


class CgroupScope:
    """Which cgroup v2 ids lie at or below ``ProbeContext.cgroup_root``.

    The ids are inode numbers of the v2 hierarchy's directories, so the subtree is
    walked once and again only when an unknown id shows up (at most once per drain).
    """

    def __init__(self, ctx: ProbeContext) -> None:
        root = ctx.cgroup_root.strip("/")
        self._everything = root == ""
        self._top = Path(ctx.cgroup_v2_mount) / root
        self._ids: set[int] = set()

    def _rescan(self) -> None:
        ids: set[int] = set()
        for directory, _subdirs, _files in os.walk(self._top):
            with contextlib.suppress(OSError):
                ids.add(os.stat(directory).st_ino)
        self._ids = ids

    def select(self, cgroup_ids: Sequence[int]) -> set[int]:
        """The ids among ``cgroup_ids`` inside the scope."""
        if self._everything:
            return set(cgroup_ids)
        if any(cgid not in self._ids for cgid in cgroup_ids):
            self._rescan()
        return {cgid for cgid in cgroup_ids if cgid in self._ids}


class BpfCgroupProbe:
    """A probe backed by one ``bpf/NAME.bpf.c`` that keeps per-cgroup ``stats``.

    Subclasses set ``name``, ``tracepoints`` (``category:event``), ``counters``
    (C field → metric name) and ``histograms`` (C slots field → histogram name).
    """

    name: str = ""
    tracepoints: ClassVar[tuple[str, ...]] = ()
    counters: ClassVar[Mapping[str, str]] = {}
    histograms: ClassVar[Mapping[str, str]] = {}

    def __init__(
        self, ctx: ProbeContext, paths: HostPaths | None = None, cflags: Sequence[str] = ()
    ) -> None:
        self._ctx = ctx
        self._paths = paths
        self._cflags = tuple(cflags)
        """Extra compiler flags (tests shrink the maps with ``-DMAX_TASKS=…``)."""
        self._scope = CgroupScope(ctx)
        self._program: LoadedProgram | None = None
        self._generation = 0
        self._missed_events = 0
        self._losing_entries = False
        self.lost_entries_by_kind: dict[str, int] = {}
        """The latest interval's lost entries by kind (:data:`LOST_ENTRY_KINDS`)."""

    def start(self) -> None:
        program = load_program(self.name, self._ctx, self.tracepoints, self._paths, self._cflags)
        missing = (set(self.counters) | set(self.histograms)) - set(program.leaf_fields)
        lost_slots = 2 * len(LOST_ENTRY_KINDS)
        if missing or program.lost_slots != lost_slots:
            program.close()
            lacks = (
                f"its stats struct lacks {sorted(missing)}"
                if missing
                else f"its lost_entries map has {program.lost_slots} slots, not {lost_slots}"
            )
            raise ProbeUnavailable(
                f"bpf/{self.name}.bpf.c does not match this agent: {lacks}; ship the bpf/ "
                f"directory of the same release"
            )
        # What was counted before the first interval begins (from the attach on, while the
        # loader seeded the tasks map) belongs to no interval: drain it away.
        try:
            self.drain(program)
            program.take_lost_entries(self._generation - 1)
        except OSError as exc:
            program.close()
            raise ProbeUnavailable(f"cannot read the maps of bpf/{self.name}.bpf.c: {exc}") from exc
        self._missed_events = program.missed_events()
        self._program = program

    def collect(self) -> Sample:
        sample = Sample()
        if self._program is None:
            return sample
        try:
            totals = self.drain(self._program)
        except OSError as exc:
            reason = f"draining the maps of bpf/{self.name}.bpf.c failed: {exc}"
            raise CollectFailed(reason) from exc
        missed = self._program.missed_events()
        sample.node[BPF_MISSED_EVENTS] = float(missed - self._missed_events)
        self._missed_events = missed
        # drain() moved the generation on and waited the grace period. Not knowing what
        # was lost must not read as nothing lost: an OSError here fails the collect, and
        # the agent leaves this probe's families out of the interval.
        lost = self._program.take_lost_entries(self._generation - 1)
        self.lost_entries_by_kind = lost
        sample.node[BPF_LOST_ENTRIES] = float(sum(lost.values()))
        self._log_lost_entries(lost)
        for cgid in self._scope.select(list(totals)):
            cgroup = totals[cgid]
            sample.by_cgroup_id[cgid] = {
                metric: float(cgroup.counters.get(field, 0))
                for field, metric in self.counters.items()
            }
            sample.histograms_by_cgroup_id[cgid] = {
                name: hist.normalize(cgroup.slots.get(field, []))
                for field, name in self.histograms.items()
            }
        return sample

    def _log_lost_entries(self, lost: Mapping[str, int]) -> None:
        """One warning when a streak of intervals with lost entries starts, a line when
        it ends."""
        losing = any(lost.values())
        if losing and not self._losing_entries:
            log.warning(
                "probe %s: BPF maps lost entries this interval (%s): more tasks or cgroups "
                "were active than bpf/intf.h MAX_TASKS / MAX_CGROUPS hold; the interval's "
                "figures are incomplete and published as unmeasured (degraded), see "
                "bpf_lost_entries",
                self.name,
                ", ".join(f"{count} {kind}" for kind, count in lost.items()),
            )
        elif self._losing_entries and not losing:
            log.info("probe %s: BPF maps lose no entries any more", self.name)
        self._losing_entries = losing

    def drain(self, program: LoadedProgram) -> dict[int, CgroupTotals]:
        """Move to a new generation and return (and delete) everything counted before it."""
        self._generation += 1
        program.set_generation(self._generation)
        time.sleep(DRAIN_GRACE_S)
        totals: dict[int, CgroupTotals] = {}
        for key in program.stats_keys():
            if key.generation == self._generation:
                continue
            per_cpu = program.lookup_per_cpu(key)
            program.delete(key)
            if per_cpu is None:
                continue
            cgroup = sum_per_cpu(per_cpu)
            if key.cgroup_id in totals:
                merge_totals(totals[key.cgroup_id], cgroup)
            else:
                totals[key.cgroup_id] = cgroup
        return totals

    def close(self) -> None:
        program, self._program = self._program, None
        if program is not None:
            program.close()
