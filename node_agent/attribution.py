"""Who owns a cgroup: cgroup id → cgroup path → pod UID, container id and QoS class.

BPF reports ``bpf_get_current_cgroup_id()``, which is the inode number of the task's
cgroup v2 directory. :class:`Attributor` keeps an index of those inode numbers for the
v2 hierarchy below ``ProbeContext.cgroup_root`` and re-walks it when it meets an id it
does not know (at most once per ``refresh_interval_s``, so a burst of unknown ids costs
one walk). The path is then parsed by :func:`parse_cgroup_path`, which understands the
kubelet's two cgroup drivers and the three runtimes' container cgroup names:

=========  =================================================================================
driver     path (any prefix may come before ``kubepods``)
=========  =================================================================================
systemd    ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/
           cri-containerd-<id>.scope`` (or ``crio-<id>.scope``, ``docker-<id>.scope``);
           guaranteed pods sit directly in ``kubepods.slice/kubepods-pod<uid_>.slice``;
           ``<uid_>`` is the UID with ``-`` written as ``_``
cgroupfs   ``kubepods/burstable/pod<uid>/<id>`` (containerd, Docker) or ``.../crio-<id>``;
           guaranteed pods sit directly in ``kubepods/pod<uid>``
=========  =================================================================================

Anything else (system services, the runtime itself, the kubelet) is the ``system`` bucket.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from interference.signals import SYSTEM_POD
from node_agent.pods import PodDirectory
from node_agent.probes.base import ProbeContext

log = logging.getLogger(__name__)

QOS_GUARANTEED = "guaranteed"
QOS_BURSTABLE = "burstable"
QOS_BESTEFFORT = "besteffort"

RUNTIME_CONTAINERD = "containerd"
RUNTIME_CRIO = "crio"
RUNTIME_DOCKER = "docker"


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """Who owns a cgroup."""

    uid: str
    """Pod UID; empty for the system bucket."""
    namespace: str
    """Pod namespace; empty when unknown."""
    name: str
    """Pod name; the UID when the name is unknown; ``system`` for the system bucket."""
    qos: str
    """``guaranteed``, ``burstable``, ``besteffort``, or empty for the system bucket."""
    container_id: str = ""
    """Container id (64 hex digits) when the cgroup is a container's; empty for the pod's own."""


SYSTEM = PodIdentity(uid="", namespace="", name=SYSTEM_POD, qos="")
"""Every cgroup that does not belong to a Kubernetes pod."""

_SYSTEMD_POD = re.compile(
    r"^(?:[\w-]+-)?kubepods(?:-(?P<qos>burstable|besteffort))?-pod(?P<uid>[0-9a-fA-F_]{32,36})\.slice$"
)
_CGROUPFS_POD = re.compile(r"^pod(?P<uid>[0-9a-fA-F-]{32,36})$")
_CONTAINER = re.compile(
    r"^(?:(?P<prefix>cri-containerd|crio|docker)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$"
)
_CRIO_CONMON = re.compile(r"^crio-conmon-[0-9a-f]{64}\.scope$")
_RUNTIME_BY_PREFIX = {
    "cri-containerd": RUNTIME_CONTAINERD,
    "crio": RUNTIME_CRIO,
    "docker": RUNTIME_DOCKER,
}


@lru_cache(maxsize=8192)
def parse_cgroup_path(path: str) -> tuple[str, str, str, str] | None:
    """``(pod_uid, qos, container_id, runtime)`` for a pod's cgroup path, else ``None``.

    Pure. The pod is recognised by its own directory (``kubepods[-<qos>]-pod<uid>.slice``
    for the systemd driver, ``kubepods/[<qos>/]pod<uid>`` for cgroupfs); a missing QoS
    level means ``guaranteed``. The container id comes from the next level
    (``cri-containerd-<id>.scope``, ``crio-<id>.scope``, ``docker-<id>.scope`` or a bare
    64-hex id); deeper cgroups a container made for itself belong to that container.
    ``runtime`` is ``containerd``/``crio``/``docker``, or empty where the name does not say
    (a bare id under cgroupfs is used by both containerd and Docker, and the pod's own
    cgroup and CRI-O's ``crio-conmon-<id>.scope`` have no container).
    """
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        systemd = _SYSTEMD_POD.match(part)
        if systemd is not None:
            uid = systemd["uid"].replace("_", "-").lower()
            qos = systemd["qos"] or QOS_GUARANTEED
            return (uid, qos, *_container(parts[i + 1 : i + 2], conmon_runtime=RUNTIME_CRIO))
        cgroupfs = _CGROUPFS_POD.match(part)
        if cgroupfs is not None and _is_cgroupfs_qos_parent(parts[:i]):
            qos = parts[i - 1] if parts[i - 1] != "kubepods" else QOS_GUARANTEED
            uid = cgroupfs["uid"].lower()
            return (uid, qos, *_container(parts[i + 1 : i + 2], conmon_runtime=RUNTIME_CRIO))
    return None


def _is_cgroupfs_qos_parent(parents: list[str]) -> bool:
    """``…/kubepods`` or ``…/kubepods/{burstable,besteffort}`` directly above ``pod<uid>``."""
    if parents[-1:] == ["kubepods"]:
        return True
    return (
        len(parents) >= 2
        and parents[-2] == "kubepods"
        and parents[-1]
        in (
            QOS_BURSTABLE,
            QOS_BESTEFFORT,
        )
    )


def _container(child: list[str], conmon_runtime: str) -> tuple[str, str]:
    """``(container_id, runtime)`` from the level below the pod's cgroup (if any)."""
    if not child:
        return "", ""
    if _CRIO_CONMON.match(child[0]):
        return "", conmon_runtime
    match = _CONTAINER.match(child[0])
    if match is None:
        return "", ""
    prefix = match["prefix"]
    return match["id"], _RUNTIME_BY_PREFIX[prefix] if prefix else ""


class Attributor:
    """Maps cgroup ids, cgroup paths and pids to the pod that owns them.

    Namespace and name come from ``directory``; when it does not know the UID (no API
    credentials, or the pod is not yet in the watch cache) the pod is named by its UID.
    """

    def __init__(
        self,
        ctx: ProbeContext,
        directory: PodDirectory,
        *,
        refresh_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``refresh_interval_s``: least time between two walks of the v2 hierarchy."""
        self._ctx = ctx
        self._directory = directory
        self._refresh_interval_s = refresh_interval_s
        self._clock = clock
        self._path_by_id: dict[int, str] = {}
        self._last_walk = -float("inf")
        self.walks = 0
        """How many times the hierarchy was walked (for tests and metrics)."""

    def path_of(self, cgroup_id: int) -> str | None:
        """The v2 path (relative to the v2 mount, starting with ``/``) of a cgroup id."""
        path = self._path_by_id.get(cgroup_id)
        if path is None and self._clock() - self._last_walk >= self._refresh_interval_s:
            self.refresh()
            path = self._path_by_id.get(cgroup_id)
        return path

    def refresh(self) -> None:
        """Re-walk the v2 hierarchy below ``cgroup_root`` and rebuild the id index."""
        self._last_walk = self._clock()
        self.walks += 1
        mount = self._ctx.cgroup_v2_mount.rstrip("/") or "/"
        top = os.path.join(mount, self._ctx.cgroup_root.strip("/"))
        index: dict[int, str] = {}
        # os.walk ignores directories that vanish mid-walk; a cgroup removed between
        # listing and stat is simply skipped.
        for directory, _subdirs, _files in os.walk(top):
            try:
                inode = os.stat(directory).st_ino
            except OSError:
                continue
            relative = os.path.relpath(directory, mount)
            index[inode] = "/" if relative == "." else "/" + relative
        self._path_by_id = index

    def by_id(self, cgroup_id: int) -> PodIdentity:
        """Owner of a cgroup v2 id (as BPF reports it); ``SYSTEM`` when unknown."""
        path = self.path_of(cgroup_id)
        return SYSTEM if path is None else self.by_path(path)

    def by_path(self, path: str) -> PodIdentity:
        """Owner of a cgroup path (v1 or v2, any prefix); ``SYSTEM`` unless it is a pod's."""
        parsed = parse_cgroup_path(path)
        if parsed is None:
            return SYSTEM
        uid, qos, container_id, _runtime = parsed
        known = self._directory.lookup(uid)
        namespace, name = known if known is not None else ("", uid)
        return PodIdentity(
            uid=uid, namespace=namespace, name=name, qos=qos, container_id=container_id
        )

    def by_pid(self, pid: int) -> PodIdentity:
        """Owner of a process, from ``/proc/PID/cgroup``; ``SYSTEM`` if it has exited.

        The v2 line (``0::/…``) is used when it names a pod; on hybrid hosts where the
        runtime placed the task only in v1 controllers, the first v1 line naming a pod is.
        """
        try:
            with open(os.path.join(self._ctx.proc_root, str(pid), "cgroup")) as f:
                lines = f.read().splitlines()
        except OSError:  # exited, or not visible from this pid namespace
            return SYSTEM
        v2 = [line[3:] for line in lines if line.startswith("0::")]
        v1 = [line.split(":", 2)[-1] for line in lines if not line.startswith("0::")]
        for path in v2 + v1:
            identity = self.by_path(path)
            if identity is not SYSTEM:
                return identity
        return SYSTEM
