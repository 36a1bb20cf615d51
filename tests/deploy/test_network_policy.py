"""NetworkPolicy: default-deny in both namespaces, and every connection the rendered pods might
open judged by an evaluator of NetworkPolicy semantics (ingress and egress, pod and namespace
selectors, ipBlock, named and numbered ports, hostNetwork pods seen as their node's address)
and, for deploy/components/cilium, of CiliumNetworkPolicy entities. The set of allowed
connections must equal, exactly, the flows docs/operations.md lists; everything else is
refused."""

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
    find,
    kustomizations,
    load_examples,
    pod_templates,
    render,
)

SYSTEM = "interference-system"
AGENTS = "interference-agent"
PLACEHOLDER = "192.0.2.0/24"
NODE_IP = "10.0.0.5"
OTHER_NODE_IP = "10.0.0.6"
APISERVER_IP = "10.0.0.1"
INTERNET_IP = "93.184.216.34"
ISSUER = "interference-credentials"
SCRAPER = {"interference.io/metrics-scraper": "true"}
VIEWER = {"interference.io/redis-viewer": "true"}


@dataclass(frozen=True)
class Endpoint:
    """One end of a connection: a pod (namespace, labels, its ports by name) or an address
    outside the pod network (``entity`` says which, for Cilium)."""

    name: str
    ip: str
    namespace: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    host_network: bool = False
    entity: str = "world"
    """Cilium's name for a non-pod address: host (this node), remote-node, kube-apiserver,
    world."""

    @property
    def is_pod(self) -> bool:
        return self.namespace is not None and not self.host_network


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


NAMESPACE_LABELS = {"monitoring": SCRAPER}
"""Labels a cluster admin set on a namespace (docs/operations.md: the scrapers' one)."""


def namespace_labels(namespace: str) -> dict[str, str]:
    """What the API server labels every namespace with, and what an admin added."""
    return {"kubernetes.io/metadata.name": namespace, **NAMESPACE_LABELS.get(namespace, {})}


def peer_matches(peer: Obj, other: Endpoint, policy_namespace: str) -> bool:
    """One ``from``/``to`` entry of a NetworkPolicy."""
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        address = ipaddress.ip_address(other.ip)
        inside = address in ipaddress.ip_network(block["cidr"])
        return inside and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    if not other.is_pod:
        return False  # a selector names pods; a node's or an outside address is no pod
    assert other.namespace is not None
    if "namespaceSelector" in peer:
        if not selector_matches(peer["namespaceSelector"], namespace_labels(other.namespace)):
            return False
    elif other.namespace != policy_namespace:
        return False
    return selector_matches(peer.get("podSelector", {}), other.labels)


def port_matches(rule: Obj, destination: Endpoint, port: int, protocol: str) -> bool:
    if "ports" not in rule:
        return True
    for entry in rule["ports"]:
        if entry.get("protocol", "TCP") != protocol:
            continue
        wanted = entry.get("port")
        if wanted is None or wanted == port:
            return True
        if isinstance(wanted, str) and destination.ports.get(wanted) == port:
            return True
    return False


def cilium_peer_matches(rule: Obj, other: Endpoint, direction: str) -> bool:
    entities = rule.get("toEntities" if direction == "Egress" else "fromEntities", [])
    return other.entity in entities or "all" in entities


def cilium_port_matches(rule: Obj, port: int, protocol: str) -> bool:
    if "toPorts" not in rule:
        return True
    return any(
        int(p["port"]) == port and p.get("protocol", "TCP") == protocol
        for entry in rule["toPorts"]
        for p in entry["ports"]
    )


