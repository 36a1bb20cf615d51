"""scripts/create-extender-certs.sh on a real kube-apiserver: it creates the two Secrets the
extender component mounts, whose certificates chain to one CA and serve a real TLS
handshake with client authentication between them; a second run keeps them, ``--rotate``
replaces both with a new CA, and one Secret without the other is refused."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from interference_infra.server_tls import ServerTls
from tests.deploy.manifests import REPO, find, render
from tests.e2e.test_install_secret import NAMESPACE, kubectl, run
from tests.interference_infra.test_http_limits import SERVER_NAME

pytestmark = [pytest.mark.e2e]

__all__ = ["kubectl"]  # the fixture: a kubectl for a fresh control plane

SCRIPT = REPO / "scripts" / "create-extender-certs.sh"
SERVING = "interference-extender-serving"
CLIENT = "interference-extender-client"


def create_certs(kubectl: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KUBECTL": str(kubectl)},
    )


def secret(kubectl: Path, name: str) -> tuple[str, dict[str, bytes]]:
    """The Secret's type and decoded data."""
    done = run(kubectl, "-n", NAMESPACE, "get", "secret", name, "-o", "json")
    assert done.returncode == 0, done.stderr
    obj = json.loads(done.stdout)
    return obj["type"], {k: base64.b64decode(v) for k, v in obj["data"].items()}


def write_files(directory: Path, data: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in data.items():
        (directory / key).write_bytes(value)
    return directory


def handshake(serving: Path, client: Path | None) -> bool:
    """A TLS handshake and one byte each way between a server on ``serving``'s files
    (requiring a client certificate from its ca.crt) and a client on ``client``'s."""
    tls = ServerTls(str(serving / "tls.crt"), str(serving / "tls.key"), str(serving / "ca.crt"))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    served: list[bool] = []

    def serve() -> None:
        connection, _ = listener.accept()
        connection.settimeout(10)
        try:
            with tls.context().wrap_socket(connection, server_side=True) as wrapped:
                wrapped.sendall(wrapped.recv(1))
                served.append(True)
        except (ssl.SSLError, OSError):
            served.append(False)

    thread = threading.Thread(target=serve)
    thread.start()
    context = ssl.create_default_context(cafile=str((client or serving) / "ca.crt"))
    if client is not None:
        context.load_cert_chain(str(client / "tls.crt"), str(client / "tls.key"))
    echoed = b""
    try:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        with context.wrap_socket(raw, server_hostname=SERVER_NAME) as wrapped:
            wrapped.sendall(b"x")
            echoed = wrapped.recv(1)
    except (ssl.SSLError, OSError):
        pass
    finally:
        thread.join(10)
        listener.close()
    return echoed == b"x" and served == [True]


def test_the_script_makes_the_secrets_the_component_mounts(kubectl: Path, tmp_path: Path) -> None:
    done = create_certs(kubectl)
    assert done.returncode == 0, done.stderr
    assert f"created secrets {NAMESPACE}/{SERVING} and {NAMESPACE}/{CLIENT}" in done.stdout
    objects = render(REPO / "deploy" / "overlays" / "extender")
    mounted = {
        volume["secret"]["secretName"]
        for kind, name in (
            ("Deployment", "interference-scheduler"),
            ("Deployment", "interference-kube-scheduler"),
        )
        for volume in find(objects, kind, name)["spec"]["template"]["spec"]["volumes"]
        if "secret" in volume and volume["secret"]["secretName"].startswith("interference-ext")
    }
    assert mounted == {SERVING, CLIENT}
    files = {}
    for name in (SERVING, CLIENT):
        kind, data = secret(kubectl, name)
        assert kind == "kubernetes.io/tls" and set(data) == {"tls.crt", "tls.key", "ca.crt"}
        files[name] = write_files(tmp_path / name, data)
    assert handshake(files[SERVING], files[CLIENT])
    assert not handshake(files[SERVING], None)  # no client certificate: refused

    again = create_certs(kubectl)  # kept
    assert again.returncode == 0 and "kept" in again.stdout
    for name in (SERVING, CLIENT):
        assert secret(kubectl, name)[1]["tls.crt"] == (files[name] / "tls.crt").read_bytes()

    rotated = create_certs(kubectl, "--rotate")
    assert rotated.returncode == 0, rotated.stderr
    assert "rollout restart deploy/interference-kube-scheduler" in rotated.stdout
    new = {name: write_files(tmp_path / f"new-{name}", secret(kubectl, name)[1])
           for name in (SERVING, CLIENT)}  # fmt: skip
    assert (new[SERVING] / "ca.crt").read_bytes() != (files[SERVING] / "ca.crt").read_bytes()
    assert handshake(new[SERVING], new[CLIENT])
    assert not handshake(new[SERVING], files[CLIENT])  # the old client certificate: refused

    assert run(kubectl, "-n", NAMESPACE, "delete", "secret", CLIENT).returncode == 0
    half = create_certs(kubectl)
    assert half.returncode == 1 and "--rotate" in half.stderr
