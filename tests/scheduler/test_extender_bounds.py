"""A costly extender request is refused before any scheduling work, within a bound of CPU,
counted and logged once, while the largest legitimate request (a real pod, 5,000 node
names) and a pod at every bound get their full answer: the real extender behind its real
HTTP endpoint on loopback, 5,000 nodes in its cache, bodies up to the 6 MiB limit."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.endpoint.http import EXTENDER_MAX_BODY_BYTES
from scheduler.extender.bounds import (
    MAX_ANNOTATION_BYTES,
    POD_BOUNDS,
    TOO_COMPLEX,
    UNKNOWN_NODES_ALLOWED,
    names_over_bound,
    pod_over_bounds,
)
from scheduler.extender.extender import NOT_SYNCED
from tests.builders import affinity_terms, node_obj, pod_obj
from tests.scheduler.served_extender import ServedExtender, extender_args, runq_p99_us
from tests.scheduler.test_extender import Harness

NODES = 5000
CPU_BOUND_S = 2.0
"""CPU the process may spend on one refused 6 MiB request (measured: 0.6 s at most, most
of it ``json.loads``; 218 s before the bounds for 6 MiB of nodeSelector keys)."""
TOLERANT = {"interference.io/max-runq-p99-us": "500"}
NAMES = [f"node-{i:05d}" for i in range(NODES)]


def _nodes() -> list[dict[str, Any]]:
    """Zone and rack labels, one in ten tainted."""
    return [
        node_obj(
            name,
            cpu="64",
            labels={"zone": f"zone-{i % 3}", "rack": f"rack-{i % 50}"},
            taints=[("dedicated", "db", "NoSchedule")] if i % 10 == 0 else [],
        )
        for i, name in enumerate(NAMES)
    ]


@pytest.fixture(scope="module")
def served() -> Iterator[ServedExtender]:
    served = ServedExtender(_nodes())
    served.endpoint.start()
    yield served
    served.endpoint.stop()


def _body(pod: dict[str, Any], names: list[str] = NAMES) -> bytes:
    return extender_args(pod, names)


def _filling(build: Callable[[int], dict[str, Any]]) -> bytes:
    """The body of the largest ``build(n)`` (n a power of two) within the 6 MiB limit."""
    n = 1
    while len(_body(build(2 * n))) <= EXTENDER_MAX_BODY_BYTES:
        n *= 2
    return _body(build(n))


def _node_selector_keys(n: int) -> dict[str, Any]:
    return pod_obj(nodeSelector={f"key-{i}": "v" for i in range(n)})


def _node_affinity_terms(n: int) -> dict[str, Any]:
    return pod_obj(affinity=affinity_terms(*([("zone", "In", ["zone-1"])],) * n))


def _tolerations(n: int) -> dict[str, Any]:
    return pod_obj(tolerations=[{"key": f"k{i}", "operator": "Exists"} for i in range(n)])


COSTLY: dict[str, tuple[Callable[[], bytes], str]] = {
    "nodeSelector-keys": (lambda: _filling(_node_selector_keys), "nodeSelector labels"),
    "node-affinity-terms": (lambda: _filling(_node_affinity_terms), "node-affinity terms"),
    "tolerations": (lambda: _filling(_tolerations), "tolerations"),
    "unknown-node-names": (
        lambda: _body(pod_obj(), [f"{i:x}" for i in range(600_000)]),
        "node names",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(COSTLY))
def test_a_costly_request_is_refused_within_the_cpu_bound_and_counted(
    served: ServedExtender, shape: str
) -> None:
    build, what = COSTLY[shape]
    body = build()
    assert len(body) > EXTENDER_MAX_BODY_BYTES // 2  # close to the limit, still taken
    before = served.refused(TOO_COMPLEX)
    cpu = time.process_time()
    code, answer = served.post("filter", body)
    spent = time.process_time() - cpu
    assert code == 200
    error = json.loads(answer)["Error"]
    assert "refuses the request" in error and what in error, error
    assert spent < CPU_BOUND_S, f"{spent:.2f} s of CPU for a refused request"
    code, answer = served.post("prioritize", body)
    assert code == 400 and what in answer.decode()
    assert served.refused(TOO_COMPLEX) == before + 2


def test_refusals_are_logged_once_and_each_counted(caplog: pytest.LogCaptureFixture) -> None:
    harness = Harness()
    caplog.set_level(logging.WARNING, logger="scheduler.extender.extender")
    body = _body(_tolerations(2000), ["quiet"])
    for route in (harness.extender.filter_route, harness.extender.prioritize_route) * 2:
        route(body)
    refused = [r for r in caplog.records if r.name == "scheduler.extender.extender"]
    assert len(refused) == 1 and "2000 tolerations" in refused[0].getMessage()
    assert (
        harness.sample("interference_scheduler_extender_refused_total", reason="too_complex") == 4
    )
    assert harness.decisions.items == []


def test_json_nested_thousands_deep_is_a_bad_request_not_a_crash(served: ServedExtender) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    body = f'{{"Pod":{{"metadata":{{"name":"p"}},"x":{deep}}},"NodeNames":[]}}'.encode()
    code, answer = served.post("filter", body)
    assert code == 400 and "nested too deeply" in json.loads(answer)["Error"]
    code, answer = served.post("prioritize", body)
    assert code == 400 and b"nested too deeply" in answer


def _at_every_bound() -> dict[str, Any]:
    """A pod with every list of POD_BOUNDS exactly at its limit (its node selector names
    keys no node carries: no node passes, every node is answered)."""
    values = [f"v{i}" for i in range(64)]
    term = {
        "matchExpressions": [
            {"key": key, "operator": "NotIn", "values": values} for key in ("zone", "rack") * 2
        ]
    }
    selector = {
        "matchExpressions": [
            {"key": "app", "operator": "In", "values": [f"a{i}" for i in range(255)]}
        ]
    }
    pod_term = {"labelSelector": selector, "topologyKey": "zone"}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term] * 128},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": term}] * 128,
        },
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": pod_term}] * 256},
    }  # fmt: skip
    containers: list[dict[str, Any]] = [
        {"name": f"c{i}", "image": "b", "ports": [{"containerPort": 80 + j} for j in range(4)]}
        for i in range(1024)
    ]
    containers[0]["resources"] = {"requests": {"cpu": "1"}}
    return pod_obj(
        containers=containers,
        annotations={**TOLERANT, "filler": "x" * (MAX_ANNOTATION_BYTES - 100)},
        labels={f"l{i}": "v" for i in range(4096)},
        affinity=affinity,
        nodeSelector={f"key-{i}": "v" for i in range(256)},
        tolerations=[{"key": f"k{i}", "operator": "Exists"} for i in range(1024)],
        topologySpreadConstraints=[
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
        ]
        * 256,
        volumes=[{"name": f"v{i}", "emptyDir": {}} for i in range(4096)],
    )


@pytest.mark.parametrize("bound", POD_BOUNDS, ids=lambda b: b.what)
def test_the_pod_at_every_bound_is_exactly_at_each(bound: Any) -> None:
    assert bound.count(_at_every_bound()) == bound.limit


def test_the_largest_legitimate_requests_get_their_full_answer(served: ServedExtender) -> None:
    real = pod_obj("real", requests={"cpu": "1"}, annotations=TOLERANT)
    code, answer = served.post("filter", _body(real))
    verdict = json.loads(answer)
    assert code == 200 and "Error" not in verdict, verdict
    failed = {**verdict["FailedNodes"], **verdict["FailedAndUnresolvableNodes"]}
    assert sorted([*verdict["NodeNames"], *failed]) == NAMES
    quiet = [n for i, n in enumerate(NAMES) if i % 10 and runq_p99_us(i) <= 500]
    assert verdict["NodeNames"] == quiet  # untainted, within the tolerance
    code, answer = served.post("prioritize", _body(real))
    assert code == 200 and [p["Host"] for p in json.loads(answer)] == NAMES

    bounded = _body(_at_every_bound())
    before = served.refused(TOO_COMPLEX)
    cpu = time.process_time()
    code, answer = served.post("filter", bounded)
    verdict = json.loads(answer)
    assert code == 200 and "Error" not in verdict, verdict.get("Error")
    assert sorted(verdict["FailedAndUnresolvableNodes"]) == NAMES  # no node has key-0
    code, answer = served.post("prioritize", bounded)
    spent = time.process_time() - cpu
    assert code == 200 and [p["Host"] for p in json.loads(answer)] == NAMES
    assert spent < 2 * CPU_BOUND_S, f"{spent:.2f} s of CPU for the pod at every bound"
    assert served.refused(TOO_COMPLEX) == before


@pytest.mark.slow
def test_other_clients_are_answered_while_a_costly_request_is_refused(
    served: ServedExtender,
) -> None:
    costly = _filling(_node_selector_keys)
    small = _body(pod_obj("small", requests={"cpu": "1"}), NAMES[:50])
    took: list[float] = []
    done = threading.Event()

    def bystander() -> None:
        while not done.is_set():
            started = time.perf_counter()
            code, answer = served.post("filter", small)
            took.append(time.perf_counter() - started)
            assert code == 200 and "Error" not in json.loads(answer)

    thread = threading.Thread(target=bystander)
    thread.start()
    try:
        for _ in range(3):
            assert served.post("filter", costly)[0] == 200
    finally:
        done.set()
        thread.join(timeout=30)
    assert len(took) >= 3 and max(took) < 5.0, took


def test_annotations_over_the_api_servers_limit_are_refused() -> None:
    at_limit = pod_obj(annotations={"a": "x" * (MAX_ANNOTATION_BYTES - 1)})
    assert pod_over_bounds(at_limit) == ""
    over = pod_obj(annotations={"a": "x" * MAX_ANNOTATION_BYTES})
    assert "annotations take 262145 bytes" in pod_over_bounds(over)


def test_node_names_beyond_the_cache_and_its_margin_are_refused() -> None:
    assert names_over_bound(NODES + UNKNOWN_NODES_ALLOWED, NODES) == ""
    message = names_over_bound(NODES + UNKNOWN_NODES_ALLOWED + 1, NODES)
    assert "10001 node names" in message and "5000 nodes" in message


def test_operations_md_lists_the_bounds_the_code_holds() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    start = text.index("**Limits.** A request body over `extender.max_body_bytes`")
    limits = " ".join(text[start : text.index("\n\n", start)].split())
    for bound in POD_BOUNDS:
        assert f"{bound.limit:,}" in limits, bound.what
    assert f"plus {UNKNOWN_NODES_ALLOWED:,} node names" in limits
    assert f"annotations of {MAX_ANNOTATION_BYTES // 1024} KiB" in limits


def test_before_the_first_list_many_names_get_still_listing_not_a_refusal() -> None:
    harness = Harness(pods_listed=False)
    names = [f"node-{i}" for i in range(UNKNOWN_NODES_ALLOWED + 100)]
    code, answer, _ = harness.extender.filter_route(_body(pod_obj(), names))
    assert code == 200 and json.loads(answer) == {"Error": NOT_SYNCED}
    harness.cache.replace("Pod", [])
    code, answer, _ = harness.extender.filter_route(_body(pod_obj(), names))
    assert "refuses the request" in json.loads(answer)["Error"]
    assert (
        harness.sample("interference_scheduler_extender_refused_total", reason="too_complex") == 1
    )


def test_bad_requests_are_logged_once_and_each_counted(caplog: pytest.LogCaptureFixture) -> None:
    harness = Harness()
    caplog.set_level(logging.WARNING, logger="scheduler.extender.extender")
    deep = b'{"Pod":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for route in (harness.extender.filter_route, harness.extender.prioritize_route) * 2:
        assert route(deep)[0] == 400
    logged = [r.getMessage() for r in caplog.records if r.name == "scheduler.extender.extender"]
    assert logged == ["bad extender filter request: request body is JSON nested too deeply"]
    errors = sum(
        harness.sample("interference_scheduler_extender_requests_total", verb=v, result="error")
        for v in ("filter", "prioritize")
    )
    assert errors == 4
