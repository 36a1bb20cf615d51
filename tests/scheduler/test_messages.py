"""kube-scheduler wording of FailedScheduling and Scheduled messages."""

from __future__ import annotations

import pytest

from scheduler.cycle.messages import (
    NO_NODES,
    failed_scheduling_message,
    refused_message,
    relaxed_message,
    scheduled_message,
)


@pytest.mark.parametrize(
    ("nodes", "counts", "expected"),
    [
        (
            12,
            {"node(s) had untolerated taint(s)": 9, "Insufficient nvidia.com/gpu": 3},
            "0/12 nodes are available: 3 Insufficient nvidia.com/gpu, "
            "9 node(s) had untolerated taint(s).",
        ),
        (
            13,
            {"Insufficient cpu": 3, "node(s) didn't match Pod's node affinity/selector": 10},
            "0/13 nodes are available: "
            "10 node(s) didn't match Pod's node affinity/selector, 3 Insufficient cpu.",
        ),
        (
            2,
            {"Insufficient memory": 2, "Insufficient cpu": 2},
            "0/2 nodes are available: 2 Insufficient cpu, 2 Insufficient memory.",
        ),
        (
            1,
            {"node(s) were unschedulable": 1, "Too many pods": 0},
            "0/1 nodes are available: 1 node(s) were unschedulable.",
        ),
        (0, {}, NO_NODES),
    ],
    ids=[
        "issue-example",
        "sorted-as-strings-like-go",
        "same-count-by-reason",
        "zero-counts-dropped",
        "no-nodes",
    ],
)
def test_failed_scheduling_message(nodes: int, counts: dict[str, int], expected: str) -> None:
    assert failed_scheduling_message(nodes, counts) == expected


def test_other_messages() -> None:
    assert scheduled_message("ml/train-0", "gpu-3") == "Successfully assigned ml/train-0 to gpu-3"
    refused = refused_message(3, ["spec.topologySpreadConstraints", "spec.affinity.podAffinity"])
    assert refused.startswith("0/3 nodes are available: standalone interference-scheduler")
    assert "spec.topologySpreadConstraints, spec.affinity.podAffinity" in refused
    assert "stays Pending" in refused and "extender mode" in refused
    assert relaxed_message(61.2).startswith("pod waited 61s blocked only by interference filters")
