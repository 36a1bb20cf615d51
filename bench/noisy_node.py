"""One node writing at or over its cap while 1,000 honest nodes report (issue 28, chaos run).

A ``redis-server`` runs the shipped ``deploy/base/redis/redis.conf`` (its limits, key
events, ``maxmemory``, ``noeviction``; plaintext, no ACL file) inside a memory cgroup of
512 MiB, the Redis Deployment's limit, where the machine allows one. ``--nodes`` honest
nodes report every second as their agents' own publishing code writes it
(:mod:`bench.signal_replay`, ``full`` mode, ``--pods`` pods each). The credential issuer's
warden (:mod:`credential_issuer.warden`) runs in its own process. One node, ``bad``, logs
in as its own ACL user (:func:`interference.acl.agent_acl_rules`, what the issuer grants)
and for ``--seconds`` writes over its caps or at them (``--attack``, see :func:`attack`).
Meanwhile the scheduler's signal follower
(:class:`~scheduler.adapters.redis_signals.RedisSignalCache`) polls every node's scheduling
record every 0.5 s and the rebalancer's reader
(:class:`~scheduler.adapters.node_reports.RedisNodeReportSource`) reads 40 nodes' streams,
``bad`` among them, every 5 s.

Reported: the most honest nodes without a fresh record at any poll after warm-up, the
follower's poll p50/p99, the attacker's bytes accepted, whether and when it was cut off,
the warden's CPU, Redis' peak RSS and whether it is the same process, clients Redis
evicted, and the reader's refusals. With ``--bind-rate``, the scheduler itself binds too
(:mod:`bench.binding_probe`: a real kube-apiserver with a Node per reporting node, the
interference-scheduler CLI reading this Redis, pods with a tolerance created at that rate
from the warm-up on): pods bound, creation-to-bind before and during the attack, pods bound
on the attacker. ``--attack none`` is the same run without the bad node, the baseline.
Figures: docs/BENCHMARKS.md.

    .venv/bin/python bench/noisy_node.py [--nodes 1000] [--pods 30] [--seconds 60]
        [--attack over-cap|at-cap|at-rate|none] [--bind-rate PODS_PER_S]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import multiprocessing
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import redis
from prometheus_client import CollectorRegistry

from bench.signal_replay import start_replay
from credential_issuer.settings import redis_target
from credential_issuer.warden import Warden, WardenLimits, WardenMetrics, cutoff_key
from interference import acl, keys
from scheduler.adapters.node_reports import RedisNodeReportSource
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
LIMIT_BYTES = 512 * MIB
CGROUP = Path("/sys/fs/cgroup/memory")
COOLDOWN_S = 300.0


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The shipped redis.conf without its TLS lines, on a plaintext loopback port."""
    shipped = (REPO / "deploy/base/redis/redis.conf").read_text().splitlines()
    conf = workdir / "redis.conf"
    conf.write_text(
        "\n".join(line for line in shipped if not line.startswith(("tls-", "port", "bind")))
    )
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", str(conf), "--port", str(port), "--bind", "127.0.0.1"],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    for _ in range(100):
        with contextlib.suppress(redis.ConnectionError):
            client.ping()
            return proc, port
        time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def limit_memory(pid: int) -> Path | None:
    group = CGROUP / f"bench-noisy-node-{pid}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(LIMIT_BYTES))
        (group / "cgroup.procs").write_text(str(pid))
    except OSError:
        return None
    return group


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def run_warden(port: int, stop: Any) -> None:
    """The credential issuer's warden, in its own process as in its own Pod, logged in as
    Redis' admin (the bench's Redis has no ACL file)."""
    warden = Warden(
        redis_target(f"redis://127.0.0.1:{port}/0"),
        WardenLimits(),
        WardenMetrics(CollectorRegistry()),
        cooldown_s=COOLDOWN_S,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s warden %(message)s")
    warden.start()
    stop.wait()
    warden.close()


def attack(port: int, password: str, seconds: float, mode: str, written: Any,
           refused_after: Any) -> None:  # fmt: skip
    """The bad node. ``over``: stream entries of 16 fields of 1 MiB as fast as Redis takes
    them, and every 10 s six connections that each start a 100 MiB command and never finish
    it. Otherwise at its caps, never over: its stream at 10 entries of 340 KiB and its
    record at 48 KiB (with the agent's TTL), rewritten as fast as Redis takes them
    (``at-cap``) or 9 times a second, just under the warden's rate bound (``at-rate``). After a
    refusal it logs in again every 0.2 s, as an agent would after enrolling (the issuer
    gives a node cut off no new password during its cool-down, longer than this run)."""
    user = acl.agent_username("bad")
    started = time.monotonic()
    client = redis.Redis(port=port, username=user, password=password)
    fields = {f"f{i}": os.urandom(MIB) for i in range(16)}
    at_cap = {"r": os.urandom(340 << 10)}
    record = os.urandom(48 << 10)
    stream = keys.reports_key("bad")
    over = mode == "over-cap"
    pause = 1 / 9 if mode == "at-rate" else 0.0

    def unfinished() -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        with contextlib.suppress(OSError):
            sock.sendall(f"AUTH {user} {password}\r\n".encode())
            sock.recv(100)
            head = b"*202\r\n$4\r\nHSET\r\n$%d\r\n%s\r\n" % (
                len(keys.node_key("bad")),
                keys.node_key("bad").encode(),
            )
            sock.sendall(head)
            for i in range(100):
                sock.sendall(b"$2\r\nf%d\r\n$%d\r\n" % (i % 10, MIB) + fields["f0"] + b"\r\n")
        sock.close()

    end, next_burst = time.monotonic() + seconds, 0.0
    while time.monotonic() < end:
        if over and time.monotonic() >= next_burst:
            next_burst = time.monotonic() + 10
            for _ in range(6):
                threading.Thread(target=unfinished, daemon=True).start()
        try:
            if over:
                client.xadd(stream, fields, maxlen=10, approximate=False)  # type: ignore[arg-type]
                size = 16 * MIB
            else:
                with client.pipeline(transaction=False) as pipe:
                    pipe.xadd(stream, at_cap, maxlen=10, approximate=False)  # type: ignore[arg-type]
                    pipe.expire(stream, 5)
                    pipe.set(keys.sched_key("bad"), record, ex=5)
                    pipe.execute()
                size = len(at_cap["r"]) + len(record)
                time.sleep(pause)
            with written.get_lock():
                written.value += size
        except redis.RedisError:
            if refused_after.value < 0:
                refused_after.value = time.monotonic() - started
            time.sleep(0.2)
            client = redis.Redis(port=port, username=user, password=password)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument(
        "--attack", choices=("over-cap", "at-cap", "at-rate", "none"), default="over-cap",
        help="the bad node over its caps, at them as fast as Redis takes it (both cut off),"
        " at them just under the rate bound (not cut off), or absent (the baseline)",
    )  # fmt: skip
    parser.add_argument(
        "--bind-rate", type=float, default=0.0,
        help="pods with a tolerance created per second for the real scheduler to bind on a"
        " real kube-apiserver (0: no apiserver, the signal follower alone)",
    )  # fmt: skip
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="noisy-node-"))
    proc, port = start_redis(workdir)
    honest = [f"node-{i:05d}" for i in range(args.nodes)]
    probe = None
    if args.bind_rate > 0:
        from bench.binding_probe import BindingProbe

        probe = BindingProbe(port, [*honest, "bad"], args.bind_rate, workdir)
        probe.start_control_plane()
    group = limit_memory(proc.pid)
    admin = redis.Redis(port=port)
    password = secrets.token_hex(24)
    admin.execute_command(
        "ACL", "SETUSER", acl.agent_username("bad"), *acl.agent_acl_rules("bad", password)
    )
    stop = multiprocessing.Event()
    replayers, _sent = start_replay(port, honest, args.pods, "full", args.publishers, stop)
    warden = multiprocessing.Process(target=run_warden, args=(port, stop), daemon=True)
    warden.start()
    settings = RedisSettings(url=f"redis://127.0.0.1:{port}/0", poll_interval_s=0.5)
    connection = connect(settings, {})
    metrics = SignalMetrics(CollectorRegistry())
    cache = RedisSignalCache(connection, settings, metrics, known_nodes=lambda: [*honest, "bad"])
    reader = RedisNodeReportSource(connection, metrics)
    time.sleep(5)  # warm-up: every honest node has reported a few times
    if probe is not None:
        probe.start_scheduling()
        time.sleep(15)  # the scheduler's informers sync and the first pods bind
    attack_began = time.time()
    written = multiprocessing.Value("q", 0)
    refused_after = multiprocessing.Value("d", -1.0)
    attacker = multiprocessing.Process(
        target=attack,
        args=(port, password, args.seconds, args.attack, written, refused_after),
        daemon=True,
    )
    if args.attack != "none":
        attacker.start()
    worst_stale, polls, durations, series = 0, 0, [], []
    end, next_read = time.monotonic() + args.seconds, 0.0
    while time.monotonic() < end:
        started = time.perf_counter()
        cache.poll_once()
        durations.append(time.perf_counter() - started)
        frame = cache.snapshot()
        fresh = frame.columns["fresh_until"][: len(honest)] >= time.time()
        worst_stale = max(worst_stale, int((~fresh).sum()))
        series.append(int((~fresh).sum()))
        polls += 1
        if time.monotonic() >= next_read:
            next_read = time.monotonic() + 5
            reader.recent(["bad", *honest[:39]])
        time.sleep(max(0.0, 0.5 - (time.perf_counter() - started)))
    if args.attack != "none":
        attacker.join(30)
    binding = probe.finish(attack_began, "bad") if probe is not None else None
    alive_publishers = sum(r.is_alive() for r in replayers)
    warden_alive = warden.is_alive()
    warden_cpu_s = cpu_seconds(warden.pid) if warden.pid else 0.0
    bad_user = admin.acl_getuser(acl.agent_username("bad")) or {}
    cut_off_for_s = admin.ttl(cutoff_key("bad"))
    stop.set()
    for replayer in replayers:
        replayer.join(10)
    warden.join(15)
    stats = admin.info("stats")
    alive = proc.poll() is None
    result = {
        "nodes": args.nodes,
        "pods": args.pods,
        "seconds": args.seconds,
        "memory_cgroup": group is not None,
        "polls": polls,
        "most_honest_nodes_stale_at_a_poll": worst_stale,
        "poll_p50_ms": round(1000 * float(np.percentile(durations, 50)), 1),
        "poll_p99_ms": round(1000 * float(np.percentile(durations, 99)), 1),
        "stale_by_poll": series,
        "publishers_alive_at_end": alive_publishers,
        "attacker_bytes_accepted_mib": written.value // MIB,
        "redis_same_process": alive,
        "redis_peak_rss_mib": peak_rss(proc.pid) // MIB if alive else None,
        "redis_used_memory_mib": admin.info("memory")["used_memory"] // MIB,
        "evicted_clients": stats.get("evicted_clients"),
        "reader_refusals": reader.refused,
        "attack": args.attack,
        "warden_alive_at_end": warden_alive,
        "warden_cpu_share_of_a_core": round(warden_cpu_s / (args.seconds + 5), 2),
        "bad_user_on_at_end": "on" in bad_user.get("flags", []),
        "bad_cut_off": cut_off_for_s > 0,
        "bad_first_refused_after_s": round(refused_after.value, 2)
        if refused_after.value >= 0
        else None,
    }
    if binding is not None:
        result["binding"] = dataclasses.asdict(binding)
    survivors = probe.close() if probe is not None else []
    if survivors:
        result["processes_left_behind"] = survivors
    print(json.dumps(result, indent=2))
    proc.terminate()
    proc.wait(10)
    if group is not None:
        with contextlib.suppress(OSError):
            group.rmdir()


if __name__ == "__main__":
    main()
