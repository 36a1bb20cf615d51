"""The optional changes to the base are kustomize Components that combine: every overlay is
the base plus its one component, and every combination docs/operations.md ("Overlays")
lists renders, validates and has each component's effect, with no object twice."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import DEPLOY, REPO, Obj, container, find, kustomizations, render
from tests.deploy.test_render_validate import validation_errors

DOC = REPO / "docs" / "operations.md"
COMPONENTS = DEPLOY / "components"
ROW = re.compile(r"^\| `deploy/overlays/([a-z-]+)` \|.*\| ((?:`[a-z-]+`(?:, )?)+) \|$", re.M)
DOC_COMBINATION = re.compile(
    r"^```yaml\n(# my-combination/kustomization\.yaml.*?)^```", re.M | re.S
)


def components() -> list[str]:
    return sorted(p.parent.name for p in COMPONENTS.glob("*/kustomization.yaml"))


def documented_combinations() -> dict[str, set[str]]:
    """Overlay → the components the doc's table says it combines with."""
    rows = ROW.findall(DOC.read_text())
    return {name: set(re.findall(r"`([a-z-]+)`", others)) for name, others in rows}


def pairs() -> list[tuple[str, str]]:
    return sorted(
        {
            tuple(sorted((a, b)))  # type: ignore[misc]
            for a, others in documented_combinations().items()
            for b in others
        }
    )


def combination(tmp_path: Path, names: tuple[str, ...]) -> tuple[Obj, ...]:
    """The base with ``names`` as components, from a kustomization in ``tmp_path``."""
    directory = tmp_path / "-".join(names)
    directory.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / "base", directory)],
        "components": [os.path.relpath(COMPONENTS / name, directory) for name in names],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return render(directory)


def scheduler_args(objects: tuple[Obj, ...]) -> list[str]:
    args: list[str] = container(find(objects, "Deployment", "interference-scheduler"), "scheduler")[
        "args"
    ]
    return args


def is_dry_run(objects: tuple[Obj, ...]) -> None:
    assert "--dry-run" in scheduler_args(objects)
    role = find(objects, "ClusterRole", "interference-scheduler")
    for rule in role["rules"]:
        assert not {"pods/binding", "pods/status", "events"} & set(rule["resources"]), rule
        assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule


def uses_local_images(objects: tuple[Obj, ...]) -> None:
    ours = [
        c
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet")
        for c in o["spec"]["template"]["spec"]["containers"]
        if c["image"].startswith("interference-")
    ]
    assert len(ours) >= 4
    assert all(c["imagePullPolicy"] == "Never" for c in ours), ours
    redis = container(find(objects, "Deployment", "redis"), "redis")
    assert redis["image"] == "interference-redis:7.0.15"


def has_legacy_capabilities(objects: tuple[Obj, ...]) -> None:
    agent = container(find(objects, "DaemonSet", "interference-agent"), "agent")
    assert "SYS_ADMIN" in agent["securityContext"]["capabilities"]["add"]


def uses_host_namespaces(objects: tuple[Obj, ...]) -> None:
    agent = find(objects, "DaemonSet", "interference-agent")["spec"]["template"]["spec"]
    assert agent["hostPID"] is True and agent["hostNetwork"] is True
    assert "NET_ADMIN" in container_of(agent, "agent")["securityContext"]["capabilities"]["add"]


def names_cilium_entities(objects: tuple[Obj, ...]) -> None:
    policies = [o for o in objects if o["kind"] == "CiliumNetworkPolicy"]
    entities = {e for p in policies for rule in p["spec"]["egress"] for e in rule["toEntities"]}
    assert entities == {"kube-apiserver", "host"}
    names = {o["metadata"]["name"] for o in objects if o["kind"] == "NetworkPolicy"}
    assert not {"apiserver", "interference-agent-kubelet"} & names


def container_of(spec: Obj, name: str) -> Obj:
    found: Obj = next(c for c in spec["containers"] if c["name"] == name)
    return found


def is_extender(objects: tuple[Obj, ...]) -> None:
    assert scheduler_args(objects)[0] == "extender"
    find(objects, "Deployment", "interference-kube-scheduler")
    find(objects, "Service", "interference-scheduler-extender")


def uses_external_redis(objects: tuple[Obj, ...]) -> None:
    assert not [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "redis"
    ]


def degrades_in_dry_run(objects: tuple[Obj, ...]) -> None:
    agent = container(find(objects, "DaemonSet", "interference-agent"), "agent")
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["DEGRADE"] == "dry-run"
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert mounts["/sys/fs/cgroup"].get("readOnly") is False
    assert env["DEGRADE_STATE_FILE"].startswith(mounts["/run/interference-agent"]["mountPath"])
    role = find(objects, "ClusterRole", "interference-agent-degrade")
    assert role["rules"] == [
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}
    ]


