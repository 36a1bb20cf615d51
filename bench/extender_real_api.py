"""kube-scheduler alone vs kube-scheduler + ``interference-scheduler extender``, real API.

The harness of ``bench/scheduler_real_api.py`` (one etcd + kube-apiserver v1.36 on
loopback, ``--nodes`` fake nodes, a third with 8 GPUs; per round ``--pods`` pods created
while no scheduler runs, then the scheduler started and timed from a pod watch). Both
rounds run the same kube-scheduler binary with the same KubeSchedulerConfiguration
(client QPS/burst 5000, no leader election); the second adds our extender exactly as
``deploy/overlays/extender`` configures it (filter + prioritize, ``nodeCacheCapable``,
``ignorable: false``, weight 5), served by an ``interference-scheduler extender``
process with a real ``redis-server`` holding a fresh report for every node (so the
interference score is computed for every offered node). Pods: 100m CPU each, no
interference tolerance.

Printed: drain rate of each round and their ratio (target >= 0.8x), and the extender's
p99 answer time per verb at that rate, read from its ``/metrics`` histogram (the upper
bound of the bucket holding the 99th percentile), with its CPU per pod.

    .venv/bin/python bench/extender_real_api.py [--nodes 5000] [--pods 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
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
from interference import keys  # noqa: E402
from interference.codec import encode_report, node_hash  # noqa: E402
from interference.signals import SIGNAL_FAMILIES, NodeMetrics, NodeReport  # noqa: E402
from interference_cli.redis_process import free_port, private_redis_server  # noqa: E402
from tests.e2e.control_plane import AssetsMissing, ControlPlane, find_assets  # noqa: E402

OVERLAY_CONFIG = REPO / "deploy" / "overlays" / "extender" / "kube-scheduler-config.yaml"
SCHEDULER = "interference-scheduler"


def publish_quiet_reports(redis_url: str, nodes: int) -> None:
    """One fresh report per node (interval 600 s: fresh for the whole run)."""
    store: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    pipe = store.pipeline(transaction=False)
    for i in range(nodes):
        report = NodeReport(
            node=f"node-{i:05d}",
            ts=time.time(),
            interval_s=600.0,
            metrics=NodeMetrics(runq_p99_us=50 + i % 400, interference_index=float(i % 60)),
            measured=SIGNAL_FAMILIES,
        )
        pipe.hset(keys.node_key(report.node), mapping=dict(node_hash(report)))  # type: ignore[arg-type]
        pipe.xadd(keys.STREAM, {keys.STREAM_FIELD: encode_report(report)})
    pipe.execute()
    store.close()


def kube_scheduler_config(path: Path, kubeconfig: Path, extender_port: int | None) -> Path:
    """Client QPS/burst 5000, no leader election; with the overlay's extender when a port is
    given (pointed at loopback), else kube-scheduler alone."""
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
        config["extenders"] = [{**extender, "urlPrefix": f"http://127.0.0.1:{extender_port}"}]
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
    results: list[Result] = []
    extender: subprocess.Popen[bytes] | None = None
    metrics_text, extender_cpu_s = "", 0.0
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
        alone = kube_scheduler_config(work / "alone.yaml", admin, None)
        result = run_round(plane, api, "kube-scheduler", "plain", args.pods,
                           [*kube, f"--config={alone}"], SCHEDULER,
                           work / "alone.log", args.timeout)  # fmt: skip
        results.append(result)
        print(f"  kube-scheduler alone: {result.bound}/{result.pods} bound, "
              f"{result.drain_pods_per_s:,.0f} pods/s", flush=True)  # fmt: skip
        with private_redis_server(str(work)) as redis_url:
            publish_quiet_reports(redis_url, args.nodes)
            port = free_port()
            config = work / "extender.yaml"
            settings = {
                "loop": {"scheduler_name": SCHEDULER},
                "redis": {"url": redis_url},
                "http": {"port": port, "host": "127.0.0.1"},
            }
            config.write_text(json.dumps(settings))
            script = str(Path(sys.executable).parent / "interference-scheduler")
            env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DRY_RUN")}
            with (work / "extender.log").open("ab") as log:
                extender = subprocess.Popen(
                    [script, "extender", "--config", str(config), "--kubeconfig", str(admin)],
                    stdout=log, stderr=subprocess.STDOUT, env=env,
                )  # fmt: skip
            ready_url = f"http://127.0.0.1:{port}/readyz"
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(ready_url, timeout=2) as answer:
                        if answer.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline or extender.poll() is not None:
                    tail = (work / "extender.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"the extender did not become ready:\n{tail}")
                time.sleep(0.2)
            cpu_before = cpu_seconds(extender.pid)
            with_ext = kube_scheduler_config(work / "with-extender.yaml", admin, port)
            result = run_round(plane, api, "kube-scheduler-extender", "plain", args.pods,
                               [*kube, f"--config={with_ext}"], SCHEDULER,
                               work / "with-extender.log", args.timeout)  # fmt: skip
            results.append(result)
            extender_cpu_s = cpu_seconds(extender.pid) - cpu_before
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                metrics_text = answer.read().decode()
            print(f"  kube-scheduler + extender: {result.bound}/{result.pods} bound, "
                  f"{result.drain_pods_per_s:,.0f} pods/s", flush=True)  # fmt: skip
            extender.terminate()
            extender.wait(30)
    finally:
        if extender is not None and extender.poll() is None:
            extender.kill()
            extender.wait(10)
        survivors = plane.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    alone_result, ext_result = results if len(results) == 2 else (results[0], None)
    cpus = os.cpu_count()
    print(f"\n{args.nodes} nodes, {args.pods} pods per round, real kube-apiserver v1.36 on"
          f" loopback, {cpus} CPUs shared by apiserver, etcd and the schedulers")  # fmt: skip
    print(f"{'round':<26} {'bound':>11} {'drain pods/s':>13} {'kube-scheduler CPU ms/pod':>26}")
    for r in results:
        print(f"{r.scheduler:<26} {r.bound:>5}/{r.pods:<5} {r.drain_pods_per_s:>13,.0f} "
              f"{r.drain_cpu_ms_per_pod:>26.2f}")  # fmt: skip
    if ext_result is not None and alone_result.drain_pods_per_s:
        ratio = ext_result.drain_pods_per_s / alone_result.drain_pods_per_s
        print(f"drain with extender / alone = {ratio:.2f}x "
              f"(target >= 0.8x: {'met' if ratio >= 0.8 else 'missed'}); extender CPU "
              f"{1000 * extender_cpu_s / max(1, ext_result.bound):.2f} ms/pod")  # fmt: skip
        name = "interference_scheduler_extender_request_duration_seconds"
        for verb in ("filter", "prioritize"):
            p99, count, mean = histogram_p99(metrics_text, name, verb)
            print(f"extender {verb}: {count} requests, p99 <= {1000 * p99:.0f} ms "
                  f"(histogram bucket), mean {1000 * mean:.2f} ms")  # fmt: skip
    if survivors:
        print(f"processes left behind: {survivors}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
