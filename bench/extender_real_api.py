"""kube-scheduler alone vs kube-scheduler + ``interference-scheduler extender``, real API.

The harness of ``bench/scheduler_real_api.py`` (one etcd + kube-apiserver v1.36 on
loopback, ``--nodes`` fake nodes, a third with 8 GPUs; per round ``--pods`` pods created
while no scheduler runs, then the scheduler started and timed from a pod watch). Every
round runs the same kube-scheduler binary with the same KubeSchedulerConfiguration
(client QPS/burst 5000, no leader election); the extender rounds add an extender exactly
as ``deploy/overlays/extender`` configures it (filter + prioritize, ``nodeCacheCapable``,
``ignorable: false``, weight 5). Pods: 100m CPU each, no interference tolerance. Rounds:

1. kube-scheduler alone;
2. kube-scheduler + a no-op extender (``bench/noop_extender.py``: passes every node,
   scores 0, on the same HTTP stack as ours). An emulator on purpose: it measures what
   no real component can, the cost of calling *any* HTTP extender — the ceiling for
   round 3;
3. kube-scheduler + ``interference-scheduler extender`` over plain HTTP
   (``extender.plaintext``), with a real ``redis-server`` holding a fresh report for
   every node (so the quietness score is computed for every offered node);
4. the same over HTTPS with kube-scheduler's client certificate, as deployed
   (certificates from ``scripts/create-extender-certs.sh --out``): the cost of TLS.

Printed per round: drain rate and its ratio to round 1 (target for round 4: >= 0.8x),
kube-scheduler's and the extender's CPU per pod (user+system from ``/proc``, first to
last bind), and the distinct client connections to the extender seen during the round
(kube-scheduler reusing kept-alive connections shows as a handful); then round 4 / round 2
(the part of the gap that is our extender's work), round 4 / round 3 (TLS) and our
extender's p99 answer time per verb at that rate, read from its ``/metrics`` histogram
(the upper bound of the bucket holding the 99th percentile).

    .venv/bin/python bench/extender_real_api.py [--nodes 5000] [--pods 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import redis
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.scheduler_real_api import (  # noqa: E402
    Api,
    Result,
    cpu_seconds,
    create_nodes,
    run_round,
)
from interference import freshness  # noqa: E402
from interference.signals import SIGNAL_FAMILIES, NodeMetrics, NodeReport  # noqa: E402
from interference_cli.redis_process import free_port, private_redis_server  # noqa: E402
from node_agent.publisher import PublisherSettings, RedisPublisher  # noqa: E402
from tests.e2e.control_plane import AssetsMissing, ControlPlane, find_assets  # noqa: E402

OVERLAY_CONFIG = REPO / "deploy" / "components" / "extender" / "kube-scheduler-config.yaml"
SCHEDULER = "interference-scheduler"
NOOP = "noop-extender"
OURS_PLAIN = "our-extender-http"
OURS = "our-extender"
LABELS = {
    NOOP: "kube-scheduler + no-op extender",
    OURS_PLAIN: "kube-scheduler + ours, plain HTTP",
    OURS: "kube-scheduler + ours, HTTPS+cert",
}
CERTS_SCRIPT = REPO / "scripts" / "create-extender-certs.sh"
SERVER_NAME = "interference-scheduler-extender.interference-system.svc"
"""A DNS name in the script's serving certificate (kube-scheduler calls 127.0.0.1)."""


def publish_quiet_reports(redis_url: str, nodes: int) -> None:
    """One fresh report per node (interval 600 s: fresh for the whole run), written by the
    agent's own publishing code: every key of each node, its scheduling record included."""
    interval_s = 600.0
    publisher = RedisPublisher(
        PublisherSettings(redis_url=redis_url, ttl_s=freshness.ttl_seconds(interval_s))
    )
    store: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    pipe = store.pipeline(transaction=False)
    for i in range(nodes):
        report = NodeReport(
            node=f"node-{i:05d}",
            ts=time.time(),
            interval_s=interval_s,
            metrics=NodeMetrics(runq_p99_us=50 + i % 400, interference_index=float(i % 60)),
            measured=SIGNAL_FAMILIES,
        )
        publisher.queue_report(pipe, report)
        if len(pipe) >= 10_000:
            pipe.execute()
    pipe.execute()
    store.close()
    publisher.close()


