"""KubeletPodDirectory: pod names from a kubelet's ``GET /pods`` over TLS with a bearer token,
served here by an HTTPS server answering as the kubelet does (its PodList, 401 for a token it
cannot review, 403 for a denied ``get nodes/pods``). The real kubelet, with webhook
authentication and authorisation, is exercised by ``make e2e-cluster`` (the agent names the
example pod)."""

from __future__ import annotations

import http.server
import json
import ssl
import subprocess
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.kubelet_pods import (
    KUBELET_PERMISSION,
    KubeletPodDirectory,
    KubeletRefused,
    KubeletSettings,
    pods_of_node,
)

NODE = "gpu-node-1"
TOKEN = "a-service-account-token"


def pod(uid: str, name: str, namespace: str = "shop", node: str | None = NODE) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"uid": uid, "name": name, "namespace": namespace}, "spec": spec}


class FakeKubelet:
    """An HTTPS server answering ``GET /pods`` as a kubelet: the PodList it holds for a
    request with the expected bearer token, else ``status`` (401 or 403)."""

    def __init__(self, certificate: Path, key: Path) -> None:
        self.pods: list[dict[str, Any]] = []
        self.status = 200
        self.requests: list[tuple[str, str, str]] = []
        kubelet = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                kubelet.requests.append(
                    (self.command, self.path, self.headers.get("Authorization", ""))
                )
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    status = 401
                else:
                    status = kubelet.status
                body = (
                    json.dumps({"kind": "PodList", "apiVersion": "v1", "items": kubelet.pods})
                    if status == 200
                    else "Forbidden"
                ).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certificate, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}"

    def pods_requests(self) -> int:
        return sum(1 for _, path, _ in self.requests if path == "/pods")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed serving certificate for 127.0.0.1, as a kubelet makes its own."""
    directory = tmp_path_factory.mktemp("kubelet-pki")
    return self_signed(directory, "127.0.0.1")


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}"]
    kind = "IP" if name[0].isdigit() else "DNS"
    command += ["-addext", f"subjectAltName={kind}:{name}"]
    subprocess.run(command, check=True, capture_output=True)
    return cert, key


@pytest.fixture
def kubelet(certificate: tuple[Path, Path]) -> Iterator[FakeKubelet]:
    server = FakeKubelet(*certificate)
    yield server
    server.close()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def settings(url: str, token: Path, **overrides: Any) -> KubeletSettings:
    fast: dict[str, Any] = {
        "poll_interval_s": 0.5,
        "min_interval_s": 0.05,
        "deleted_grace_s": 0.0,
        "backoff_max_s": 0.2,
        "timeout_s": 5.0,
    }
    return KubeletSettings(url=url, token_file=str(token), **{**fast, **overrides})


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_lists_this_nodes_pods_with_the_token_over_self_signed_tls(
    kubelet: FakeKubelet, token_file: Path
) -> None:
    kubelet.pods = [pod("uid-1", "api-0"), pod("uid-2", "web-0", "front")]
    directory = KubeletPodDirectory(settings(kubelet.url, token_file), NODE)
    assert directory.list_once() == 2
    assert directory.lookup("uid-1") == ("shop", "api-0")
    assert directory.lookup("uid-2") == ("front", "web-0")
    assert kubelet.requests == [("GET", "/pods", f"Bearer {TOKEN}")]
    # The kubelet authorises GET /pods as get nodes/pods (what the ClusterRole grants).
    assert KUBELET_PERMISSION == ("", "nodes/pods", "get")


def test_a_ca_file_verifies_the_kubelets_certificate(
    kubelet: FakeKubelet, token_file: Path, certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    kubelet.pods = [pod("uid-1", "api-0")]
    trusted = KubeletPodDirectory(
        settings(kubelet.url, token_file, ca_file=str(certificate[0])), NODE
    )
    assert trusted.list_once() == 1
    other, _ = self_signed(tmp_path, "other")
    untrusted = KubeletPodDirectory(settings(kubelet.url, token_file, ca_file=str(other)), NODE)
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        untrusted.list_once()


@pytest.mark.parametrize(
    ("status", "message"),
    [(403, "refused get nodes/pods"), (401, "authentication.webhook")],
)
def test_refusals_say_what_to_fix(
    kubelet: FakeKubelet, token_file: Path, status: int, message: str
) -> None:
    kubelet.status = status
    directory = KubeletPodDirectory(settings(kubelet.url, token_file), NODE)
    with pytest.raises(KubeletRefused, match=message):
        directory.list_once()


def test_an_unreadable_token_is_a_refusal(kubelet: FakeKubelet, tmp_path: Path) -> None:
    directory = KubeletPodDirectory(settings(kubelet.url, tmp_path / "absent"), NODE)
    with pytest.raises(KubeletRefused, match="cannot read the token"):
        directory.list_once()
    assert kubelet.requests == []


def test_an_unknown_uid_lists_again_and_deleted_pods_are_forgotten(
    kubelet: FakeKubelet, token_file: Path
) -> None:
    kubelet.pods = [pod("uid-1", "api-0")]
    directory = KubeletPodDirectory(
        settings(kubelet.url, token_file, poll_interval_s=30.0, deleted_grace_s=0.3), NODE
    )
    directory.start()
    try:
        assert directory.wait_synced(10)
        before = kubelet.pods_requests()
        kubelet.pods = [pod("uid-1", "api-0"), pod("uid-2", "api-1")]
        assert directory.lookup("uid-2") is None  # asks the kubelet at once
        wait_until(lambda: directory.lookup("uid-2") == ("shop", "api-1"), "a new pod named")
        assert kubelet.pods_requests() > before
        kubelet.pods = [pod("uid-2", "api-1")]
        directory.lookup("uid-unknown")  # one more listing, which sees uid-1 gone
        wait_until(lambda: directory.deleted_since("uid-1") is not None, "uid-1 seen gone")
        assert directory.lookup("uid-1") == ("shop", "api-0")  # within the grace
        wait_until(lambda: directory.lookup("uid-1") is None, "uid-1 forgotten")
    finally:
        directory.stop()


def test_keeps_trying_while_refused_and_recovers(kubelet: FakeKubelet, token_file: Path) -> None:
    kubelet.status = 403
    kubelet.pods = [pod("uid-1", "api-0")]
    directory = KubeletPodDirectory(settings(kubelet.url, token_file), NODE)
    directory.start()
    try:
        wait_until(lambda: directory.errors >= 2, "two refused listings")
        assert not directory.wait_synced(0)
        kubelet.status = 200
        assert directory.wait_synced(10)
        assert directory.lookup("uid-1") == ("shop", "api-0")
    finally:
        directory.stop()
    assert directory._thread is not None and not directory._thread.is_alive()


def test_pods_of_node_keeps_this_nodes_well_formed_pods() -> None:
    body = {
        "items": [
            pod("uid-1", "api-0"),
            pod("uid-2", "elsewhere", node="other-node"),
            pod("uid-3", "static", node=None),
            {"metadata": {"uid": 7, "name": "x", "namespace": "y"}, "spec": {}},
            "not a pod",
        ]
    }
    assert pods_of_node(body, NODE) == {
        "uid-1": ("shop", "api-0"),
        "uid-3": ("shop", "static"),
    }
    with pytest.raises(KubeletRefused, match="no items list"):
        pods_of_node({"kind": "Status"}, NODE)


def test_a_listing_carries_each_pods_tolerance_and_the_next_forgets_it(
    kubelet: FakeKubelet, token_file: Path
) -> None:
    """The agent shows a pod's declared tolerance on /metrics (node_agent/signal_metrics.py):
    read from the same listing, gone with the pod or its annotation."""
    from node_agent.tolerances import PodTolerance

    declared = pod("uid-1", "api-0")
    declared["metadata"]["annotations"] = {"interference.io/max-runq-p99-us": "900"}
    kubelet.pods = [declared, pod("uid-2", "web-0")]
    directory = KubeletPodDirectory(settings(kubelet.url, token_file), NODE)
    directory.list_once()
    assert directory.tolerance("uid-1") == PodTolerance(max_runq_p99_us=900)
    assert directory.tolerance("uid-2") is None
    kubelet.pods = [pod("uid-2", "web-0")]
    directory.list_once()
    assert directory.tolerance("uid-1") is None
