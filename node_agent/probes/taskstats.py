"""Per-task CPU and reclaim delay from taskstats (pyroute2): the fallback when BPF cannot load.

For every task (thread) in a cgroup below ``ProbeContext.cgroup_root`` — v2
``cgroup.threads`` and, on hybrid hosts, the v1 ``cpu`` controller's ``tasks`` — the
probe asks the kernel's taskstats genetlink family for ``cpu_delay_total`` (run-queue
wait, the same clock as ``/proc/PID/schedstat``), ``cpu_count`` and
``freepages_delay_total`` (direct reclaim), and reports their increase per task id in
``Sample.by_pid``. Reclaim delay needs delay accounting (``sysctl kernel.task_delayacct=1``
or the ``delayacct`` boot flag); CPU delay does not. Tasks that exit between two
intervals lose their last partial interval.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from typing import Any

from node_agent.probes.base import (
    CPU_DELAY_COUNT,
    CPU_DELAY_NS,
    RECLAIM_DELAY_NS,
    CollectFailed,
    ProbeContext,
    ProbeUnavailable,
    Sample,
    register,
)
from node_agent.probes.cgroup_files import (
    CounterDeltas,
    Hierarchy,
    read_text,
    v1_hierarchy,
    v2_hierarchy,
)

log = logging.getLogger(__name__)

# struct taskstats (linux/taskstats.h): freepages_delay_total follows the 21 u64 fields
# from ac_etime (offset 144) on, then freepages_count. Version 15 (Linux 6.15/6.16)
# inserted max/min fields mid-struct; pyroute2 decodes that layout itself.
_FREEPAGES_DELAY_OFFSET = 144 + 21 * 8 + 8
_FIRST_VERSION_WITH_FREEPAGES = 6


def delays_from_stats(stats: Any) -> dict[str, int]:
    """CPU and reclaim delay counters from a decoded ``TASKSTATS_TYPE_STATS`` attribute."""
    delays = {CPU_DELAY_NS: int(stats["cpu_delay_total"]), CPU_DELAY_COUNT: int(stats["cpu_count"])}
    version = int(stats["version"])
    if version == 15:
        delays[RECLAIM_DELAY_NS] = int(stats["freepages_delay_total"])
    elif version >= _FIRST_VERSION_WITH_FREEPAGES:
        # pyroute2 stops decoding before freepages_*: read it from the raw attribute
        payload = stats.data[stats.offset + 4 : stats.offset + stats.length]
        if len(payload) >= _FREEPAGES_DELAY_OFFSET + 8:
            (reclaim,) = struct.unpack_from("=Q", payload, _FREEPAGES_DELAY_OFFSET)
            delays[RECLAIM_DELAY_NS] = int(reclaim)
    return delays


def check_host_pid_namespace(proc_root: str) -> None:
    """Raise unless this process's pid is the same in ``proc_root``'s PID namespace.

    Tasks are listed by the host's pids (``cgroup.threads`` read through the host's
    cgroupfs) and taskstats looks them up in the caller's PID namespace: both must be the
    host's."""
    try:
        seen_as = int(os.readlink(os.path.join(proc_root, "self")))
    except (OSError, ValueError) as exc:
        raise ProbeUnavailable(
            f"cannot read {proc_root}/self ({exc}); mount the host's /proc (PROC_ROOT)"
        ) from exc
    if seen_as != os.getpid():
        raise ProbeUnavailable(
            f"the agent runs in its own PID namespace (pid {os.getpid()}, {seen_as} on the "
            "host): taskstats needs the host's (hostPID, deploy/components/host-namespaces)"
        )


