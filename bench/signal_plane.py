"""The signal plane at cluster scale: what following every node's reports costs the
scheduler, and how old the signals are when it decides.

For each ``--nodes`` size (ascending, one control plane): that many Nodes exist in a real
kube-apiserver v1.36 (etcd + apiserver on loopback, binaries found as the e2e tests find
them); ``--publishers`` processes replay every node's report once a second, spread over
the second, as the agent's own publishing code writes it (:mod:`bench.signal_replay`:
production-shaped reports with ``--pods`` pods, histograms and windows, encoded ahead and
sent with a fresh record timestamp); the scheduler runs as its CLI
(``interference-scheduler``, leader election off) against a real ``redis-server`` and
follows them. After a warm-up, over ``--seconds``:

* scheduler CPU — user + system of its process (``/proc/PID/stat``), in cores and per
  1,000 nodes (everything the process does: informers, loop, HTTP, signal follower);
* signal age p50 / p99 — from the scheduler's own ``/metrics``
  (``interference_scheduler_signal_age_seconds``, the difference of two scrapes,
  interpolated within buckets): now − the record's ts when the scheduler took it;
* records accepted per second by the scheduler vs flushes sent, and Redis' CPU.

Targets (issue 16): at 5,000 nodes × 30 pods ≤ 0.05 core per 1,000 nodes and age p99 ≤
1.5 s; at 20,000 nodes age p99 ≤ 2 s.

Run from the repository root (several minutes; 2 CPUs are shared by apiserver, etcd, Redis,
the publishers and the scheduler)::

    .venv/bin/python bench/signal_plane.py [--pods 30] [--seconds 30]
        [--runs 1000:full,1000:records,5000:records,20000:records]

Each run is ``NODES:MODE``: ``full`` replays everything an agent writes, ``records`` only
the scheduling records. The scheduler reads the same either way (only the records), so
the two modes side by side at one size show that its cost does not depend on the pod
rows; absorbing the full write volume costs Redis itself about a third of a core per
1,000 nodes (measured here), so beyond 1,000 nodes this machine's 2 CPUs could not carry
Redis, the publishers and the scheduler at once, and the larger runs replay records.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families

from bench.scheduler_real_api import Api, cpu_seconds, create_nodes
from bench.signal_replay import MODES, start_replay
from interference_cli.redis_process import (
    free_port,
    start_redis_server,
    stop_redis_server,
)
from tests.e2e.control_plane import AssetsMissing, ControlPlane, find_assets, terminate

AGE = "interference_scheduler_signal_age_seconds"
POLL = "interference_scheduler_signal_poll_seconds"
ACCEPTED = "interference_scheduler_signal_records_total"
DEFAULT_RUNS = "1000:full,1000:records,5000:records,20000:records"


@dataclass
class Scrape:
    at: float
    cpu_s: float
    redis_cpu_s: float
    buckets: list[tuple[float, float]]
    """(upper bound, cumulative count) of the age histogram."""
    poll_buckets: list[tuple[float, float]]
    """The same of the poll duration histogram."""
    accepted: float
    sent: int


@dataclass
class Row:
    nodes: int
    pods: int
    mode: str
    cores: float
    age_p50_s: float
    age_p99_s: float
    accepted_per_s: float
    sent_per_s: float
    redis_cores: float
    poll_p50_ms: float
    poll_p99_ms: float

    @property
    def cores_per_1000(self) -> float:
        return self.cores / (self.nodes / 1000)


def metrics(port: int) -> tuple[dict[str, list[tuple[float, float]]], float]:
    """The age and poll-duration histograms' buckets, and records accepted so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    buckets: dict[str, list[tuple[float, float]]] = {AGE: [], POLL: []}
    accepted = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            histogram = sample.name.removesuffix("_bucket")
            if sample.name.endswith("_bucket") and histogram in buckets:
                buckets[histogram].append((float(sample.labels["le"]), sample.value))
            elif sample.name == ACCEPTED:
                accepted = sample.value
    return {name: sorted(values) for name, values in buckets.items()}, accepted


def quantile(
    before: list[tuple[float, float]], after: list[tuple[float, float]], q: float
) -> float:
    """The ``q`` quantile of the observations between two scrapes, linear within a bucket."""
    counts = [(le, a - b) for (le, a), (_, b) in zip(after, before, strict=True)]
    total = counts[-1][1]
    if total <= 0:
        return float("nan")
    target, lower, lower_count = q * total, 0.0, 0.0
    for le, cumulative in counts:
        if cumulative >= target:
            if le == float("inf"):
                return lower
            share = (target - lower_count) / max(cumulative - lower_count, 1e-9)
            return lower + share * (le - lower)
        lower, lower_count = le, cumulative
    return lower


