"""TaintToleration filter: every effect and operator."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.settings import CycleSettings
from scheduler.plugins.taint_toleration import taint_toleration
from tests.builders import node_obj, pod_obj, table_of
from tests.scheduler.filters import or_all_pass

GPU_TAINT = ("nvidia.com/gpu", "present", "NoSchedule")


@pytest.mark.parametrize(
    ("taints", "tolerations", "passes"),
    [
        ([], [], True),
        ([GPU_TAINT], [], False),
        ([("k", "v", "NoExecute")], [], False),
        ([("k", "v", "PreferNoSchedule")], [], True),
        (
            [GPU_TAINT],
            [
                {
                    "key": "nvidia.com/gpu",
                    "operator": "Equal",
                    "value": "present",
                    "effect": "NoSchedule",
                }
            ],
            True,
        ),
        ([GPU_TAINT], [{"key": "nvidia.com/gpu", "value": "present"}], True),
        ([GPU_TAINT], [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}], False),
        ([GPU_TAINT], [{"key": "nvidia.com/gpu", "operator": "Exists"}], True),
        ([GPU_TAINT], [{"operator": "Exists"}], True),
        ([GPU_TAINT], [{"operator": "Exists", "effect": "NoExecute"}], False),
        (
            [GPU_TAINT],
            [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}],
            False,
        ),
        (
            [("k", "v", "NoExecute")],
            [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
            True,
        ),
        (
            [GPU_TAINT, ("k", "v", "NoExecute")],
            [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            False,
        ),
        (
            [GPU_TAINT, ("k", "v", "PreferNoSchedule")],
            [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            True,
        ),
        ([GPU_TAINT], [{"key": "other", "operator": "Exists"}], False),
    ],
    ids=[
        "untainted",
        "noschedule-untolerated",
        "noexecute-untolerated",
        "prefernoschedule-never-filters",
        "equal-exact",
        "equal-default-operator",
        "equal-wrong-value",
        "exists-any-value",
        "empty-key-exists-tolerates-all",
        "empty-key-exists-wrong-effect",
        "effect-mismatch",
        "noexecute-tolerated-with-seconds",
        "second-taint-untolerated",
        "prefer-taint-ignored-beside-tolerated",
        "other-key",
    ],
)
def test_taint_toleration(
    taints: list[tuple[str, str, str]], tolerations: list[dict[str, Any]], passes: bool
) -> None:
    table = table_of([node_obj("n", taints=taints)])
    result = or_all_pass(
        taint_toleration(table, parse_pod(pod_obj(tolerations=tolerations))), table
    )
    assert bool(result.passed[0]) is passes


def test_reason_names_first_untolerated_taint_in_node_order() -> None:
    table = table_of(
        [
            node_obj(
                "a",
                taints=[
                    ("x", "1", "PreferNoSchedule"),
                    ("dedicated", "infra", "NoSchedule"),
                    ("k", "v", "NoExecute"),
                ],
            ),
            node_obj("b", taints=[("k", "v", "NoExecute"), ("dedicated", "infra", "NoSchedule")]),
            node_obj("c", taints=[("dedicated", "infra", "NoSchedule")]),
            node_obj("d"),
        ]
    )
    result = taint_toleration(
        table, parse_pod(pod_obj(tolerations=[{"key": "dedicated", "operator": "Exists"}]))
    )
    assert result.passed.tolist() == [False, False, True, True]
    assert result.reasons_for(0) == ["node(s) had untolerated taint(s)"]
    result = or_all_pass(taint_toleration(table, parse_pod(pod_obj())), table)
    # kube-scheduler v1.36: one reason whatever the taints, so nodes count under it together
    assert result.reasons == ("node(s) had untolerated taint(s)",)
    assert result.reasons_for(0) == ["node(s) had untolerated taint(s)"]
    assert result.reasons_for(1) == ["node(s) had untolerated taint(s)"]
    assert result.reasons_for(3) == []


def test_untolerated_taints_count_as_one_reason_like_kube_scheduler_v1_36() -> None:
    nodes = [
        node_obj("gpu", taints=[("nvidia.com/gpu", "present", "NoSchedule")]),
        node_obj("infra", taints=[("dedicated", "infra", "NoExecute")]),
        node_obj("both", taints=[("a", "1", "NoSchedule"), ("b", "2", "NoSchedule")]),
    ]
    result = SchedulingCycle(CycleSettings()).schedule(parse_pod(pod_obj()), table_of(nodes), 0.0)
    assert result.message == "0/3 nodes are available: 3 node(s) had untolerated taint(s)."
    assert result.reason_counts == {"node(s) had untolerated taint(s)": 3}