def kube_scheduler_config(
    path: Path, kubeconfig: Path, extender_port: int | None, certs: Path | None = None
) -> Path:
    """Client QPS/burst 5000, no leader election; with the overlay's extender when a port is
    given (pointed at loopback: over HTTPS with ``certs``' client certificate, else plain
    HTTP), else kube-scheduler alone."""
    overlay = yaml.safe_load(OVERLAY_CONFIG.read_text())
    config: dict[str, object] = {
        "apiVersion": overlay["apiVersion"],
        "kind": overlay["kind"],
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 5000, "burst": 5000},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": SCHEDULER}],
    }
    if extender_port is not None:
        (extender,) = overlay["extenders"]
        extender = {**extender, "urlPrefix": f"http://127.0.0.1:{extender_port}"}
        extender.pop("tlsConfig")
        extender["enableHTTPS"] = certs is not None
        if certs is not None:
            extender["urlPrefix"] = f"https://127.0.0.1:{extender_port}"
            extender["tlsConfig"] = {
                "certFile": str(certs / "client.crt"),
                "keyFile": str(certs / "client.key"),
                "caFile": str(certs / "ca.crt"),
                "serverName": SERVER_NAME,
            }
        config["extenders"] = [extender]
    path.write_text(yaml.safe_dump(config))
    return path


def histogram_p99(metrics: str, name: str, verb: str) -> tuple[float, int, float]:
    """(p99 upper bound in s, count, mean in s) of one verb of a Prometheus histogram."""
    buckets: list[tuple[float, float]] = []
    count = total = 0.0
    for line in metrics.splitlines():
        if not line.startswith(name) or f'verb="{verb}"' not in line:
            continue
        sample, value = line.rsplit(" ", 1)
        if sample.startswith(f"{name}_bucket"):
            bound = sample.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if bound == "+Inf" else float(bound), float(value)))
        elif sample.startswith(f"{name}_count"):
            count = float(value)
        elif sample.startswith(f"{name}_sum"):
            total = float(value)
    p99 = next((bound for bound, seen in sorted(buckets) if seen >= 0.99 * count), float("nan"))
    return p99, int(count), total / count if count else float("nan")


@dataclass
class ExtenderRound:
    """One kube-scheduler round with an extender: what the extender process cost."""

    result: Result
    extender_cpu_ms_per_pod: float
    connections: int
    """Distinct client connections to the extender seen during the round (keep-alive: few)."""
    metrics: str
    """The extender's ``/metrics`` after the round (empty for the no-op)."""


