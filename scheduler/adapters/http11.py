"""A minimal HTTP/1.1 client connection for the scheduler's small API writes.

Each Binding and Event is one request of a few hundred bytes answered by a few hundred
bytes, a thousand times a second. ``http.client`` spends most of that on generality:
building the request line by line and parsing the answer's headers through the
``email`` package took more interpreter time than the rest of a write together. This
connection sends a request as one buffer and reads the answer with a handful of
``readline`` calls: status line, headers (``Content-Length``, ``Transfer-Encoding:
chunked``, ``Connection``), body by length, by chunks or to the end of the connection.

Errors are ``http.client``'s (``RemoteDisconnected``, ``BadStatusLine``,
``IncompleteRead``, ``LineTooLong``, all :class:`http.client.HTTPException`) and
``OSError``, so callers handle them like any ``http.client`` failure. After any error the
connection is unusable and must be closed.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from dataclasses import dataclass

_MAX_LINE = 65536
"""Longest status, header or chunk-size line accepted (as ``http.client``)."""
_MAX_HEADERS = 100
_NO_BODY_STATUS = frozenset({204, 304})


@dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP answer: status, reason, lower-cased headers and the whole body."""

    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    will_close: bool
    """The server closes the connection after this answer (or its body ran to EOF)."""


class Http11Connection:
    """One kept-alive connection to ``host:port`` (TLS when ``context`` is given).

    Not thread-safe: use one per thread.
    """

    def __init__(
        self, host: str, port: int, timeout_s: float, context: ssl.SSLContext | None = None
    ) -> None:
        raw = socket.create_connection((host, port), timeout=timeout_s)
        try:
            # The request goes out in one send; no reason to hold small packets back.
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock: socket.socket = (
                raw if context is None else context.wrap_socket(raw, server_hostname=host)
            )
        except BaseException:
            raw.close()
            raise
        self._reader = self.sock.makefile("rb")
        default_port = 443 if context is not None else 80
        bracketed = f"[{host}]" if ":" in host else host
        self.host_header = bracketed if port == default_port else f"{bracketed}:{port}"

    def close(self) -> None:
        self._reader.close()
        self.sock.close()

    def exchange(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Answer:
        """Send one request with ``body`` and return the complete answer."""
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines.append(f"Content-Length: {len(body)}")
        joined = "".join(lines)
        if "\r" in joined or "\n" in joined:  # would let a value inject headers
            raise ValueError("an HTTP request line or header contains a line break")
        head = "\r\n".join(lines) + "\r\n\r\n"
        self.sock.sendall(head.encode("latin-1") + body)
        return self._answer(method)

    def _answer(self, method: str) -> Answer:
        status, reason, version = self._status_line()
        while status == 100:  # interim answer; the real one follows
            self._headers()
            status, reason, version = self._status_line()
        headers = self._headers()
        connection = headers.get("connection", "").lower()
        will_close = "close" in connection or (
            version == "HTTP/1.0" and "keep-alive" not in connection
        )
        if method == "HEAD" or status in _NO_BODY_STATUS or 100 <= status < 200:
            body = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._chunked()
        elif "content-length" in headers:
            body = self._exactly(_content_length(headers["content-length"]))
        else:  # the body runs to the end of the connection
            body = self._reader.read()
            will_close = True
        return Answer(status, reason, headers, body, will_close)

    def _line(self) -> bytes:
        line = self._reader.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise http.client.LineTooLong("status, header or chunk-size line")
        return line

    def _status_line(self) -> tuple[int, str, str]:
        line = self._line()
        if not line:
            raise http.client.RemoteDisconnected(
                "the server closed the connection without answering"
            )
        parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise http.client.BadStatusLine(repr(line))
        return int(parts[1]), parts[2] if len(parts) == 3 else "", parts[0]

    def _headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS + 1):
            line = self._line()
            if line in (b"\r\n", b"\n"):
                return headers
            if not line:
                raise http.client.RemoteDisconnected("the connection closed inside the headers")
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise http.client.BadStatusLine(f"malformed header line {line!r}")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        raise http.client.HTTPException(f"more than {_MAX_HEADERS} headers")

    def _exactly(self, size: int) -> bytes:
        data = self._reader.read(size)
        if len(data) < size:
            raise http.client.IncompleteRead(data, size - len(data))
        return data

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size_text = self._line().split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise http.client.IncompleteRead(b"".join(parts)) from None
            if size == 0:
                break
            parts.append(self._exactly(size))
            self._exactly(2)  # the CRLF after each chunk
        while self._line() not in (b"\r\n", b"\n", b""):  # trailers, ignored
            pass
        return b"".join(parts)


def _content_length(text: str) -> int:
    # Repeated identical values arrive joined ("12, 12"); anything else is malformed.
    values = {value.strip() for value in text.split(",")}
    if len(values) != 1 or not (value := values.pop()).isdigit():
        raise http.client.BadStatusLine(f"malformed Content-Length {text!r}")
    return int(value)
