"""Which cgroup v2 ids lie at or below ``ProbeContext.cgroup_root``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from node_agent.probes.base import ProbeContext


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
