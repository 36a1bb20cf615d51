"""The degrader's Events (node_agent/events.py) on the real apiserver, as deploy/'s agent
ServiceAccount: refused with the base's RBAC, written once deploy/components/degrade's
ClusterRole is applied — on the pod, by interference.io/agent, with what and why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from interference.signals import PodMetrics
from node_agent.events import REPORTING_CONTROLLER, KubernetesEvents
from tests.e2e.kube import Kube, wait_for

pytestmark = [pytest.mark.e2e]

NAMESPACE = "e2e-degrade"
RBAC = Path(__file__).resolve().parents[2] / "deploy" / "components" / "degrade" / "rbac.yaml"


@pytest.fixture
def degrade_rbac(kube: Kube) -> Iterator[None]:
    """deploy/components/degrade's ClusterRole and binding, removed afterwards."""
    # No OpenAPI download: a fresh apiserver may not serve it yet; the server validates.
    kube.kubectl("apply", "--validate=false", "-f", str(RBAC))
    try:
        yield
    finally:
        kube.kubectl("delete", "-f", str(RBAC), "--ignore-not-found")


def agent_events(agent_kubeconfig: Path) -> KubernetesEvents:
    api = config.new_client_from_config(config_file=str(agent_kubeconfig))
    return KubernetesEvents(client.EventsV1Api(api), "node-1")


def test_the_base_agent_may_not_write_events(kube: Kube, agent_kubeconfig: Path) -> None:
    kube.ensure_namespace(NAMESPACE)
    pod = kube.create_pod(NAMESPACE, "hog-base", "default-scheduler", node_name="node-1")
    events = agent_events(agent_kubeconfig)
    events.emit(PodMetrics(NAMESPACE, "hog-base", uid=pod["metadata"]["uid"]), "X", "y", True)
    assert (events.written, events.failed) == (0, 1)


def test_degrade_component_lets_the_agent_write_them(
    kube: Kube, agent_kubeconfig: Path, degrade_rbac: None
) -> None:
    kube.ensure_namespace(NAMESPACE)
    pod = kube.create_pod(NAMESPACE, "hog", "default-scheduler", node_name="node-1")
    uid = pod["metadata"]["uid"]
    events = agent_events(agent_kubeconfig)
    message = "set cpu.weight 100 → 1 (/sys/fs/cgroup/…/pod…): for 5 intervals pods waited"

    def written() -> bool:
        events.emit(PodMetrics(NAMESPACE, "hog", uid=uid), "InterferenceDegraded", message, True)
        return events.written > 0

    wait_for(written, "the ClusterRole to take effect")
    (event,) = [e for e in kube.events(NAMESPACE) if e["regarding"]["name"] == "hog"]
    assert event["reason"] == "InterferenceDegraded" and event["type"] == "Warning"
    assert event["note"] == message
    assert event["regarding"]["uid"] == uid and event["regarding"]["kind"] == "Pod"
    assert event["reportingController"] == REPORTING_CONTROLLER
    assert event["reportingInstance"] == "node-1"
