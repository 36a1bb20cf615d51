"""GPU packing score."""

from __future__ import annotations

import pytest

from scheduler.api.pods import parse_pod
from scheduler.plugins.gpu_packing import GpuPackingArgs, gpu_packing_score
from scheduler.signals.table import NodeTable
from tests.builders import node_obj, pod_obj, table_of

GPU = "nvidia.com/gpu"


def _table() -> NodeTable:
    return table_of(
        [
            node_obj("cpu-only"),
            node_obj("gpu-empty", extra={GPU: "8"}),
            node_obj("gpu-half", extra={GPU: "8"}),
        ],
        [(pod_obj("train", requests={GPU: "4"}), "gpu-half")],
    )


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        (None, [100.0, 0.0, 0.0]),
        ("1", [0.0, 12.5, 62.5]),
        ("4", [0.0, 50.0, 100.0]),
        ("6", [0.0, 75.0, 100.0]),
    ],
    ids=[
        "cpu-pod-keeps-off-gpu-nodes",
        "one-gpu-prefers-partly-used",
        "fills-node-exactly",
        "overfull-clamps",
    ],
)
def test_gpu_packing(gpus: str | None, expected: list[float]) -> None:
    pod = parse_pod(pod_obj(requests={GPU: gpus} if gpus else {"cpu": "1"}))
    assert gpu_packing_score(_table(), pod, GpuPackingArgs()).tolist() == pytest.approx(expected)


def test_cluster_without_gpus() -> None:
    table = table_of([node_obj("a"), node_obj("b")])
    args = GpuPackingArgs()
    assert gpu_packing_score(table, parse_pod(pod_obj()), args).tolist() == [100.0, 100.0]
    assert gpu_packing_score(table, parse_pod(pod_obj(requests={GPU: "1"})), args).tolist() == [
        0.0,
        0.0,
    ]


def test_configured_gpu_resource() -> None:
    table = table_of([node_obj("amd", extra={"amd.com/gpu": "4"})])
    pod = parse_pod(pod_obj(requests={"amd.com/gpu": "2"}))
    assert gpu_packing_score(table, pod, GpuPackingArgs(resource="amd.com/gpu"))[0] == 50.0
