"""Least-allocated balance score."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.api.pods import parse_pod
from scheduler.plugins.node_resources_fit import least_allocated_score
from tests.builders import container, node_obj, pod_obj, table_of


@pytest.mark.parametrize(
    ("node", "placed", "requests", "expected"),
    [
        (node_obj(cpu="4", memory="4Gi"), {}, {"cpu": "1", "memory": "1Gi"}, 75.0),
        (
            node_obj(cpu="4", memory="4Gi"),
            {"cpu": "2", "memory": "3Gi"},
            {"cpu": "1", "memory": "1Gi"},
            (25 + 0) / 2,
        ),
        (node_obj(cpu="4", memory="4Gi"), {}, {"cpu": "8", "memory": "1Gi"}, (0 + 75) / 2),
        (node_obj(cpu="0", memory="4Gi"), {}, {"cpu": "1", "memory": "2Gi"}, (0 + 50) / 2),
        (node_obj(cpu="1", memory="1000Mi"), {}, None, (90 + 80) / 2),
    ],
    ids=[
        "empty-node",
        "partly-used",
        "overcommit-clamps-to-zero",
        "no-cpu-allocatable",
        "defaults-for-no-requests",
    ],
)
def test_least_allocated(
    node: dict[str, Any], placed: dict[str, str], requests: dict[str, str] | None, expected: float
) -> None:
    table = table_of([node], [(pod_obj("old", requests=placed), "n1")] if placed else [])
    pod = parse_pod(pod_obj(containers=[container(requests)]))
    assert least_allocated_score(table, pod)[0] == pytest.approx(expected)


def test_emptier_node_scores_higher() -> None:
    table = table_of(
        [node_obj("busy"), node_obj("idle")],
        [(pod_obj("old", requests={"cpu": "3", "memory": "6Gi"}), "busy")],
    )
    scores = least_allocated_score(
        table, parse_pod(pod_obj(requests={"cpu": "500m", "memory": "1Gi"}))
    )
    assert scores[1] > scores[0]
