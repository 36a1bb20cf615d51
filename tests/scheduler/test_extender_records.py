"""Extender decision records only for pods the informers know, and a request body limit
sized for the largest legitimate request: a caller cannot make records under names it
chooses, a record waits briefly for a pod our watch has not delivered yet, and the
largest ExtenderArgs kube-scheduler can send for 5,000 nodes fits the limit."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from scheduler.endpoint.http import EXTENDER_MAX_BODY_BYTES, ExtenderSettings
from scheduler.extender.decision_records import RECORD_CONFIRM_S, UNCONFIRMED_RECORDS
from scheduler.plugins.interference import RUNQ_EXCEEDED
from tests.builders import pod_obj
from tests.scheduler.test_extender import TOLERANT, Harness

UNKNOWN = "interference_scheduler_extender_unknown_pod_records_total"


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_pod_the_informer_never_delivers_is_answered_and_records_nothing(verb: str) -> None:
    harness = Harness()
    pod = pod_obj("forged", annotations=TOLERANT)
    if verb == "filter":
        code, answer = harness.filter(pod, ["quiet", "noisy"], informed=False)
        assert (code, answer["NodeNames"]) == (200, ["quiet"])  # the same answer as for a known pod
    else:
        assert harness.prioritize(pod, ["quiet", "noisy"], informed=False)["quiet"] > 0
    harness.extender.confirm_records()
    assert harness.decisions.items == []  # held, not written
    harness.clock.advance(RECORD_CONFIRM_S + 0.1)
    harness.extender.confirm_records()
    assert harness.decisions.items == []
    assert harness.sample(UNKNOWN) == 1


def test_a_record_waits_for_the_informer_to_deliver_its_pod() -> None:
    """kube-scheduler may call before our watch has the new pod: its record is written once
    the informer delivers it."""
    harness = Harness()
    pod = pod_obj("new", annotations=TOLERANT)
    harness.filter(pod, ["quiet", "noisy"], informed=False)
    assert harness.decisions.items == []
    harness.clock.advance(RECORD_CONFIRM_S / 2)
    harness.inform(pod)
    harness.extender.confirm_records()
    assert harness.decisions.last("new").result == "filtered"
    harness.extender.confirm_records()
    assert len(harness.decisions.items) == 1 and harness.sample(UNKNOWN) == 0


def test_a_record_is_written_when_the_watch_delivers_the_pod_and_its_bind_back_to_back() -> None:
    """Our watch can deliver the new pod and kube-scheduler's bind between two polls of the
    confirmer: the pod was pending here, so its record is written."""
    harness = Harness()
    pod = pod_obj("fast", annotations=TOLERANT)
    harness.prioritize(pod, ["quiet", "noisy"], informed=False)
    assert harness.decisions.items == []
    harness.inform(pod)
    bound = json.loads(json.dumps(pod))
    bound["spec"]["nodeName"] = "quiet"
    harness.cache.apply("Pod", "MODIFIED", bound)
    assert harness.cache.pending_pod("default/fast") is None
    harness.extender.confirm_records()
    assert harness.decisions.last("fast").result == "prioritized"
    assert harness.sample(UNKNOWN) == 0


@pytest.mark.parametrize(
    "change",
    [
        {"metadata": {"uid": "another"}},  # a pod of that name, but not this one
        {"spec": {"schedulerName": "default-scheduler"}},  # not ours
        {"spec": {"nodeName": "quiet"}},  # already bound
    ],
    ids=["other-uid", "other-scheduler", "bound"],
)
def test_a_request_naming_a_pod_the_informer_holds_differently_records_nothing(
    change: dict[str, dict[str, Any]],
) -> None:
    harness = Harness()
    pod = pod_obj("web-0")
    informed = json.loads(json.dumps(pod))
    for part, fields in change.items():
        informed[part].update(fields)
    harness.inform(informed)
    harness.filter(pod, ["quiet", "noisy"], informed=False)
    harness.clock.advance(RECORD_CONFIRM_S + 0.1)
    harness.extender.confirm_records()
    assert harness.decisions.items == [] and harness.sample(UNKNOWN) == 1


def test_held_records_are_bounded() -> None:
    harness = Harness()
    for i in range(UNCONFIRMED_RECORDS + 40):
        harness.filter(pod_obj(f"flood-{i}"), ["quiet"], informed=False)
    assert harness.sample(UNKNOWN) == 40  # the oldest, dropped as the newest arrived
    harness.inform(pod_obj(f"flood-{UNCONFIRMED_RECORDS + 39}"))
    harness.extender.confirm_records()
    assert [d.pod for d in harness.decisions.items] == [f"flood-{UNCONFIRMED_RECORDS + 39}"]


def test_known_pods_are_recorded_at_once() -> None:
    harness = Harness()
    pod = pod_obj("known")
    harness.filter(pod, ["quiet", "noisy"])
    assert harness.decisions.last("known").result == "filtered"
    harness.prioritize(pod, ["quiet", "noisy"])
    assert harness.decisions.last("known").result == "prioritized"


def largest_legitimate_request() -> bytes:
    """ExtenderArgs with NodeNames for 5,000 nodes, each name as long as a node name may be
    (253 characters), and a Pod of 3 MiB as JSON (the API server's limit on a request body,
    so no stored Pod is larger)."""
    names = [f"{i:05d}-" + "n" * 247 for i in range(5000)]
    assert {len(n) for n in names} == {253}
    pod = pod_obj("big", requests={"cpu": "100m"})
    pod["metadata"]["resourceVersion"] = "1"
    filler = 3 * 1024 * 1024 - len(json.dumps(pod)) - 200
    env = [{"name": "FILL", "value": "x" * filler}]
    pod["spec"]["containers"][0]["env"] = env
    assert 3 * 1024 * 1024 - 300 < len(json.dumps(pod)) <= 3 * 1024 * 1024
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


def test_the_body_limit_fits_the_largest_legitimate_request_for_5000_nodes() -> None:
    body = largest_legitimate_request()
    assert ExtenderSettings().max_body_bytes == EXTENDER_MAX_BODY_BYTES
    assert len(body) <= EXTENDER_MAX_BODY_BYTES
    assert len(body) > EXTENDER_MAX_BODY_BYTES * 0.6  # sized from it, not far above
    harness = Harness()
    code, answer, _ = harness.extender.filter_route(body)
    assert code == 200, answer
    assert json.loads(answer)["FailedNodes"]  # names not in the cache, answered one by one


def test_an_extender_record_keeps_the_runq_p99_compared_and_says_what_to_do() -> None:
    """Extender mode's records as standalone's: each recorded node's run-queue p99 against
    the pod's tolerance and, for a pod no offered node passed, the nearest node, when the
    pod is relaxed and how far to raise the tolerance (kube-scheduler writes the Event)."""
    harness = Harness()
    harness.filter(pod_obj("fits", annotations=TOLERANT), ["quiet", "noisy"])
    fits = harness.decisions.last("fits").runq
    assert fits is not None and (fits.tolerance_us, fits.window) == (500.0, "10s")
    assert fits.measured_us == {"quiet": 50.0, "noisy": 900.0}
    assert (fits.nearest, fits.relax_at) == ("", None)

    now = harness.clock.now
    harness.filter(pod_obj("picky", annotations=TOLERANT), ["noisy"])
    record = harness.decisions.last("picky")
    assert record.result == "unschedulable" and record.runq is not None
    assert (record.runq.nearest, record.runq.relax_at) == ("noisy", now + 60)
    assert record.runq.measured_us == {"noisy": 900.0}
    at = time.strftime("%H:%M:%S UTC", time.gmtime(now + 60))
    assert record.message == (
        f"0/1 nodes are available: 1 {RUNQ_EXCEEDED} (measured 900 µs > tolerance 500 µs)."
        " Nearest node: noisy, run-queue p99 "
        f"900 µs against the tolerance 500 µs (10s window). Relaxed to interference-blind in "
        f"60 s (at {at}). Hint: raise interference.io/max-runq-p99-us to at least 900 µs."
    )


def test_extender_records_keep_the_index_the_decision_read() -> None:
    """The filter's and the prioritize verb's records keep, per recorded node, the index
    the Interference plugin read (the decision page charts it), as standalone's do."""
    harness = Harness()
    pod = pod_obj("web")
    harness.filter(pod, ["quiet", "noisy"])
    filtered = harness.decisions.last("web").interference_index
    harness.prioritize(pod, ["quiet", "noisy"])
    prioritized = harness.decisions.last("web").interference_index
    assert filtered is not None and prioritized is not None
    assert filtered == prioritized and filtered.window == "10s"
    assert filtered.by_node == {"quiet": pytest.approx(5.0), "noisy": pytest.approx(90.0)}
