"""Bind, Events and the PodScheduled condition on a real kube-apiserver, as the ServiceAccount
of deploy/ (tests/e2e/conftest.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.conftest import start_scheduler
from tests.e2e.kube import Kube, SchedulerProcess, condition, wait_for

pytestmark = [pytest.mark.e2e]

SCHEDULER = "e2e-events"
NAMESPACE = "e2e-events"
EVENT_NAME = re.compile(r"[a-z0-9-]+\.[0-9a-f]+")


@pytest.fixture
def two_nodes(kube: Kube) -> list[str]:
    names = ["events-node-a", "events-node-b"]
    for name in names:
        kube.create_node(name, cpu="4")
    kube.ensure_namespace(NAMESPACE)
    yield names
    for name in names:
        kube.delete_node(name)


def test_bind_scheduled_event_and_condition(
    kube: Kube,
    two_nodes: list[str],
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
) -> None:
    start_scheduler(schedulers, tmp_path, scheduler_kubeconfig, redis_url, SCHEDULER)
    kube.create_pod(NAMESPACE, "fits", SCHEDULER, cpu="1")
    pod = wait_for(lambda: (p := kube.pod(NAMESPACE, "fits"))["spec"].get("nodeName") and p,
                   "the pod to be bound")  # fmt: skip
    assert pod["spec"]["nodeName"] in two_nodes
    scheduled = condition(pod, "PodScheduled")
    assert scheduled is not None and scheduled["status"] == "True"

    def scheduled_events() -> list[dict]:
        return [e for e in kube.events(NAMESPACE)
                if e["regarding"]["name"] == "fits" and e["reason"] == "Scheduled"]  # fmt: skip

    (event,) = wait_for(scheduled_events, "the Scheduled Event")
    assert EVENT_NAME.fullmatch(event["metadata"]["name"]) and event["metadata"]["name"].startswith(
        "fits."
    )
    assert event["type"] == "Normal" and event["action"] == "Binding"
    assert event["reportingController"] == "interference-scheduler"
    assert event["reportingInstance"].startswith("scheduler-0_")
    assert event["note"] == f"Successfully assigned {NAMESPACE}/fits to {pod['spec']['nodeName']}"
    assert event["regarding"]["uid"] == pod["metadata"]["uid"]
    core = [e for e in kube.kubectl_events(NAMESPACE)
            if e["involvedObject"]["name"] == "fits" and e["reason"] == "Scheduled"]  # fmt: skip
    assert len(core) == 1 and core[0]["message"] == event["note"]
    assert core[0]["type"] == "Normal"
    assert "Scheduled" in kube.kubectl("get", "events", "-n", NAMESPACE)


def test_unschedulable_pod_gets_one_failed_scheduling_series(
    kube: Kube,
    two_nodes: list[str],
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
) -> None:
    scheduler = start_scheduler(schedulers, tmp_path, scheduler_kubeconfig, redis_url, SCHEDULER)
    kube.create_pod(NAMESPACE, "too-big", SCHEDULER, cpu="64")
    message = "0/2 nodes are available: 2 Insufficient cpu."

    def pod_condition() -> dict | None:
        found = condition(kube.pod(NAMESPACE, "too-big"), "PodScheduled")
        return found if found and found["status"] == "False" else None

    found = wait_for(pod_condition, "PodScheduled=False")
    assert found["reason"] == "Unschedulable" and found["message"].startswith(message)

    def failed_series() -> list[dict]:
        events = [
            e
            for e in kube.events(NAMESPACE)
            if e["regarding"]["name"] == "too-big" and e["reason"] == "FailedScheduling"
        ]
        return events if events and (events[0].get("series") or {}).get("count", 0) >= 2 else []

    # Retries back off 1 s, 2 s, 4 s, ...: the second attempt PATCHes the series at once.
    (event,) = wait_for(failed_series, "a FailedScheduling series", timeout_s=30)
    assert event["type"] == "Warning" and event["action"] == "Scheduling"
    assert event["note"].startswith(message), event["note"]
    assert EVENT_NAME.fullmatch(event["metadata"]["name"])
    assert event["series"]["lastObservedTime"] >= event["eventTime"]
    core = [e for e in kube.kubectl_events(NAMESPACE)
            if e["involvedObject"]["name"] == "too-big"]  # fmt: skip
    assert len(core) == 1, core  # one Event, not one per retry
    assert core[0]["type"] == "Warning" and core[0]["reason"] == "FailedScheduling"
    assert core[0]["series"]["count"] >= 2
    table = kube.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                         "involvedObject.name=too-big")  # fmt: skip
    assert "FailedScheduling" in table and "0/2 nodes are available" in table
    attempts = 'interference_scheduler_attempts_total{result="unschedulable"}'
    wait_for(lambda: scheduler.metrics().get(attempts, 0) >= 4, "a fourth attempt")
    events = [e for e in kube.events(NAMESPACE) if e["regarding"]["name"] == "too-big"]
    assert len(events) == 1, "a retry wrote a new Event instead of counting in the series"
