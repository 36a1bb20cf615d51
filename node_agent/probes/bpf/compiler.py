"""The compiler process: compile, load and attach one program with BCC, then hand its
map and attachment descriptors to the agent.

:func:`~node_agent.probes.bpf.loader.load_program` starts it, and only this process ever
imports ``bcc``; the descriptors go in the order
:class:`~node_agent.probes.bpf.loaded_program.LoadedProgram` takes them apart.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from node_agent.probes.bpf.prerequisites import import_bcc

STATS_TABLE = b"stats"
GENERATION_TABLE = b"drain_generation"
LOST_TABLE = b"lost_entries"

PAIR_TABLES = (b"culprits",)
"""Further generation-keyed maps a program may have (shared across CPUs, not per-CPU):
handed over with the others when present and drained by the probe that reads them
(``LoadedProgram.drain_table``)."""

SEEDED_TASKS_TABLE = b"tasks"
"""A program's per-task map keyed by pid (``runqlat``), seeded at attach (:func:`seed_tasks`)."""
BPF_NOEXIST = 1


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
    """Entry point of the compiler process (see
    :func:`~node_agent.probes.bpf.loader.load_program`).

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
