"""A pod's CPU and memory knobs in cgroupfs, read and written by the degrader.

The knob of each resource lives where its controller is: cgroup v2 when the pod's v2
cgroup has the controller (``cpu.weight``, ``memory.high``), else the v1 controller's
hierarchy (hybrid hosts, as in this project's lab: ``cpu.shares``,
``memory.soft_limit_in_bytes``). v1 has no ``memory.high``; its soft limit is what the
kernel reclaims from first under global memory pressure — which is when the node stalls
in reclaim, the only time the degrader sets it — and it never throttles or kills, where
``memory.limit_in_bytes`` would invoke the OOM killer.

Every write goes to the pod's own cgroup (``…/pod<uid>``, the level the kubelet sizes
from requests), never a container's or a QoS class's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from node_agent.attribution import parse_cgroup_path
from node_agent.probes.base import ProbeContext

Resource = Literal["cpu", "memory"]

V2_CPU_WEIGHT = "cpu.weight"
V1_CPU_SHARES = "cpu.shares"
V2_MEMORY_HIGH = "memory.high"
V1_MEMORY_SOFT_LIMIT = "memory.soft_limit_in_bytes"
V2_MEMORY_CURRENT = "memory.current"
V1_MEMORY_USAGE = "memory.usage_in_bytes"
PAGE_BYTES = 4096
V1_MIN_CPU_SHARES = 2
"""The kernel's smallest ``cpu.shares``."""


@dataclass(frozen=True)
class Knob:
    """One cgroup file that holds a pod's share of a resource."""

    resource: Resource
    path: str
    """Absolute path of the file."""

    @property
    def file(self) -> str:
        return os.path.basename(self.path)

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)


def v1_cpu_shares(weight: int) -> int:
    """``cpu.shares`` for a v2 ``cpu.weight`` (systemd's mapping: 100 ↔ 1024)."""
    return max(V1_MIN_CPU_SHARES, weight * 1024 // 100)


class PodCgroups:
    """Finds pods' cgroup directories by UID in the v2 hierarchy and in the v1 ``cpu`` and
    ``memory`` hierarchies (re-walked when a UID is not found)."""

    def __init__(self, ctx: ProbeContext) -> None:
        self._ctx = ctx
        self._dirs: dict[str, dict[str, str]] = {}

    def _mounts(self) -> dict[str, str]:
        return {
            "v2": self._ctx.cgroup_v2_mount,
            "cpu": os.path.join(self._ctx.cgroup_v1_mount, "cpu"),
            "memory": os.path.join(self._ctx.cgroup_v1_mount, "memory"),
        }

    def _rescan(self) -> None:
        found: dict[str, dict[str, str]] = {}
        for hierarchy, mount in self._mounts().items():
            top = os.path.join(mount, self._ctx.cgroup_root.strip("/"))
            for directory, _subdirs, _files in os.walk(top):
                parsed = parse_cgroup_path(os.path.relpath(directory, mount))
                if parsed is not None and parsed[2] == "" and os.path.basename(directory):
                    uid = parsed[0]
                    # The pod's own level: its parent is not the same pod.
                    parent = parse_cgroup_path(os.path.relpath(os.path.dirname(directory), mount))
                    if parent is None or parent[0] != uid:
                        found.setdefault(uid, {})[hierarchy] = directory
        self._dirs = found

    def directories(self, uid: str) -> dict[str, str]:
        """``{"v2" | "cpu" | "memory": directory}`` of the pod's own cgroup."""
        if uid not in self._dirs:
            self._rescan()
        return self._dirs.get(uid, {})

    def knob(self, uid: str, resource: Resource) -> Knob | None:
        """Where the pod's ``resource`` share is set, or None (no such pod, or the
        controller is in neither hierarchy)."""
        dirs = self.directories(uid)
        v2_file, v1_file = (
            (V2_CPU_WEIGHT, V1_CPU_SHARES)
            if resource == "cpu"
            else (V2_MEMORY_HIGH, V1_MEMORY_SOFT_LIMIT)
        )
        if "v2" in dirs and os.path.exists(os.path.join(dirs["v2"], v2_file)):
            return Knob(resource, os.path.join(dirs["v2"], v2_file))
        if resource in dirs and os.path.exists(os.path.join(dirs[resource], v1_file)):
            return Knob(resource, os.path.join(dirs[resource], v1_file))
        return None


def read_knob(knob: Knob) -> str:
    """The file's value (``OSError`` when the cgroup is gone)."""
    with open(knob.path) as f:
        return f.read().strip()


def write_knob(knob: Knob, value: str) -> None:
    """Write ``value`` (``OSError`` when the cgroup is gone or the kernel refuses it)."""
    with open(knob.path, "w") as f:
        f.write(value)


def memory_usage_bytes(knob: Knob) -> int:
    """The pod's memory use, from the file beside a memory knob."""
    name = V2_MEMORY_CURRENT if knob.file == V2_MEMORY_HIGH else V1_MEMORY_USAGE
    with open(os.path.join(knob.directory, name)) as f:
        return int(f.read().strip())


def degraded_value(
    knob: Knob, *, cpu_weight: int, memory_ratio: float, memory_floor_bytes: int
) -> str:
    """What the degrader writes: the lowered CPU share, or a memory ceiling of
    ``max(floor, ratio · current use)``, page-aligned (reads the use for memory)."""
    if knob.resource == "cpu":
        return str(cpu_weight if knob.file == V2_CPU_WEIGHT else v1_cpu_shares(cpu_weight))
    ceiling = max(memory_floor_bytes, int(memory_usage_bytes(knob) * memory_ratio))
    return str(ceiling // PAGE_BYTES * PAGE_BYTES)
