"""Node agent overhead: ``perf bench sched pipe`` throughput with the agent attached vs not.

The same ratio is measured for libbpf-tools ``runqlat`` and bcc ``runqlat-bpfcc`` in the
same run: every repetition runs the four set-ups (nothing attached, our agent, libbpf-tools,
bcc) in a rotated order, so machine noise hits them alike; the medians are compared.
Also printed: the agent's CPU % while the benchmark runs, and its peak (VmHWM) and steady
(median VmRSS once running) resident memory. Targets: our ratio ≥ libbpf-tools' ratio,
steady RSS ≤ 120 MB.

Run as root from the repository root (``make bench`` runs it):
``.venv/bin/python bench/agent_overhead.py [--repetitions 5] [--loops 200000] [--cpu 0]
[--rt-priority 50]``. The ratio of a set-up is the median over repetitions of its
throughput divided by that repetition's unattached throughput.
The agent runs for real (``interference-agent --interval 1``) and publishes to its own
``redis-server`` on a free loopback port.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

from interference import keys
from interference_cli.redis_process import private_redis_server

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / ".venv" / "bin" / "interference-agent"
LIBBPF_RUNQLAT = "/usr/sbin/runqlat"
BCC_RUNQLAT = "runqlat-bpfcc"
NODE = "bench-node"
READY_TIMEOUT_S = 120.0
TRACING_BANNER = "Tracing run queue latency"


@dataclass(frozen=True)
class BenchSettings:
    """What one run of the benchmark does."""

    repetitions: int = 5
    """Rounds of the four set-ups; medians are taken over these."""
    loops: int = 200_000
    """``perf bench sched pipe -l``: round trips per measurement."""
    cpu: int = 0
    """CPU the pipe benchmark is pinned to (``taskset -c``)."""
    agent_interval_s: float = 1.0
    """The agent's report interval (``--interval``)."""
    rt_priority: int = 50
    """SCHED_FIFO priority of the pipe benchmark (``chrt -f``), so other load on a shared
    machine cannot preempt it and every set-up sees the same CPU; 0 = normal scheduling."""


@dataclass
class AgentUsage:
    """Resource use of the agent process, sampled while the pipe benchmark ran."""

    cpu_percent: list[float] = field(default_factory=list)
    peak_rss_mb: list[float] = field(default_factory=list)
    steady_rss_mb: list[float] = field(default_factory=list)


def pipe_ops_per_s(settings: BenchSettings) -> float:
    """One pinned ``perf bench sched pipe`` run; its ops/sec."""
    argv = ["chrt", "-f", str(settings.rt_priority)] if settings.rt_priority else []
    argv += ["taskset", "-c", str(settings.cpu), "perf", "bench", "sched", "pipe"]
    argv += ["-l", str(settings.loops)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600).stdout
    match = re.search(r"(\d+)\s+ops/sec", out)
    if match is None:
        raise RuntimeError(f"no ops/sec in perf output:\n{out}")
    return float(match.group(1))