def allows(
    policies: list[Obj],
    subject: Endpoint,
    other: Endpoint,
    destination: Endpoint,
    port: int,
    protocol: str,
    direction: str,
) -> bool:
    """Whether the policies of ``subject``'s namespace let it send (Egress) to, or receive
    (Ingress) from, ``other``. A pod no policy selects for that direction is not isolated."""
    if not subject.is_pod:
        return True  # the host network: no NetworkPolicy applies to it
    selecting = []
    for policy in policies:
        if policy["metadata"]["namespace"] != subject.namespace:
            continue
        spec = policy["spec"]
        if policy["kind"] == "CiliumNetworkPolicy":
            if not selector_matches(spec["endpointSelector"], subject.labels):
                continue
            if direction.lower() in spec:
                selecting.append(policy)
            continue
        if selector_matches(spec["podSelector"], subject.labels) and direction in spec.get(
            "policyTypes", ["Ingress"]
        ):
            selecting.append(policy)
    if not selecting:
        return True
    key = direction.lower()
    peers_key = "to" if direction == "Egress" else "from"
    for policy in selecting:
        namespace = policy["metadata"]["namespace"]
        for rule in policy["spec"].get(key, []):
            if policy["kind"] == "CiliumNetworkPolicy":
                if cilium_peer_matches(rule, other, direction) and cilium_port_matches(
                    rule, port, protocol
                ):
                    return True
                continue
            if not port_matches(rule, destination, port, protocol):
                continue
            peers = rule.get(peers_key)
            if peers is None or any(peer_matches(p, other, namespace) for p in peers):
                return True
    return False


def connects(
    policies: list[Obj], source: Endpoint, destination: Endpoint, port: int, protocol: str = "TCP"
) -> bool:
    """Source's egress and destination's ingress both allow it."""
    return allows(policies, source, destination, destination, port, protocol, "Egress") and allows(
        policies, destination, source, destination, port, protocol, "Ingress"
    )


# --- the rendered world ------------------------------------------------------------------


def endpoints(objects: tuple[Obj, ...]) -> dict[str, Endpoint]:
    """Every rendered pod (one per workload), pods of strangers and the addresses outside."""
    found: dict[str, Endpoint] = {}
    for index, (owner, template) in enumerate(pod_templates(objects)):
        spec = template["spec"]
        host = bool(spec.get("hostNetwork"))
        ports = {
            p["name"]: p["containerPort"]
            for c in spec["containers"]
            for p in c.get("ports", [])
            if "name" in p
        }
        found[owner["metadata"]["name"]] = Endpoint(
            owner["metadata"]["name"],
            NODE_IP if host else f"10.244.1.{10 + index}",
            owner["metadata"]["namespace"],
            dict(template["metadata"].get("labels", {})),
            ports,
            host,
            "host" if host else "world",
        )
    found["viewer"] = Endpoint("viewer", "10.244.2.5", SYSTEM, {"app": "debug", **VIEWER})
    found["viewer-elsewhere"] = Endpoint("viewer-elsewhere", "10.244.2.6", "shop", VIEWER)
    found["stranger"] = Endpoint("stranger", "10.244.2.7", SYSTEM, {"app": "debug"})
    found["agent-impostor"] = Endpoint(
        "agent-impostor", "10.244.2.8", "shop", {"app.kubernetes.io/name": "interference-agent"}
    )
    found["scraper"] = Endpoint("scraper", "10.244.2.9", "monitoring", SCRAPER)
    # the pod label alone, set by whoever may create a pod in shop
    found["scraper-elsewhere"] = Endpoint("scraper-elsewhere", "10.244.2.10", "shop", SCRAPER)
    found["host-stranger"] = Endpoint(
        "host-stranger", NODE_IP, "kube-system", host_network=True, entity="host"
    )
    found["dns"] = Endpoint("dns", "10.244.0.2", "kube-system", {"k8s-app": "kube-dns"})
    found["apiserver"] = Endpoint("apiserver", APISERVER_IP, entity="kube-apiserver")
    found["kubelet"] = Endpoint("kubelet", NODE_IP, entity="host")
    found["other-kubelet"] = Endpoint("other-kubelet", OTHER_NODE_IP, entity="remote-node")
    found["internet"] = Endpoint("internet", INTERNET_IP)
    for file, objs in load_examples().items():
        for owner, template in pod_templates(objs):
            found[f"example {file}"] = Endpoint(
                owner["metadata"]["name"],
                "10.244.3.9",
                owner["metadata"].get("namespace", "default"),
                dict(template["metadata"].get("labels", {})),
            )
    return found


