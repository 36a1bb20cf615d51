"""`kubectl apply -k deploy/` on a real kube-apiserver: without the Secret redis-credentials
it fails naming the Secret; after scripts/create-redis-secret.sh it succeeds and neither the
first apply nor a re-apply touches the Secret's passwords, client- or server-side.

deploy/ holds a data-less stub of the Secret (type kubernetes.io/basic-auth), which the API
server's Secret validation refuses to create, and which apply merges into the real Secret
without removing data it never set. Each test gets its own control plane: the install
creates the namespace, and with no namespace controller it could never be removed again.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.manifests import DEPLOY, REPO
from tests.e2e.control_plane import Assets, ControlPlane
from tests.e2e.kube import Kube

pytestmark = [pytest.mark.e2e]

NAMESPACE = "interference-system"
SECRET = "redis-credentials"
SCRIPT = REPO / "scripts" / "create-redis-secret.sh"
# This kube-apiserver build answers /openapi/v2 with 503, so kubectl's client-side schema
# check cannot run (tests/cluster/e2e_cluster.sh wraps kubectl the same way); the server
# validates every object regardless.
KUBECTL_WRAPPER = """#!/bin/sh
case "$1" in
    apply|create|replace) verb=$1; shift; set -- "$verb" --validate=false "$@" ;;
esac
exec {kubectl} --kubeconfig={kubeconfig} --cache-dir={cache} "$@"
"""


@pytest.fixture
def kubectl(assets: Assets, tmp_path: Path) -> Iterator[Path]:
    """A kubectl for a fresh control plane of this test alone, as one executable (the
    script's KUBECTL)."""
    plane = ControlPlane(assets)
    try:
        plane.start()
        wrapper = tmp_path / "kubectl"
        wrapper.write_text(
            KUBECTL_WRAPPER.format(
                kubectl=assets.kubectl,
                kubeconfig=Kube(plane).kubeconfig,
                cache=tmp_path / "kube-cache",  # kubectl's discovery cache stays in the test
            )
        )
        wrapper.chmod(0o755)
        yield wrapper
    finally:
        survivors = plane.stop()
    assert not survivors, f"processes left behind: {survivors}"


def run(kubectl: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(kubectl), *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


def apply(kubectl: Path, mode: str) -> subprocess.CompletedProcess[str]:
    """`kubectl apply -k deploy/`, client-side or ``--server-side``."""
    extra = ["--server-side"] if mode == "server-side" else []
    return run(kubectl, "apply", "-k", str(DEPLOY), *extra)


def create_secret(kubectl: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ["PATH"], "KUBECTL": str(kubectl)},
    )


def secret(kubectl: Path) -> tuple[str, dict[str, str]]:
    """The Secret's type and (base64) data as the API server stores them."""
    done = run(kubectl, "-n", NAMESPACE, "get", "secret", SECRET, "-o",
               "jsonpath={.type} {.data}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    kind, _, data = done.stdout.partition(" ")
    parsed: dict[str, str] = json.loads(data)
    return kind, parsed


@pytest.mark.parametrize("mode", ["client-side", "server-side"])
def test_apply_fails_naming_the_secret_until_the_script_created_it(
    kubectl: Path, mode: str
) -> None:
    missing = apply(kubectl, mode)
    assert missing.returncode != 0
    assert f'The Secret "{SECRET}" is invalid' in missing.stderr
    assert "data[username]: Required value" in missing.stderr
    assert run(kubectl, "-n", NAMESPACE, "get", "secret", SECRET).returncode != 0

    created = create_secret(kubectl)
    assert created.returncode == 0, created.stderr
    assert f"created secret {NAMESPACE}/{SECRET}" in created.stdout
    made_by_script = secret(kubectl)
    assert made_by_script[0] == "kubernetes.io/basic-auth"
    assert {"username", "password", "credentials-password", "scheduler-password",
            "viewer-password"} == set(made_by_script[1])  # fmt: skip

    first = apply(kubectl, mode)
    assert first.returncode == 0, first.stderr
    assert secret(kubectl) == made_by_script
    again = apply(kubectl, mode)
    assert again.returncode == 0, again.stderr
    assert secret(kubectl) == made_by_script


def test_an_old_opaque_secret_is_explained_and_rotate_converts_it(kubectl: Path) -> None:
    """The Secret an older script made (type Opaque) cannot take the stub's type: the apply
    fails on the immutable type, the script says what to run, ``--rotate`` recreates it and
    the apply then succeeds."""
    assert run(kubectl, "create", "namespace", NAMESPACE).returncode == 0
    old = subprocess.run(
        [str(kubectl), "-n", NAMESPACE, "create", "secret", "generic", SECRET,
         "--from-env-file=/dev/stdin"],
        input="admin-password=0123456789abcdef0123\n",
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert old.returncode == 0, old.stderr
    refused = apply(kubectl, "client-side")
    assert refused.returncode != 0
    assert f'The Secret "{SECRET}" is invalid' in refused.stderr
    assert "field is immutable" in refused.stderr

    kept = create_secret(kubectl)
    assert kept.returncode == 1
    assert "exists with type Opaque" in kept.stderr
    assert "scripts/create-redis-secret.sh --rotate" in kept.stderr
    assert secret(kubectl)[0] == "Opaque"

    rotated = create_secret(kubectl, "--rotate")
    assert rotated.returncode == 0, rotated.stderr
    assert "recreated as kubernetes.io/basic-auth" in rotated.stdout
    converted = secret(kubectl)
    assert converted[0] == "kubernetes.io/basic-auth"
    applied = apply(kubectl, "client-side")
    assert applied.returncode == 0, applied.stderr
    assert secret(kubectl) == converted


def test_a_secret_from_before_the_credential_issuer_gains_its_key(kubectl: Path) -> None:
    """The previous release's Secret (basic-auth, an agent password, no
    credentials-password): the script adds the issuer's key with ``kubectl patch`` through
    stdin, keeps every other password, and the apply then succeeds."""
    assert run(kubectl, "create", "namespace", NAMESPACE).returncode == 0
    old = subprocess.run(
        [str(kubectl), "-n", NAMESPACE, "create", "secret", "generic", SECRET,
         "--type", "kubernetes.io/basic-auth", "--from-env-file=/dev/stdin"],
        input="username=admin\npassword=0123456789abcdef0123\nagent-password=0123456789abcdef0124\n"
        "scheduler-password=0123456789abcdef0125\nviewer-password=0123456789abcdef0126\n",
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert old.returncode == 0, old.stderr
    _, before = secret(kubectl)
    added = create_secret(kubectl)
    assert added.returncode == 0, added.stderr
    assert "added credentials-password" in added.stdout
    kind, after = secret(kubectl)
    assert kind == "kubernetes.io/basic-auth"
    assert {k: v for k, v in after.items() if k != "credentials-password"} == before
    assert len(after["credentials-password"]) > 16
    assert create_secret(kubectl).stdout.strip().endswith("kept (use --rotate for new passwords)")
    applied = apply(kubectl, "client-side")
    assert applied.returncode == 0, applied.stderr
    assert secret(kubectl)[1] == after
