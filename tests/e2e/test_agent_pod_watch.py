"""The agent's pod directory (node_agent/pods.py) against the real apiserver, as deploy/'s
agent ServiceAccount: it names the pods of its node by UID and nothing else."""

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


def test_agent_resolves_pods_on_its_node(kube: Kube, agent_kubeconfig: Path) -> None:
    kube.ensure_namespace(NAMESPACE)
    here = kube.create_pod(NAMESPACE, "on-this-node", "default-scheduler", node_name=NODE)
    there = kube.create_pod(NAMESPACE, "elsewhere", "default-scheduler", node_name="other-node")
    api = config.new_client_from_config(config_file=str(agent_kubeconfig))
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
        kube.delete_pod(NAMESPACE, "on-this-node")
        # A deleted pod keeps its name for the grace period (its last interval is reported).
        assert directory.lookup(here["metadata"]["uid"]) == (NAMESPACE, "on-this-node")
        assert directory.errors == 0
    finally:
        directory.stop()
    # Least privilege: the agent's ServiceAccount reads pods and nothing else.
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(api).list_node()
    assert refused.value.status == 403
