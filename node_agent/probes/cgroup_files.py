"""Shared plumbing for the probes that read the kernel's cgroup and pressure files.

Walks one hierarchy below ``ProbeContext.cgroup_root``, parses the flat-keyed files
(``cpu.stat``, ``memory.events``) and the pressure files, and turns cumulative kernel
counters into per-interval deltas. Cgroups vanish at any moment on a busy node: every
read here treats a missing file or directory as "no data", never as an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from node_agent.probes.base import ProbeContext, ProbeUnavailable, Sample


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: the v2 tree or one v1 controller's tree."""

    mount: str
    """Where it is mounted, e.g. ``/sys/fs/cgroup/unified`` or ``/sys/fs/cgroup/cpu``."""
    version: int
    """1 or 2."""

    def walk(self, cgroup_root: str) -> Iterator[tuple[str, str]]:
        """``(path relative to the mount starting with "/", absolute directory)`` pairs.

        Only ``cgroup_root`` and its descendants; nothing when it does not exist.
        """
        mount = self.mount.rstrip("/") or "/"
        top = os.path.join(mount, cgroup_root.strip("/"))
        for directory, _subdirs, _files in os.walk(top):  # skips dirs that vanish
            relative = os.path.relpath(directory, mount)
            yield ("/" if relative == "." else "/" + relative), directory


def v2_hierarchy(ctx: ProbeContext, controller: str | None = None) -> Hierarchy | None:
    """The v2 hierarchy if mounted (and, if ``controller`` is given, has that controller)."""
    controllers = read_text(os.path.join(ctx.cgroup_v2_mount, "cgroup.controllers"))
    if controllers is None:
        return None
    if controller is not None and controller not in controllers.split():
        return None
    return Hierarchy(ctx.cgroup_v2_mount, 2)


def v1_hierarchy(ctx: ProbeContext, controller: str) -> Hierarchy | None:
    """The v1 hierarchy of ``controller`` (``cpu``, ``memory``) if it is mounted."""
    mount = os.path.join(ctx.cgroup_v1_mount, controller)
    if os.path.realpath(mount) == os.path.realpath(ctx.cgroup_v2_mount):
        return None
    # A v1 controller mount has ``tasks``; the v2 hierarchy never does.
    return Hierarchy(mount, 1) if os.path.exists(os.path.join(mount, "tasks")) else None


def read_text(path: str) -> str | None:
    """File contents, or ``None`` if it (or its cgroup) is gone or unreadable."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # ENOENT/ENODEV after rmdir, EACCES, EOPNOTSUPP (PSI disabled)
        return None


def read_flat_keyed(path: str) -> dict[str, int] | None:
    """Parse a ``key value`` per line file (``cpu.stat``, ``memory.events``)."""
    text = read_text(path)
    if text is None:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            values[key] = int(value)
        except ValueError:
            continue
    return values


def read_pressure_totals(path: str) -> dict[str, int] | None:
    """``{"some": total_us, "full": total_us}`` from a PSI file (``/proc/pressure/cpu``, …).

    ``full`` is missing where the kernel does not report it (node-level ``cpu`` before 5.13).
    """
    text = read_text(path)
    if text is None:
        return None
    totals: dict[str, int] = {}
    for line in text.splitlines():
        kind, _, fields = line.partition(" ")
        for field in fields.split():
            name, _, value = field.partition("=")
            if name == "total" and value.isdigit():
                totals[kind] = int(value)
    return totals


def read_pressure_average(path: str, kind: str = "some", span: str = "avg10") -> float | None:
    """The kernel's own running average ``span`` (``avg10``, ``avg60``, ``avg300``; percent)
    of the ``kind`` line of a PSI file; ``None`` when the file or the value is missing."""
    text = read_text(path)
    if text is None:
        return None
    for line in text.splitlines():
        line_kind, _, fields = line.partition(" ")
        if line_kind != kind:
            continue
        for field in fields.split():
            name, _, value = field.partition("=")
            if name == span:
                try:
                    return float(value)
                except ValueError:
                    return None
    return None


Key = TypeVar("Key", bound=Hashable)


class CounterDeltas(Generic[Key]):
    """Turns cumulative counters into deltas since the previous call, per key.

    The first call only sets the baseline. Later, a key not seen before (a cgroup or
    interface created since) counts its whole value, and so does a counter that went
    backwards (an object recreated under the same key). Keys missing from a call are
    forgotten, so memory follows what exists now.
    """

    def __init__(self) -> None:
        self._previous: dict[Key, Mapping[str, int]] | None = None

    def update(self, current: Mapping[Key, Mapping[str, int]]) -> dict[Key, dict[str, int]]:
        """Deltas since the previous call (empty on the first call)."""
        previous, self._previous = self._previous, dict(current)
        if previous is None:
            return {}
        deltas: dict[Key, dict[str, int]] = {}
        for key, counters in current.items():
            before = previous.get(key, {})
            deltas[key] = {
                name: _delta(value, before.get(name)) for name, value in counters.items()
            }
        return deltas


def _delta(value: int, previous: int | None) -> int:
    return value if previous is None or value < previous else value - previous


CounterReader = Callable[[str], dict[str, int] | None]
"""Reads one cgroup directory's counters (metric name → cumulative value), or ``None``."""


