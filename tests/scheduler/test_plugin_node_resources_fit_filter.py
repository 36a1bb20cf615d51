"""NodeResourcesFit filter: cpu, memory, ephemeral storage, pod count, extended resources."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.api.pods import parse_pod
from scheduler.plugins.node_resources_fit import TOO_MANY_PODS, resources_fit
from tests.builders import container, node_obj, pod_obj, table_of


def _placed(name: str, node: str, **requests: str) -> tuple[dict[str, Any], str]:
    return pod_obj(name, requests={k.replace("_", "-"): v for k, v in requests.items()}), node


@pytest.mark.parametrize(
    ("node", "placed", "requests", "reasons"),
    [
        (node_obj(cpu="2"), [], {"cpu": "2"}, []),
        (node_obj(cpu="2"), [], {"cpu": "2001m"}, ["Insufficient cpu"]),
        (
            node_obj(cpu="2"),
            [_placed("old", "n1", cpu="1500m")],
            {"cpu": "600m"},
            ["Insufficient cpu"],
        ),
        (node_obj(cpu="2"), [_placed("old", "n1", cpu="1500m")], {"cpu": "500m"}, []),
        (node_obj(memory="1Gi"), [], {"memory": "1025Mi"}, ["Insufficient memory"]),
        (
            node_obj(cpu="1", memory="1Gi"),
            [],
            {"cpu": "2", "memory": "2Gi"},
            ["Insufficient cpu", "Insufficient memory"],
        ),
        (node_obj(), [], {"ephemeral-storage": "101Gi"}, ["Insufficient ephemeral-storage"]),
        (node_obj(pods="1"), [_placed("old", "n1")], {}, [TOO_MANY_PODS]),
        (node_obj(pods="2"), [_placed("old", "n1")], {}, []),
        (node_obj(cpu="1"), [_placed("old", "n1", cpu="1")], {}, []),
        (
            node_obj(extra={"nvidia.com/gpu": "4"}),
            [_placed("g", "n1", **{"nvidia.com/gpu": "3"})],
            {"nvidia.com/gpu": "1"},
            [],
        ),
        (
            node_obj(extra={"nvidia.com/gpu": "4"}),
            [_placed("g", "n1", **{"nvidia.com/gpu": "3"})],
            {"nvidia.com/gpu": "2"},
            ["Insufficient nvidia.com/gpu"],
        ),
        (node_obj(), [], {"nvidia.com/gpu": "1"}, ["Insufficient nvidia.com/gpu"]),
        (node_obj(), [], {"example.com/fpga": "1"}, ["Insufficient example.com/fpga"]),
        (
            node_obj(pods="0"),
            [],
            {"cpu": "100", "nvidia.com/gpu": "1"},
            [TOO_MANY_PODS, "Insufficient cpu", "Insufficient nvidia.com/gpu"],
        ),
    ],
    ids=[
        "cpu-exact-fit",
        "cpu-one-milli-over",
        "cpu-with-placed-pod",
        "cpu-fits-beside-placed",
        "memory-over",
        "cpu-and-memory-both-listed",
        "ephemeral-storage",
        "too-many-pods",
        "pod-count-fits",
        "zero-request-pod-fits-full-node",
        "gpu-fits",
        "gpu-over",
        "gpu-on-cpu-node",
        "resource-no-node-offers",
        "all-reasons-in-kube-order",
    ],
)
def test_resources_fit(
    node: dict[str, Any],
    placed: list[tuple[dict[str, Any], str]],
    requests: dict[str, str],
    reasons: list[str],
) -> None:
    table = table_of([node], placed)
    result = resources_fit(table, parse_pod(pod_obj(requests=requests)))
    assert bool(result.passed[0]) is (not reasons)
    assert result.reasons_for(0) == reasons


@pytest.mark.parametrize(
    ("spec", "fits"),
    [
        ({"initContainers": [container({"cpu": "3"})]}, True),
        ({"initContainers": [container({"cpu": "3501m"})]}, False),
        ({"initContainers": [container({"cpu": "1001m"}, restartPolicy="Always")]}, False),
        ({"overhead": {"cpu": "1"}}, True),
        ({"overhead": {"cpu": "1001m"}}, False),
    ],
    ids=[
        "init-peak-fits",
        "init-peak-too-big",
        "sidecar-adds-to-containers",
        "overhead-fits",
        "overhead-tips-over",
    ],
)
def test_init_containers_and_overhead_count(spec: dict[str, Any], fits: bool) -> None:
    table = table_of([node_obj(cpu="4")], [_placed("old", "n1", cpu="500m")])
    obj = pod_obj(requests={"cpu": "2500m"})
    obj["spec"].update(spec)
    assert bool(resources_fit(table, parse_pod(obj)).passed[0]) is fits


def test_removed_pod_frees_its_requests() -> None:
    old = pod_obj("old", requests={"cpu": "3"})
    table = table_of([node_obj(cpu="4")], [(old, "n1")])
    pod = parse_pod(pod_obj(requests={"cpu": "2"}))
    assert not resources_fit(table, pod).passed[0]
    table.remove_pod(parse_pod(old))
    assert resources_fit(table, pod).passed[0]


def test_vectorised_over_many_nodes() -> None:
    nodes = [node_obj(f"n{i}", cpu=str(i)) for i in range(1, 9)]
    table = table_of(nodes)
    result = resources_fit(table, parse_pod(pod_obj(requests={"cpu": "5"})))
    assert result.passed.tolist() == [False] * 4 + [True] * 4
