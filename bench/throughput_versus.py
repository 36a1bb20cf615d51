"""Scheduler throughput of this tree beside a previous revision, side by side in one run.

``--base REV`` is checked out into a temporary ``git worktree`` (removed at the end, also
on an error or Ctrl-C). Each side runs its *own* ``bench/scheduler_throughput.py`` in a
subprocess with ``PYTHONPATH`` set to its own tree (the same interpreter and packages
otherwise), alternating base/this/base/this for ``--rounds`` rounds so the machine's noise
hits both. Each side runs its own driver because the driver builds on internals
(``ClusterCache``, ``SchedulingCycle``, ``SchedulingLoop``, ``NodeTable``, ``InMemoryCluster``),
exactly what a refactor of the scheduling cycle changes; one driver against both trees
would break or measure something else.

Figures come from the driver's ``--json`` line where that side's driver has it, else from
its human table (older revisions): ``SchedulingCycle.schedule`` decisions/s, decisions/s with
signal refresh + assume, in-memory loop pods/s, end-to-end pods/s and pods per CPU-second.
Per figure: each side's median and best round, the ratios this/base of both, and "no
slower" when both ratios are at least 0.95 (``THRESHOLD``). Both, because on a shared
2-vCPU VM the same code's rate spreads by 20–40 % between runs: the median can hide a
side's slow rounds, and the best round (what ``timeit`` reports: noise never makes code
faster than it is) can be one lucky round. Take more rounds for a close call. Exit status
1 when any figure is below the threshold.

Run from the repository root (defaults: the sizes of docs/BENCHMARKS.md; ``make bench
BENCH=throughput_versus BASE=REV`` runs it in end-to-end turns)::

    .venv/bin/python bench/throughput_versus.py --base REV [--rounds 3] [--nodes 5000]
        [--running 50000] [--pending 10000] [--bind-workers 16] [--seed 42]
        [--skip-cycle] [--skip-end-to-end] [--skip-in-memory] [--base-patch FILE]...
        [--turns DECISIONS [--turns-phase cycle|loop|end-to-end]]

``cycle_decisions_per_cpu_s`` counts the scheduling thread's CPU time only, so it does
not swing with what else runs on the machine. A base whose driver lacks a figure or the
turns can be given them with ``--base-patch`` (a patch to the base's ``bench/``).

``--turns N`` compares one phase in turns instead (``--turns-phase cycle``, the default;
``loop``: the scheduling loop over an in-memory cluster; ``end-to-end``: the loop binding
over HTTP and writing records to Redis; a loop's turn ends when its pods' binds, Events
and records are written): both drivers list their clusters at once, then
take turns of ``N`` decisions each (base first, then this, then this first, and so on),
every turn timed by the driver (its ``Turns``; a base without it needs a ``--base-patch``
that adds it). Both
sides decide the same pods in the same order, so turn ``k`` of one side and turn ``k`` of
the other are the same work measured seconds apart: the ratio of each pair cancels the
host's slow drift that whole rounds minutes apart cannot. Printed per round and over all
rounds: the median and quartiles of the pairs' ratios this/base (wall and CPU), the
share of pairs where this tree was faster, and the ratio of the totals; "no slower" when
the median and the totals' ratio are at least ``THRESHOLD``.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER = Path("bench/scheduler_throughput.py")
TURNS_ENV = "THROUGHPUT_TURNS"
"""The driver's variable for ``--turns`` (``scheduler_throughput.TURNS_ENV``)."""
THRESHOLD = 0.95
"""Ratio this/base (higher is better) at or above which a figure is "no slower"."""
FIGURES = {
    "cycle_decisions_per_s": "cycle: SchedulingCycle.schedule only",
    "cycle_decisions_per_cpu_s": "cycle: per CPU-second",
    "attempt_decisions_per_s": "cycle: + signals refresh + assume",
    "in_memory_pods_per_s": "loop, in-memory cluster (no HTTP)",
    "end_to_end_pods_per_s": "end to end: bound over HTTP",
    "end_to_end_pods_per_cpu_s": "end to end: pods per CPU-second",
}
"""The driver's JSON key → the label of its row in the human table."""
FORMER_WORD = "engine"  # vocabulary: former name
"""The driver's word for the scheduling cycle before it took kube-scheduler's: a base that
old gets its flags and turns phase in that word, and its figures are read back."""


