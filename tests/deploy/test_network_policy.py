"""The NetworkPolicies in front of Redis and of the credential issuer: schema-valid for every
Kubernetes version we claim; Redis admitting exactly the agents, the scheduler, the issuer
and labelled viewers, the issuer exactly the agents — judged against the labels of the pods
the same render creates, by an evaluator of NetworkPolicy ingress semantics (podSelector in
the policy's namespace, ipBlock, named ports)."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import (
    DEPLOY,
    REPO,
    Obj,
    container,
    find,
    kustomizations,
    load_examples,
    pod_templates,
    render,
)
from tests.deploy.test_render_validate import validation_errors

NAMESPACE = "interference-system"
VIEWER_LABEL = {"interference.io/redis-viewer": "true"}
PLACEHOLDER = "192.0.2.0/24"


@dataclass(frozen=True)
class Client:
    """A pod that opens a connection to Redis."""

    name: str
    namespace: str
    labels: dict[str, str]
    source_ip: str
    """The address the connection comes from: the node's for hostNetwork pods."""
    host_network: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def selector_matches(selector: Obj, labels: dict[str, str]) -> bool:
    """Kubernetes label selector semantics (matchLabels and matchExpressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def peer_admits(peer: Obj, client: Client, policy_namespace: str, pod_identity: bool) -> bool:
    """One ``from`` entry. ``pod_identity``: whether the network plugin knows which pod a
    hostNetwork connection belongs to (most do not: it is just the node's address)."""
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        address = ipaddress.ip_address(client.source_ip)
        inside = address in ipaddress.ip_network(block["cidr"])
        return inside and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    if client.host_network and not pod_identity:
        return False
    if "namespaceSelector" in peer:
        return False  # the policy uses none; a peer with one would need namespace labels
    return client.namespace == policy_namespace and selector_matches(
        peer.get("podSelector", {}), client.labels
    )


def admitted(
    policy: Obj, redis_pod: Obj, client: Client, port: str, *, pod_identity: bool = False
) -> bool:
    """Whether ``policy`` lets ``client`` open ``port`` on ``redis_pod``."""
    labels = redis_pod["metadata"]["labels"]
    if not selector_matches(policy["spec"]["podSelector"], labels):
        return True  # not selected: the policy does not restrict this pod
    assert "Ingress" in policy["spec"]["policyTypes"]
    namespace = policy["metadata"]["namespace"]
    for rule in policy["spec"].get("ingress", []):
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        if any(peer_admits(p, client, namespace, pod_identity) for p in rule.get("from", [])):
            return True
    return False


def clients(objects: tuple[Obj, ...], node_ip: str) -> dict[str, Client]:
    """The rendered pods that might connect, plus a labelled viewer and strangers."""
    found = {}
    for owner, template in pod_templates(objects):
        spec = template["spec"]
        host = bool(spec.get("hostNetwork"))
        found[owner["metadata"]["name"]] = Client(
            owner["metadata"]["name"],
            owner["metadata"].get("namespace", NAMESPACE),
            dict(template["metadata"].get("labels", {})),
            node_ip if host else "10.244.1.17",
            host,
        )
    found["viewer"] = Client("viewer", NAMESPACE, {"app": "debug", **VIEWER_LABEL}, "10.244.2.5")
    found["viewer-elsewhere"] = Client("viewer-elsewhere", "shop", VIEWER_LABEL, "10.244.2.6")
    found["stranger"] = Client("stranger", NAMESPACE, {"app": "debug"}, "10.244.2.7")
    found["host-stranger"] = Client("host-stranger", "kube-system", {}, node_ip, True)
    for file, objs in load_examples().items():
        for owner, template in pod_templates(objs):
            found[f"example {file}"] = Client(
                owner["metadata"]["name"],
                owner["metadata"].get("namespace", "default"),
                dict(template["metadata"].get("labels", {})),
                "10.244.3.9",
            )
    return found


def service_port_name(objects: tuple[Obj, ...], name: str, container_name: str) -> str:
    """The named port of a Deployment's container that its Service targets."""
    service = find(objects, "Service", name)
    (target,) = {p["targetPort"] for p in service["spec"]["ports"]}
    ports = container(find(objects, "Deployment", name), container_name)["ports"]
    assert target in {p["name"] for p in ports}
    return str(target)


def redis_port_name(objects: tuple[Obj, ...]) -> str:
    """The named port of the Redis container that the Service targets."""
    return service_port_name(objects, "redis", "redis")


ISSUER = "interference-credentials"


DOC_OVERLAY = re.compile(r"^```yaml\n(# my-cluster/kustomization\.yaml.*?)^```", re.M | re.S)
"""The overlay docs/operations.md ("NetworkPolicy") tells operators to write."""


def doc_overlay(directory: Path, base: Path, cidr: str) -> Path:
    """The doc's overlay, written to ``directory``, on ``base``, with the range ``cidr``."""
    (text,) = DOC_OVERLAY.findall((REPO / "docs" / "operations.md").read_text())
    overlay = yaml.safe_load(text)
    assert overlay["resources"] == ["../deploy"]
    overlay["resources"] = [os.path.relpath(base, directory)]
    assert {p["target"]["name"] for p in overlay["patches"]} == {"redis", ISSUER}
    for patch in overlay["patches"]:
        assert patch["patch"].count("10.0.0.0/16") == 1
        patch["patch"] = patch["patch"].replace("10.0.0.0/16", cidr)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return directory


def with_node_range(tmp_path: Path, cidr: str) -> tuple[Obj, ...]:
    """The base rendered through the doc's overlay that sets the nodes' range."""
    return render(doc_overlay(tmp_path / "my-cluster", DEPLOY, cidr))


def test_the_policy_is_schema_valid_and_in_every_render_that_runs_redis() -> None:
    for name, directory in kustomizations().items():
        objects = render(directory)
        runs_redis = any(
            o["kind"] == "Deployment" and o["metadata"]["name"] == "redis" for o in objects
        )
        policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
        names = {p["metadata"]["name"] for p in policies}
        assert names == ({"redis", ISSUER} if runs_redis else {ISSUER}), name
        for policy in policies:
            assert validation_errors(policy) == []
            assert policy["metadata"]["namespace"] == NAMESPACE


def test_only_the_scheduler_agents_and_labelled_viewers_reach_redis() -> None:
    objects = render(DEPLOY)
    policy = find(objects, "NetworkPolicy", "redis")
    redis_pod = find(objects, "Deployment", "redis")["spec"]["template"]
    port = redis_port_name(objects)
    everyone = clients(objects, node_ip="10.0.0.5")
    # With a plugin that knows hostNetwork pods, the agents' own selector admits them.
    allowed = {
        n for n, c in everyone.items() if admitted(policy, redis_pod, c, port, pod_identity=True)
    }
    assert allowed == {"interference-scheduler", "interference-agent", ISSUER, "viewer"}
    # Commonly the agents' connections are just the node's address: the shipped placeholder
    # range admits no node, so the agents are refused until the operator sets it.
    assert PLACEHOLDER in str(policy)
    allowed = {n for n, c in everyone.items() if admitted(policy, redis_pod, c, port)}
    assert allowed == {"interference-scheduler", ISSUER, "viewer"}
    # A different port of the Redis pod is refused even to the scheduler.
    assert not admitted(policy, redis_pod, everyone["interference-scheduler"], "metrics")


def test_with_the_nodes_range_set_the_agents_reach_redis(tmp_path: Path) -> None:
    objects = with_node_range(tmp_path, "10.0.0.0/24")
    policy = find(objects, "NetworkPolicy", "redis")
    redis_pod = find(objects, "Deployment", "redis")["spec"]["template"]
    port = redis_port_name(objects)
    everyone = clients(objects, node_ip="10.0.0.5")
    allowed = {n for n, c in everyone.items() if admitted(policy, redis_pod, c, port)}
    # Any hostNetwork process on a node shares the node's address: the ACL user, not the
    # policy, keeps it out (the NetworkPolicy cannot tell them apart).
    assert allowed == {
        "interference-scheduler",
        "interference-agent",
        ISSUER,
        "viewer",
        "host-stranger",
    }
    assert not admitted(policy, redis_pod, everyone["stranger"], port)
    # And the agents reach the credential issuer.
    issuer_policy = find(objects, "NetworkPolicy", ISSUER)
    issuer_pod = find(objects, "Deployment", ISSUER)["spec"]["template"]
    issuer_port = service_port_name(objects, ISSUER, "issuer")
    allowed = {
        n for n, c in everyone.items() if admitted(issuer_policy, issuer_pod, c, issuer_port)
    }
    assert allowed == {"interference-agent", "host-stranger"}


def test_only_the_agents_reach_the_credential_issuer() -> None:
    objects = render(DEPLOY)
    policy = find(objects, "NetworkPolicy", ISSUER)
    issuer_pod = find(objects, "Deployment", ISSUER)["spec"]["template"]
    port = service_port_name(objects, ISSUER, "issuer")
    everyone = clients(objects, node_ip="10.0.0.5")
    allowed = {
        n for n, c in everyone.items() if admitted(policy, issuer_pod, c, port, pod_identity=True)
    }
    assert allowed == {"interference-agent"}
    # The placeholder range admits no node: agents seen by address only are refused.
    assert PLACEHOLDER in str(policy)
    assert not any(admitted(policy, issuer_pod, c, port) for c in everyone.values())
    # The policy selects the issuer pods only: Redis is judged by its own policy.
    redis_pod = find(objects, "Deployment", "redis")["spec"]["template"]
    assert not selector_matches(policy["spec"]["podSelector"], redis_pod["metadata"]["labels"])


def test_the_doc_overlay_refuses_to_patch_once_the_placeholder_moved(tmp_path: Path) -> None:
    """The overlay's ``test`` line: on a policy whose entry no longer holds the placeholder
    (here: the overlay applied twice) kustomize fails instead of replacing another range."""
    first = doc_overlay(tmp_path / "first", DEPLOY, "10.0.0.0/24")
    second = doc_overlay(tmp_path / "second", first, "10.1.0.0/24")
    done = subprocess.run(
        ["kubectl", "kustomize", str(second)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "testing value /spec/ingress/0/from/3/ipBlock/cidr failed" in done.stderr


def test_the_evaluator_can_refuse() -> None:
    """The judge above is not vacuous: an empty rule list admits nobody, a policy that does
    not select the pod admits everybody."""
    objects = render(DEPLOY)
    redis_pod = find(objects, "Deployment", "redis")["spec"]["template"]
    policy = find(objects, "NetworkPolicy", "redis")
    scheduler = clients(objects, "10.0.0.5")["interference-scheduler"]
    closed = {**policy, "spec": {**policy["spec"], "ingress": []}}
    assert not admitted(closed, redis_pod, scheduler, "redis")
    other = {
        **policy,
        "spec": {**policy["spec"], "podSelector": {"matchLabels": {"x": "y"}}, "ingress": []},
    }
    assert admitted(other, redis_pod, scheduler, "redis")


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {"a": "1"}, True),
        (
            {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]},
            {"a": "1"},
            False,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {}, True),
        ({}, {"anything": "x"}, True),
    ],
)
def test_selector_semantics(selector: Obj, labels: dict[str, str], expected: bool) -> None:
    assert selector_matches(selector, labels) is expected
