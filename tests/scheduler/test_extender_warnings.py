"""Extender mode tells a pod's owner about an annotation typo as standalone mode does: a
``Warning UnknownAnnotation`` Event naming the closest known key, once per pod, written by a
thread of its own from a bounded queue (a slow API server never delays a ``/filter``
answer), only for pods the informers know."""

from __future__ import annotations

import threading
import time

from interference.annotations import unknown_annotation_message
from scheduler.adapters.memory import InMemoryCluster, RecordedEvent
from scheduler.cycle.ports import PodRef
from scheduler.extender.pod_warnings import WAIT_FOR_INFORMER_S, WAITING_PODS
from tests.builders import pod_obj
from tests.scheduler.test_extender import TOLERANT, Harness

TYPO = {"interference.io/max-runq-p99": "500"}
"""``-us`` left out: no tolerance at all without the Event."""
UNWRITTEN = "interference_scheduler_extender_unwritten_pod_warnings_total"


def unknown_annotation_events(cluster: InMemoryCluster) -> list[RecordedEvent]:
    return [e for e in cluster.events if e.reason == "UnknownAnnotation"]


def test_a_typo_gets_one_warning_naming_the_closest_key_however_often_filtered() -> None:
    cluster = InMemoryCluster()
    harness = Harness(events=cluster)
    pod = pod_obj("typo", annotations=TYPO)
    for _ in range(3):
        code, answer = harness.filter(pod, ["quiet", "noisy"])
        assert code == 200 and answer["NodeNames"] == ["quiet", "noisy"]  # no tolerance read
    assert cluster.events == []  # the answers wrote nothing: the writer does
    assert harness.extender.write_pod_warnings() == 1
    harness.filter(pod, ["quiet"])
    assert harness.extender.write_pod_warnings() == 0
    (event,) = unknown_annotation_events(cluster)
    assert (event.namespace, event.pod, event.type) == ("default", "typo", "Warning")
    assert event.message == unknown_annotation_message("interference.io/max-runq-p99")
    assert event.message.endswith("has no effect; did you mean interference.io/max-runq-p99-us?")


def test_a_pod_without_a_typo_gets_none() -> None:
    cluster = InMemoryCluster()
    harness = Harness(events=cluster)
    harness.filter(pod_obj("fine", annotations=TOLERANT), ["quiet"])
    assert harness.extender.write_pod_warnings() == 0 and cluster.events == []


def test_other_warnings_or_a_new_pod_of_that_name_are_told_again() -> None:
    cluster = InMemoryCluster()
    harness = Harness(events=cluster)
    harness.filter(pod_obj("web", annotations=TYPO), ["quiet"])
    assert harness.extender.write_pod_warnings() == 1
    # still pending, its owner fixed that typo and made another
    edited = pod_obj("web", annotations={"interference.io/max-reclaim-stall": "2"})
    harness.filter(edited, ["quiet"])
    assert harness.extender.write_pod_warnings() == 1
    harness.filter(edited, ["quiet"])
    assert harness.extender.write_pod_warnings() == 0
    recreated = pod_obj("web", annotations={"interference.io/max-reclaim-stall": "2"})
    recreated["metadata"]["uid"] = "uid-web-2"
    harness.filter(recreated, ["quiet"])
    assert harness.extender.write_pod_warnings() == 1
    notes = [e.message for e in unknown_annotation_events(cluster)]
    assert "did you mean interference.io/max-runq-p99-us?" in notes[0]
    assert all("interference.io/max-reclaim-stall-ms-per-s?" in note for note in notes[1:])


def test_a_pod_bound_before_the_writer_comes_round_is_told() -> None:
    """kube-scheduler binds within milliseconds of our answer: the informers vouched for
    the pod when it was asked about, which is what counts."""
    cluster = InMemoryCluster()
    harness = Harness(events=cluster)
    pod = pod_obj("quick", annotations=TYPO)
    harness.filter(pod, ["quiet"])
    harness.inform({**pod, "spec": {**pod["spec"], "nodeName": "quiet"}})
    assert harness.cache.pending_pod("default/quick") is None
    assert harness.extender.write_pod_warnings() == 1
    assert [e.pod for e in cluster.events] == ["quick"]


def test_a_flag_annotation_that_is_neither_true_nor_false_is_told_too() -> None:
    cluster = InMemoryCluster()
    harness = Harness(events=cluster)
    harness.filter(pod_obj("evict", annotations={"interference.io/rebalance": "maybe"}), ["quiet"])
    harness.extender.write_pod_warnings()
    (event,) = cluster.events
    assert event.reason == "InvalidAnnotation" and "interference.io/rebalance" in event.message


def test_a_pod_the_informers_do_not_know_gets_none_and_is_counted() -> None:
    """A caller cannot make Events about names it chooses; a pod our watch delivers within
    the wait is told."""
    cluster = InMemoryCluster()
    harness = Harness(events=cluster)
    harness.filter(pod_obj("forged", annotations=TYPO), ["quiet"], informed=False)
    late = pod_obj("late", annotations=TYPO)
    harness.filter(late, ["quiet"], informed=False)
    assert harness.extender.write_pod_warnings() == 0
    harness.clock.advance(WAIT_FOR_INFORMER_S / 2)
    harness.inform(late)
    assert harness.extender.write_pod_warnings() == 1
    harness.clock.advance(WAIT_FOR_INFORMER_S)
    assert harness.extender.write_pod_warnings() == 0
    assert [e.pod for e in cluster.events] == ["late"]
    assert harness.sample(UNWRITTEN) == 1


class BlockedApiServer:
    """An API server that does not answer Event writes until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.written: list[tuple[str, str]] = []

    def record_event(self, pod: PodRef, event_type: str, reason: str, message: str) -> None:
        self.entered.set()
        assert self.release.wait(30), "never released"
        self.written.append((pod.name, reason))


def test_a_blocked_api_server_never_delays_an_answer_and_the_queue_stays_bounded() -> None:
    api = BlockedApiServer()
    harness = Harness(events=api)
    stop = threading.Event()
    writer = threading.Thread(target=harness.extender.run_pod_warnings, args=(stop,))
    writer.start()
    try:
        harness.filter(pod_obj("first", annotations=TYPO), ["quiet"])
        assert api.entered.wait(10), "the writer never took the first pod"
        flood = WAITING_PODS + 40
        started = time.perf_counter()
        for i in range(flood):
            code, _ = harness.filter(pod_obj(f"flood-{i}", annotations=TYPO), ["quiet"])
            assert code == 200
        per_answer_s = (time.perf_counter() - started) / flood
        assert per_answer_s < 0.5  # answered while the writer waits (it would hang for 30 s)
        assert harness.sample(UNWRITTEN) == 40  # the oldest beyond the queue dropped
        api.release.set()
        deadline = time.monotonic() + 30
        while len(api.written) < 1 + WAITING_PODS and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        api.release.set()
        stop.set()
        writer.join(30)
    names = [name for name, _ in api.written]
    assert names == ["first", *(f"flood-{i}" for i in range(40, flood))]
    # the dropped ones are told when kube-scheduler asks about them again
    harness.filter(pod_obj("flood-0", annotations=TYPO), ["quiet"])
    assert harness.extender.write_pod_warnings() == 1