DESTINATION_PORTS: dict[str, list[tuple[int, str]]] = {
    "redis": [(6379, "TCP")],
    ISSUER: [(10272, "TCP")],
    "interference-scheduler": [(10251, "TCP"), (10262, "TCP")],
    "interference-agent": [(10271, "TCP")],
    "interference-kube-scheduler": [(10259, "TCP")],
    "dns": [(53, "UDP"), (53, "TCP")],
    "apiserver": [(443, "TCP"), (6443, "TCP")],
    "kubelet": [(10250, "TCP")],
    "other-kubelet": [(10250, "TCP")],
    "internet": [(443, "TCP")],
}


def policies_of(objects: tuple[Obj, ...]) -> list[Obj]:
    return [o for o in objects if o["kind"] in ("NetworkPolicy", "CiliumNetworkPolicy")]


def allowed_flows(objects: tuple[Obj, ...]) -> set[tuple[str, str, int]]:
    """Every (source, destination, port) the policies allow among the endpoints."""
    world = endpoints(objects)
    policies = policies_of(objects)
    flows = set()
    for source in world.values():
        if source.name in ("apiserver", "kubelet", "other-kubelet", "internet", "dns"):
            continue
        for destination_name, ports in DESTINATION_PORTS.items():
            destination = world.get(destination_name)
            if destination is None or destination is source:
                continue
            for port, protocol in ports:
                if connects(policies, source, destination, port, protocol):
                    flows.add((source.name, destination_name, port))
    return flows


def ours(flows: set[tuple[str, str, int]]) -> set[tuple[str, str, int]]:
    """The flows between the parts we install and the services they use (a stranger's pod
    reaching the internet is not ours to judge)."""
    installed = {"redis", ISSUER, "interference-scheduler", "interference-agent"}
    installed |= {"interference-kube-scheduler"}
    return {f for f in flows if f[0] in installed or f[1] in installed}


SCRAPED = {
    ("scraper", ISSUER, 10272),
    ("scraper", "interference-scheduler", 10251),
    ("scraper", "interference-agent", 10271),
}
BASE_FLOWS = SCRAPED | {
    ("interference-agent", "redis", 6379),
    ("interference-agent", ISSUER, 10272),
    ("interference-agent", "dns", 53),
    ("interference-agent", "kubelet", 10250),
    # Standard NetworkPolicy cannot say "this node": any node's kubelet port (cilium can).
    ("interference-agent", "other-kubelet", 10250),
    ("interference-scheduler", "redis", 6379),
    ("interference-scheduler", "dns", 53),
    ("interference-scheduler", "apiserver", 443),
    ("interference-scheduler", "apiserver", 6443),
    (ISSUER, "redis", 6379),
    (ISSUER, "dns", 53),
    (ISSUER, "apiserver", 443),
    (ISSUER, "apiserver", 6443),
    ("viewer", "redis", 6379),
}
"""What docs/operations.md ("NetworkPolicy") lists for the base."""


def expected_base_flows() -> set[tuple[str, str, int]]:
    # The API server's address is outside the pod network, so its rule is a port: any
    # address on 443/6443, the internet's too (documented; narrowed by an ipBlock of the
    # control plane, or by deploy/components/cilium).
    return BASE_FLOWS | {
        ("interference-scheduler", "internet", 443),
        (ISSUER, "internet", 443),
    }


# --- tests ---------------------------------------------------------------------------------


def test_every_render_has_default_deny_in_both_namespaces() -> None:
    for name, directory in kustomizations().items():
        objects = render(directory)
        for namespace in (SYSTEM, AGENTS):
            deny = [
                o
                for o in objects
                if o["kind"] == "NetworkPolicy"
                and o["metadata"]["name"] == "default-deny"
                and o["metadata"]["namespace"] == namespace
            ]
            assert len(deny) == 1, (name, namespace)
            assert deny[0]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
        for policy in policies_of(objects):
            assert policy["metadata"]["namespace"] in (SYSTEM, AGENTS), policy["metadata"]


def test_the_base_allows_exactly_the_documented_flows() -> None:
    flows = ours(allowed_flows(render(DEPLOY)))
    expected = expected_base_flows()
    assert flows - expected == set(), f"allowed but not documented: {sorted(flows - expected)}"
    assert expected - flows == set(), f"documented but refused: {sorted(expected - flows)}"


