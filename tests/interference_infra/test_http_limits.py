"""The shared endpoint's limits and HTTPS over real sockets: a body over the limit is 413 and
never reaches the route, connections beyond the pool wait and then get 503 (or are closed
when the queue is full) while the threads stay bounded, and with client authentication
only a client holding a certificate from the configured CA reaches a handler; renewed
files are served without a restart. Certificates come from the install script
(scripts/create-extender-certs.sh --out)."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from interference_infra.http import HealthEndpoint, ServerLimits
from interference_infra.server_tls import ServerTls
from tests.deploy.manifests import REPO

SCRIPT = REPO / "scripts" / "create-extender-certs.sh"
SERVER_NAME = "interference-scheduler-extender.interference-system.svc"
"""A DNS name of the serving certificate the script makes."""


def make_certs(directory: Path) -> Path:
    """The install script's certificate files (a fresh CA each call) in ``directory``."""
    subprocess.run(
        ["sh", str(SCRIPT), "--out", str(directory)],
        check=True,
        capture_output=True,
        timeout=60,
        env={**os.environ, "KUBECTL": "/nonexistent"},  # --out touches no cluster
    )
    return directory


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Certificates of another CA."""
    return make_certs(tmp_path_factory.mktemp("other-certs"))


class Recorder:
    """Routes that record their calls; ``gate`` holds ``/slow`` until set."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []
        self.refused: list[str] = []
        self.gate = threading.Event()
        self.lock = threading.Lock()

    def echo(self, body: bytes) -> tuple[int, bytes, str]:
        with self.lock:
            self.calls.append(body)
        return 200, body, "application/octet-stream"

    def slow(self, body: bytes) -> tuple[int, bytes, str]:
        self.gate.wait(30)
        return self.echo(body)

    def refuse(self, reason: str) -> None:
        with self.lock:
            self.refused.append(reason)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def serve(recorder: Recorder, limits: ServerLimits, tls: ServerTls | None = None) -> HealthEndpoint:
    endpoint = HealthEndpoint(
        "127.0.0.1",
        0,
        None,
        {},
        post_routes={"/echo": recorder.echo, "/slow": recorder.slow},
        keep_alive=True,
        limits=limits,
        tls=tls,
        on_refused=recorder.refuse,
    )
    endpoint.start()
    return endpoint


@pytest.fixture
def endpoint(recorder: Recorder) -> Iterator[HealthEndpoint]:
    served = serve(recorder, ServerLimits(max_connections=2, max_waiting=3, queue_wait_s=0.5,
                                          max_body_bytes=1000, max_per_client=16))  # fmt: skip
    yield served
    recorder.gate.set()
    served.stop()


def post(port: int, path: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        connection.request("POST", path, body)
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


def test_a_body_over_the_limit_is_413_and_never_reaches_the_route(
    endpoint: HealthEndpoint, recorder: Recorder
) -> None:
    status, body, headers = post(endpoint.port, "/echo", b"x" * 1001)
    assert status == 413 and b"1001 bytes is over this endpoint's limit of 1000" in body
    assert headers["Connection"] == "close"
    assert recorder.calls == [] and recorder.refused == ["too_large"]
    assert post(endpoint.port, "/echo", b"y" * 1000)[:2] == (200, b"y" * 1000)  # at the limit


def test_a_chunked_body_is_refused_with_411(endpoint: HealthEndpoint, recorder: Recorder) -> None:
    client = socket.create_connection(("127.0.0.1", endpoint.port), timeout=10)
    try:
        client.sendall(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n"
        )
        answer = client.recv(4096)
    finally:
        client.close()
    assert answer.startswith(b"HTTP/1.1 411") and b"Content-Length" in answer
    assert recorder.calls == []


def test_connections_beyond_the_pool_wait_then_get_503_and_threads_stay_bounded(
    endpoint: HealthEndpoint, recorder: Recorder
) -> None:
    """Two threads held by slow requests; three more requests wait (longer than
    queue_wait_s, then 503 with Retry-After); beyond the queue of three, requests are
    closed at once; never more than two pool threads."""
    threads_before = threading.active_count()
    answers: dict[str, tuple[int, bytes, dict[str, str]]] = {}

    def call(name: str, path: str) -> None:
        try:
            answers[name] = post(endpoint.port, path, name.encode())
        except OSError as exc:
            answers[name] = (0, str(exc).encode(), {})

    held = [threading.Thread(target=call, args=(f"slow-{i}", "/slow")) for i in range(2)]
    for thread in held:
        thread.start()
    deadline = time.monotonic() + 10
    while endpoint.pool_threads() < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.2)  # both slow requests are inside the route
    waiting = [threading.Thread(target=call, args=(f"wait-{i}", "/echo")) for i in range(3)]
    for thread in waiting:
        thread.start()
    time.sleep(0.3)  # the three are queued before the overflow arrives
    overflow = []
    for _ in range(4):
        client = socket.create_connection(("127.0.0.1", endpoint.port), timeout=10)
        client.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx")
        overflow.append(client)
    for client in overflow:  # closed by the server without an answer
        assert client.recv(1) == b""
        client.close()
    time.sleep(0.5)  # the waiting ones are now past queue_wait_s
    recorder.gate.set()
    for thread in held + waiting:
        thread.join(timeout=20)
    assert [answers[f"slow-{i}"][:2] for i in range(2)] == [(200, b"slow-0"), (200, b"slow-1")]
    for i in range(3):
        status, body, headers = answers[f"wait-{i}"]
        assert (status, headers.get("Retry-After")) == (503, "1"), body
        assert b"all 2 request threads" in body
    assert sorted(recorder.refused) == ["busy"] * 3 + ["queue_full"] * 4
    assert endpoint.pool_threads() == 2
    assert threading.active_count() - threads_before <= 2 + 1  # + at most one joining client
    assert post(endpoint.port, "/echo", b"again")[:2] == (200, b"again")


