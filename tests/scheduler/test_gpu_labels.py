"""GPU model and memory: node labels first, else the agent's reported devices."""

from __future__ import annotations

from typing import Any

import pytest

from interference.signals import GpuDevice, NodeMetrics
from scheduler.engine import GPU_MEMORY_MIB, GPU_MODEL, Engine
from scheduler.model import GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, gpu_labels, parse_pod
from scheduler.plugins.gpu_packing import gpu_packing_score
from scheduler.ports import NodeSignals
from scheduler.settings import EngineSettings
from scheduler.table import NodeTable
from tests.scheduler.test_model import affinity_terms, node_obj, pod_obj, table_of

NOW = 1000.0
GPU = "nvidia.com/gpu"
A100 = "NVIDIA A100-SXM4-80GB"


def _device(index: int = 0, model: str = A100, memory_mib: float = 81920.0) -> GpuDevice:
    return GpuDevice(index, f"GPU-{index}", model, memory_mib, 100.0, 37.0, 1)


def _report(table: NodeTable, **gpus: list[GpuDevice]) -> None:
    table.set_signals(
        {name: NodeSignals(NodeMetrics(), NOW, tuple(devices)) for name, devices in gpus.items()}
    )


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ([], {}),
        (
            [_device()],
            {GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB", GPU_MEMORY_LABEL: "81920"},
        ),
        # the lowest index labels the node, whatever order the agent listed them in
        (
            [_device(1, "Tesla T4", 15360), _device(0, "NVIDIA H100 80GB HBM3", 81559.4)],
            {GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3", GPU_MEMORY_LABEL: "81559"},
        ),
        # characters a label value cannot hold become '-', ends trimmed, 63 chars at most
        ([_device(0, " (Quadro) RTX/8000 ", 0)], {GPU_PRODUCT_LABEL: "Quadro-RTX-8000"}),
        ([_device(0, "x" * 80, 1024)], {GPU_PRODUCT_LABEL: "x" * 63, GPU_MEMORY_LABEL: "1024"}),
        ([_device(0, "", 0)], {}),  # nothing usable reported
    ],
)
def test_gpu_labels_from_devices(devices: list[GpuDevice], expected: dict[str, str]) -> None:
    assert gpu_labels(devices) == expected


def _gpu_nodes() -> NodeTable:
    """labelled: GFD labels (T4); reported: no labels, agent reports an A100;
    partial: product label only, memory from the agent; bare: a GPU node with neither."""
    table = table_of(
        [
            node_obj(
                "labelled",
                extra={GPU: "4"},
                labels={GPU_PRODUCT_LABEL: "Tesla-T4", GPU_MEMORY_LABEL: "15360"},
            ),
            node_obj("reported", extra={GPU: "4"}),
            node_obj("partial", extra={GPU: "4"}, labels={GPU_PRODUCT_LABEL: "NVIDIA-L4"}),
            node_obj("bare", extra={GPU: "4"}),
        ]
    )
    _report(
        table,
        labelled=[_device(0, "NVIDIA A100-SXM4-80GB")],  # labels win over the agent
        reported=[_device(0, A100)],
        partial=[_device(0, "NVIDIA L4", 23034)],
    )
    return table


def _gpu_pod(**spec: Any) -> Any:
    return parse_pod(pod_obj(requests={GPU: "1"}, **spec))


@pytest.mark.parametrize(
    ("spec", "nodes"),
    [
        ({"nodeSelector": {GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}}, {"reported"}),
        ({"nodeSelector": {GPU_PRODUCT_LABEL: "Tesla-T4"}}, {"labelled"}),
        ({"nodeSelector": {GPU_MEMORY_LABEL: "23034"}}, {"partial"}),
        (
            {"affinity": affinity_terms([(GPU_MEMORY_LABEL, "Gt", ["20000"])])},
            {"reported", "partial"},
        ),
        (
            {"affinity": affinity_terms([(GPU_PRODUCT_LABEL, "Exists", [])])},
            {"labelled", "reported", "partial"},
        ),
        ({"affinity": affinity_terms([(GPU_PRODUCT_LABEL, "DoesNotExist", [])])}, {"bare"}),
    ],
)
def test_selector_and_affinity_see_labels_or_reported_devices(
    spec: dict[str, Any], nodes: set[str]
) -> None:
    table = _gpu_nodes()
    engine = Engine(EngineSettings(record_top_k=10))
    result = engine.schedule(_gpu_pod(**spec), table, NOW)
    assert {c.node for c in result.candidates if c.passed} == nodes


def test_decision_records_gpu_model_for_gpu_pods_only() -> None:
    table = _gpu_nodes()
    result = Engine(EngineSettings(record_top_k=10)).schedule(_gpu_pod(), table, NOW)
    details = {c.node: c.details for c in result.candidates}
    assert details == {
        "labelled": {GPU_MODEL: "Tesla-T4", GPU_MEMORY_MIB: "15360"},
        "reported": {GPU_MODEL: "NVIDIA-A100-SXM4-80GB", GPU_MEMORY_MIB: "81920"},
        "partial": {GPU_MODEL: "NVIDIA-L4", GPU_MEMORY_MIB: "23034"},
        "bare": {},
    }
    plain = Engine(EngineSettings(record_top_k=10)).schedule(parse_pod(pod_obj()), table, NOW)
    assert all(c.details == {} for c in plain.candidates)


def test_packing_keeps_other_pods_off_nodes_with_reported_gpus() -> None:
    # "reported" has no nvidia.com/gpu allocatable yet (device plugin not up) and no
    # labels, but its agent reports a GPU: plain pods keep off it like off labelled ones.
    table = table_of([node_obj("cpu"), node_obj("reported"), node_obj("gpu", extra={GPU: "8"})])
    settings = EngineSettings()
    plain = parse_pod(pod_obj())
    assert gpu_packing_score(table, plain, settings).tolist() == [100.0, 100.0, 0.0]
    _report(table, reported=[_device()])
    assert gpu_packing_score(table, plain, settings).tolist() == [100.0, 0.0, 0.0]


def test_inventory_changes_refresh_cached_masks_but_utilisation_does_not() -> None:
    table = table_of([node_obj("n", extra={GPU: "1"})])
    pod = _gpu_pod(nodeSelector={GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"})
    engine = Engine(EngineSettings())
    assert engine.schedule(pod, table, NOW).node is None  # no labels, no report yet
    _report(table, n=[_device()])
    generation = table.generation
    assert engine.schedule(pod, table, NOW).node == "n"
    busier = GpuDevice(0, "GPU-0", A100, 81920.0, 70000.0, 99.0, 4)
    table.set_signals({"n": NodeSignals(NodeMetrics(interference_index=5), NOW + 1, (busier,))})
    assert table.generation == generation  # same inventory: cached masks kept
    _report(table, n=[_device(0, "Tesla T4", 15360)])  # the GPU was swapped
    assert table.generation > generation
    assert engine.schedule(pod, table, NOW).node is None
    table.set_signals({})  # the agent's data expired: its labels go with it
    assert table.node_label(0, GPU_PRODUCT_LABEL) is None
