"""The last good configuration's verdict while a reload is judged
(scheduler.standalone.reload_baseline), on the real loop, cache, table and cycle: a pod the new
configuration leaves Pending is Pending anyway only when the last good one finds no node
either; the pods a changed scheduler name or ignore list stops attempting are stranded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scheduler.cycle.settings import CycleSettings
from scheduler.standalone.loop import DEFAULT_SCHEDULER_NAME, LoopSettings
from tests.builders import node_obj, pod_obj
from tests.scheduler.profiles import interference_settings
from tests.scheduler.runtime_helpers import LoopHarness

GOOD = CycleSettings()
REJECT = interference_settings(stale_policy="reject")  # no signals here: every node stale
OURS = (DEFAULT_SCHEDULER_NAME, ())


@pytest.fixture
def harness() -> Iterator[LoopHarness]:
    h = LoopHarness(cycle=REJECT)
    h.cluster.add_node(node_obj("n1", cpu="4"))
    h.cluster.add_pod(pod_obj("fits", requests={"cpu": "1"}))
    h.cluster.add_pod(pod_obj("huge", requests={"cpu": "64"}))  # fits no node, ever
    h.informer.sync()
    yield h
    h.close()


@pytest.mark.parametrize(
    ("before", "pod", "anyway"),
    [
        pytest.param(None, "fits", True, id="not judging: nothing to ask"),
        pytest.param(REJECT, "fits", True, id="the cycle unchanged: Pending anyway"),
        pytest.param(GOOD, "fits", False, id="the last good cycle places it: the reload's"),
        pytest.param(GOOD, "huge", True, id="no node under either: Pending anyway"),
    ],
)
def test_pending_anyway(
    harness: LoopHarness, before: CycleSettings | None, pod: str, anyway: bool
) -> None:
    loop = harness.loop
    loop.baseline.judge(None if before is None else (before, OURS), (REJECT, OURS))
    found = loop.cache.pending_pod(f"default/{pod}")
    assert found is not None
    with loop.cache.lock:
        assert loop.baseline.pending_anyway(found, loop.cache.table, 0.0, True) is anyway


def test_the_loop_reports_each_attempt_against_the_last_good_configuration(
    harness: LoopHarness,
) -> None:
    seen: list[tuple[str, bool, bool]] = []
    harness.loop._on_attempt = lambda key, placed, anyway: seen.append((key, placed, anyway))
    harness.loop.baseline.judge((GOOD, OURS), (REJECT, OURS))
    harness.step()
    assert sorted(seen) == [("default/fits", False, False), ("default/huge", False, True)]


@pytest.mark.parametrize(
    ("after", "stranded"),
    [
        pytest.param(OURS, [], id="the same pods are ours"),
        pytest.param(("tpyo", ()), ["default/fits", "default/huge", "team/t"], id="a typo"),
        pytest.param((DEFAULT_SCHEDULER_NAME, ("team",)), ["team/t"], id="a namespace ignored"),
    ],
)
def test_stranded(
    harness: LoopHarness, after: tuple[str, tuple[str, ...]], stranded: list[str]
) -> None:
    h = harness
    h.cluster.add_pod(pod_obj("t", "team"))
    h.cluster.add_pod(pod_obj("other", schedulerName="someone-else"))
    h.cluster.add_pod(pod_obj("placed", nodeName="n1"))
    h.informer.sync()
    name, ignored = after
    h.loop.update_settings(REJECT, LoopSettings(scheduler_name=name, ignore_namespaces=ignored))
    h.loop.baseline.judge((REJECT, OURS), (REJECT, after))
    assert sorted(h.loop.baseline.stranded(h.loop.cache)) == stranded
    h.loop.baseline.judge(None)
    assert h.loop.baseline.stranded(h.loop.cache) == []
