"""The agent's side of a loaded program: its maps read and written with plain ``bpf(2)``
calls, its programs and attachments held as file descriptors until closed."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOST_ENTRY_KINDS = ("cgroup", "task")
"""Slots of ``lost_entries`` within one parity, in the order of ``LOST_*_ENTRY`` in
``bpf/intf.h``: per-cgroup ``stats`` entries not created, per-task entries not stored
(or evicted while the task was queued)."""


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
    """One of a program's :data:`~node_agent.probes.bpf.compiler.PAIR_TABLES`: its
    descriptor and key and value layout (u64 fields, the key's last one ``generation``)."""

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
        """The program's :data:`~node_agent.probes.bpf.compiler.PAIR_TABLES`, by name."""
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