def run_size(
    plane: ControlPlane, admin: Path, work: Path, nodes: int, mode: str, args: argparse.Namespace
) -> Row:
    pods = args.pods if mode == "full" else 0  # records alone do not carry the pod rows
    redis_port = free_port()
    redis_proc = start_redis_server(redis_port, str(work))
    names = [f"node-{i:05d}" for i in range(nodes)]
    stop = multiprocessing.Event()
    began = time.time()
    publishers, sent = start_replay(redis_port, names, pods, mode, args.publishers, stop)
    print(f"  {nodes} nodes: reports encoded in {time.time() - began:.0f} s ({mode})", flush=True)
    http_port = free_port()
    config = work / f"scheduler-{nodes}.yaml"
    config.write_text(json.dumps({
        "redis": {"url": f"redis://127.0.0.1:{redis_port}/0"},
        "leader_election": {"enabled": False},
        "http": {"port": http_port, "host": "127.0.0.1"},
    }))  # fmt: skip
    log = (work / f"scheduler-{nodes}.log").open("ab")
    scheduler = subprocess.Popen(
        [str(Path(sys.executable).parent / "interference-scheduler"),
         "--config", str(config), "--kubeconfig", str(admin)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.time() + 300
        while True:  # every node's record taken at least once
            try:
                if metrics(http_port)[1] >= nodes:
                    break
            except OSError:
                pass
            if time.time() > deadline or scheduler.poll() is not None:
                raise RuntimeError(f"the scheduler did not follow {nodes} nodes; see {log.name}")
            time.sleep(0.5)
        time.sleep(args.warmup)

        def scrape() -> Scrape:
            buckets, accepted = metrics(http_port)
            return Scrape(time.time(), cpu_seconds(scheduler.pid), cpu_seconds(redis_proc.pid),
                          buckets[AGE], buckets[POLL], accepted, int(sent.value))  # fmt: skip

        first = scrape()
        time.sleep(args.seconds)
        last = scrape()
    finally:
        terminate(scheduler, grace_s=30)
        stop.set()
        for proc in publishers:
            proc.join(30)
        stop_redis_server(redis_proc)
    span = last.at - first.at
    return Row(
        nodes=nodes,
        pods=pods,
        mode=mode,
        cores=(last.cpu_s - first.cpu_s) / span,
        age_p50_s=quantile(first.buckets, last.buckets, 0.5),
        age_p99_s=quantile(first.buckets, last.buckets, 0.99),
        accepted_per_s=(last.accepted - first.accepted) / span,
        sent_per_s=(last.sent - first.sent) / span,
        redis_cores=(last.redis_cpu_s - first.redis_cpu_s) / span,
        poll_p50_ms=1000 * quantile(first.poll_buckets, last.poll_buckets, 0.5),
        poll_p99_ms=1000 * quantile(first.poll_buckets, last.poll_buckets, 0.99),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--runs", default=DEFAULT_RUNS, help=f"comma-separated NODES:MODE (modes: {MODES})"
    )
    parser.add_argument("--pods", type=int, default=30, help="pods per report")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured span per size")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--publishers", type=int, default=2, help="replaying processes")
    args = parser.parse_args()
    runs = []
    for item in args.runs.split(","):
        nodes, _, mode = item.partition(":")
        if not nodes.isdigit() or mode not in MODES:
            parser.error(f"--runs: {item!r} is not NODES:MODE with MODE one of {MODES}")
        runs.append((int(nodes), mode))
    runs.sort(key=lambda run: run[0])
    try:
        assets = find_assets()
    except AssetsMissing as exc:
        print(f"signal_plane: {exc}", file=sys.stderr)
        return 2
    plane = ControlPlane(assets)
    work = Path(tempfile.mkdtemp(prefix="bench-signal-plane-"))
    rows: list[Row] = []
    try:
        plane.start()
        api = Api(plane)
        admin = plane.kubeconfig(work / "admin.kubeconfig", plane.admin_token, "admin")
        created = 0
        for nodes, mode in runs:
            if nodes > created:
                began = time.time()
                create_nodes(api, nodes - created, start=created)
                print(f"{nodes} Nodes in the apiserver (+{nodes - created} in "
                      f"{time.time() - began:.0f} s)", flush=True)  # fmt: skip
                created = nodes
            rows.append(run_size(plane, admin, work, nodes, mode, args))
            print_row(rows[-1])
    finally:
        survivors = plane.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    print_table(rows)
    if survivors:
        print(f"processes left behind: {survivors}", file=sys.stderr)
        return 1
    return 0


HEADER = (
    f"{'nodes':>6} {'pods':>4} {'mode':<7} {'sched cores':>11} {'/1000 nodes':>11} "
    f"{'age p50 s':>9} {'age p99 s':>9} {'taken/s':>8} {'sent/s':>8} {'redis cores':>11} "
    f"{'poll p50/p99 ms':>15}"
)


def print_row(r: Row) -> None:
    print(f"{r.nodes:>6} {r.pods:>4} {r.mode:<7} {r.cores:>11.3f} {r.cores_per_1000:>11.4f} "
          f"{r.age_p50_s:>9.2f} {r.age_p99_s:>9.2f} {r.accepted_per_s:>8,.0f} "
          f"{r.sent_per_s:>8,.0f} {r.redis_cores:>11.2f} "
          f"{r.poll_p50_ms:>7.1f}/{r.poll_p99_ms:<7.1f}", flush=True)  # fmt: skip


def print_table(rows: list[Row]) -> None:
    print(f"\nsignal plane, one run, this machine's {os.cpu_count()} CPUs shared by apiserver, "
          "etcd, Redis, publishers and the scheduler")  # fmt: skip
    print(HEADER)
    for r in rows:
        print_row(r)
    for r in rows:
        if r.nodes == 5000:
            met = r.cores_per_1000 <= 0.05 and r.age_p99_s <= 1.5
            verdict = "met" if met else "missed"
            print(f"5,000 nodes ({r.mode}): {r.cores_per_1000:.4f} core per 1,000 nodes "
                  f"(target ≤ 0.05), "
                  f"age p99 {r.age_p99_s:.2f} s (target ≤ 1.5): {verdict}")  # fmt: skip
        if r.nodes == 20000:
            met = r.age_p99_s <= 2.0 and r.accepted_per_s >= 0.95 * r.sent_per_s
            print(f"20,000 nodes ({r.mode}): age p99 {r.age_p99_s:.2f} s (target ≤ 2), taking "
                  f"{r.accepted_per_s:,.0f} of {r.sent_per_s:,.0f} records/s: "
                  f"{'met' if met else 'missed'}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