@register("taskstats")
class TaskstatsProbe:
    """Per-task CPU/reclaim delay deltas (``by_pid``) for tasks in cgroups under the root."""

    name = "taskstats"

    def __init__(self, ctx: ProbeContext) -> None:
        self._ctx = ctx
        self._socket: Any = None
        self._hierarchies: list[tuple[Hierarchy, str]] = []
        self._deltas: CounterDeltas[int] = CounterDeltas()

    def start(self) -> None:
        """Bind the taskstats family, find where tasks are listed, take the baseline."""
        v2 = v2_hierarchy(self._ctx)
        v1 = v1_hierarchy(self._ctx, "cpu")
        if v2 is not None:
            self._hierarchies.append((v2, "cgroup.threads"))
        if v1 is not None:
            self._hierarchies.append((v1, "tasks"))
        if not self._hierarchies:
            raise ProbeUnavailable(
                f"no cgroup hierarchy at {self._ctx.cgroup_v2_mount} or "
                f"{self._ctx.cgroup_v1_mount}/cpu to find tasks in; mount /sys/fs/cgroup"
            )
        check_host_pid_namespace(self._ctx.proc_root)
        try:
            from pyroute2 import TaskStats

            self._socket = TaskStats()
            self._socket.bind()
        except Exception as exc:  # pyroute2 raises NetlinkError or plain errors here
            self.close()
            raise ProbeUnavailable(
                f"taskstats netlink family unavailable ({exc}): the kernel needs "
                "CONFIG_TASKSTATS and the agent CAP_NET_ADMIN"
            ) from exc
        self._check_query_allowed()
        if (
            read_text(os.path.join(self._ctx.proc_root, "sys/kernel/task_delayacct")) or ""
        ).strip() == "0":
            log.warning(
                "taskstats: delay accounting is off, reclaim delay will read 0 "
                "(sysctl -w kernel.task_delayacct=1 turns it on)"
            )
        self._deltas.update(self._read())

    def _check_query_allowed(self) -> None:
        """Query the agent's own pid: without CAP_NET_ADMIN the family binds but refuses
        every query, which would otherwise read as tasks that never wait."""
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            self._socket.get_pid_stat(os.getpid())
        except NetlinkError as exc:
            self.close()
            if exc.code == errno.EPERM:
                raise ProbeUnavailable(
                    "taskstats refused a query for the agent's own pid (EPERM): it needs "
                    "CAP_NET_ADMIN (add NET_ADMIN to the container's capabilities)"
                ) from exc
            raise ProbeUnavailable(
                f"taskstats query for the agent's own pid failed ({exc}); the kernel needs "
                "CONFIG_TASKSTATS"
            ) from exc

    def _task_ids(self) -> set[int]:
        tids: set[int] = set()
        for hierarchy, listing in self._hierarchies:
            for _path, directory in hierarchy.walk(self._ctx.cgroup_root):
                text = read_text(os.path.join(directory, listing)) or ""
                tids.update(int(tid) for tid in text.split())
        return tids

    def _read(self) -> dict[int, dict[str, int]]:
        from pyroute2.netlink.exceptions import NetlinkError

        delays: dict[int, dict[str, int]] = {}
        for tid in self._task_ids():
            try:
                (reply,) = self._socket.get_pid_stat(tid)
            except NetlinkError as exc:
                if exc.code == errno.ESRCH:  # the task exited after it was listed
                    continue
                raise
            aggregate = reply.get_attr("TASKSTATS_TYPE_AGGR_PID")
            stats = aggregate.get_attr("TASKSTATS_TYPE_STATS") if aggregate else None
            if stats is not None:
                delays[tid] = delays_from_stats(stats)
        return delays

    def collect(self) -> Sample:
        """Delay accumulated since the previous call, per task with any."""
        if self._socket is None:
            return Sample()
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            deltas = self._deltas.update(self._read())
        except (OSError, NetlinkError) as exc:
            raise CollectFailed(f"taskstats read failed: {exc}") from exc
        by_pid = {
            tid: {name: float(value) for name, value in counters.items() if value}
            for tid, counters in deltas.items()
            if any(counters.values())
        }
        return Sample(by_pid=by_pid)

    def close(self) -> None:
        """Close the netlink socket; safe to call twice."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
