"""Check what loading a BPF program needs (privileges, tracepoints, kernel headers,
the ``bcc`` module), each failure a :class:`ProbeUnavailable` saying what to do."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node_agent.probes.base import ProbeUnavailable

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39


@dataclass(frozen=True)
class HostPaths:
    """Where the kernel-side prerequisites of BCC live (overridable for tests)."""

    modules_root: str = "/lib/modules"
    """Holds ``$(uname -r)/build``: the kernel headers BCC compiles against."""
    kheaders: str = "/sys/kernel/kheaders.tar.xz"
    """In-kernel headers (CONFIG_IKHEADERS), which BCC uses when ``build`` is missing."""
    kernel_release: str = ""
    """``uname -r``; empty means the running kernel's."""


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
    sys_admin, bpf, perfmon = (
        (capabilities >> bit) & 1 == 1 for bit in (CAP_SYS_ADMIN, CAP_BPF, CAP_PERFMON)
    )
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
    try:
        found = events.is_dir()
    except PermissionError as exc:
        raise ProbeUnavailable(
            f"tracefs at {tracefs} is not readable ({exc.strerror}): it is root's, run the "
            "agent as uid 0"
        ) from exc
    if not found:
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
