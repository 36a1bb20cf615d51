"""Load one program: check its prerequisites, run the compiler process
(:mod:`node_agent.probes.bpf.compiler`) and take over the descriptors it hands over."""

from __future__ import annotations

import importlib.util
import json
import logging
import socket
import subprocess
import sys
from collections.abc import Sequence

from node_agent.probes.base import ProbeContext, ProbeUnavailable
from node_agent.probes.bpf.loaded_program import LoadedProgram
from node_agent.probes.bpf.prerequisites import (
    HostPaths,
    check_kernel_headers,
    check_privileges,
    check_tracepoints,
    effective_capabilities,
    import_bcc,
)
from node_agent.probes.bpf.sources import read_program, resolve_source_dir

log = logging.getLogger(__name__)

COMPILE_TIMEOUT_S = 180.0
"""Upper bound for one BCC compile + load + attach on a busy node."""

_COMPILER_ENTRY = "from node_agent.probes.bpf.compiler import compiler_main; compiler_main()"


def load_program(
    name: str,
    ctx: ProbeContext,
    tracepoints: Sequence[str],
    paths: HostPaths | None = None,
    cflags: Sequence[str] = (),
) -> LoadedProgram:
    """Check prerequisites, then compile, load and attach ``NAME.bpf.c`` in a compiler
    process (:func:`~node_agent.probes.bpf.compiler.compiler_main`) and take over its
    maps and attachments.

    ``cflags`` are extra compiler flags; tests shrink the maps with them
    (``-DMAX_TASKS=64``), the agent passes none.

    Every failure is a :class:`ProbeUnavailable` whose message says what to mount,
    install or grant; compiler and verifier output is included.
    """
    check_privileges(effective_capabilities(ctx.proc_root))
    check_tracepoints(ctx.tracefs, tracepoints)
    check_kernel_headers(paths or HostPaths())
    if importlib.util.find_spec("bcc") is None:
        import_bcc()  # raises with the installation hint
    source_dir = resolve_source_dir(ctx)
    text = read_program(source_dir, name)
    where = f"{source_dir / name}.bpf.c"
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours:
        with theirs:
            compiler = subprocess.Popen(
                # -P: no current directory on sys.path of a root process
                [
                    sys.executable,
                    "-P",
                    "-c",
                    _COMPILER_ENTRY,
                    str(theirs.fileno()),
                    json.dumps(list(cflags)),
                    ctx.proc_root,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
            )
        try:
            _, err = compiler.communicate(text.encode(), timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            compiler.kill()
            compiler.communicate()
            raise ProbeUnavailable(
                f"compiling {where} took over {COMPILE_TIMEOUT_S:.0f} s; the node is "
                f"overloaded or the compiler hangs"
            ) from exc
        output = err.decode(errors="replace").splitlines()
        if compiler.returncode != 0:
            reason = next(
                (line[len("error: ") :] for line in reversed(output) if line.startswith("error: ")),
                f"exit status {compiler.returncode}",
            )
            raise ProbeUnavailable(
                f"BPF program {where} failed to compile, load or attach ({reason}); check "
                f"the kernel headers at /lib/modules/$(uname -r)/build and that the kernel "
                f"allows BPF (lockdown=confidentiality blocks it). Output:\n"
                + "\n".join(output[-15:])
            )
        if output:
            log.debug("BCC output while loading %s:\n%s", name, "\n".join(output))
        ours.settimeout(5.0)
        message, fds, _flags, _address = socket.recv_fds(ours, 1 << 16, 64)
    return LoadedProgram(fds, json.loads(message))
