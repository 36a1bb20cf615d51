"""Find a program's ``NAME.bpf.c`` and read it with its local headers inlined."""

from __future__ import annotations

import os
import re
from pathlib import Path

from node_agent.probes.base import ProbeContext, ProbeUnavailable

BPF_DIR_ENV = "INTERFERENCE_BPF_DIR"
"""Environment variable naming the directory of ``*.bpf.c`` (set by the agent image)."""

_LOCAL_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_.-]+)"[ \t]*$', re.MULTILINE)


def default_bpf_dir() -> Path:
    """The ``bpf/`` folder shipped next to the ``node_agent`` package."""
    return Path(__file__).resolve().parents[3] / "bpf"


def resolve_source_dir(ctx: ProbeContext) -> Path:
    """``ctx.bpf_source_dir``, else ``$INTERFERENCE_BPF_DIR``, else :func:`default_bpf_dir`."""
    if ctx.bpf_source_dir:
        return Path(ctx.bpf_source_dir)
    from_env = os.environ.get(BPF_DIR_ENV, "")
    return Path(from_env) if from_env else default_bpf_dir()


def read_program(source_dir: Path, name: str) -> str:
    """The C text of ``NAME.bpf.c`` with its local ``#include "x.h"`` files inlined.

    BCC rewrites map accesses (``m.lookup(...)``) only in the main source text, never in
    included files, so shared helpers that touch maps must be part of that text.
    """
    path = source_dir / f"{name}.bpf.c"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProbeUnavailable(
            f"cannot read BPF source {path}: {exc.strerror}; point ProbeContext.bpf_source_dir "
            f"or ${BPF_DIR_ENV} at the directory holding {name}.bpf.c (the repository's bpf/)"
        ) from exc

    def inline(match: re.Match[str]) -> str:
        header = source_dir / match.group(1)
        try:
            return header.read_text()
        except OSError as exc:
            raise ProbeUnavailable(
                f"cannot read {header} (included by {path}): {exc.strerror}; "
                f"copy the whole bpf/ directory, headers included"
            ) from exc

    return _LOCAL_INCLUDE.sub(inline, text)
