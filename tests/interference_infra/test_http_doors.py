"""No door held by a slow or anonymous client (issue 28), on the shared endpoint over real
sockets: clients that send a byte every 2 s, or stall their TLS handshake, hold no
request thread, are closed at their deadline and counted, and meanwhile ``/healthz``,
``/readyz`` and a route are answered at once. Attackers connect from other loopback
addresses (127.0.0.2 on), as pods of their own would; the probes from 127.0.0.1."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from interference_infra.http import HealthEndpoint, ServerLimits
from interference_infra.server_tls import ServerTls
from tests.interference_infra.test_http_limits import (
    SERVER_NAME,
    Recorder,
    client_context,
    https_post,
    make_certs,
)

PROBE_LIMIT_S = 1.0
"""A probe answered later than this counts as timed out (kubelet's default is 1 s)."""


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs"))


class Trickle:
    """``count`` connections from ``addresses`` (round robin) that send a request one byte
    every ``every_s`` seconds, re-opening any the server closes, until stopped."""

    REQUEST = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789"

    def __init__(self, port: int, count: int, addresses: list[str], every_s: float = 2.0):
        self.port, self.count, self.addresses, self.every_s = port, count, addresses, every_s
        self.stop = threading.Event()
        self.opened = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _connect(self, index: int) -> tuple[socket.socket, int] | None:
        address = self.addresses[index % len(self.addresses)]
        try:
            sock = socket.create_connection(
                ("127.0.0.1", self.port), timeout=2, source_address=(address, 0)
            )
        except OSError:
            return None
        self.opened += 1
        return sock, 0

    def _run(self) -> None:
        held: list[tuple[socket.socket, int] | None] = [self._connect(i) for i in range(self.count)]
        while not self.stop.wait(self.every_s):
            for index, entry in enumerate(held):
                if entry is None:
                    held[index] = self._connect(index)
                    continue
                sock, sent = entry
                try:
                    sock.send(self.REQUEST[sent : sent + 1])
                    held[index] = (sock, (sent + 1) % len(self.REQUEST))
                except OSError:
                    sock.close()
                    held[index] = self._connect(index)
        for entry in held:
            if entry is not None:
                entry[0].close()

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def timed_get(port: int, path: str) -> tuple[int, float]:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    finally:
        connection.close()


def timed_post(port: int, body: bytes) -> tuple[int, float]:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("POST", "/echo", body)
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    finally:
        connection.close()


def serve(recorder: Recorder, limits: ServerLimits, tls: ServerTls | None = None) -> HealthEndpoint:
    endpoint = HealthEndpoint(
        "127.0.0.1",
        0,
        None,
        {"/healthz": lambda: (200, "ok\n"), "/readyz": lambda: (200, "ok\n")},
        post_routes={"/echo": recorder.echo, "/slow": recorder.slow},
        keep_alive=True,
        limits=limits,
        tls=tls,
        on_refused=recorder.refuse,
    )
    endpoint.start()
    return endpoint


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    yield recorder
    recorder.gate.set()


@pytest.mark.slow
@pytest.mark.parametrize("count", [20, 70])
def test_a_byte_every_two_seconds_holds_no_door(recorder: Recorder, count: int) -> None:
    """``count`` trickling connections from ten addresses, against an endpoint of four
    request threads: every probe and every real request is answered within 1 s, no
    trickling connection gets a thread, each is closed at its whole-request deadline."""
    served = serve(recorder, ServerLimits(max_connections=4, request_deadline_s=3.0))
    addresses = [f"127.0.0.{i}" for i in range(2, 12)]
    try:
        with Trickle(served.port, count, addresses):
            time.sleep(1.0)  # every trickling connection is open
            answers = []
            for _ in range(8):  # 8 rounds over ~6 s: past the first deadlines
                answers += [timed_get(served.port, "/healthz"), timed_get(served.port, "/readyz")]
                answers.append(timed_post(served.port, b"real"))
                time.sleep(0.6)
        assert all(status == 200 for status, _ in answers), answers
        slowest = max(elapsed for _, elapsed in answers)
        assert slowest < PROBE_LIMIT_S, answers
        assert recorder.calls == [b"real"] * 8  # no trickled request reached the route
        assert served.pool_threads() <= 1  # the real requests', one at a time
        assert recorder.refused.count("deadline") >= min(count, 8 * len(addresses))
    finally:
        served.stop()


def test_one_address_gets_at_most_its_share(recorder: Recorder) -> None:
    """Forty silent connections from one address: it keeps at most ``max_per_client``
    open, the older ones give way (counted), and another address is served."""
    served = serve(recorder, ServerLimits(max_per_client=5, request_deadline_s=30))
    held = []
    try:
        for _ in range(40):
            held.append(
                socket.create_connection(
                    ("127.0.0.1", served.port), timeout=5, source_address=("127.0.0.2", 0)
                )
            )
        deadline = time.monotonic() + 5
        while recorder.refused.count("per_client") < 35:
            assert time.monotonic() < deadline, recorder.refused
            time.sleep(0.02)
        still_open = 0
        for sock in held:
            sock.setblocking(False)
            try:
                still_open += sock.recv(1) != b""
            except BlockingIOError:
                still_open += 1  # no end of stream: open
        assert still_open == 5
        assert timed_get(served.port, "/healthz")[0] == 200
    finally:
        for sock in held:
            sock.close()
        served.stop()


def test_the_whole_request_has_a_deadline_however_the_bytes_trickle(recorder: Recorder) -> None:
    """Headers then a body a byte every 0.2 s: each read is prompt, the whole is not;
    408 at the deadline, nothing reaches the route."""
    served = serve(recorder, ServerLimits(request_deadline_s=1.5))
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    try:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        started = time.monotonic()
        answer = b""
        try:
            for _ in range(100):
                sock.send(b"x")
                time.sleep(0.2)
        except OSError:
            pass
        sock.settimeout(5)
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except OSError:
            pass
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert time.monotonic() - started < 4
        assert recorder.calls == [] and recorder.refused == ["deadline"]
    finally:
        sock.close()
        served.stop()


def stalled_handshakes(port: int, count: int, addresses: list[str]) -> list[socket.socket]:
    """Connections that send the first bytes of a TLS record and stop."""
    held = []
    for index in range(count):
        sock = socket.create_connection(
            ("127.0.0.1", port), timeout=5, source_address=(addresses[index % len(addresses)], 0)
        )
        sock.send(b"\x16\x03\x01\x02\x00")  # a handshake record's header, no body
        held.append(sock)
    return held


def test_stalled_tls_handshakes_leave_real_calls_answered(certs: Path, recorder: Recorder) -> None:
    """12 (then 40) connections stalling their handshake against an endpoint of 8 threads,
    as the extender's: 7 of 7 real calls are answered 200 at once, and the stalled ones
    are closed at the handshake deadline and counted."""
    tls = ServerTls(str(certs / "serving.crt"), str(certs / "serving.key"), str(certs / "ca.crt"))
    served = serve(recorder, ServerLimits(max_connections=8, handshake_timeout_s=2.0), tls)
    context = client_context(certs, certs)
    addresses = [f"127.0.0.{i}" for i in range(2, 8)]
    held: list[socket.socket] = []
    try:
        for count in (12, 40):
            held += stalled_handshakes(served.port, count, addresses)
            time.sleep(0.3)
            for call in range(7):
                started = time.monotonic()
                assert https_post(served.port, context, f"call {call}".encode())[0] == 200
                assert time.monotonic() - started < PROBE_LIMIT_S
        deadline = time.monotonic() + 10
        while recorder.refused.count("tls_handshake") + recorder.refused.count("per_client") < 52:
            assert time.monotonic() < deadline, recorder.refused
            time.sleep(0.05)
        assert served.pool_threads() <= 1
    finally:
        for sock in held:
            sock.close()
        served.stop()
    assert len(recorder.calls) == 14


def test_health_probes_have_their_own_thread(recorder: Recorder) -> None:
    """Every request thread held inside a slow route, the queue full: the probes are
    still answered."""
    served = serve(recorder, ServerLimits(max_connections=2, max_waiting=2, queue_wait_s=30))
    callers = [
        threading.Thread(target=lambda: timed_post_path(served.port, "/slow"), daemon=True)
        for _ in range(4)
    ]
    try:
        for caller in callers:
            caller.start()
        deadline = time.monotonic() + 5
        while served.pool_threads() < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)
        for path in ("/healthz", "/readyz"):
            status, elapsed = timed_get(served.port, path)
            assert status == 200 and elapsed < PROBE_LIMIT_S
    finally:
        recorder.gate.set()
        for caller in callers:
            caller.join(10)
        served.stop()


def timed_post_path(port: int, path: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        connection.request("POST", path, b"x")
        connection.getresponse().read()
    except OSError:
        pass
    finally:
        connection.close()


def test_a_tls_client_sending_its_request_with_the_handshake_is_answered(
    certs: Path, recorder: Recorder
) -> None:
    """Keep-alive over TLS: three requests on one connection, each answered."""
    tls = ServerTls(str(certs / "serving.crt"), str(certs / "serving.key"), str(certs / "ca.crt"))
    served = serve(recorder, ServerLimits(), tls)
    try:
        raw = socket.create_connection(("127.0.0.1", served.port), timeout=5)
        with client_context(certs, certs).wrap_socket(raw, server_hostname=SERVER_NAME) as conn:
            for index in range(3):
                body = f"kept {index}".encode()
                conn.sendall(
                    b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                answer = b""
                while not answer.endswith(body):
                    chunk = conn.recv(4096)
                    assert chunk, answer
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 200")
    except ssl.SSLError as exc:
        raise AssertionError(exc) from exc
    finally:
        served.stop()
    assert recorder.calls == [b"kept 0", b"kept 1", b"kept 2"]
