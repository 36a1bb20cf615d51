"""NodeReady and NodeUnschedulable filters."""

from __future__ import annotations

import pytest

from scheduler.filters.node_state import NOT_READY, UNSCHEDULABLE, node_ready, node_schedulable
from scheduler.model import parse_pod
from tests.scheduler.test_model import node_obj, pod_obj, table_of


def test_node_ready_rejects_not_ready_nodes() -> None:
    table = table_of([node_obj("up"), node_obj("down", ready=False)])
    result = node_ready(table)
    assert result.passed.tolist() == [True, False]
    assert result.reasons_for(0) == []
    assert result.reasons_for(1) == [NOT_READY]


@pytest.mark.parametrize(
    ("tolerations", "cordoned_passes"),
    [
        ([], False),
        (
            [
                {
                    "key": "node.kubernetes.io/unschedulable",
                    "operator": "Exists",
                    "effect": "NoSchedule",
                }
            ],
            True,
        ),
        ([{"operator": "Exists"}], True),
        (
            [
                {
                    "key": "node.kubernetes.io/unschedulable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                }
            ],
            False,
        ),
        ([{"key": "other", "operator": "Exists"}], False),
    ],
    ids=[
        "no-toleration",
        "tolerates-cordon-taint",
        "tolerates-everything",
        "wrong-effect",
        "other-key",
    ],
)
def test_node_schedulable(tolerations: list[dict[str, str]], cordoned_passes: bool) -> None:
    table = table_of([node_obj("open"), node_obj("cordoned", unschedulable=True)])
    result = node_schedulable(table, parse_pod(pod_obj(tolerations=tolerations)))
    assert result.passed.tolist() == [True, cordoned_passes]
    assert result.reasons_for(1) == ([] if cordoned_passes else [UNSCHEDULABLE])
