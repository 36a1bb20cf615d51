"""An antagonist that is on for 5 s and off for 5 s, on the real kernel: do latency pods
land on its node in its quiet seconds?

Two real agents watch two cgroup-partition nodes (``tests/data/bursty-nodes.yaml``):
node-a runs ``stress-ng`` 5 s on, 5 s off; node-b a steady 40 % CPU loop, so in node-a's
off seconds node-a *looks* quieter than node-b. The reports are recorded from
the nodes' report streams exactly as ``interference record`` does, then one latency pod a second
(``tests/data/bursty-arrivals.yaml``, tolerance 10 ms run-queue p99) is placed by the
real scheduling cycle under each policy on that same recording — so every policy sees the same
kernel signals, side by side in one run:

- ``per-second``: the interference-aware policy on each report's latest interval;
- ``10s`` / ``60s``: the same policy on the agent's windows (merged run-queue histogram
  p99, index mean + k·σ).

Printed per policy: decisions, the share that avoided node-a (overall and in node-a's off
seconds), and tolerance violations as ``interference simulate`` judges them. Run as root
(BPF, cgroups)::

    .venv/bin/python bench/onoff_antagonist.py [--seconds 120] [--out FILE]

``--out tests/data/bursty-trace.msgpack`` refreshes the committed trace.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

from interference.signals import NodeReport
from interference_cli.simulate import Policy, load_policy, load_workload, simulate
from interference_cli.store import Store
from interference_cli.trace import load_trace, record_to_file
from interference_demo.lab import LocalLab
from interference_demo.local_cluster import load_manifests, load_nodes
from scheduler.plugins.interference import InterferenceArgs, SignalWindow

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
NODES = DATA / "bursty-nodes.yaml"
PODS = DATA / "bursty-pods.yaml"
ARRIVALS = DATA / "bursty-arrivals.yaml"
AWARE_POLICY = ROOT / "deploy" / "demo" / "policies" / "interference-aware.yaml"
ANTAGONIST_NODE = "node-a"
WARMUP_S = 12.0
"""Reports before the recording starts, so the 10 s window is full from the first one."""
ON_WAIT_RATIO = 0.5
"""node-a's wait ratio above which the antagonist counts as on in that second (three
CPU hogs on one CPU read about 2; the probe alone about 0)."""
WINDOWS: tuple[SignalWindow, ...] = ("latest", "10s", "60s")


def record(seconds: float, out: Path) -> None:
    """Run the lab and record ``seconds`` of its reports to ``out`` (replaced: ``record``
    itself would append to a trace already there)."""
    out.unlink(missing_ok=True)
    lab = LocalLab(load_nodes(NODES), load_manifests([PODS]), f"intf-onoff-{os.getpid()}")
    try:
        lab.start()
        lab.await_reports()
        time.sleep(WARMUP_S)
        recorded = record_to_file(Store(lab.url), out, duration_s=seconds)
    finally:
        lab.close()
    print(f"recorded {recorded.written} reports ({seconds:g} s) to {out}")


def antagonist_on_at(reports: list[NodeReport]) -> list[tuple[float, bool]]:
    """``(ts, on)`` of every node-a report, in time order."""
    return sorted(
        (r.ts, r.metrics.runq_wait_ratio > ON_WAIT_RATIO)
        for r in reports
        if r.node == ANTAGONIST_NODE
    )


def phase_at(phases: list[tuple[float, bool]], t: float) -> bool:
    """Whether the antagonist was on in node-a's latest report at or before ``t``."""
    on = False
    for ts, state in phases:
        if ts > t:
            break
        on = state
    return on


def evaluate(trace: Path) -> list[dict[str, float | str]]:
    """Each policy's decisions on ``trace``: avoidance overall and in off seconds."""
    reports = load_trace(trace)
    workload = load_workload(ARRIVALS)
    base = load_policy(AWARE_POLICY)
    t0 = min(r.ts for r in reports)
    phases = antagonist_on_at(reports)
    rows: list[dict[str, float | str]] = []
    for window in WINDOWS:
        name = "per-second" if window == "latest" else window
        args = InterferenceArgs(signal_window=window)
        profile = dataclasses.replace(
            base.settings.profile, plugin_config=(("Interference", args),)
        )
        settings = dataclasses.replace(base.settings, profile=profile)
        result = simulate(reports, workload, Policy(name, settings))
        off = [(t, node) for t, _, node in result.placements if not phase_at(phases, t0 + t)]
        avoided = sum(node != ANTAGONIST_NODE for _, _, node in result.placements)
        avoided_off = sum(node != ANTAGONIST_NODE for _, node in off)
        rows.append(
            {
                "policy": name,
                "decisions": len(result.placements),
                "avoided": avoided / max(1, len(result.placements)),
                "off_decisions": len(off),
                "avoided_off": avoided_off / max(1, len(off)),
                "violations": result.violations,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="recording length")
    parser.add_argument("--out", default="", help="keep the recorded trace here")
    parser.add_argument(
        "--trace", default="", help="evaluate an existing trace instead of recording one"
    )
    args = parser.parse_args()
    if args.trace:
        trace = Path(args.trace)
    else:
        if os.geteuid() != 0:
            print("onoff_antagonist: needs root (BPF programs, cgroups)", file=sys.stderr)
            return 1
        trace = Path(args.out or tempfile.mkstemp(suffix=".msgpack")[1])
        record(args.seconds, trace)
    rows = evaluate(trace)
    print(
        f"{'policy':<12} {'decisions':>9} {'avoided node-a':>15} "
        f"{'in off seconds':>15} {'violations':>10}"
    )
    for row in rows:
        print(
            f"{row['policy']:<12} {row['decisions']:>9} {row['avoided']:>15.1%} "
            f"{row['avoided_off']:>8.1%} of {row['off_decisions']:<3} {row['violations']:>10}"
        )
    if not args.out and not args.trace:
        trace.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
