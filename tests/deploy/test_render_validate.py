"""Acceptance 1: the base and every overlay render with kubectl kustomize, and every rendered
object (and every example workload) validates offline against the published schemas of
several Kubernetes minor versions."""

from __future__ import annotations

import functools
import json

import kubernetes_validate
import pytest
from kubernetes_validate.utils import (
    SchemaNotFoundError,
    ValidationError,
    all_versions,
    major_minor,
)

from tests.deploy.manifests import Obj, kustomizations, load_examples, render

VERSIONS = ("1.28", "1.29", "1.30", "1.31", "1.32", "1.33")
"""Six supported minor versions, all bundled with kubernetes-validate (no network needed)."""

EXPECTED_OVERLAYS = {"external-redis", "dry-run", "extender"}


def cilium_policy_errors(obj: Obj) -> list[str]:
    """CiliumNetworkPolicy (no published schema in kubernetes-validate): the fields
    deploy/components/cilium uses, checked against Cilium's v2 API."""
    from tests.deploy.test_network_policy import cilium_policy_errors as check

    return check(obj)


def podmonitor_errors(obj: Obj) -> list[str]:
    """PodMonitor (the Prometheus Operator's CRD, no published schema either)."""
    from tests.deploy.prometheus_operator import podmonitor_errors as check

    return check(obj)


CUSTOM_RESOURCES = {
    "cilium.io/v2": cilium_policy_errors,
    "monitoring.coreos.com/v1": podmonitor_errors,
}
"""Kinds of CRDs, validated by their own checks."""


def validation_errors(obj: Obj) -> list[str]:
    """Strict (unknown fields rejected) schema errors of ``obj`` for every version."""
    return list(_validation_errors(json.dumps(obj, sort_keys=True)))


@functools.cache
def _validation_errors(text: str) -> tuple[str, ...]:
    """By the object's text: the overlays and combinations render mostly the same objects,
    each validated against six schemas (this file and test_overlay_components.py took
    about 7 minutes of ``make test`` without this cache, 1 minute with it)."""
    obj = json.loads(text)
    errors: list[str] = []
    name = f"{obj['kind']}/{obj['metadata']['name']}"
    if obj["apiVersion"] in CUSTOM_RESOURCES:
        return tuple(CUSTOM_RESOURCES[obj["apiVersion"]](obj))
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{name} @ {version}: {path}: {exc.message}")
        except SchemaNotFoundError as exc:
            errors.append(f"{name} @ {version}: {exc.message}")
    return tuple(errors)


def test_the_bundled_schemas_cover_every_version_we_claim() -> None:
    bundled = {major_minor(v) for v in all_versions()}
    assert set(VERSIONS) <= bundled, f"kubernetes-validate bundles only {sorted(bundled)}"


def test_the_expected_overlays_exist() -> None:
    assert set(kustomizations()) >= EXPECTED_OVERLAYS


def test_deploy_dir_installs_the_base() -> None:
    """``kubectl apply -k deploy/`` renders exactly what deploy/base renders."""
    assert render(kustomizations()["base"]) == render(kustomizations()["base"] / "base")


@pytest.mark.parametrize("name", sorted(kustomizations()))
def test_kustomization_renders_and_validates(name: str) -> None:
    objects = render(kustomizations()[name])
    kinds = {o["kind"] for o in objects}
    assert {"DaemonSet", "Deployment", "ClusterRole", "PodDisruptionBudget"} <= kinds
    errors = [error for obj in objects for error in validation_errors(obj)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("file", sorted(load_examples()))
def test_example_validates(file: str) -> None:
    objects = load_examples()[file]
    assert objects
    errors = [error for obj in objects for error in validation_errors(obj)]
    assert not errors, "\n".join(errors)


def test_validation_rejects_a_broken_object() -> None:
    """The check above can fail: a misspelt field and a wrong type are both reported."""
    deployment = next(o for o in render(kustomizations()["base"]) if o["kind"] == "Deployment")
    broken = {**deployment, "spec": {**deployment["spec"], "replicas": "two", "replica": 2}}
    errors = validation_errors(broken)
    assert len(errors) == len(VERSIONS)
    assert all("replica" in e for e in errors)


def test_every_resource_file_in_base_is_rendered() -> None:
    """No manifest under deploy/base is left out of the kustomization by mistake."""
    base = kustomizations()["base"] / "base"
    listed = (base / "kustomization.yaml").read_text()
    for path in base.rglob("*.yaml"):
        relative = str(path.relative_to(base))
        if path.name != "kustomization.yaml":
            assert relative in listed, f"{relative} is not referenced by {base}/kustomization.yaml"
