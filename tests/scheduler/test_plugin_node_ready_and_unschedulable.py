"""NodeReady and NodeUnschedulable filters."""

from __future__ import annotations

import pytest

from scheduler.api.pods import parse_pod
from scheduler.plugins.node_ready import NOT_READY, node_ready
from scheduler.plugins.node_unschedulable import UNSCHEDULABLE, node_unschedulable
from tests.builders import node_obj, pod_obj, table_of
from tests.scheduler.filters import or_all_pass


@pytest.mark.parametrize(
    ("tolerations", "down_passes"),
    [
        ([], False),
        (
            [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}],
            True,
        ),
        (
            [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            False,
        ),
    ],
    ids=["no-toleration", "tolerates-not-ready-noschedule", "default-noexecute-toleration-only"],
)
def test_node_ready(tolerations: list[dict[str, object]], down_passes: bool) -> None:
    table = table_of([node_obj("up"), node_obj("down", ready=False)])
    result = or_all_pass(node_ready(table, parse_pod(pod_obj(tolerations=tolerations))), table)
    assert result.passed.tolist() == [True, down_passes]
    assert result.reasons_for(0) == []
    assert result.reasons_for(1) == ([] if down_passes else [NOT_READY])


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
    result = or_all_pass(
        node_unschedulable(table, parse_pod(pod_obj(tolerations=tolerations))), table
    )
    assert result.passed.tolist() == [True, cordoned_passes]
    assert result.reasons_for(1) == ([] if cordoned_passes else [UNSCHEDULABLE])