def wait_for_banner(log: Path, proc: subprocess.Popen[bytes], what: str) -> None:
    """Wait until a runqlat tool says it is tracing (its probes are attached)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while TRACING_BANNER not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start tracing:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)


def wait_for_report(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until the agent has published a report (probes loaded, loop running): its
    node's scheduling record is there."""
    client = redis.Redis.from_url(url)
    client.delete(keys.sched_key(NODE))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not client.exists(keys.sched_key(NODE)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the agent published nothing:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def cpu_seconds(pid: int) -> float:
    """CPU time of all threads of a process (``/proc/PID/task/*/schedstat``, ns precision)."""
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            total_ns += int((task / "schedstat").read_text().split()[0])
    return total_ns / 1e9


def status_kb(pid: int, name: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return float(line.split()[1])
    raise RuntimeError(f"{name} missing from /proc/{pid}/status")


def run_with_agent(settings: BenchSettings, url: str, workdir: str, usage: AgentUsage) -> float:
    log = Path(workdir) / "agent.log"
    argv = [str(AGENT), "--node-name", NODE, "--redis-url", url]
    argv += ["--interval", str(settings.agent_interval_s)]
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for_report(url, proc, log)
        cpu_before, wall_before = cpu_seconds(proc.pid), time.monotonic()
        ops = pipe_ops_per_s(settings)
        cpu_after, wall_after = cpu_seconds(proc.pid), time.monotonic()
        usage.cpu_percent.append(100 * (cpu_after - cpu_before) / (wall_after - wall_before))
        usage.steady_rss_mb.append(status_kb(proc.pid, "VmRSS") / 1024)
        usage.peak_rss_mb.append(status_kb(proc.pid, "VmHWM") / 1024)
        if proc.poll() is not None:
            raise RuntimeError(f"the agent exited during the run:\n{log.read_text()[-2000:]}")
        return ops
    finally:
        stop(proc, signal.SIGTERM)


def run_with_tool(settings: BenchSettings, argv: Sequence[str], workdir: str) -> float:
    log = Path(workdir) / f"{Path(argv[0]).name}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(list(argv), stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for_banner(log, proc, argv[0])
        return pipe_ops_per_s(settings)
    finally:
        stop(proc, signal.SIGINT)


def check_prerequisites() -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append("run as root (the agent and the runqlat tools load BPF programs)")
    for tool in ("perf", "taskset", "chrt", LIBBPF_RUNQLAT, BCC_RUNQLAT):
        if shutil.which(tool) is None:
            problems.append(
                f"{tool} is missing: run `make setup` (linux-perf, libbpf-tools, bpfcc-tools)"
            )
    if shutil.which("redis-server") is None:
        problems.append("redis-server is missing: run `make setup`")
    if not AGENT.exists():
        problems.append(f"{AGENT} is missing: run `make setup`")
    if problems:
        sys.exit("agent_overhead: " + "; ".join(problems))


def main(argv: Sequence[str] | None = None) -> None:
    defaults = BenchSettings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--repetitions", type=int, default=defaults.repetitions)
    parser.add_argument("--loops", type=int, default=defaults.loops)
    parser.add_argument("--cpu", type=int, default=defaults.cpu)
    parser.add_argument("--rt-priority", type=int, default=defaults.rt_priority)
    args = parser.parse_args(argv)
    settings = BenchSettings(
        repetitions=args.repetitions, loops=args.loops, cpu=args.cpu, rt_priority=args.rt_priority
    )
    check_prerequisites()

    ops: dict[str, list[float]] = {"none": [], "agent": [], "libbpf-tools": [], "bcc": []}
    usage = AgentUsage()
    with (
        tempfile.TemporaryDirectory(prefix="agent-overhead-") as workdir,
        private_redis_server(workdir) as url,
    ):
        runs = {
            "none": lambda: pipe_ops_per_s(settings),
            "agent": lambda: run_with_agent(settings, url, workdir, usage),
            "libbpf-tools": lambda: run_with_tool(settings, [LIBBPF_RUNQLAT, "1"], workdir),
            "bcc": lambda: run_with_tool(settings, [BCC_RUNQLAT, "1"], workdir),
        }
        order = list(runs)
        for repetition in range(settings.repetitions):
            rotated = order[repetition % len(order) :] + order[: repetition % len(order)]
            for name in rotated:
                ops[name].append(runs[name]())
                print(f"  rep {repetition + 1} {name:13s} {ops[name][-1]:9.0f} ops/s", flush=True)

    # Each repetition's own baseline cancels slow drifts in the machine's load.
    ratios = {
        name: [value / base for value, base in zip(values, ops["none"], strict=True)]
        for name, values in ops.items()
    }
    print()
    print(
        f"perf bench sched pipe -l {settings.loops}, pinned to CPU {settings.cpu}"
        f"{f', SCHED_FIFO {settings.rt_priority}' if settings.rt_priority else ''}; "
        f"medians of {settings.repetitions} interleaved repetitions"
    )
    print(f"{'attached':14s} {'ops/s':>9s} {'ratio':>7s}  ratio range")
    for name, values in ops.items():
        spread = f"{min(ratios[name]):.3f}-{max(ratios[name]):.3f}"
        median_ratio = statistics.median(ratios[name])
        print(f"{name:14s} {statistics.median(values):9.0f} {median_ratio:7.3f}  {spread}")
    ours = statistics.median(ratios["agent"])
    libbpf = statistics.median(ratios["libbpf-tools"])
    print()
    print(f"agent CPU while piping: {statistics.median(usage.cpu_percent):.1f} % of one CPU")
    print(
        f"agent RSS: peak {max(usage.peak_rss_mb):.1f} MB, "
        f"steady {statistics.median(usage.steady_rss_mb):.1f} MB"
    )
    verdict_ratio = "met" if ours >= libbpf else "NOT met"
    verdict_rss = "met" if statistics.median(usage.steady_rss_mb) <= 120 else "NOT met"
    print(f"target ratio >= libbpf-tools ({ours:.3f} vs {libbpf:.3f}): {verdict_ratio}")
    print(f"target steady RSS <= 120 MB: {verdict_rss}")


if __name__ == "__main__":
    main()
