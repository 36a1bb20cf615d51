"""How many CPUs the measured cgroup subtree can run on: the denominator of
``runq_wait_ratio``.

Under ``--cgroup-root`` the tasks of the subtree only run on the CPUs of its cpuset, so
the ratio of waiting-task seconds per CPU-second must divide by those, not by the host's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import PurePosixPath

V2_EFFECTIVE_CPUS = "cpuset.cpus.effective"
"""cgroup v2: the CPUs a cgroup's tasks may use (present where the controller is enabled)."""
V1_EFFECTIVE_CPUS = "cpuset.effective_cpus"
"""cgroup v1 ``cpuset`` controller: the same, for hybrid hosts."""


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPUs of a kernel cpu list such as ``"0-3,8,10-11"`` (``cpuset.cpus``,
    ``/sys/devices/system/cpu/online``): comma-separated CPU numbers and inclusive
    ``first-last`` ranges; whitespace around items is ignored and an empty list is
    the empty set. ``ValueError`` names the item that is not a CPU or a range."""
    cpus: set[int] = set()
    for item in (part.strip() for part in text.strip().split(",")):
        if not item:
            continue
        first, sep, last = item.partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(f"cpu list item {item!r} is neither N nor N-M (in {text!r})")
        low, high = int(first), int(last) if sep else int(first)
        if high < low:
            raise ValueError(f"cpu range {item!r} ends before it starts (in {text!r})")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


@dataclass(frozen=True)
class CpuCount:
    """CPUs available to the measured subtree and where that figure came from."""

    count: int
    source: str
    """The file it was read from, or why the host's count is used."""


def subtree_cpus(cgroup_root: str, cgroup_v2_mount: str, cgroup_v1_mount: str) -> CpuCount:
    """The CPUs of ``cgroup_root``'s cpuset: v2 ``cpuset.cpus.effective`` under
    ``cgroup_v2_mount``, else v1 ``<cgroup_v1_mount>/cpuset/<root>/cpuset.effective_cpus``,
    each read at the root or, where it has no such (non-empty) file, its nearest ancestor
    that has one; else the host's CPU count."""
    candidates = (
        (cgroup_v2_mount, V2_EFFECTIVE_CPUS),
        (os.path.join(cgroup_v1_mount, "cpuset"), V1_EFFECTIVE_CPUS),
    )
    for mount, file_name in candidates:
        found = _nearest_cpu_list(mount, cgroup_root, file_name)
        if found is not None:
            path, cpus = found
            return CpuCount(count=len(cpus), source=path)
    return CpuCount(
        count=os.cpu_count() or 1,
        source=f"the host's CPUs (no cpuset file for {cgroup_root} under {cgroup_v2_mount} "
        f"or {cgroup_v1_mount}/cpuset)",
    )


def _nearest_cpu_list(
    mount: str, cgroup_root: str, file_name: str
) -> tuple[str, frozenset[int]] | None:
    """The first non-empty ``file_name`` from ``mount/cgroup_root`` up to ``mount``."""
    relative = PurePosixPath("/", cgroup_root.strip("/"))
    for directory in (relative, *relative.parents):
        path = os.path.join(mount, str(directory).lstrip("/"), file_name)
        try:
            with open(path) as f:
                cpus = parse_cpu_list(f.read())
        except OSError:
            continue
        if cpus:  # an empty v1 cpuset holds no task; its parent's CPUs are the real bound
            return path, cpus
    return None
