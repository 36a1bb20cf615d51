"""Pressure stall information: node totals from ``/proc/pressure/*`` and per-cgroup files.

Each PSI file's ``total=`` is cumulative stall time in µs; the probe reports its
increase over the interval (``psi_cpu_some_us``, ``psi_mem_some_us``, ``psi_mem_full_us``,
``psi_io_some_us``). Dividing by the interval length gives the share of time stalled.
Per-cgroup values come from the v2 ``cpu.pressure``/``memory.pressure``/``io.pressure``
files and cover the cgroup *and its descendants* — they are not additive across levels:
use the pod's own cgroup, not the sum of its containers.
"""

from __future__ import annotations

import os

from node_agent.probes.base import (
    PSI_CPU_SOME_US,
    PSI_IO_SOME_US,
    PSI_MEM_FULL_US,
    PSI_MEM_SOME_US,
    ProbeContext,
    ProbeUnavailable,
    Sample,
    register,
)
from node_agent.probes.cgroup_files import (
    CgroupCounters,
    CounterDeltas,
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


@register("psi")
class PsiProbe:
    """Node PSI deltas in ``Sample.node``; per-cgroup PSI deltas in ``by_cgroup_path``."""

    name = "psi"

    def __init__(self, ctx: ProbeContext) -> None:
        self._ctx = ctx
        self._node_dir = os.path.join(ctx.proc_root, "pressure")
        self._node: CounterDeltas[str] = CounterDeltas()
        self._cgroups: CgroupCounters | None = None

    def start(self) -> None:
        """Check that the kernel exposes PSI and take the baselines."""
        if read_pressure(self._node_dir, "") is None:
            raise ProbeUnavailable(
                f"{self._node_dir}/{{cpu,memory,io}} cannot be read: the kernel was built "
                "without CONFIG_PSI or booted with psi=0; boot with psi=1 (kernel ≥ 4.20)"
            )
        self._node.update(self._read_node())
        v2 = v2_hierarchy(self._ctx)
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
        return Sample(
            node={name: float(value) for name, value in node.items()}, by_cgroup_path=by_path
        )

    def close(self) -> None:
        """Nothing to release."""
        self._cgroups = None
