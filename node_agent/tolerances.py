"""A pod's declared interference tolerance as the agent reads it from its annotations
(``interference.io/max-runq-p99-us``, ``…/max-reclaim-stall-ms-per-s`` and ``…/max-index``;
:mod:`interference.annotations`).

The agent only shows a tolerance (its Prometheus metrics, :mod:`node_agent.signal_metrics`);
the scheduler decides with it and warns the pod's owner about a value it cannot read. So a
value that is not a number in the scheduler's range is left out here, silently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from interference.annotations import MAX_INDEX, MAX_RECLAIM_STALL_MS_PER_S, MAX_RUNQ_P99_US


@dataclass(frozen=True, slots=True)
class PodTolerance:
    """The bounds a pod declared; None where it declared none."""

    max_runq_p99_us: float | None = None
    max_reclaim_stall_ms_per_s: float | None = None
    max_index: float | None = None


def _bound(raw: object, upper: float | None = None) -> float | None:
    if not isinstance(raw, str):
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0 or (upper is not None and value > upper):
        return None
    return value


def tolerance_of(annotations: Mapping[str, object] | None) -> PodTolerance | None:
    """The pod's tolerance, or None when it declares no readable bound."""
    if not annotations:
        return None
    found = PodTolerance(
        max_runq_p99_us=_bound(annotations.get(MAX_RUNQ_P99_US)),
        max_reclaim_stall_ms_per_s=_bound(annotations.get(MAX_RECLAIM_STALL_MS_PER_S)),
        max_index=_bound(annotations.get(MAX_INDEX), 100.0),
    )
    return None if found == PodTolerance() else found


def tolerances_of_node(pod_list: object, node_name: str) -> dict[str, PodTolerance]:
    """``{uid: tolerance}`` of the pods in a kubelet ``PodList`` body bound to
    ``node_name`` that declare one (anything malformed is skipped)."""
    items = pod_list.get("items") if isinstance(pod_list, dict) else None
    found: dict[str, PodTolerance] = {}
    for item in items if isinstance(items, list) else []:
        metadata = item.get("metadata") if isinstance(item, dict) else None
        spec = item.get("spec") if isinstance(item, dict) else None
        if not isinstance(metadata, dict) or not isinstance(spec, dict):
            continue
        uid, annotations = metadata.get("uid"), metadata.get("annotations")
        if spec.get("nodeName") not in (None, node_name) or not isinstance(uid, str):
            continue
        if isinstance(annotations, dict) and (tolerance := tolerance_of(annotations)):
            found[uid] = tolerance
    return found