class CgroupCounters:
    """Per-cgroup deltas of the counters ``read`` finds in each cgroup of a hierarchy."""

    def __init__(self, hierarchy: Hierarchy, cgroup_root: str, read: CounterReader) -> None:
        self.hierarchy = hierarchy
        self._cgroup_root = cgroup_root
        self._read = read
        self._deltas: CounterDeltas[str] = CounterDeltas()

    def collect(self) -> dict[str, dict[str, float]]:
        """Cgroup path → metric → increase since the previous call; only non-zero ones."""
        current: dict[str, dict[str, int]] = {}
        for path, directory in self.hierarchy.walk(self._cgroup_root):
            counters = self._read(directory)
            if counters is not None:
                current[path] = counters
        changed: dict[str, dict[str, float]] = {}
        for key, deltas in self._deltas.update(current).items():
            nonzero = {name: float(value) for name, value in deltas.items() if value}
            if nonzero:
                changed[key] = nonzero
        return changed


class CgroupCounterProbe:
    """A probe reporting per-cgroup counter deltas from one controller's files.

    Subclasses name the ``controller`` and give one reader per cgroup version; ``start()``
    prefers the v2 hierarchy when it has the controller, else the v1 controller mount.
    Results are keyed by cgroup path in ``Sample.by_cgroup_path``; cgroups whose counters
    did not move in the interval are left out.
    """

    name: str
    controller: ClassVar[str]
    """The cgroup controller whose files are read: ``cpu``, ``memory``."""
    counters_description: ClassVar[str]
    """What is missing when neither hierarchy has the controller, e.g. "CFS throttling
    counters"; starts the :class:`ProbeUnavailable` message."""
    readers: ClassVar[Mapping[int, CounterReader]]
    """The reader of one cgroup directory's counters, by cgroup version (1 and 2)."""

    def __init__(self, ctx: ProbeContext) -> None:
        self._ctx = ctx
        self._counters: CgroupCounters | None = None

    def start(self) -> None:
        """Pick the hierarchy that has the controller and take the baseline."""
        hierarchy = v2_hierarchy(self._ctx, self.controller) or v1_hierarchy(
            self._ctx, self.controller
        )
        if hierarchy is None:
            v1_mount = os.path.join(self._ctx.cgroup_v1_mount, self.controller)
            raise ProbeUnavailable(
                f"no {self.counters_description}: the cgroup v2 hierarchy at "
                f"{self._ctx.cgroup_v2_mount} lacks the {self.controller} controller and no "
                f"v1 {self.controller} controller is mounted at {v1_mount}; mount the host's "
                "/sys/fs/cgroup into the agent (or pass --cgroup-v2-mount/--cgroup-v1-mount)"
            )
        read = self.readers[hierarchy.version]
        self._counters = CgroupCounters(hierarchy, self._ctx.cgroup_root, read)
        self._counters.collect()

    def collect(self) -> Sample:
        """Counter increases since the previous call, per cgroup whose counters moved."""
        if self._counters is None:
            return Sample()
        return Sample(by_cgroup_path=self._counters.collect())

    def close(self) -> None:
        """Nothing to release (files are opened and closed per read)."""
        self._counters = None
