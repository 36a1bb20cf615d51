"""Rendering the kustomizations under deploy/ and finding objects in them (test helpers)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
EXAMPLES = DEPLOY / "examples"

Obj = dict[str, Any]


def kustomizations() -> dict[str, Path]:
    """``base`` (what ``kubectl apply -k deploy/`` installs) and every overlay by name."""
    found = {"base": DEPLOY}
    for kustomization in sorted((DEPLOY / "overlays").glob("*/kustomization.yaml")):
        found[kustomization.parent.name] = kustomization.parent
    return found


@functools.cache
def render(directory: Path) -> tuple[Obj, ...]:
    """Objects of ``kubectl kustomize DIRECTORY``; fails the test with kubectl's message."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed (kubectl >= 1.32 with kustomize v5 is needed)")
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        pytest.fail(f"kubectl kustomize {directory} failed:\n{done.stderr}")
    return tuple(obj for obj in yaml.safe_load_all(done.stdout) if obj)


def load_examples() -> dict[str, list[Obj]]:
    """Objects of each file in deploy/examples/, by file name."""
    return {
        path.name: [obj for obj in yaml.safe_load_all(path.read_text()) if obj]
        for path in sorted(EXAMPLES.glob("*.yaml"))
    }


def find(objects: tuple[Obj, ...] | list[Obj], kind: str, name: str) -> Obj:
    """The one object of ``kind`` named ``name`` (plus the hash suffix kustomize gives
    generated ConfigMaps and Secrets)."""
    pattern = re.compile(rf"{re.escape(name)}(-[a-z0-9]{{10}})?")
    matches = [o for o in objects if o["kind"] == kind and pattern.fullmatch(o["metadata"]["name"])]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_templates(objects: tuple[Obj, ...] | list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(owner object, pod template) of every workload object."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            yield obj, obj["spec"]["template"]
        elif obj["kind"] == "CronJob":
            yield obj, obj["spec"]["jobTemplate"]["spec"]["template"]
        elif obj["kind"] == "Pod":
            yield obj, obj


def container(workload: Obj, name: str) -> Obj:
    """The container ``name`` of a workload's pod template."""
    containers = workload["spec"]["template"]["spec"]["containers"]
    matches = [c for c in containers if c["name"] == name]
    assert len(matches) == 1, f"{workload['metadata']['name']} has no container {name}"
    found: Obj = matches[0]
    return found
