"""Pressure stall information: node totals from ``/proc/pressure/*`` and per-cgroup files.

Each PSI file's ``total=`` is cumulative stall time in µs; the probe reports its
increase over the interval (``psi_cpu_some_us``, ``psi_mem_some_us``, ``psi_mem_full_us``,
``psi_io_some_us``). Dividing by the interval length gives the share of time stalled.
Per-cgroup values come from the v2 ``cpu.pressure``/``memory.pressure``/``io.pressure``
files and cover the cgroup *and its descendants* — they are not additive across levels:
use the pod's own cgroup, not the sum of its containers.

Beside the totals, the probe reads the kernel's own 10 s average of memory ``some``
pressure (``avg10``, percent) of the cgroup root the agent watches — its
``memory.pressure`` in the v2 hierarchy, ``/proc/pressure/memory`` when the root is ``/``
— as ``psi_mem_some_avg10``: a gauge the kernel smooths itself, which the scheduling
record carries as it is (``interference.sched_record.NODE_SIGNALS``).
"""

from __future__ import annotations

import os

from node_agent.probes.base import (
    PSI_CPU_SOME_US,
    PSI_IO_SOME_US,
    PSI_MEM_FULL_US,
    PSI_MEM_SOME_AVG10,
    PSI_MEM_SOME_US,
    ProbeContext,
    ProbeUnavailable,
    Sample,
    register,
)
from node_agent.probes.cgroup_files import (
    CgroupCounters,
    CounterDeltas,
    Hierarchy,
    read_pressure_average,
    read_pressure_totals,
    v2_hierarchy,
)

_NODE = "node"


def read_pressure(directory: str, suffix: str) -> dict[str, int] | None:
    """PSI totals (µs) from the ``cpu``, ``memory`` and ``io`` files in ``directory``.

    File names are ``<resource><suffix>``: ``suffix`` is empty for ``/proc/pressure`` and
    ``.pressure`` for a cgroup. ``None`` when none of them can be read.
    """
    totals: dict[str, int] = {}
    for resource, wanted in (
        ("cpu", ((PSI_CPU_SOME_US, "some"),)),
        ("memory", ((PSI_MEM_SOME_US, "some"), (PSI_MEM_FULL_US, "full"))),
        ("io", ((PSI_IO_SOME_US, "some"),)),
    ):
        name = f"{resource}{suffix}"
        values = read_pressure_totals(os.path.join(directory, name))
        if values is None:
            continue
        for metric, kind in wanted:
            if kind in values:
                totals[metric] = values[kind]
    return totals or None


def read_cgroup_pressure(directory: str) -> dict[str, int] | None:
    """PSI totals of one v2 cgroup (``cpu.pressure`` …); ``None`` when PSI is off for it."""
    return read_pressure(directory, ".pressure")


def memory_pressure_file(ctx: ProbeContext, v2: Hierarchy | None) -> str | None:
    """The memory PSI file of the cgroup root the agent watches: ``/proc/pressure/memory``
    for ``/`` (the whole node, also on v1-only hosts), else the root's ``memory.pressure``
    in the v2 hierarchy — the subtree's stalls, as the agent's PSI totals are. ``None``
    for a root below ``/`` without a v2 hierarchy (no PSI file covers just that subtree)."""
    root = ctx.cgroup_root.strip("/")
    if not root:
        return os.path.join(ctx.proc_root, "pressure", "memory")
    return None if v2 is None else os.path.join(v2.mount, root, "memory.pressure")


@register("psi")
class PsiProbe:
    """Node PSI deltas in ``Sample.node``; per-cgroup PSI deltas in ``by_cgroup_path``."""

    name = "psi"

    def __init__(self, ctx: ProbeContext) -> None:
        self._ctx = ctx
        self._node_dir = os.path.join(ctx.proc_root, "pressure")
        self._node: CounterDeltas[str] = CounterDeltas()
        self._cgroups: CgroupCounters | None = None
        self._memory_pressure_file: str | None = None

    def start(self) -> None:
        """Check that the kernel exposes PSI and take the baselines."""
        if read_pressure(self._node_dir, "") is None:
            raise ProbeUnavailable(
                f"{self._node_dir}/{{cpu,memory,io}} cannot be read: the kernel was built "
                "without CONFIG_PSI or booted with psi=0; boot with psi=1 (kernel ≥ 4.20)"
            )
        self._node.update(self._read_node())
        v2 = v2_hierarchy(self._ctx)
        self._memory_pressure_file = memory_pressure_file(self._ctx, v2)
        if v2 is not None:
            self._cgroups = CgroupCounters(v2, self._ctx.cgroup_root, read_cgroup_pressure)
            self._cgroups.collect()

    def _read_node(self) -> dict[str, dict[str, int]]:
        totals = read_pressure(self._node_dir, "")
        return {_NODE: totals} if totals is not None else {}

    def collect(self) -> Sample:
        """Stall µs accumulated since the previous call (node, and per cgroup with any)."""
        node = self._node.update(self._read_node()).get(_NODE, {})
        by_path = self._cgroups.collect() if self._cgroups is not None else {}
        values = {name: float(value) for name, value in node.items()}
        pressure_file = self._memory_pressure_file
        average = None if pressure_file is None else read_pressure_average(pressure_file)
        if average is not None:
            values[PSI_MEM_SOME_AVG10] = average
        return Sample(node=values, by_cgroup_path=by_path)

    def close(self) -> None:
        """Nothing to release."""
        self._cgroups = None
