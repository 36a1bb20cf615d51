"""``kubectl interference …`` (the executable ``kubectl-interference``): the CLI finds
Redis and the viewer's credentials through the kubeconfig's cluster — the Secret
``redis-viewer`` and a port-forward to ``svc/redis`` — with no set-up (issue 31). A fake
``kubectl`` answers as the real one does, in front of a real redis-server with the
viewer's password."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from interference_cli.kubectl_plugin import main
from tests.cli.test_query import filled
from tests.conftest import RedisServer

pytestmark = pytest.mark.redis
__all__ = ["filled"]

PASSWORD = "viewer-secret"


def fake_kubectl(tmp_path: Path, port: int, *, secret: bool = True) -> Path:
    """A ``kubectl`` that logs its arguments, answers ``get secret redis-viewer`` with a
    basic-auth Secret and ``port-forward`` as kubectl does (then waits to be stopped)."""
    data = {
        "username": base64.b64encode(b"interference-viewer").decode(),
        "password": base64.b64encode(PASSWORD.encode()).decode(),
    }
    body = json.dumps({"kind": "Secret", "type": "kubernetes.io/basic-auth", "data": data})
    script = tmp_path / "kubectl"
    log = tmp_path / "kubectl.log"
    script.write_text(
        f"""#!{sys.executable}
import sys, time
with open({str(log)!r}, "a") as out:
    out.write(" ".join(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
if "get" in args and "secret" in args:
    if not {secret!r}:
        sys.stderr.write('Error from server (Forbidden): secrets "redis-viewer" is forbidden\\n')
        sys.exit(1)
    print({body!r})
    sys.exit(0)
if "port-forward" in args:
    print("Forwarding from 127.0.0.1:{port} -> 6379", flush=True)
    print("Forwarding from [::1]:{port} -> 6379", flush=True)
    time.sleep(600)
sys.exit(2)
"""
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.fixture
def viewer_redis(filled: RedisServer) -> RedisServer:
    client = filled.client()
    client.execute_command(
        "ACL", "SETUSER", "interference-viewer", "on", f">{PASSWORD}", "~intf:*", "+@read",
        "+scan", "+time",
    )  # fmt: skip
    return filled


def test_top_through_the_kubeconfigs_cluster(
    viewer_redis: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubectl = fake_kubectl(tmp_path, viewer_redis.port)
    env = {"PATH": os.environ["PATH"], "KUBECTL": str(kubectl)}
    assert main(["--context", "prod", "top", "-o", "json"], environ=env) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    nodes = {n["node"] for n in json.loads(out)["nodes"]}
    assert {"busy-node", "quiet-node"} <= nodes
    calls = (tmp_path / "kubectl.log").read_text().splitlines()
    assert calls[0] == "--context prod -n interference-system get secret redis-viewer -o json"
    assert calls[1] == "--context prod -n interference-system port-forward svc/redis :6379"
    assert PASSWORD not in out


def test_a_refused_secret_says_which_role_to_bind(
    viewer_redis: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubectl = fake_kubectl(tmp_path, viewer_redis.port, secret=False)
    started = time.monotonic()
    assert main(["top"], environ={"PATH": os.environ["PATH"], "KUBECTL": str(kubectl)}) == 1
    err = capsys.readouterr().err
    assert "redis-viewer" in err and "interference-redis-viewer" in err and "forbidden" in err
    assert time.monotonic() - started < 30


def test_without_kubectl_it_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["top"], environ={"PATH": str(tmp_path), "KUBECTL": "kubectl"}) == 1
    assert "kubectl" in capsys.readouterr().err


def test_a_port_forward_that_fails_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubectl = fake_kubectl(tmp_path, 0)
    text = kubectl.read_text().replace(
        'print("Forwarding from 127.0.0.1:0 -> 6379", flush=True)',
        'sys.stderr.write("error: services \\"redis\\" not found\\n"); sys.exit(1)',
    )
    kubectl.write_text(text)
    assert main(["top"], environ={"PATH": os.environ["PATH"], "KUBECTL": str(kubectl)}) == 1
    err = capsys.readouterr().err
    assert 'gave no local port (error: services "redis" not found)' in err, err


def test_kubectl_finds_the_plugin_by_its_name() -> None:
    """kubectl runs ``kubectl-interference`` from PATH: the package installs that script."""
    import tomllib

    scripts = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert scripts["project"]["scripts"]["kubectl-interference"] == (
        "interference_cli.kubectl_plugin:main"
    )
