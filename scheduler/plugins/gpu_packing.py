"""GpuPacking (ours): GPU pods fill partly used GPU nodes first, other pods keep off GPU nodes.

With ``g`` the GPU extended resource (``nvidia.com/gpu``) and ``want`` the pod's request::

    GPU pod (want > 0):  score = 100 · min(1, (requested[g] + want) / allocatable[g]),
                         0 where allocatable[g] = 0
    other pods:          score = 0 on GPU nodes, else 100
    GPU node:            allocatable[g] > 0, or a known GPU model (``nvidia.com/gpu.product``
                         labelled, or reported by the node's agent)

Most-allocated on GPUs leaves whole nodes free for large GPU pods (less fragmentation);
counting nodes whose GPUs the agent reports keeps other pods off them even before their
device plugin advertises ``nvidia.com/gpu``.

Evidence: a GPU pod's decision record names each candidate's GPU model and memory per GPU
(the node's ``nvidia.com/gpu.product`` and ``nvidia.com/gpu.memory`` labels).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scheduler.api.objects import GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, PodInfo
from scheduler.plugins.base import CandidateDetails, CycleState, Evidence, Score
from scheduler.signals.table import NodeTable

NAME = "GpuPacking"
GPU_MODEL = "gpu_model"
"""Candidate detail: the node's GPU model (``nvidia.com/gpu.product``), for GPU pods."""
GPU_MEMORY_MIB = "gpu_memory_mib"
"""Candidate detail: memory per GPU in MiB (``nvidia.com/gpu.memory``), for GPU pods."""


@dataclass(frozen=True, slots=True)
class GpuPackingArgs:
    """The GpuPacking plugin's args (``plugin_config``)."""

    resource: str = "nvidia.com/gpu"
    """Extended resource that counts as GPUs (also what makes a pod a GPU pod in decision
    records, which then name each node's GPU model and memory)."""

    def __post_init__(self) -> None:
        if not self.resource:
            raise ValueError("resource: must name an extended resource, e.g. nvidia.com/gpu")


def gpu_packing_score(table: NodeTable, pod: PodInfo, args: GpuPackingArgs) -> NDArray[np.float64]:
    """0–100 per node (see the module formula)."""
    gpu = args.resource
    inverse = table.inverse_allocatable(gpu)
    want = pod.requests.get(gpu, 0)
    if want == 0:
        return table.cached("allocatable", (NAME, gpu), _keep_off, table, inverse)
    row = table.resource_row(gpu)
    if row is None:
        return np.zeros(len(table))
    packed: NDArray[np.float64] = (table.requested[row] + want) * inverse
    np.minimum(packed, 1.0, out=packed)
    packed *= 100.0
    return packed


def _score(state: CycleState, feasible: NDArray[np.bool_]) -> NDArray[np.float64] | None:
    return gpu_packing_score(state.table, state.pod, state.args_of(NAME, GpuPackingArgs))


def gpu_details(state: CycleState) -> CandidateDetails | None:
    """For a GPU pod's record: each candidate's GPU model and memory (its labels);
    ``None`` for other pods."""
    table = state.table
    if state.pod.requests.get(state.args_of(NAME, GpuPackingArgs).resource, 0) == 0:
        return None  # no call per candidate: most pods are not GPU pods

    # labels change only with the table's generation, which empties this scope
    found: dict[int, dict[str, str]] = table.cached("constraints", "gpu_details", dict)

    def details(row: int) -> dict[str, str]:
        cached = found.get(row)
        if cached is None:
            labels = ((GPU_MODEL, GPU_PRODUCT_LABEL), (GPU_MEMORY_MIB, GPU_MEMORY_LABEL))
            values = {name: table.node_label(row, label) for name, label in labels}
            cached = {name: value for name, value in values.items() if value is not None}
            found[row] = cached
        return cached

    return details


SCORE = Score(
    name=NAME,
    explain="GPU pods: the node's GPUs most allocated after placing the pod; other pods: "
    "nodes without GPUs",
    score=_score,
    default_weight=1.0,
    args=GpuPackingArgs,
    evidence=Evidence(candidate_details=gpu_details),
)


def _keep_off(table: NodeTable, inverse: NDArray[np.float64]) -> NDArray[np.float64]:
    """A pod without GPUs: 100 on nodes without GPUs, 0 on GPU nodes."""
    scores: NDArray[np.float64] = np.where((inverse > 0) | table.gpu_model_known(), 0.0, 100.0)
    return scores