class ConnectionCounter:
    """Samples ``/proc/net/tcp`` every 0.5 s for connections to ``port`` from loopback and
    keeps each client port seen: kube-scheduler reusing its connections shows as a handful,
    a connection per request as one new port nearly every sample. (One read of
    ``/proc/net/tcp`` costs milliseconds of CPU: sampling faster would slow the rounds
    it watches.)"""

    def __init__(self, port: int) -> None:
        self._local = f"0100007F:{port:04X}"
        self.clients: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[1] == self._local and fields[3] == "01":  # ESTABLISHED
                    self.clients.add(fields[2])

    def close(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return len(self.clients)


def start_extender(argv: list[str], port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """Start an extender process and wait until its ``/readyz`` answers 200."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DRY_RUN")}
    with log_path.open("ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    ready_url = f"http://127.0.0.1:{port}/readyz"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(ready_url, timeout=2) as answer:
                if answer.status == 200:
                    return process
        except OSError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{argv[0]} did not become ready:\n{tail}")
        time.sleep(0.2)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def extender_round(
    plane: ControlPlane, api: Api, name: str, args: argparse.Namespace, kube: list[str],
    admin: Path, extender_argv: list[str], port: int, work: Path, *, read_metrics: bool,
    verbs_port: int | None = None, certs: Path | None = None,
) -> ExtenderRound:  # fmt: skip
    """Start the extender (``/readyz`` and ``/metrics`` on ``port``, the verbs on
    ``verbs_port``, the same when not given), run one kube-scheduler round against it,
    stop it."""
    verbs_port = port if verbs_port is None else verbs_port
    extender = start_extender(extender_argv, port, work / f"{name}-extender.log")
    try:
        cpu_before = cpu_seconds(extender.pid)
        config = kube_scheduler_config(work / f"{name}.yaml", admin, verbs_port, certs)
        counter = ConnectionCounter(verbs_port)
        result = run_round(plane, api, name, "plain", args.pods, [*kube, f"--config={config}"],
                           SCHEDULER, work / f"{name}.log", args.timeout)  # fmt: skip
        connections = counter.close()
        cpu_ms = 1000 * (cpu_seconds(extender.pid) - cpu_before) / max(1, result.bound)
        metrics = ""
        if read_metrics:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                metrics = answer.read().decode()
    finally:
        stop_process(extender)
    rate = result.drain_pods_per_s
    print(f"  {LABELS[name]}: {result.bound}/{result.pods} bound, {rate:,.0f} pods/s", flush=True)
    return ExtenderRound(result, cpu_ms, connections, metrics)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--timeout", type=float, default=300.0, help="per round, seconds")
    args = parser.parse_args()
    try:
        assets = find_assets()
    except AssetsMissing as exc:
        print(f"extender_real_api: {exc}", file=sys.stderr)
        return 2
    if assets.kube_scheduler is None:
        print("extender_real_api: no kube-scheduler next to kube-apiserver", file=sys.stderr)
        return 2
    plane = ControlPlane(
        assets, apiserver_args=["--disable-admission-plugins=TaintNodesByCondition"]
    )
    work = Path(tempfile.mkdtemp(prefix="bench-extender-"))
    alone: Result | None = None
    rounds: dict[str, ExtenderRound] = {}
    try:
        plane.start()
        api = Api(plane)
        admin = plane.kubeconfig(work / "admin.kubeconfig", plane.admin_token, "admin")
        began = time.time()
        create_nodes(api, args.nodes)
        print(f"{args.nodes} nodes in {time.time() - began:.0f} s", flush=True)
        kube = [str(assets.kube_scheduler), f"--authentication-kubeconfig={admin}",
                f"--authorization-kubeconfig={admin}", "--authentication-skip-lookup=true",
                "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--v=0"]  # fmt: skip
        config = kube_scheduler_config(work / "alone.yaml", admin, None)
        alone = run_round(plane, api, "kube-scheduler", "plain", args.pods,
                          [*kube, f"--config={config}"], SCHEDULER,
                          work / "alone.log", args.timeout)  # fmt: skip
        print(f"  kube-scheduler alone: {alone.bound}/{alone.pods} bound, "
              f"{alone.drain_pods_per_s:,.0f} pods/s", flush=True)  # fmt: skip
        port = free_port()
        noop = [sys.executable, str(REPO / "bench" / "noop_extender.py"), f"--port={port}"]
        rounds[NOOP] = extender_round(plane, api, NOOP, args, kube, admin, noop, port, work,
                                      read_metrics=False)  # fmt: skip
        certs = work / "certs"
        subprocess.run(["sh", str(CERTS_SCRIPT), "--out", str(certs)], check=True,
                       capture_output=True, timeout=60)  # fmt: skip
        tls = {"tls_cert_file": str(certs / "serving.crt"),
               "tls_key_file": str(certs / "serving.key"),
               "client_ca_file": str(certs / "ca.crt")}  # fmt: skip
        with private_redis_server(str(work)) as redis_url:
            publish_quiet_reports(redis_url, args.nodes)
            script = str(Path(sys.executable).parent / "interference-scheduler")
            for name, secured in ((OURS_PLAIN, False), (OURS, True)):
                port, verbs_port = free_port(), free_port()
                verbs = tls if secured else {"plaintext": True}
                settings = {
                    "loop": {"scheduler_name": SCHEDULER},
                    "redis": {"url": redis_url},
                    "http": {"port": port, "host": "127.0.0.1"},
                    "extender": {"port": verbs_port, "host": "127.0.0.1", **verbs},
                }
                (work / f"{name}.yaml").write_text(json.dumps(settings))
                ours = [script, "extender", "--config", str(work / f"{name}.yaml"),
                        "--kubeconfig", str(admin)]  # fmt: skip
                rounds[name] = extender_round(plane, api, name, args, kube, admin, ours, port,
                                              work, read_metrics=True, verbs_port=verbs_port,
                                              certs=certs if secured else None)  # fmt: skip
    finally:
        survivors = plane.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    report(args, alone, rounds)
    if survivors:
        print(f"processes left behind: {survivors}", file=sys.stderr)
        return 1
    return 0


def report(
    args: argparse.Namespace, alone: Result | None, rounds: dict[str, ExtenderRound]
) -> None:
    print(f"\n{args.nodes} nodes, {args.pods} pods per round, real kube-apiserver v1.36 on"
          f" loopback, {os.cpu_count()} CPUs shared by apiserver, etcd, kube-scheduler and"
          " the extender")  # fmt: skip
    print(f"{'round':<34} {'bound':>11} {'drain pods/s':>13} {'vs alone':>9}"
          f" {'kube-scheduler CPU ms/pod':>26} {'extender CPU ms/pod':>20}"
          f" {'connections':>12}")  # fmt: skip
    if alone is None:
        return
    base = alone.drain_pods_per_s
    print(f"{'kube-scheduler alone':<34} {alone.bound:>5}/{alone.pods:<5} {base:>13,.0f}"
          f" {'1.00x':>9} {alone.drain_cpu_ms_per_pod:>26.2f} {'-':>20} {'-':>12}")  # fmt: skip
    for name, r in rounds.items():
        label = LABELS[name]
        rate = r.result.drain_pods_per_s
        print(f"{label:<34} {r.result.bound:>5}/{r.result.pods:<5} {rate:>13,.0f}"
              f" {(rate / base if base else 0):>8.2f}x {r.result.drain_cpu_ms_per_pod:>26.2f}"
              f" {r.extender_cpu_ms_per_pod:>20.2f} {r.connections:>12}")  # fmt: skip
    noop, plain, ours = rounds.get(NOOP), rounds.get(OURS_PLAIN), rounds.get(OURS)
    if ours is None or not base:
        return
    ratio = ours.result.drain_pods_per_s / base
    print(f"drain with our extender / alone = {ratio:.2f}x "
          f"(target >= 0.8x: {'met' if ratio >= 0.8 else 'missed'})")  # fmt: skip
    if noop is not None and noop.result.drain_pods_per_s:
        ceiling = noop.result.drain_pods_per_s / base
        print(f"ceiling (no-op extender) / alone = {ceiling:.2f}x; ours / no-op ="
              f" {ours.result.drain_pods_per_s / noop.result.drain_pods_per_s:.2f}x")  # fmt: skip
    if plain is not None and plain.result.drain_pods_per_s:
        print(f"ours over HTTPS with a client certificate / plain HTTP ="
              f" {ours.result.drain_pods_per_s / plain.result.drain_pods_per_s:.2f}x drain,"
              f" {ours.extender_cpu_ms_per_pod / max(plain.extender_cpu_ms_per_pod, 1e-9):.2f}x"
              " extender CPU per pod")  # fmt: skip
    name = "interference_scheduler_extender_request_duration_seconds"
    for verb in ("filter", "prioritize"):
        p99, count, mean = histogram_p99(ours.metrics, name, verb)
        print(f"our extender {verb}: {count} requests, p99 <= {1000 * p99:.0f} ms "
              f"(histogram bucket), mean {1000 * mean:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
