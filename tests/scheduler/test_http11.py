"""The minimal HTTP/1.1 connection against a real TCP server that answers canned bytes."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from scheduler.adapters.http11 import Answer, Http11Connection


class CannedServer:
    """Accepts one connection on 127.0.0.1 and answers each request with the next reply.

    A request is read up to its headers' end plus ``Content-Length`` bytes; the raw bytes
    of every request are kept for the test to inspect. A reply of ``None`` closes the
    connection instead of answering; so does running out of replies.
    """

    def __init__(self, replies: list[bytes | None]) -> None:
        self.replies = replies
        self.requests: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        try:
            connection, _ = self.listener.accept()
        except OSError:  # the test closed the listener without connecting (nothing was sent)
            return
        with connection, connection.makefile("rb") as reader:
            for reply in self.replies:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.requests.append(head + reader.read(length))
                if reply is None:
                    return
                connection.sendall(reply)


@contextmanager
def canned(replies: list[bytes | None]) -> Iterator[tuple[CannedServer, Http11Connection]]:
    server = CannedServer(replies)
    server.thread.start()
    connection = Http11Connection("127.0.0.1", server.port, timeout_s=5.0)
    try:
        yield server, connection
    finally:
        connection.close()
        server.listener.close()
        server.thread.join(5)


def post(connection: Http11Connection, body: bytes = b'{"a":1}') -> Answer:
    return connection.exchange(
        "POST", "/api/v1/x", {"Content-Type": "application/json", "Accept": "*/*"}, body
    )


@pytest.mark.parametrize(
    ("name", "reply", "status", "body", "will_close"),
    [
        (
            "content-length",
            b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nhello",
            201,
            b"hello",
            False,
        ),
        (
            "chunked with extension and trailer",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n",
            200,
            b"abcde",
            False,
        ),
        (
            "connection close",
            b"HTTP/1.1 409 Conflict\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
            409,
            b"{}",
            True,
        ),
        (
            "HTTP/1.0 without keep-alive",
            b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
            200,
            b"",
            True,
        ),
        ("no length: body to EOF", b"HTTP/1.1 200 OK\r\n\r\nrest of it", 200, b"rest of it", True),
        ("204 has no body", b"HTTP/1.1 204 No Content\r\n\r\n", 204, b"", False),
        (
            "interim 100 Continue skipped",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\nx",
            201,
            b"x",
            False,
        ),
        (
            "repeated identical Content-Length",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\ny",
            200,
            b"y",
            False,
        ),
    ],
)
def test_answer_framing(
    name: str, reply: bytes, status: int, body: bytes, will_close: bool
) -> None:
    with canned([reply]) as (_, connection):
        answer = post(connection)
    assert (answer.status, answer.body, answer.will_close) == (status, body, will_close), name


def test_request_is_one_well_formed_message_and_connection_is_reused() -> None:
    ok = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    with canned([ok, ok]) as (server, connection):
        first = post(connection, b'{"kind":"Binding"}')
        second = post(connection, b"{}")
    assert first.headers == {"content-type": "application/json", "content-length": "2"}
    assert first.reason == "Created" and second.status == 201
    assert server.requests[0] == (
        b"POST /api/v1/x HTTP/1.1\r\n"
        + f"Host: 127.0.0.1:{server.port}\r\n".encode()
        + b"Content-Type: application/json\r\nAccept: */*\r\nContent-Length: 18\r\n\r\n"
        + b'{"kind":"Binding"}'
    )
    assert len(server.requests) == 2  # both over the one connection


@pytest.mark.parametrize(
    ("name", "reply", "error"),
    [
        ("closed without answering", None, http.client.RemoteDisconnected),
        ("not HTTP", b"SSH-2.0-OpenSSH\r\n\r\n", http.client.BadStatusLine),
        ("status not a number", b"HTTP/1.1 OK fine\r\n\r\n", http.client.BadStatusLine),
        ("header without colon", b"HTTP/1.1 200 OK\r\nbroken\r\n\r\n", http.client.BadStatusLine),
        (
            "conflicting Content-Length",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx",
            http.client.BadStatusLine,
        ),
        (
            "body shorter than Content-Length",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
            http.client.IncompleteRead,
        ),
        (
            "bad chunk size",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            http.client.IncompleteRead,
        ),
        (
            "status line too long",
            b"HTTP/1.1 200 " + b"x" * 70000 + b"\r\n\r\n",
            http.client.LineTooLong,
        ),
    ],
)
def test_broken_answers_raise_http_client_errors(
    name: str, reply: bytes | None, error: type[Exception]
) -> None:
    # The server closes after its reply; every failure is one of http.client's.
    with canned([reply]) as (_, connection), pytest.raises(http.client.HTTPException) as caught:
        post(connection)
    assert isinstance(caught.value, error), name


def test_header_with_line_break_is_refused_before_sending() -> None:
    with canned([None]) as (server, connection), pytest.raises(ValueError, match="line break"):
        connection.exchange("POST", "/x", {"Authorization": "Bearer a\r\nX-Evil: 1"}, b"")
    assert server.requests == []
