"""Every rendered kustomization is self-consistent: what a pod references (Secrets and
their keys, ConfigMaps, ServiceAccounts, PodDisruptionBudget and Service selectors,
RBAC role refs) exists in the same render — so an overlay that removes or replaces
something cannot leave a workload pointing at nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.conftest import generated_secret
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


OPERATOR_SECRET = "redis-credentials"
"""The Secret every render holds only as a data-less stub: the operator creates the real
one with scripts/create-redis-secret.sh, so no password is ever in the manifests."""


@pytest.mark.parametrize("name", sorted(kustomizations()))
def test_pod_references_resolve(name: str) -> None:
    objects = render(kustomizations()[name])
    created_by_script = set(generated_secret())
    for owner, template in pod_templates(objects):
        for kind, ref, key in references(template):
            # Generated names carry kustomize's hash suffix; kustomize rewrites references.
            matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == ref]
            assert matches, f"{owner['metadata']['name']} references missing {kind}/{ref}"
            if (kind, ref) == ("Secret", OPERATOR_SECRET):
                assert key in created_by_script, f"the Secret generator makes no key {key}"
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
    # The agents and the scheduler still log in with the Secret's passwords.
    assert [(o["kind"], o["metadata"]["name"]) for o in left] == [("Secret", OPERATOR_SECRET)]