def test_what_the_base_refuses() -> None:
    """The doors the issue found open are shut: a host-network process is no agent, an
    unlabelled pod or another namespace's labelled pod reaches nothing, Redis opens nothing."""
    objects = render(DEPLOY)
    world, policies = endpoints(objects), policies_of(objects)
    refused = [
        ("host-stranger", "redis", 6379),
        ("host-stranger", ISSUER, 10272),
        ("stranger", "redis", 6379),
        ("stranger", "interference-scheduler", 10251),
        ("viewer-elsewhere", "redis", 6379),
        ("agent-impostor", "redis", 6379),
        ("agent-impostor", ISSUER, 10272),
        ("scraper-elsewhere", "interference-scheduler", 10251),
        ("scraper-elsewhere", ISSUER, 10272),
        ("scraper-elsewhere", "interference-agent", 10271),
        ("redis", "dns", 53),
        ("redis", "internet", 443),
        ("interference-agent", "apiserver", 443),
        ("interference-agent", "interference-scheduler", 10251),
        ("interference-scheduler", "kubelet", 10250),
        ("interference-scheduler", "internet", 80),
        ("example latency-sensitive-service.yaml", "redis", 6379),
        ("example latency-sensitive-service.yaml", "interference-scheduler", 10251),
    ]
    for source, destination, port in refused:
        assert not connects(policies, world[source], world[destination], port), (
            source,
            destination,
            port,
        )


def test_the_scheduler_port_admits_kube_scheduler_in_extender_mode() -> None:
    flows = allowed_flows(render(kustomizations()["extender"]))
    scheduler = endpoints(render(kustomizations()["extender"]))["interference-scheduler"]
    extender_port = scheduler.ports["extender"]
    assert ("interference-kube-scheduler", "interference-scheduler", extender_port) in flows
    assert ("interference-kube-scheduler", "interference-scheduler", 10251) not in flows
    assert ("scraper", "interference-scheduler", extender_port) not in flows
    assert ("interference-kube-scheduler", "apiserver", 6443) in flows
    assert ("interference-kube-scheduler", "redis", 6379) not in flows


def test_cilium_names_the_api_server_and_this_nodes_kubelet(tmp_path: Path) -> None:
    objects = render(kustomizations()["cilium"])
    for policy in policies_of(objects):
        if policy["kind"] == "CiliumNetworkPolicy":
            assert cilium_policy_errors(policy) == []
    flows = ours(allowed_flows(objects))
    # This node's kubelet only; the API server by entity, not every address on its port.
    assert flows == BASE_FLOWS - {("interference-agent", "other-kubelet", 10250)}


def test_host_namespaces_agents_are_refused_until_the_nodes_range_is_set(
    tmp_path: Path,
) -> None:
    objects = render(kustomizations()["host-namespaces"])
    world, policies = endpoints(objects), policies_of(objects)
    agent = world["interference-agent"]
    assert agent.host_network and agent.ip == NODE_IP
    assert PLACEHOLDER in str(find(objects, "NetworkPolicy", "redis"))
    assert not connects(policies, agent, world["redis"], 6379)
    assert not connects(policies, agent, world[ISSUER], 10272)
    objects = render(doc_overlay(tmp_path / "my-cluster", "10.0.0.0/24"))
    world, policies = endpoints(objects), policies_of(objects)
    assert connects(policies, world["interference-agent"], world["redis"], 6379)
    assert connects(policies, world["interference-agent"], world[ISSUER], 10272)
    # Any host-network process of a node shares its address: the ACL user, not the policy,
    # keeps it out (docs/operations.md says so).
    assert connects(policies, world["host-stranger"], world["redis"], 6379)
    assert not connects(policies, world["stranger"], world["redis"], 6379)


DOC_OVERLAY = re.compile(r"^```yaml\n(# my-cluster/kustomization\.yaml.*?)^```", re.M | re.S)
"""The overlay docs/operations.md ("NetworkPolicy") tells host-namespaces users to write."""


