"""The API-server pod directory (node_agent/pods.py, for an agent run with a kubeconfig)
against the real apiserver: it names the pods of its node by UID and nothing else. And deploy/'s
agent ServiceAccount is not given that: it may ask a kubelet for its pods (get nodes/pods) and
nothing else — no pod list in the API server, no nodes/proxy."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from node_agent.pods import KubernetesPodDirectory, PodWatchSettings
from tests.e2e.kube import Kube, wait_for

pytestmark = [pytest.mark.e2e]

NAMESPACE = "e2e-agent"
NODE = "agent-node"


def test_agent_resolves_pods_on_its_node(kube: Kube) -> None:
    kube.ensure_namespace(NAMESPACE)
    here = kube.create_pod(NAMESPACE, "on-this-node", "default-scheduler", node_name=NODE)
    there = kube.create_pod(NAMESPACE, "elsewhere", "default-scheduler", node_name="other-node")
    api = config.new_client_from_config(config_file=str(kube.kubeconfig))
    directory = KubernetesPodDirectory(
        client.CoreV1Api(api), NODE, PodWatchSettings(read_timeout_s=5, deleted_grace_s=60)
    )
    directory.start()
    try:
        assert directory.wait_synced(30), "the first list did not complete"
        assert directory.lookup(here["metadata"]["uid"]) == (NAMESPACE, "on-this-node")
        assert directory.lookup(there["metadata"]["uid"]) is None
        later = kube.create_pod(NAMESPACE, "arrives-later", "default-scheduler", node_name=NODE)
        uid = later["metadata"]["uid"]
        wait_for(lambda: directory.lookup(uid), "the watch to name a new pod")
        assert directory.lookup(uid) == (NAMESPACE, "arrives-later")
        assert directory.errors == 0
    finally:
        directory.stop()


def test_deploys_agent_may_ask_a_kubelet_for_pods_and_nothing_else(
    agent_kubeconfig: Path,
) -> None:
    """The API server's own answer (SelfSubjectAccessReview) for the agent's token."""
    agent = config.new_client_from_config(config_file=str(agent_kubeconfig))
    api = client.AuthorizationV1Api(agent)

    def allowed(verb: str, resource: str, subresource: str = "") -> bool:
        review = client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    verb=verb, resource=resource, subresource=subresource, name=NODE
                )
            )
        )
        return bool(api.create_self_subject_access_review(review).status.allowed)

    assert allowed("get", "nodes", "pods")
    assert not allowed("get", "nodes", "proxy")
    assert not allowed("create", "nodes", "proxy")
    assert not allowed("list", "pods") and not allowed("watch", "pods")
    assert not allowed("get", "nodes")
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(agent).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}")
    assert refused.value.status == 403


def test_deleted_pod_stays_known_for_the_grace_period(kube: Kube) -> None:
    """A pod deleted at any moment — even between the list and the watch opening, which the
    watch then replays from the list's resourceVersion — keeps its name for
    ``deleted_grace_s`` (its last interval is still reported), then is forgotten."""
    kube.ensure_namespace(NAMESPACE)
    created = kube.create_pod(NAMESPACE, "short-job", "default-scheduler", node_name=NODE)
    uid = created["metadata"]["uid"]
    now = [1000.0]
    api = config.new_client_from_config(config_file=str(kube.kubeconfig))
    directory = KubernetesPodDirectory(
        client.CoreV1Api(api),
        NODE,
        PodWatchSettings(read_timeout_s=5, deleted_grace_s=30),
        clock=lambda: now[0],
    )
    directory.start()
    try:
        assert directory.wait_synced(30), "the first list did not complete"
        kube.delete_pod(NAMESPACE, "short-job")
        wait_for(lambda: directory.deleted_since(uid) is not None, "the watch to see the delete")
        now[0] += 29.0
        assert directory.lookup(uid) == (NAMESPACE, "short-job")
        now[0] += 2.0
        assert directory.lookup(uid) is None
        assert directory.errors == 0
    finally:
        directory.stop()
