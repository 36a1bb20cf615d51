"""Compile, attach and drain the agent's BCC programs, with errors a person can act on.

Every BPF program in ``bpf/`` follows the contract of ``bpf/intf.h``: one per-CPU hash
named ``stats`` keyed by ``(cgroup_id, generation)`` whose value is a struct of ``u64``
counters and ``u64 NAME_slots[HIST_SLOTS]`` log2 histograms, and a one-slot array
``drain_generation``. :class:`BpfCgroupProbe` bumps the generation, waits a grace
period for programs already running, then reads and deletes the old generation: events
counted during the drain land in the new generation, so nothing is lost and the map
starts every interval empty.

``bcc`` is imported only when a program is loaded, so the agent (and its tests) import
fine on machines without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from interference import hist
from node_agent.probes.base import ProbeContext, ProbeUnavailable, Sample

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
    has = [(capabilities >> bit) & 1 == 1 for bit in (CAP_SYS_ADMIN, CAP_BPF, CAP_PERFMON)]
    sys_admin, bpf, perfmon = has
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
    if not events.is_dir():
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


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Collect what native code writes to fd 2 (clang and verifier output) into a list."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())


def load_program(
    name: str,
    ctx: ProbeContext,
    tracepoints: Sequence[str],
    paths: HostPaths | None = None,
) -> Any:
    """Check prerequisites, compile ``NAME.bpf.c`` with BCC and attach its tracepoints.

    Returns the ``bcc.BPF`` object; every failure is a :class:`ProbeUnavailable` whose
    message says what to mount, install or grant.
    """
    check_privileges(effective_capabilities(ctx.proc_root))
    check_tracepoints(ctx.tracefs, tracepoints)
    check_kernel_headers(paths or HostPaths())
    bcc = import_bcc()
    source_dir = resolve_source_dir(ctx)
    text = read_program(source_dir, name)
    output: list[str] = []
    try:
        with captured_stderr() as output:
            program = bcc.BPF(text=text.encode())
    except Exception as exc:  # bcc raises bare Exception for compile, load and attach
        details = "\n".join(output[-15:])
        raise ProbeUnavailable(
            f"BPF program {source_dir / name}.bpf.c failed to compile, load or attach "
            f"({exc}); check the kernel headers at /lib/modules/$(uname -r)/build and "
            f"that the kernel allows BPF (kernel.unprivileged_bpf_disabled does not "
            f"matter for root; lockdown=confidentiality blocks it). Output:\n{details}"
        ) from exc
    if output:
        log.debug("BCC output while loading %s:\n%s", name, "\n".join(output))
    return program


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

    def __init__(self, ctx: ProbeContext, paths: HostPaths | None = None) -> None:
        self._ctx = ctx
        self._paths = paths
        self._scope = CgroupScope(ctx)
        self._program: Any = None
        self._generation = 0

    def start(self) -> None:
        program = load_program(self.name, self._ctx, self.tracepoints, self._paths)
        leaf = program[STATS_TABLE].sLeaf
        fields = {field_name for field_name, *_ in leaf._fields_}
        expected = set(self.counters) | set(self.histograms)
        if not expected <= fields:
            program.cleanup()
            raise ProbeUnavailable(
                f"bpf/{self.name}.bpf.c does not match this agent: its stats struct lacks "
                f"{sorted(expected - fields)}; ship the bpf/ directory of the same release"
            )
        self._program = program

    def collect(self) -> Sample:
        sample = Sample()
        if self._program is None:
            return sample
        try:
            totals = self.drain()
        except Exception as exc:  # bcc reports syscall failures as bare Exception
            log.warning("probe %s: draining BPF maps failed: %s", self.name, exc)
            return sample
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

    def drain(self) -> dict[int, CgroupTotals]:
        """Move to a new generation and return (and delete) everything counted before it."""
        program = self._program
        table = program[STATS_TABLE]
        self._generation += 1
        program[GENERATION_TABLE][ctypes.c_int(0)] = ctypes.c_uint64(self._generation)
        time.sleep(DRAIN_GRACE_S)
        totals: dict[int, CgroupTotals] = {}
        stale: list[Any] = []
        for key, per_cpu in table.items_lookup_batch():
            if key.generation == self._generation:
                continue
            stale.append(table.Key(key.cgroup_id, key.generation))
            cgroup = sum_per_cpu(per_cpu)
            if key.cgroup_id in totals:
                merge_totals(totals[key.cgroup_id], cgroup)
            else:
                totals[key.cgroup_id] = cgroup
        if stale:
            table.items_delete_batch((table.Key * len(stale))(*stale))
        return totals

    def close(self) -> None:
        program, self._program = self._program, None
        if program is not None:
            program.cleanup()
