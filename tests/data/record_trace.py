"""Record ``tests/data/lab-trace.msgpack``, the trace the simulator's acceptance test uses.

Four real ``interference-agent`` instances (one per cgroup-partition node of
``trace-nodes.yaml``, each with its own ``--node-name`` and ``--cgroup-root``) report
the pods of ``trace-pods.yaml``: a latency probe on every node and ``stress-ng`` on
node-1, whose CPU node-3 shares. The reports are taken from the nodes' report streams
exactly as ``interference record`` takes them; ``--out`` is replaced (``record`` itself
would append to the trace already there). Run as root::

    .venv/bin/python -m tests.data.record_trace [--seconds 40] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from interference_cli.store import Store
from interference_cli.trace import record_to_file
from interference_demo.lab import LocalLab
from interference_demo.local_cluster import load_manifests, load_nodes

HERE = Path(__file__).resolve().parent
WARMUP_S = 2.0
"""Seconds between the last agent's first report and the start of the recording."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--out", default=str(HERE / "lab-trace.msgpack"))
    args = parser.parse_args()
    lab = LocalLab(
        load_nodes(HERE / "trace-nodes.yaml"),
        load_manifests([HERE / "trace-pods.yaml"]),
        f"intf-trace-{os.getpid()}",
    )
    try:
        lab.start()
        lab.await_reports()
        time.sleep(WARMUP_S)
        Path(args.out).unlink(missing_ok=True)
        recorded = record_to_file(Store(lab.url), args.out, duration_s=args.seconds)
    finally:
        lab.close()
    print(f"recorded {recorded.written} reports to {args.out}")


if __name__ == "__main__":
    main()
