"""Every rendered kustomization is self-consistent: what a pod references (Secrets and
their keys, ConfigMaps, ServiceAccounts, PodDisruptionBudget and Service selectors,
RBAC role refs) exists in the same render — so an overlay that removes or replaces
something cannot leave a workload pointing at nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.deploy.conftest import generated_objects
from tests.deploy.manifests import REPO, Obj, find, kustomizations, pod_templates, render


def references(template: Obj) -> Iterator[tuple[str, str, str | None]]:
    """(kind, name, key or None) of everything a pod template points at."""
    spec = template["spec"]
    if "serviceAccountName" in spec:
        yield "ServiceAccount", spec["serviceAccountName"], None
    for volume in spec.get("volumes", []):
        sources: list[tuple[str, Obj]] = []
        if "configMap" in volume:
            sources.append(("ConfigMap", volume["configMap"]))
        if "secret" in volume:
            sources.append(("Secret", {**volume["secret"], "name": volume["secret"]["secretName"]}))
        for source in volume.get("projected", {}).get("sources", []):
            for kind, field in (("Secret", "secret"), ("ConfigMap", "configMap")):
                if field in source:
                    sources.append((kind, source[field]))
        for kind, source in sources:
            yield kind, source["name"], None
            for item in source.get("items", []):
                yield kind, source["name"], item["key"]
    for container in spec["containers"] + spec.get("initContainers", []):
        for var in container.get("env", []):
            source = var.get("valueFrom", {})
            for kind, field in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                if field in source:
                    yield kind, source[field]["name"], source[field]["key"]


def made_by_script() -> dict[tuple[str, str], set[str]]:
    """(kind, name) → keys of what scripts/create-redis-secret.sh makes: the Secrets every
    render holds only as data-less stubs (no password is ever in the manifests) and the
    ConfigMap redis-ca."""
    return {(o["kind"], o["metadata"]["name"]): set(o["data"]) for o in generated_objects()}


def made_by_extender_script() -> set[str]:
    """The Secrets scripts/create-extender-certs.sh makes (or cert-manager.yaml, in the
    extender component): certificates, never in a render."""
    text = (REPO / "scripts" / "create-extender-certs.sh").read_text()
    return {m.group(2) for m in re.finditer(r"^(SERVING|CLIENT)=(\S+)$", text, re.M)}


def test_the_extender_script_names_its_secrets() -> None:
    assert made_by_extender_script() == {
        "interference-extender-serving",
        "interference-extender-client",
    }


@pytest.mark.parametrize("name", sorted(kustomizations()))
def test_pod_references_resolve(name: str) -> None:
    objects = render(kustomizations()[name])
    created_by_script = made_by_script()
    certificates = made_by_extender_script()
    for owner, template in pod_templates(objects):
        for kind, ref, key in references(template):
            if kind == "Secret" and ref in certificates:
                continue
            # Generated names carry kustomize's hash suffix; kustomize rewrites references.
            matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == ref]
            if kind == "Secret" or (kind, ref) not in created_by_script:
                assert matches, f"{owner['metadata']['name']} references missing {kind}/{ref}"
            if (kind, ref) in created_by_script:
                made = created_by_script[kind, ref]
                assert key is None or key in made, f"the script makes no key {key} in {ref}"
            elif key is not None:
                assert key in matches[0].get("data", {}), f"{kind}/{ref} has no key {key}"


BOOTSTRAP_ROLES = {
    ("ClusterRole", "system:kube-scheduler"),
    ("ClusterRole", "system:volume-scheduler"),
    ("Role", "extension-apiserver-authentication-reader"),
}
"""Roles every kube-apiserver creates at start (its RBAC bootstrap policy), bound by the
extender overlay's kube-scheduler; tests/e2e/test_extender.py runs kube-scheduler with
exactly those bindings on a real apiserver."""


@pytest.mark.parametrize("name", sorted(kustomizations()))
def test_selectors_and_role_refs_resolve(name: str) -> None:
    objects = render(kustomizations()[name])
    pod_labels = [t["metadata"].get("labels", {}) for _, t in pod_templates(objects)]
    for obj in objects:
        if obj["kind"] in ("Service", "PodDisruptionBudget"):
            selector = obj["spec"]["selector"]
            wanted = selector if obj["kind"] == "Service" else selector["matchLabels"]
            assert any(wanted.items() <= labels.items() for labels in pod_labels), (
                f"{obj['kind']}/{obj['metadata']['name']} selects no pod"
            )
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            role = (obj["roleRef"]["kind"], obj["roleRef"]["name"])
            if role not in BOOTSTRAP_ROLES:
                find(objects, *role)
            for subject in obj["subjects"]:
                account = find(objects, "ServiceAccount", subject["name"])
                assert subject["namespace"] == account["metadata"]["namespace"]


def test_external_redis_overlay_drops_the_bundled_redis() -> None:
    objects = render(kustomizations()["external-redis"])
    left = [o for o in objects if o["metadata"]["name"].startswith("redis")]
    # The credential issuer, the scheduler and CLI users still log in with their Secrets'
    # passwords (and the external Redis' CA in them); Redis' own admin and TLS go.
    assert sorted((o["kind"], o["metadata"]["name"]) for o in left if o["kind"] == "Secret") == [
        ("Secret", "redis-issuer"),
        ("Secret", "redis-scheduler"),
        ("Secret", "redis-viewer"),
    ]
