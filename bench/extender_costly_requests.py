"""CPU seconds one extender request costs, per request shape, against the real extender.

The real :class:`~scheduler.extender.extender.Extender` behind the real
:class:`~scheduler.endpoint.http.ExtenderEndpoint` (plain HTTP on loopback, the default limits:
6 MiB bodies), its cache holding ``--nodes`` nodes (zone and rack labels, one in ten
tainted, one report each) and two running pods per node. Each shape is one ``ExtenderArgs``
body of at most 6 MiB posted to ``/filter`` and ``/prioritize``; printed per shape and verb:
the body's size, the answer's status, wall seconds and the process's CPU seconds (the
server's threads and this client; the body is encoded beforehand), and the CPU of
``json.loads`` of the body alone. A second client's small filter requests are timed while
each shape is served: the longest any of them took is what everyone else waits.

    .venv/bin/python bench/extender_costly_requests.py [--nodes 5000] [--shapes a,b]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.builders import node_obj, pod_obj  # noqa: E402
from tests.scheduler.served_extender import ServedExtender, extender_args  # noqa: E402

LIMIT = 6 * 1024 * 1024
TOLERANT = {"interference.io/max-runq-p99-us": "500"}


def served_extender(count: int) -> ServedExtender:
    """``count`` nodes (zone and rack labels, one in ten tainted, 8 GPUs each) with two
    running pods each."""
    names = [f"node-{i:05d}" for i in range(count)]
    nodes = [
        node_obj(
            name,
            cpu="64",
            memory="256Gi",
            extra={"nvidia.com/gpu": "8"},
            labels={"zone": f"zone-{i % 3}", "rack": f"rack-{i % 50}"},
            taints=[("dedicated", "db", "NoSchedule")] if i % 10 == 0 else [],
        )
        for i, name in enumerate(names)
    ]
    running = []
    for i, name in enumerate(names):
        for j in range(2):
            pod = pod_obj(f"run-{i}-{j}", labels={"app": f"app-{(i + j) % 20}"})
            pod["spec"]["nodeName"] = name
            pod["status"] = {"phase": "Running"}
            running.append(pod)
    return ServedExtender(nodes, running)


def _filling(build: Callable[[int], dict[str, Any]], names: list[str]) -> bytes:
    """The largest ``build(n)`` pod whose ``ExtenderArgs`` with ``names`` fits 6 MiB."""
    low, high = 1, 1
    while len(extender_args(build(high), names)) <= LIMIT:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if len(extender_args(build(middle), names)) <= LIMIT:
            low = middle
        else:
            high = middle
    return extender_args(build(low), names)


def _values(n: int) -> list[str]:
    return [f"v{i}" for i in range(n)]


def shapes(names: list[str]) -> dict[str, Callable[[], bytes]]:
    """Each shape's body (built when asked)."""
    real = pod_obj("real", requests={"cpu": "1", "nvidia.com/gpu": "1"}, annotations=TOLERANT)

    def pod(**spec: Any) -> dict[str, Any]:
        return pod_obj("costly", requests={"cpu": "1"}, annotations=TOLERANT, **spec)

    def node_terms(terms: int, values: int) -> dict[str, Any]:
        return {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In",
                                               "values": _values(values)}]}
                        for _ in range(terms)
                    ]
                }
            }
        }  # fmt: skip

    def preferred_terms(terms: int) -> dict[str, Any]:
        term = {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["x"]}]}
        return {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": term} for _ in range(terms)
                ]
            }
        }

    def pod_terms(terms: int) -> dict[str, Any]:
        term = {
            "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In",
                                                    "values": ["a", "b"]}]},
            "topologyKey": "zone",
        }  # fmt: skip
        return {
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term] * terms},
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "podAffinityTerm": term}
                ]
                * terms
            },
        }

    def spread(n: int) -> list[dict[str, Any]]:
        return [
            {"maxSkew": 1, "topologyKey": f"key-{i}", "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"app": "web"}}}
            for i in range(n)
        ]  # fmt: skip

    def tolerations(n: int) -> list[dict[str, Any]]:
        return [{"key": f"k{i}", "operator": "Exists"} for i in range(n)]

    def containers(n: int) -> list[dict[str, Any]]:
        return [
            {"name": f"c{i}", "image": "b", "resources": {"requests": {"cpu": "1m"}},
             "ports": [{"containerPort": 80, "hostPort": 1000 + i % 60000}]}
            for i in range(n)
        ]  # fmt: skip

    def nested(depth: int) -> bytes:
        pod = json.dumps(real, separators=(",", ":"))
        deep = "[" * depth + "]" * depth
        pod = pod[:-1] + f',"x":{deep}}}'
        return f'{{"Pod":{pod},"NodeNames":{json.dumps(names)}}}'.encode()

    def at_bounds(key: Callable[[int], str]) -> dict[str, Any]:
        """Every list of :data:`~scheduler.extender.bounds.POD_BOUNDS` at its limit, label
        keys named by ``key(i)``."""
        requirement = {"operator": "NotIn", "values": _values(63)}
        term = {"matchExpressions": [{**requirement, "key": key(i)} for i in range(4)]}
        affinity = pod_terms(128)
        affinity["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term] * 128},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [
                    {**requirement, "key": key(j * 4 + i)} for i in range(4)]}}
                for j in range(128)
            ],
        }  # fmt: skip
        built = pod(
            affinity=affinity,
            nodeSelector={key(i): "zone-1" for i in range(256)},
            tolerations=tolerations(1024),
            topologySpreadConstraints=spread(256),
        )
        built["spec"]["containers"] = containers(1024)
        built["spec"]["containers"][0]["ports"] *= 4
        built["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
        built["metadata"]["labels"] = {f"l{i}": "v" for i in range(4096)}
        return built

    return {
        "real-pod-5000-names": lambda: extender_args(real, names),
        "every-bound-unknown-keys": lambda: extender_args(at_bounds(lambda i: f"key-{i}"), names),
        "every-bound-node-keys": lambda: extender_args(
            at_bounds(lambda i: "zone" if i % 2 else "rack"), names
        ),
        "one-term-huge-values": lambda: _filling(lambda n: pod(affinity=node_terms(1, n)), names),
        "many-terms-few-values": lambda: _filling(lambda n: pod(affinity=node_terms(n, 1)), names),
        "many-terms-x-values": lambda: _filling(lambda n: pod(affinity=node_terms(n, 50)), names),
        "preferred-node-terms": lambda: _filling(lambda n: pod(affinity=preferred_terms(n)), names),
        "pod-affinity-terms": lambda: _filling(lambda n: pod(affinity=pod_terms(n)), names),
        "spread-constraints": lambda: _filling(
            lambda n: pod(topologySpreadConstraints=spread(n)), names
        ),
        "tolerations": lambda: _filling(lambda n: pod(tolerations=tolerations(n)), names),
        "node-selector-keys": lambda: _filling(
            lambda n: pod(nodeSelector={f"k{i}": "v" for i in range(n)}), names
        ),
        "containers-host-ports": lambda: _filling(
            lambda n: pod_obj("costly", containers=containers(n)), names
        ),
        "annotations": lambda: _filling(
            lambda n: pod_obj("costly", annotations={f"a{i}": "v" for i in range(n)}), names
        ),
        "unknown-short-names": lambda: extender_args(real, [f"{i:x}" for i in range(LIMIT // 9)]),
        "deep-json": lambda: nested(LIMIT // 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--shapes", default="", help="comma-separated; default all")
    parser.add_argument("--timeout", type=float, default=120.0, help="skip prioritize past it")
    options = parser.parse_args()
    served = served_extender(options.nodes)
    served.endpoint.start()
    chosen = [s for s in options.shapes.split(",") if s]
    small = extender_args(
        pod_obj("bystander", requests={"cpu": "1"}, annotations=TOLERANT), served.names[:100]
    )
    print(f"{options.nodes} nodes in the cache; bodies of at most {LIMIT} bytes")
    print(f"{'shape':<24} {'bytes':>8} {'loads cpu':>9}  verb        code   wall s    cpu s")
    try:
        for name, build in shapes(served.names).items():
            if chosen and name not in chosen:
                continue
            body = build()
            cpu = time.process_time()
            with contextlib.suppress(RecursionError):
                json.loads(body)
            loads_s = time.process_time() - cpu
            for verb in ("filter", "prioritize"):
                bystander: list[float] = []
                done = threading.Event()
                thread = threading.Thread(target=_bystander, args=(served, small, bystander, done))
                wall, cpu = time.perf_counter(), time.process_time()
                thread.start()
                code, answer = served.post(verb, body, timeout_s=600)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                done.set()
                thread.join()
                note = answer[:80].decode(errors="replace") if code != 200 else ""
                if not note and answer.startswith(b"{"):
                    note = str(json.loads(answer).get("Error", ""))[:80]
                print(
                    f"{name:<24} {len(body):>8} {loads_s:>9.3f}  {verb:<10} {code:>5}"
                    f" {wall:>8.2f} {cpu:>8.2f}  bystander max {max(bystander):.3f} s  {note}",
                    flush=True,
                )
        return 0
    finally:
        served.endpoint.stop()


def _bystander(
    served: ServedExtender, body: bytes, took: list[float], done: threading.Event
) -> None:
    """Another client's small filter requests, one after another while the costly one is
    served (and at least one)."""
    while True:
        started = time.perf_counter()
        served.post("filter", body, timeout_s=600)
        took.append(time.perf_counter() - started)
        if done.wait(0.02):
            return


if __name__ == "__main__":
    sys.exit(main())
