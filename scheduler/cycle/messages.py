"""Event and condition messages in kube-scheduler's wording.

``FailedScheduling`` follows kube-scheduler's ``FitError.Error()``: every reason of every
rejected node is counted, each rendered ``"<count> <reason>"``, the strings sorted as plain
strings (Go's ``sort.Strings``, so ``"10 …"`` sorts before ``"3 …"``), joined with ``", "``::

    0/12 nodes are available: 3 Insufficient nvidia.com/gpu, 9 node(s) had untolerated taint(s).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

NO_NODES = "no nodes available to schedule pods"


def failed_scheduling_message(node_count: int, reason_counts: Mapping[str, int]) -> str:
    """The ``FailedScheduling`` message for ``node_count`` nodes that all failed."""
    if node_count == 0:
        return NO_NODES
    histogram = sorted(f"{count} {reason}" for reason, count in reason_counts.items() if count)
    return f"0/{node_count} nodes are available: {', '.join(histogram)}."


def pod_rejected_message(node_count: int, reason: str) -> str:
    """``FailedScheduling`` when a pod-wide check (kube-scheduler's PreFilter) rejects the
    pod on every node: ``0/3 nodes are available: persistentvolumeclaim "data" not found.``"""
    return f"0/{node_count} nodes are available: {reason}."


def scheduled_message(pod_key: str, node: str) -> str:
    """The ``Scheduled`` Event message (``pod_key`` is ``namespace/name``)."""
    return f"Successfully assigned {pod_key} to {node}"


def refused_message(node_count: int, fields: Iterable[str]) -> str:
    """``FailedScheduling`` for a pod asking for fields standalone mode does not implement:
    it is refused (left Pending), never placed with the constraint ignored."""
    return (
        f"0/{node_count} nodes are available: standalone interference-scheduler does not "
        f"implement {', '.join(fields)}; the pod stays Pending rather than be placed with "
        "that ignored. Schedule it with kube-scheduler running interference-scheduler as an "
        "extender (extender mode), or with the default scheduler, or remove the field."
    )


def unparseable_message(error: str) -> str:
    """``FailedScheduling`` for a pod of ours that does not parse (``error`` names the
    field); it is tried again whenever the pod changes."""
    return (
        f"cannot schedule this pod: {error}. Fix the field (or recreate the pod without it); "
        "the scheduler reads the pod again whenever it changes."
    )


def relaxed_message(waited_s: float) -> str:
    """Event for a pod scheduled without interference filters after waiting too long."""
    return (
        f"pod waited {waited_s:.0f}s blocked only by interference filters; "
        "scheduling it without them (its interference tolerance is not enforced this time)"
    )