def test_an_idle_kept_alive_connection_holds_no_thread(recorder: Recorder) -> None:
    """With one request thread, a kept-alive idle connection leaves it free for others and
    is itself served again on its next request."""
    served = serve(recorder, ServerLimits(max_connections=1, queue_wait_s=10))
    try:
        first = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        first.request("POST", "/echo", b"1")
        assert first.getresponse().read() == b"1"  # kept alive and idle
        started = time.monotonic()
        assert post(served.port, "/echo", b"2")[:2] == (200, b"2")
        assert time.monotonic() - started < 1
        first.request("POST", "/echo", b"3")  # the same connection, still open
        assert first.getresponse().read() == b"3"
        first.close()
        assert served.pool_threads() == 1
    finally:
        served.stop()


def client_context(certs: Path | None, client: Path | None) -> ssl.SSLContext:
    """A client trusting ``certs``' CA, presenting ``client``'s certificate when given."""
    context = ssl.create_default_context(cafile=str((certs or client or Path()) / "ca.crt"))
    if client is not None:
        context.load_cert_chain(str(client / "client.crt"), str(client / "client.key"))
    return context


def https_post(port: int, context: ssl.SSLContext, body: bytes) -> tuple[int, bytes]:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with context.wrap_socket(raw, server_hostname=SERVER_NAME) as tls:
        request = (
            f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        tls.sendall(request + body)
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), payload


def refused_over_tls(port: int, context: ssl.SSLContext) -> str:
    """What a client gets when the server refuses its handshake (the error's text)."""
    try:
        https_post(port, context, b"forged")
    except (ssl.SSLError, OSError) as exc:
        return str(exc)
    raise AssertionError("the server answered a client it should have refused")


def test_https_requires_a_client_certificate_from_the_configured_ca(
    certs: Path, other_certs: Path, recorder: Recorder
) -> None:
    tls = ServerTls(str(certs / "serving.crt"), str(certs / "serving.key"), str(certs / "ca.crt"))
    assert tls.client_auth
    served = serve(recorder, ServerLimits(), tls)
    try:
        assert https_post(served.port, client_context(certs, certs), b"signed") == (200, b"signed")
        refused_over_tls(served.port, client_context(certs, None))  # no certificate
        # a certificate of another CA (trusting the server is not the problem: same CA file)
        stranger = client_context(certs, None)
        stranger.load_cert_chain(str(other_certs / "client.crt"), str(other_certs / "client.key"))
        refused_over_tls(served.port, stranger)
        plain = socket.create_connection(("127.0.0.1", served.port), timeout=10)
        plain.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx")
        try:
            answer = plain.recv(4096)
        except ConnectionResetError:
            answer = b""
        assert not answer.startswith(b"HTTP/")  # plain HTTP gets no answer
        plain.close()
        deadline = time.monotonic() + 10
        while recorder.refused.count("tls_handshake") < 3:
            assert time.monotonic() < deadline, recorder.refused
            time.sleep(0.01)
    finally:
        served.stop()
    assert recorder.calls == [b"signed"]


def test_renewed_certificate_files_are_served_without_a_restart(
    certs: Path, other_certs: Path, recorder: Recorder, tmp_path: Path
) -> None:
    live = tmp_path / "live"
    shutil.copytree(certs, live)
    tls = ServerTls(str(live / "serving.crt"), str(live / "serving.key"), str(live / "ca.crt"))
    served = serve(recorder, ServerLimits(), tls)
    try:
        assert https_post(served.port, client_context(certs, certs), b"old")[0] == 200
        renewed = tmp_path / "renewed"
        shutil.copytree(other_certs, renewed)
        os.rename(live, tmp_path / "retired")  # a Secret volume swaps a symlinked directory
        os.rename(renewed, live)
        assert https_post(served.port, client_context(other_certs, other_certs), b"new")[0] == 200
        refused_over_tls(served.port, client_context(other_certs, certs))  # the old client
        (live / "serving.key").write_text("broken\n")  # a bad renewal keeps the last good one
        assert https_post(served.port, client_context(other_certs, other_certs), b"kept")[0] == 200
    finally:
        served.stop()


def test_a_tls_connection_that_waited_too_long_gets_503_over_tls(
    certs: Path, recorder: Recorder
) -> None:
    tls = ServerTls(str(certs / "serving.crt"), str(certs / "serving.key"), str(certs / "ca.crt"))
    served = serve(recorder, ServerLimits(max_connections=1, queue_wait_s=0.3), tls)
    try:
        context = client_context(certs, certs)
        slow = threading.Thread(target=lambda: https_post_path(served.port, context, "/slow"))
        slow.start()
        deadline = time.monotonic() + 10
        while served.pool_threads() < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)  # the slow request holds the one thread
        waited: list[tuple[int, bytes]] = []
        late = threading.Thread(
            target=lambda: waited.append(https_post(served.port, context, b"x"))
        )
        late.start()
        time.sleep(0.6)  # past queue_wait_s
        recorder.gate.set()
        slow.join(10)
        late.join(10)
        assert waited and waited[0][0] == 503 and b"request threads" in waited[0][1]
        assert recorder.refused == ["busy"]
    finally:
        recorder.gate.set()
        served.stop()


def https_post_path(port: int, context: ssl.SSLContext, path: str) -> None:
    raw = socket.create_connection(("127.0.0.1", port), timeout=20)
    with context.wrap_socket(raw, server_hostname=SERVER_NAME) as tls:
        tls.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
        tls.recv(4096)