def speaks_former(tree: Path) -> bool:
    """Whether ``tree``'s driver predates the scheduling cycle's name."""
    return '"--skip-cycle"' not in (tree / DRIVER).read_text()


def to_former(words: list[str]) -> list[str]:
    return [word.replace("cycle", FORMER_WORD) for word in words]


def from_former(text: str) -> str:
    schedule = f"{FORMER_WORD.capitalize()}.schedule"
    return text.replace(schedule, "SchedulingCycle.schedule").replace(FORMER_WORD, "cycle")


def parse_table(stdout: str) -> dict[str, float]:
    """The figures from the driver's human table (a revision without ``--json``)."""
    figures = {}
    for key, label in FIGURES.items():
        match = re.search(rf"^{re.escape(label)}\s+([\d,.]+) (?:decisions|pods)/s", stdout, re.M)
        if match:
            figures[key] = float(match.group(1).replace(",", ""))
    return figures


def run_driver(tree: Path, workload: list[str]) -> dict[str, float]:
    """One run of ``tree``'s driver on ``tree``'s code; its figures."""
    driver = tree / DRIVER
    has_json = '"--json"' in driver.read_text()
    former = speaks_former(tree)
    if former:
        workload = to_former(workload)
    argv = [sys.executable, str(driver), *workload, *(["--json"] if has_json else [])]
    done = subprocess.run(
        argv, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{driver} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    stdout = from_former(done.stdout) if former else done.stdout
    if has_json:
        figures: dict[str, float] = json.loads(stdout.strip().splitlines()[-1])
        return figures
    return parse_table(stdout)


@dataclass(frozen=True)
class Turn:
    """One turn of a driver in ``--turns`` mode, as it reported it."""

    decisions: int
    wall_s: float
    cpu_s: float


def _open_fifo_for_writing(path: Path, side: str, driver: subprocess.Popen[bytes]) -> int:
    """Open ``path`` once ``driver`` has opened it for reading (it lists its cluster
    first, which takes a while), or exit if the driver died before."""
    while True:
        try:
            return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
        if driver.poll() is not None:
            raise SystemExit(f"{side} driver exited ({driver.returncode}) before its turns")
        time.sleep(0.05)


def run_in_turns(
    trees: dict[str, Path], workload: list[str], decisions: int, phase: str
) -> dict[str, list[Turn]]:
    """Both drivers' ``phase``, in alternating turns of ``decisions`` decisions."""
    turns: dict[str, list[Turn]] = {side: [] for side in trees}
    with tempfile.TemporaryDirectory(prefix="throughput-turns-") as tmp:
        drivers, outputs, go, done = {}, {}, {}, {}
        for side, tree in trees.items():
            fifos = Path(tmp) / side
            fifos.mkdir()
            os.mkfifo(fifos / "go")
            os.mkfifo(fifos / "done")
            outputs[side] = open(fifos / "stdout", "w+b")  # noqa: SIM115 - closed below
            said = to_former([phase, *workload]) if speaks_former(tree) else [phase, *workload]
            turns_spec = f"{fifos}:{decisions}:{said[0]}"
            env = {**os.environ, "PYTHONPATH": str(tree), TURNS_ENV: turns_spec}
            argv = [sys.executable, str(tree / DRIVER), *said[1:]]
            drivers[side] = subprocess.Popen(
                argv, cwd=tree, env=env, stdout=outputs[side], stderr=subprocess.STDOUT
            )
        try:
            for side in trees:
                go[side] = _open_fifo_for_writing(Path(tmp) / side / "go", side, drivers[side])
                done[side] = open(Path(tmp) / side / "done", encoding="ascii")  # noqa: SIM115
            live, k = list(trees), 0
            while live:
                for side in live if k % 2 == 0 else live[::-1]:
                    try:
                        os.write(go[side], b"g")
                        line = done[side].readline()
                    except BrokenPipeError:
                        line = ""
                    if not line:
                        live.remove(side)
                        continue
                    n, wall_s, cpu_s = line.split()
                    turns[side].append(Turn(int(n), float(wall_s), float(cpu_s)))
                k += 1
            for side, driver in drivers.items():
                if driver.wait(600):
                    outputs[side].seek(0)
                    tail = outputs[side].read().decode(errors="replace")[-3000:]
                    raise SystemExit(f"{side} driver failed ({driver.returncode}):\n{tail}")
        finally:
            for driver in drivers.values():
                if driver.poll() is None:
                    driver.kill()
            for fd in go.values():
                os.close(fd)
            for handle in [*done.values(), *outputs.values()]:
                handle.close()
    return turns


def paired_ratios(base: list[Turn], this: list[Turn]) -> tuple[list[float], list[float]]:
    """this/base rate of each pair of turns over the same decisions: wall, then CPU."""
    pairs = [(b, t) for b, t in zip(base, this, strict=False) if b.decisions == t.decisions]
    return [b.wall_s / t.wall_s for b, t in pairs], [b.cpu_s / t.cpu_s for b, t in pairs]


def describe_ratios(ratios: list[float]) -> str:
    quartiles = statistics.quantiles(ratios, n=4)
    faster = sum(r > 1 for r in ratios) / len(ratios)
    return (
        f"median {statistics.median(ratios):.3f} (quartiles {quartiles[0]:.3f}–"
        f"{quartiles[2]:.3f}), this faster in {faster:.0%} of {len(ratios)} pairs"
    )


TURN_PHASES = ("cycle", "loop", "end-to-end")
"""What ``--turns`` can compare (the driver's whole-phase rates are not comparable then:
each side's clock also runs while it waits for the other's turn)."""


def compare_in_turns(
    worktree: Path, workload: list[str], rounds: int, decisions: int, phase: str
) -> bool:
    """Print ``phase`` compared turn by turn; True when this tree is slower."""
    walls: list[float] = []
    cpus: list[float] = []
    totals = {"base": [0.0, 0.0], "this": [0.0, 0.0]}
    trees = {"base": worktree, "this": REPO}
    for k in range(rounds):
        turns = run_in_turns(trees, workload, decisions, phase)
        wall, cpu = paired_ratios(turns["base"], turns["this"])
        walls += wall
        cpus += cpu
        round_wall = {side: sum(t.wall_s for t in turns[side]) for side in trees}
        for side in trees:
            totals[side][0] += round_wall[side]
            totals[side][1] += sum(t.cpu_s for t in turns[side])
        round_total = round_wall["base"] / round_wall["this"]
        print(
            f"  round {k + 1}: wall {describe_ratios(wall)}; totals {round_total:.3f}", flush=True
        )
    wall_total = totals["base"][0] / totals["this"][0]
    cpu_total = totals["base"][1] / totals["this"][1]
    what = {
        "cycle": "cycle decisions",
        "loop": "pods bound by the in-memory loop",
        "end-to-end": "pods bound end to end",
    }[phase]
    print(f"\n{what}, this/base over {len(walls)} pairs of {decisions}-decision turns")
    print(f"  wall: {describe_ratios(walls)}; totals {wall_total:.3f}")
    print(f"  CPU:  {describe_ratios(cpus)}; totals {cpu_total:.3f}")
    slower = min(statistics.median(walls), wall_total) < THRESHOLD
    print(f"  {'SLOWER' if slower else 'no slower'} (median and totals ≥ {THRESHOLD})")
    return slower


def apply_bench_patch(worktree: Path, patch: Path) -> None:
    """Apply ``patch`` in the base's worktree; only files under ``bench/`` may change, so
    the code being compared stays the base's own."""
    touched = subprocess.run(["git", "apply", "--numstat", str(patch)], cwd=worktree,
                             check=True, capture_output=True, text=True).stdout  # fmt: skip
    paths = [line.split("\t")[2] for line in touched.splitlines()]
    if not paths or any(not path.startswith("bench/") for path in paths):
        raise SystemExit(f"{patch}: only bench/ files may be patched, not {paths}")
    subprocess.run(["git", "apply", str(patch)], cwd=worktree, check=True)
    print(f"base patched with {patch.name}: {', '.join(paths)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--base-patch",
        type=Path,
        action="append",
        default=[],
        help="a patch to the base's bench/ applied in its worktree (e.g. a figure its driver"
        " lacks); printed, so the comparison says what it ran; repeatable",
    )
    parser.add_argument(
        "--turns",
        type=int,
        metavar="DECISIONS",
        help="compare one phase only, in alternating turns of this many decisions",
    )
    parser.add_argument(
        "--turns-phase",
        choices=TURN_PHASES,
        default="cycle",
        help="with --turns: the cycle phase, the scheduling loop over an in-memory"
        " cluster, or the loop end to end (a loop's turn ends when its pods' binds and"
        " records are written)",
    )
    for flag, default in (("--nodes", 5000), ("--running", 50_000), ("--pending", 10_000),
                          ("--bind-workers", 16), ("--seed", 42)):  # fmt: skip
        parser.add_argument(flag, type=int, default=default)
    for flag in ("--skip-cycle", "--skip-end-to-end", "--skip-in-memory"):
        parser.add_argument(flag, action="store_true")
    args = parser.parse_args(argv)
    workload = [f"--{name.replace('_', '-')}={getattr(args, name)}"
                for name in ("nodes", "running", "pending", "bind_workers", "seed")]  # fmt: skip
    workload += [flag for flag in ("--skip-cycle", "--skip-end-to-end", "--skip-in-memory")
                 if getattr(args, flag[2:].replace("-", "_"))]  # fmt: skip
    git = ["git", "-C", str(REPO)]
    base = subprocess.run([*git, "rev-parse", "--verify", f"{args.base}^{{commit}}"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    print(f"base {base[:12]} ({args.base}) vs this tree {REPO}; {' '.join(workload)}; "
          f"{args.rounds} rounds, alternating", flush=True)  # fmt: skip
    results: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="throughput-versus-") as tmp:
        worktree = Path(tmp) / "base"
        subprocess.run([*git, "worktree", "add", "-q", "--detach", str(worktree), base],
                       check=True)  # fmt: skip
        try:
            for patch in args.base_patch:
                apply_bench_patch(worktree, patch.resolve())
            if args.turns:
                slower = compare_in_turns(
                    worktree, workload, args.rounds, args.turns, args.turns_phase
                )
                print(f"{time.monotonic() - started:.0f} s")
                return 1 if slower else 0
            for k in range(args.rounds):
                for side, tree in (("base", worktree), ("this", REPO)):
                    figures = run_driver(tree, workload)
                    results[side].append(figures)
                    shown = ", ".join(f"{key} {value:,.0f}" for key, value in figures.items())
                    print(f"  round {k + 1} {side}: {shown}", flush=True)
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(worktree)], check=False)
            subprocess.run([*git, "worktree", "prune"], check=False)
    print(f"\n{time.monotonic() - started:.0f} s; {args.rounds} rounds (higher is better; "
          f"no slower: this/base ≥ {THRESHOLD} for the medians and for the bests)")  # fmt: skip
    slower = False
    print(f"  {'figure':<27} {'base med':>9} {'this med':>9} {'ratio':>6}"
          f" {'base best':>10} {'this best':>10} {'ratio':>6}")  # fmt: skip
    for key in FIGURES:
        if not all(key in r for r in results["base"] + results["this"]):
            continue
        base_values = [r[key] for r in results["base"]]
        this_values = [r[key] for r in results["this"]]
        base_median, this_median = statistics.median(base_values), statistics.median(this_values)
        base_best, this_best = max(base_values), max(this_values)
        median_ratio, best_ratio = this_median / base_median, this_best / base_best
        below = min(median_ratio, best_ratio) < THRESHOLD
        slower |= below
        verdict = "SLOWER" if below else "no slower"
        medians = f"{base_median:>9,.0f} {this_median:>9,.0f} {median_ratio:>6.3f}"
        bests = f"{base_best:>10,.0f} {this_best:>10,.0f} {best_ratio:>6.3f}"
        print(f"  {key:<27} {medians} {bests}  {verdict}")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