def has_podmonitors(objects: tuple[Obj, ...]) -> None:
    monitors = {
        (o["metadata"]["namespace"], o["metadata"]["name"])
        for o in objects
        if o["kind"] == "PodMonitor"
    }
    assert monitors == {
        ("interference-agent", "interference-agent"),
        ("interference-system", "interference-scheduler"),
        ("interference-system", "interference-credentials"),
    }
    agent = find(objects, "DaemonSet", "interference-agent")["spec"]["template"]
    assert agent["metadata"]["annotations"]["prometheus.io/scrape"] == "true"  # kept


EFFECT: dict[str, Callable[[tuple[Obj, ...]], None]] = {
    "degrade": degrades_in_dry_run,
    "dry-run": is_dry_run,
    "local-images": uses_local_images,
    "legacy-kernel": has_legacy_capabilities,
    "extender": is_extender,
    "external-redis": uses_external_redis,
    "host-namespaces": uses_host_namespaces,
    "cilium": names_cilium_entities,
    "prometheus-operator": has_podmonitors,
}
"""What each component must still do in any combination."""


def no_object_twice(objects: tuple[Obj, ...]) -> None:
    ids = Counter(
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects
    )
    assert [i for i, n in ids.items() if n > 1] == []


def test_every_overlay_is_the_base_plus_its_component() -> None:
    assert set(components()) == set(EFFECT)
    for name in components():
        overlay = DEPLOY / "overlays" / name / "kustomization.yaml"
        assert yaml.safe_load(overlay.read_text()) == {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": ["../../base"],
            "components": [f"../../components/{name}"],
        }
        component = yaml.safe_load((COMPONENTS / name / "kustomization.yaml").read_text())
        assert component["kind"] == "Component"
        assert name in kustomizations()
        EFFECT[name](render(kustomizations()[name]))


def test_the_table_lists_every_overlay_and_combinations_both_ways() -> None:
    table = documented_combinations()
    assert set(table) == set(components())
    for name, others in table.items():
        assert others <= set(components()) - {name}
        for other in others:
            assert name in table[other], f"{other} combines with {name} one way only"
    assert ("dry-run", "local-images") in pairs()


@pytest.mark.parametrize("names", pairs(), ids="+".join)
def test_a_documented_combination_renders_with_both_effects(
    names: tuple[str, str], tmp_path: Path
) -> None:
    for order in itertools.permutations(names):
        objects = combination(tmp_path, order)
        no_object_twice(objects)
        for name in names:
            EFFECT[name](objects)
    errors = [error for obj in objects for error in validation_errors(obj)]
    assert not errors, "\n".join(errors)


def test_three_components_combine(tmp_path: Path) -> None:
    objects = combination(tmp_path, ("dry-run", "legacy-kernel", "local-images"))
    no_object_twice(objects)
    for name in ("dry-run", "legacy-kernel", "local-images"):
        EFFECT[name](objects)


def test_the_docs_example_renders(tmp_path: Path) -> None:
    """The doc's own kustomization, written next to a copy of the layout it assumes."""
    (text,) = DOC_COMBINATION.findall(DOC.read_text())
    example = yaml.safe_load(text)
    assert example["resources"] == ["../deploy/base"]
    directory = tmp_path / "my-combination"
    directory.mkdir()
    relative = os.path.relpath(DEPLOY, directory)
    example["resources"] = [r.replace("../deploy", relative) for r in example["resources"]]
    example["components"] = [c.replace("../deploy", relative) for c in example["components"]]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(example))
    objects = render(directory)
    no_object_twice(objects)
    for path in example["components"]:
        EFFECT[Path(path).name](objects)


def test_kustomizations_as_resources_still_clash_so_the_doc_warns(tmp_path: Path) -> None:
    """Why components: two overlays as resources hold the base twice."""
    directory = tmp_path / "two-overlays"
    directory.mkdir()
    overlays = [
        os.path.relpath(DEPLOY / "overlays" / n, directory) for n in ("dry-run", "local-images")
    ]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({"resources": overlays}))
    done = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "already registered id" in done.stderr
    assert "already registered id" in DOC.read_text()


def test_the_extender_docs_say_to_match_the_cluster_version() -> None:
    image = container(
        find(render(kustomizations()["extender"]), "Deployment", "interference-kube-scheduler"),
        "kube-scheduler",
    )["image"]
    assert image.startswith("registry.k8s.io/kube-scheduler:v")
    tag = image.rsplit(":", 1)[1]
    text = DOC.read_text()
    assert f"`{tag}`" in text and "version-skew-policy" in text
    assert "skew policy" in (COMPONENTS / "extender" / "kustomization.yaml").read_text()


def test_the_kube_scheduler_version_is_changed_with_images(tmp_path: Path) -> None:
    """The doc's way to match the cluster: an ``images:`` entry over the component."""
    directory = tmp_path / "pinned"
    directory.mkdir()
    (directory / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOY / "base", directory)],
                "components": [os.path.relpath(COMPONENTS / "extender", directory)],
                "images": [{"name": "registry.k8s.io/kube-scheduler", "newTag": "v1.33.4"}],
            }
        )
    )
    objects = render(directory)
    kube_scheduler = find(objects, "Deployment", "interference-kube-scheduler")
    assert container(kube_scheduler, "kube-scheduler")["image"].endswith(":v1.33.4")