def doc_overlay(directory: Path, cidr: str, base: Path | None = None) -> Path:
    (text,) = DOC_OVERLAY.findall((REPO / "docs" / "operations.md").read_text())
    overlay = yaml.safe_load(text)
    assert overlay["resources"] == ["../deploy/overlays/host-namespaces"]
    target = base if base is not None else DEPLOY / "overlays" / "host-namespaces"
    overlay["resources"] = [os.path.relpath(target, directory)]
    assert {p["target"]["name"] for p in overlay["patches"]} == {"redis", ISSUER}
    for patch in overlay["patches"]:
        assert patch["patch"].count("10.0.0.0/16") == 1
        patch["patch"] = patch["patch"].replace("10.0.0.0/16", cidr)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return directory


def test_the_doc_overlay_refuses_to_patch_once_the_placeholder_moved(tmp_path: Path) -> None:
    """The overlay's ``test`` line: applied twice, kustomize fails instead of replacing
    another range."""
    first = doc_overlay(tmp_path / "first", "10.0.0.0/24")
    second = doc_overlay(tmp_path / "second", "10.1.0.0/24", base=first)
    done = subprocess.run(
        ["kubectl", "kustomize", str(second)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "testing value /spec/ingress/0/from/" in done.stderr


def test_the_evaluator_can_refuse_and_admit() -> None:
    objects = render(DEPLOY)
    world = endpoints(objects)
    redis_policy = find(objects, "NetworkPolicy", "redis")
    scheduler, redis = world["interference-scheduler"], world["redis"]
    closed = {**redis_policy, "spec": {**redis_policy["spec"], "ingress": []}}
    assert not allows([closed], redis, scheduler, redis, 6379, "TCP", "Ingress")
    assert allows([redis_policy], redis, scheduler, redis, 6379, "TCP", "Ingress")
    assert not allows([redis_policy], redis, scheduler, redis, 6380, "TCP", "Ingress")
    # Without policies nothing is isolated; with only default-deny nothing passes.
    assert connects([], world["stranger"], redis, 6379)
    deny = [o for o in policies_of(objects) if o["metadata"]["name"] == "default-deny"]
    assert not connects(deny, scheduler, redis, 6379)


CILIUM_RULE_KEYS = {"toEntities", "fromEntities", "toPorts", "toEndpoints", "fromEndpoints"}
CILIUM_ENTITIES = {
    "host",
    "remote-node",
    "kube-apiserver",
    "world",
    "cluster",
    "init",
    "health",
    "unmanaged",
    "ingress",
    "all",
}


def cilium_policy_errors(obj: Obj) -> list[str]:
    """The CiliumNetworkPolicy fields deploy/components/cilium uses, per Cilium's v2 API
    (cilium.io_ciliumnetworkpolicies CRD): endpointSelector, ingress/egress rules of entities
    and toPorts with string ports and TCP/UDP/ANY."""
    name = f"CiliumNetworkPolicy/{obj['metadata'].get('name')}"
    errors = []
    if obj.get("apiVersion") != "cilium.io/v2" or not obj["metadata"].get("namespace"):
        errors.append(f"{name}: apiVersion cilium.io/v2 and a namespace")
    spec: Any = obj.get("spec", {})
    if set(spec) - {"endpointSelector", "ingress", "egress", "description"}:
        errors.append(f"{name}: unknown spec fields {set(spec)}")
    if not isinstance(spec.get("endpointSelector"), dict):
        errors.append(f"{name}: no endpointSelector")
    for direction in ("ingress", "egress"):
        for rule in spec.get(direction, []):
            if set(rule) - CILIUM_RULE_KEYS:
                errors.append(f"{name}: unknown rule fields {set(rule) - CILIUM_RULE_KEYS}")
            for entity in rule.get("toEntities", []) + rule.get("fromEntities", []):
                if entity not in CILIUM_ENTITIES:
                    errors.append(f"{name}: unknown entity {entity}")
            for entry in rule.get("toPorts", []):
                for port in entry.get("ports", []):
                    if not isinstance(port.get("port"), str) or port.get("protocol") not in (
                        "TCP",
                        "UDP",
                        "ANY",
                    ):
                        errors.append(f"{name}: port {port}")
    return errors


def test_the_cilium_check_can_fail() -> None:
    bad = {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": {"name": "x", "namespace": SYSTEM},
        "spec": {
            "endpointSelector": {},
            "egress": [{"toEntities": ["kubelet"], "toPorts": [{"ports": [{"port": 1}]}]}],
        },
    }
    assert len(cilium_policy_errors(bad)) == 2


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
