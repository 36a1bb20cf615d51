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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scheduler.api.objects import PodInfo
from scheduler.plugins.base import CycleState, Score
from scheduler.signals.table import NodeTable

NAME = "GpuPacking"


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


SCORE = Score(
    name=NAME,
    explain="GPU pods: the node's GPUs most allocated after placing the pod; other pods: "
    "nodes without GPUs",
    score=_score,
    default_weight=1.0,
    args=GpuPackingArgs,
)


def _keep_off(table: NodeTable, inverse: NDArray[np.float64]) -> NDArray[np.float64]:
    """A pod without GPUs: 100 on nodes without GPUs, 0 on GPU nodes."""
    scores: NDArray[np.float64] = np.where((inverse > 0) | table.gpu_model_known(), 0.0, 100.0)
    return scores
