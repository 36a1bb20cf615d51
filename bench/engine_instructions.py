"""Instructions per scheduling decision, this tree beside a previous revision: a count
that the machine's noise does not move.

On this shared 2-vCPU VM the engine's decisions/s swing by 20–40 % between runs of the
same code (docs/BENCHMARKS.md), more than the differences ``throughput_versus.py`` is
asked to judge. Valgrind's callgrind counts the instructions the CPU executes instead: the
same code on the same input executes the same instructions, however loaded the machine.
It does not see cache misses or branch mispredictions, so it complements the timed
figures rather than replacing them.

Both sides run their own ``bench/scheduler_throughput.py`` (engine phase only, the same
workload and ``PYTHONHASHSEED``) under callgrind, concurrently, through
``bench/callgrind_engine_driver.py``, which counts inside ``schedule`` only, from the
second decision on. ``--base REV`` is checked out into a temporary ``git worktree``.
Needs ``valgrind`` and its headers (Debian ``valgrind``) and a C compiler; about 5 minutes
at the default sizes.

Run from the repository root::

    .venv/bin/python bench/engine_instructions.py --base REV [--nodes 5000]
        [--running 50000] [--pending 2000] [--base-patch FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "bench" / "callgrind_engine_driver.py"
TOGGLE_C = """#include <valgrind/callgrind.h>
void start_counting(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void toggle_collect(void) { CALLGRIND_TOGGLE_COLLECT; }
void stop_counting(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("engine"); }
"""
"""Callgrind's client requests, callable through ctypes (they are C macros)."""


def build_toggle_library(directory: Path) -> Path:
    if not Path("/usr/include/valgrind/callgrind.h").exists() or not shutil.which("valgrind"):
        raise SystemExit("needs valgrind and /usr/include/valgrind/callgrind.h (apt valgrind)")
    source, library = directory / "toggle.c", directory / "libcallgrind_toggle.so"
    source.write_text(TOGGLE_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
                   check=True)  # fmt: skip
    return library


def under_callgrind(out: Path, python_argv: list[str], **popen: Any) -> subprocess.Popen[str]:
    """``python python_argv…`` started under callgrind, counting nothing until the script
    asks (the toggle library's requests), its counts dumped to ``out``.*; stderr piped."""
    argv = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
        f"--callgrind-out-file={out}", sys.executable, *python_argv,
    ]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, **popen)  # fmt: skip


def start_side(tree: Path, library: Path, out: Path, workload: list[str]) -> subprocess.Popen[str]:
    python_argv = [str(DRIVER), str(library), str(tree), *workload,
                   "--skip-end-to-end", "--skip-in-memory"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    return under_callgrind(out, python_argv, cwd=tree, env=env)


def instructions_per_decision(
    process: subprocess.Popen[str], out: Path, counted_line: str = r"^decisions counted (\d+)$"
) -> tuple[int, float]:
    """When ``process`` (a callgrind run writing ``out``) ends: how many decisions it
    counted (``counted_line`` on its stderr) and the instructions per decision."""
    _, stderr = process.communicate()
    counted = re.search(counted_line, stderr, re.M)
    dumps = sorted(out.parent.glob(f"{out.name}.*"))
    if process.returncode or counted is None or not dumps:
        raise SystemExit(f"callgrind run failed ({process.returncode}):\n{stderr[-3000:]}")
    totals = re.search(r"^totals: (\d+)$", dumps[-1].read_text(), re.M)
    if totals is None:
        raise SystemExit(f"{dumps[-1]}: no totals line")
    decisions = int(counted.group(1))
    return decisions, int(totals.group(1)) / decisions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument("--base-patch", type=Path, help="as throughput_versus.py's")
    for flag, default in (("--nodes", 5000), ("--running", 50_000), ("--pending", 2000),
                          ("--seed", 42)):  # fmt: skip
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args(argv)
    workload = [
        f"--{name}={getattr(args, name)}" for name in ("nodes", "running", "pending", "seed")
    ]
    git = ["git", "-C", str(REPO)]
    with tempfile.TemporaryDirectory(prefix="engine-instructions-") as tmp:
        directory = Path(tmp)
        library = build_toggle_library(directory)
        worktree = directory / "base"
        subprocess.run([*git, "worktree", "add", "-q", "--detach", str(worktree), args.base],
                       check=True)  # fmt: skip
        try:
            if args.base_patch:
                subprocess.run(["git", "apply", str(args.base_patch.resolve())], cwd=worktree,
                               check=True)  # fmt: skip
            sides = {"base": worktree, "this": REPO}
            outs = {side: directory / f"callgrind.{side}" for side in sides}
            running = {side: start_side(tree, library, outs[side], workload)
                       for side, tree in sides.items()}  # fmt: skip
            counts = {side: instructions_per_decision(running[side], outs[side])
                      for side in sides}  # fmt: skip
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(worktree)], check=False)
            subprocess.run([*git, "worktree", "prune"], check=False)
    print(f"{' '.join(workload)}; instructions inside schedule(), per decision (callgrind)")
    for side, (decisions, per_decision) in counts.items():
        print(f"  {side:<5} {per_decision:>12,.0f}  ({decisions} decisions)")
    ratio = counts["this"][1] / counts["base"][1]
    print(f"  this / base {ratio:.3f} (lower is fewer instructions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
