"""GPU model and memory come from the Node's labels only: what an agent reports about its
GPUs never becomes a label a pod selector matches (a forged inventory cannot attract GPU
pods)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from interference import sched_record
from interference.signals import SIGNAL_FAMILIES, GpuDevice, NodeMetrics, NodeReport
from scheduler.api.objects import GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL
from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.ports import NodeSignals
from scheduler.cycle.settings import CycleSettings
from scheduler.plugins.gpu_packing import (
    GPU_MEMORY_MIB,
    GPU_MODEL,
    GpuPackingArgs,
    gpu_packing_score,
)
from scheduler.signals.frame import SIGNAL_COLUMNS
from scheduler.signals.table import NodeTable
from tests.builders import affinity_terms, node_obj, pod_obj, table_of
from tests.indexed_signals import metrics_with_index

NOW = 1000.0
GPU = "nvidia.com/gpu"
A100 = "NVIDIA A100-SXM4-80GB"


def _device(index: int = 0, model: str = A100, memory_mib: float = 81920.0) -> GpuDevice:
    return GpuDevice(index, f"GPU-{index}", model, memory_mib, 100.0, 37.0, 1)


def _report(table: NodeTable, **gpus: list[GpuDevice]) -> None:
    """The agents on ``gpus``' nodes report those devices: the scheduler's signals carry
    none of it (:func:`_signals`), only the report's metrics reach the table."""
    table.set_signals(
        {
            name: _signals(NodeReport(name, NOW, 1.0, NodeMetrics(), gpus=devices))
            for name, devices in gpus.items()
        }
    )


def _signals(report: NodeReport) -> NodeSignals:
    """What the scheduler keeps of an agent's report: every field :class:`NodeSignals`
    has (it has none for GPUs)."""
    return NodeSignals(
        report.metrics,
        report.ts,
        interval_s=report.interval_s,
        measured=SIGNAL_FAMILIES,
        windows=report.windows,
    )


def test_the_scheduler_s_signals_have_no_gpu_inventory() -> None:
    """The agent's record carries GPU aggregates (for the CLI); neither the signals the
    scheduler keeps per node nor the table's signal columns hold any of them."""
    reported = {name for name, _ in sched_record.HEADER if name.startswith("gpu")}
    assert reported  # the agent does report GPUs
    assert not any("gpu" in column for column in SIGNAL_COLUMNS)
    assert not any("gpu" in field.name for field in dataclasses.fields(NodeSignals))


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
        ({"nodeSelector": {GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}}, set()),
        ({"nodeSelector": {GPU_PRODUCT_LABEL: "Tesla-T4"}}, {"labelled"}),
        ({"nodeSelector": {GPU_MEMORY_LABEL: "23034"}}, set()),
        ({"affinity": affinity_terms([(GPU_MEMORY_LABEL, "Gt", ["20000"])])}, set()),
        (
            {"affinity": affinity_terms([(GPU_PRODUCT_LABEL, "Exists", [])])},
            {"labelled", "partial"},
        ),
        (
            {"affinity": affinity_terms([(GPU_PRODUCT_LABEL, "DoesNotExist", [])])},
            {"reported", "bare"},
        ),
    ],
)
def test_selector_and_affinity_see_node_labels_never_reported_devices(
    spec: dict[str, Any], nodes: set[str]
) -> None:
    table = _gpu_nodes()
    cycle = SchedulingCycle(CycleSettings(record_top_k=10))
    result = cycle.schedule(_gpu_pod(**spec), table, NOW)
    assert {c.node for c in result.candidates if c.passed} == nodes


def test_decision_records_gpu_model_from_labels_for_gpu_pods_only() -> None:
    table = _gpu_nodes()
    result = SchedulingCycle(CycleSettings(record_top_k=10)).schedule(_gpu_pod(), table, NOW)
    details = {c.node: c.details for c in result.candidates}
    assert details == {
        "labelled": {GPU_MODEL: "Tesla-T4", GPU_MEMORY_MIB: "15360"},
        "reported": {},
        "partial": {GPU_MODEL: "NVIDIA-L4"},
        "bare": {},
    }
    plain = SchedulingCycle(CycleSettings(record_top_k=10)).schedule(
        parse_pod(pod_obj()), table, NOW
    )
    assert all(c.details == {} for c in plain.candidates)


def test_packing_ignores_reported_gpus() -> None:
    table = table_of([node_obj("cpu"), node_obj("reported"), node_obj("gpu", extra={GPU: "8"})])
    args = GpuPackingArgs()
    plain = parse_pod(pod_obj())
    assert gpu_packing_score(table, plain, args).tolist() == [100.0, 100.0, 0.0]
    _report(table, reported=[_device()])
    assert gpu_packing_score(table, plain, args).tolist() == [100.0, 100.0, 0.0]


def test_a_forged_inventory_never_attracts_a_gpu_pod() -> None:
    table = table_of([node_obj("n", extra={GPU: "1"})])
    pod = _gpu_pod(nodeSelector={GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"})
    cycle = SchedulingCycle(CycleSettings())
    generation = table.generation
    _report(table, n=[_device()])
    busier = GpuDevice(0, "GPU-0", A100, 81920.0, 70000.0, 99.0, 4)
    report = NodeReport("n", NOW + 1, 1.0, metrics_with_index(5), gpus=[busier])
    table.set_signals({"n": _signals(report)})
    assert table.generation == generation
    assert cycle.schedule(pod, table, NOW).node is None
    assert table.node_label(0, GPU_PRODUCT_LABEL) is None
