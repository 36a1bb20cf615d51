"""What the scheduler's signal ingest costs per second of a cluster's reports, the previous
commit's path beside this one, in one run on the same production-shaped reports.

Both sides run in separate processes, each importing its own commit's code: the previous
path from a ``git worktree`` of ``--previous`` (default c25aafe, the last commit before the
scheduling records), this path from the working tree. Input: ``--nodes`` reports of
``--pods`` pods each (``tests/shaped_reports.py``: pod rows with histograms, node
histograms, both windows), as the agent encodes them. Measured, ``--rounds`` times, the CPU
of ingesting one report per node (one second of the cluster's reports) into a node table
that holds those nodes, without Redis I/O:

* previous: per report ``decode_report`` of the stream entry, a ``NodeSignals``, then one
  snapshot handed to ``NodeTable.set_signals`` (what ``RedisSignalCache`` and the loop did);
* records: ``decode_records`` + ``signal_columns`` of the scheduling records (what
  ``RedisSignalCache.poll_once`` does after ``MGET``), a ``SignalFrame``, then
  ``NodeTable.set_signals``.

Run from the repository root::

    .venv/bin/python bench/ingest_previous.py [--nodes 5000] [--pods 30] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COMMON = """
import json, sys, time
sys.path.insert(1, {repo!r})  # tests.shaped_reports (identical input for both sides)
from tests.shaped_reports import shaped_report
try:
    from scheduler.api.nodes import parse_node
except ImportError:  # the previous commit's layout
    from scheduler.model import parse_node
from scheduler.table import NodeTable
from tests.builders import node_obj
nodes, pods, rounds = {nodes}, {pods}, {rounds}
names = [f"node-{{i:05d}}" for i in range(nodes)]
table = NodeTable(capacity=nodes)
for name in names:
    table.upsert_node(parse_node(node_obj(name)))
now = time.time()
reports = [shaped_report(n, now, pods=pods, seed=i) for i, n in enumerate(names)]
"""

PREVIOUS = """
import dataclasses
from types import MappingProxyType
from interference.codec import decode_report, encode_report
from scheduler.ports import NodeSignals
payloads = [encode_report(r) for r in reports]
times = []
for k in range(rounds):
    started = time.process_time()
    entries = {{}}
    for payload in payloads:
        report = decode_report(payload)
        entries[report.node] = NodeSignals(report.metrics, report.ts + k, tuple(report.gpus),
            interval_s=report.interval_s, measured=report.measured, windows=report.windows)
    table.set_signals(MappingProxyType(entries))
    times.append(time.process_time() - started)
print(json.dumps({{"cpu_s": times, "bytes": sum(map(len, payloads)) / len(payloads)}}))
"""

RECORDS = """
import numpy as np
from interference import sched_record
from interference.index import IndexReferences
from scheduler.signal_frame import SignalFrame
from scheduler.signal_records import decode_records, signal_columns
rounds_payloads = []
for k in range(rounds):
    shifted = [dataclasses_replace(r, ts=r.ts + k) for r in reports]
    rounds_payloads.append([sched_record.encode(r) for r in shifted])
ids = np.fromiter(map(sched_record.node_id, names), np.uint64, len(names))
refs = IndexReferences()
times = []
for k, payloads in enumerate(rounds_payloads):
    started = time.process_time()
    decoded = decode_records(payloads, ids, now + k)
    columns = signal_columns(decoded.records, refs)
    frame = SignalFrame.build(tuple(names), columns, decoded.records["measured"].astype(np.uint16))
    table.set_signals(frame)
    times.append(time.process_time() - started)
    assert len(decoded.positions) == len(names), decoded.rejected
print(json.dumps({{"cpu_s": times, "bytes": sum(map(len, rounds_payloads[0])) / len(names)}}))
"""


def run(code: str, pythonpath: str, cwd: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--previous", default="c25aafedd5b8e3036a48f7b3937ee4d73fba3a61")
    args = parser.parse_args()
    common = COMMON.format(repo=str(REPO), nodes=args.nodes, pods=args.pods, rounds=args.rounds)
    with tempfile.TemporaryDirectory(prefix="ingest-previous-") as tmp:
        worktree = Path(tmp) / "previous"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach",
                        str(worktree), args.previous], check=True)  # fmt: skip
        try:
            previous = run(common + PREVIOUS.format(), str(worktree), tmp)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(worktree)], check=False)  # fmt: skip
        records_code = common.replace(
            "import json, sys, time",
            "import json, sys, time\nfrom dataclasses import replace as dataclasses_replace",
        )
        current = run(records_code + RECORDS.format(), str(REPO), tmp)
    print(
        textwrap.dedent(f"""\
        {args.nodes} nodes × {args.pods} pods, one report per node ingested into a node table,
        CPU per round (min / median of {args.rounds}), this machine's {os.cpu_count()} CPUs""")
    )
    rows = []
    for name, result in (("previous (stream entries)", previous), ("records", current)):
        cpu = sorted(result["cpu_s"])  # type: ignore[arg-type]
        rows.append((name, cpu[0], cpu[len(cpu) // 2], result["bytes"]))
        print(f"  {name:<26} {1000 * cpu[0]:8.1f} / {1000 * cpu[len(cpu) // 2]:8.1f} ms"
              f"   {result['bytes']:>8,.0f} bytes per node read")  # fmt: skip
    ratio = rows[0][2] / rows[1][2]
    print(
        f"records need {ratio:.0f}× less CPU than the previous path "
        f"({1000 * rows[1][2] / (args.nodes / 1000):.2f} vs "
        f"{1000 * rows[0][2] / (args.nodes / 1000):.1f} ms per 1,000 nodes per second, "
        "i.e. cores per 1,000 nodes × 1,000)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
