"""A probe backed by one BPF program's per-cgroup ``stats``: each interval it moves the
drain generation on, reads and deletes the old one's entries, sums them per cgroup and
returns them, with the lost entries and skipped runs, as a :class:`Sample`."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
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
from node_agent.probes.bpf.cgroup_scope import CgroupScope
from node_agent.probes.bpf.loaded_program import LOST_ENTRY_KINDS, LoadedProgram
from node_agent.probes.bpf.loader import load_program
from node_agent.probes.bpf.prerequisites import HostPaths

log = logging.getLogger(__name__)

DRAIN_GRACE_S = 0.002
"""Wait after bumping the generation: tracepoint programs run with preemption off and
finish within microseconds, so after this none still writes to the old generation."""


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
