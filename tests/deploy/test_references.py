"""Every rendered kustomization is self-consistent: what a pod references (Secrets and
their keys, ConfigMaps, ServiceAccounts, PodDisruptionBudget and Service selectors,
RBAC role refs) exists in the same render — so an overlay that removes or replaces
something cannot leave a workload pointing at nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.manifests import Obj, find, kustomizations, pod_templates, render


def references(template: Obj) -> Iterator[tuple[str, str, str | None]]:
    """(kind, name, key or None) of everything a pod template points at."""
    spec = template["spec"]
    if "serviceAccountName" in spec:
        yield "ServiceAccount", spec["serviceAccountName"], None
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"]["name"], None
        if "secret" in volume:
            yield "Secret", volume["secret"]["secretName"], None
    for container in spec["containers"] + spec.get("initContainers", []):
        for var in container.get("env", []):
            source = var.get("valueFrom", {})
            for kind, field in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                if field in source:
                    yield kind, source[field]["name"], source[field]["key"]


@pytest.mark.parametrize("name", sorted(kustomizations()))
def test_pod_references_resolve(name: str) -> None:
    objects = render(kustomizations()[name])
    for owner, template in pod_templates(objects):
        for kind, ref, key in references(template):
            # Generated names carry kustomize's hash suffix; kustomize rewrites references.
            matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == ref]
            assert matches, f"{owner['metadata']['name']} references missing {kind}/{ref}"
            if key is not None:
                assert key in matches[0].get("data", {}), f"{kind}/{ref} has no key {key}"


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
            find(objects, obj["roleRef"]["kind"], obj["roleRef"]["name"])
            for subject in obj["subjects"]:
                account = find(objects, "ServiceAccount", subject["name"])
                assert subject["namespace"] == account["metadata"]["namespace"]


def test_external_redis_overlay_drops_the_bundled_redis() -> None:
    objects = render(kustomizations()["external-redis"])
    assert not [
        o for o in objects if o["metadata"]["name"].startswith("redis") and o["kind"] != "Secret"
    ]
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"} == {
        find(objects, "Secret", "redis-credentials")["metadata"]["name"]
    }
