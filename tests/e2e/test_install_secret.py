"""`kubectl apply -k deploy/` on a real kube-apiserver: without the Secrets of Redis' users
and certificate it fails naming one; after scripts/create-redis-secret.sh it succeeds and
neither the first apply nor a re-apply touches their data, client- or server-side.

deploy/ holds data-less stubs of the Secrets (kubernetes.io/basic-auth, kubernetes.io/tls),
which the API server's Secret validation refuses to create, and which apply merges into the
real Secrets without removing data they never set. Each test gets its own control plane: the
install creates the namespaces, and with no namespace controller they could never be removed
again.
"""

from __future__ import annotations

import base64
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
SECRETS = (
    "redis-admin",
    "redis-issuer",
    "redis-scheduler",
    "redis-viewer",
    "redis-tls",
    "interference-credentials-tls",
)
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


def secret(kubectl: Path, name: str) -> tuple[str, dict[str, str]]:
    """A Secret's type and (base64) data as the API server stores them."""
    done = run(kubectl, "-n", NAMESPACE, "get", "secret", name, "-o",
               "jsonpath={.type} {.data}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    kind, _, data = done.stdout.partition(" ")
    parsed: dict[str, str] = json.loads(data)
    return kind, parsed


def secrets(kubectl: Path) -> dict[str, tuple[str, dict[str, str]]]:
    return {name: secret(kubectl, name) for name in SECRETS}


@pytest.mark.parametrize("mode", ["client-side", "server-side"])
def test_apply_fails_naming_a_secret_until_the_script_created_them(
    kubectl: Path, mode: str
) -> None:
    missing = apply(kubectl, mode)
    assert missing.returncode != 0
    for name in SECRETS:  # each stub is refused, by name
        assert f'Secret "{name}" is invalid' in missing.stderr, name
    assert "data[username]: Required value" in missing.stderr
    assert run(kubectl, "-n", NAMESPACE, "get", "secret", "redis-admin").returncode != 0

    created = create_secret(kubectl)
    assert created.returncode == 0, created.stderr
    assert "created secret interference-system/redis-tls" in created.stdout
    made_by_script = secrets(kubectl)
    assert made_by_script["redis-tls"][0] == "kubernetes.io/tls"
    issuer_kind, issuer_data = made_by_script["interference-credentials-tls"]
    assert (issuer_kind, set(issuer_data)) == (
        "kubernetes.io/tls",
        {"tls.crt", "tls.key", "ca.crt"},
    )
    for name in SECRETS[:4]:
        kind, data = made_by_script[name]
        assert kind == "kubernetes.io/basic-auth"
        assert set(data) == {"username", "password", "ca.crt"}
    for config_map in ("redis-ca", "interference-credentials-ca"):
        assert (
            run(kubectl, "-n", "interference-agent", "get", "configmap", config_map).returncode == 0
        )

    first = apply(kubectl, mode)
    assert first.returncode == 0, first.stderr
    assert secrets(kubectl) == made_by_script
    again = apply(kubectl, mode)
    assert again.returncode == 0, again.stderr
    assert secrets(kubectl) == made_by_script
    kept = create_secret(kubectl)
    assert kept.returncode == 0 and kept.stdout.count("exists; kept") == len(SECRETS)
    assert secrets(kubectl) == made_by_script


def test_an_older_release_secret_gives_its_passwords_to_the_new_ones(kubectl: Path) -> None:
    """The one Secret redis-credentials of older releases: the script copies its passwords
    into the per-user Secrets (Redis and the components keep them across the upgrade), and
    the apply then succeeds."""
    assert run(kubectl, "create", "namespace", NAMESPACE).returncode == 0
    old = subprocess.run(
        [str(kubectl), "-n", NAMESPACE, "create", "secret", "generic", "redis-credentials",
         "--type", "kubernetes.io/basic-auth", "--from-env-file=/dev/stdin"],
        input="username=admin\npassword=0123456789abcdef0123\ncredentials-password=0123456789abcdef0124\n"
        "scheduler-password=0123456789abcdef0125\nviewer-password=0123456789abcdef0126\n",
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert old.returncode == 0, old.stderr
    done = create_secret(kubectl)
    assert done.returncode == 0, done.stderr
    assert "reused the passwords of admin issuer scheduler viewer" in done.stdout
    passwords = {
        name: base64.b64decode(secret(kubectl, name)[1]["password"]).decode()
        for name in SECRETS[:4]
    }
    assert passwords == {
        "redis-admin": "0123456789abcdef0123",
        "redis-issuer": "0123456789abcdef0124",
        "redis-scheduler": "0123456789abcdef0125",
        "redis-viewer": "0123456789abcdef0126",
    }
    applied = apply(kubectl, "client-side")
    assert applied.returncode == 0, applied.stderr
