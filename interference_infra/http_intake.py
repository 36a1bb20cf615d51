"""The front of every HTTP(S) endpoint (:mod:`interference_infra.http`): one thread that
accepts connections, finishes their TLS handshakes and reads each request whole before a
request thread sees it, so a slow or silent client holds a socket and a buffer, never a
thread, and a health probe is answered however many such clients there are.

Limits (fields of :class:`~interference_infra.http.ServerLimits`):

* at most ``max_per_client`` open connections per client address and ``max_open`` in all.
  A connection over either cap takes the place of the oldest one (of that client, or of
  any) that has not sent a whole request yet, else of the oldest idle kept-alive one;
  when every one is being served it is closed. Slow connections give way, so a probe,
  which sends its request at once, always gets in.
* a TLS handshake must finish within ``handshake_timeout_s`` and a request (line, headers
  and body) within ``request_deadline_s`` of its first byte, however the bytes trickle;
  a kept-alive connection idle for ``request_timeout_s`` is closed.
* headers at most :data:`MAX_HEAD_BYTES`; a body over ``max_body_bytes`` (or chunked) is
  not read: the request thread answers 413 (411) from the headers alone.
* bytes held in unfinished requests at most ``max_buffered_bytes`` in all: beyond it the
  oldest unfinished request is closed.

Whole requests go to :class:`Workers`: a bounded queue and a bounded pool of request
threads (the endpoint has two: its routes', and its checks' own).

Each refusal is told to ``refused`` by reason: ``per_client``, ``crowded`` (``max_open``
or ``max_buffered_bytes``), ``deadline``, ``tls_handshake``, ``too_large`` (headers).
"""

from __future__ import annotations

import contextlib
import io
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from interference_infra.server_tls import ServerTls

if TYPE_CHECKING:
    from interference_infra.http import ServerLimits

MAX_HEAD_BYTES = 64 * 1024
"""Longest request line and headers together (the standard library's limit per line)."""
RECV_BYTES = 256 * 1024
"""Most bytes read from one connection per turn, so one fast sender cannot starve others."""
SWEEP_S = 0.1
"""How often deadlines are checked."""
ACCEPTS_PER_TURN = 64

HANDSHAKE, READING, IDLE, SERVING = "handshake", "reading", "idle", "serving"
_UNFINISHED = (HANDSHAKE, READING)


@dataclass(eq=False)
class Connection:
    """One client connection while the intake or a request thread holds it."""

    sock: socket.socket
    client: Any
    host: str
    phase: str
    deadline: float
    buffer: bytearray = field(default_factory=bytearray)


@dataclass(frozen=True, eq=False)
class Arrived:
    """A whole request for a request thread: its bytes (line, headers and the body when it
    is within the limit), its path, and when it arrived (``time.monotonic()``)."""

    connection: Connection
    data: bytes
    path: str
    at: float


def body_length(head: bytes, max_body_bytes: int) -> int:
    """Bytes of body to read after ``head``: its ``Content-Length``, or 0 where the request
    thread refuses the request from its headers alone (chunked, a bad or too large
    length)."""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            return 0
        if name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return 0
    return length if 0 <= length <= max_body_bytes else 0


def request_path(data: bytes) -> str:
    """The path of a request's first line, without its query ("" when it has none)."""
    parts = data.split(b"\r\n", 1)[0].split()
    if len(parts) < 2:
        return ""
    return parts[1].split(b"?", 1)[0].decode("latin-1")


class Intake:
    """Serves ``listener`` (bound and listening) on :meth:`run`'s thread; each whole request
    goes to ``deliver``, which hands it to a request thread; that thread gives the
    connection back with :meth:`done`."""

    def __init__(
        self,
        listener: socket.socket,
        limits: ServerLimits,
        tls: ServerTls | None,
        deliver: Callable[[Arrived], None],
        refused: Callable[[str, Any], None],
        log: logging.Logger,
    ) -> None:
        self._listener = listener
        self._limits = limits
        self._tls = tls
        self._deliver = deliver
        self._refused = refused
        self._log = log
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._open: dict[Connection, None] = {}
        """Every open connection, oldest first."""
        self._by_host: dict[str, dict[Connection, None]] = {}
        self._buffered = 0
        self._returned: deque[tuple[Connection, bool]] = deque()
        self._lock = threading.Lock()
        self._stopping = False
        self._next_sweep = 0.0
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)

    def open_connections(self) -> int:
        """Connections open now (read on the intake's thread; approximate elsewhere)."""
        return len(self._open)

    def run(self) -> None:
        """Accept and read until :meth:`stop`; then close every connection it holds."""
        try:
            while not self._stopping:
                timeout = SWEEP_S if self._open else 1.0
                for key, _ in self._selector.select(timeout):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_read:
                        self._take_returned()
                    elif key.data in self._open:
                        self._advance(key.data)
                now = time.monotonic()
                if now >= self._next_sweep:
                    self._next_sweep = now + SWEEP_S
                    self._sweep(now)
        finally:
            for connection in list(self._open):
                if connection.phase != SERVING:
                    self._close(connection)
            self._selector.close()
            self._wake_read.close()
            self._wake_write.close()

    def stop(self) -> None:
        """Make :meth:`run` return (from any thread)."""
        self._stopping = True
        self._wake()

    def done(self, connection: Connection, keep: bool) -> None:
        """A request thread has answered: wait for the connection's next request (``keep``)
        or forget it (the thread closed it). From any thread."""
        with self._lock:
            self._returned.append((connection, keep))
        self._wake()

    def _wake(self) -> None:
        # full (a wake-up is pending anyway) or closed (stopping): nothing to do
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")

    # --- accepting --------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, client = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: the backlog waits, the sweep frees
                self._log.warning("http: cannot accept a connection: %s", exc)
                return
            self._admit(sock, client)

    def _admit(self, sock: socket.socket, client: Any) -> None:
        host = str(client[0]) if isinstance(client, tuple) else str(client)
        limits = self._limits
        mine = self._by_host.get(host, {})
        if len(mine) >= limits.max_per_client and not self._evict(mine, "per_client"):
            self._refuse_new(sock, client, "per_client")
            return
        if len(self._open) >= limits.max_open and not self._evict(self._open, "crowded"):
            self._refuse_new(sock, client, "crowded")
            return
        now = time.monotonic()
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.context().wrap_socket(
                    sock, server_side=True, do_handshake_on_connect=False
                )
        except (OSError, ssl.SSLError) as exc:
            self._log.debug("http: cannot set up the connection of %s: %s", client, exc)
            self._refuse_new(sock, client, "tls_handshake" if self._tls else "crowded")
            return
        if self._tls is not None:
            connection = Connection(sock, client, host, HANDSHAKE, now + limits.handshake_timeout_s)
        else:
            connection = Connection(sock, client, host, READING, now + limits.request_deadline_s)
        self._open[connection] = None
        self._by_host.setdefault(host, {})[connection] = None
        self._selector.register(sock, selectors.EVENT_READ, connection)
        if self._tls is not None:
            self._handshake(connection)

    def _refuse_new(self, sock: socket.socket, client: Any, reason: str) -> None:
        sock.close()
        self._refused(reason, client)

    def _evict(self, among: dict[Connection, None], reason: str) -> bool:
        """Close the oldest unfinished connection of ``among``, else its oldest idle one;
        False when every one is being served."""
        idle = None
        for connection in among:
            if connection.phase in _UNFINISHED:
                self._drop(connection, reason)
                return True
            if idle is None and connection.phase == IDLE:
                idle = connection
        if idle is None:
            return False
        self._close(idle)
        return True

    # --- reading ----------------------------------------------------------------------

    def _advance(self, connection: Connection) -> None:
        if connection.phase == HANDSHAKE:
            self._handshake(connection)
        elif connection.phase in (READING, IDLE):
            self._read(connection)

    def _handshake(self, connection: Connection) -> None:
        sock = connection.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(sock, selectors.EVENT_READ, connection)
            return
        except ssl.SSLWantWriteError:
            self._selector.modify(sock, selectors.EVENT_WRITE, connection)
            return
        except (OSError, ssl.SSLError) as exc:
            self._log.debug("http: TLS handshake with %s failed: %s", connection.client, exc)
            self._drop(connection, "tls_handshake")
            return
        connection.phase = READING
        connection.deadline = time.monotonic() + self._limits.request_deadline_s
        self._selector.modify(sock, selectors.EVENT_READ, connection)
        self._read(connection)  # the request may have come with the handshake's last bytes

    def _read(self, connection: Connection) -> None:
        sock = connection.sock
        got = 0
        while got < RECV_BYTES:
            try:
                chunk = sock.recv(RECV_BYTES - got)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except (OSError, ssl.SSLError) as exc:  # a reset kept-alive connection: routine
                self._log.debug(
                    "http: client %s dropped the connection: %s", connection.client, exc
                )
                self._close(connection)
                return
            if not chunk:
                self._close(connection)  # the client closed its side
                return
            if connection.phase == IDLE:  # a kept-alive connection's next request begins
                connection.phase = READING
                connection.deadline = time.monotonic() + self._limits.request_deadline_s
            got += len(chunk)
            connection.buffer += chunk
            self._buffered += len(chunk)
            if self._complete(connection):
                return
            if connection not in self._open or not self._within_budget(connection):
                return
            # TLS may hold decrypted bytes that the socket's readiness no longer shows
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                return

    def _complete(self, connection: Connection) -> bool:
        """Hand a whole request on: True when it went (or the connection closed)."""
        buffer = connection.buffer
        end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
        if end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                self._answer_and_close(connection, 431, "headers over 64 KiB", "too_large")
                return True
            return False
        head = bytes(buffer[: end + 4])
        whole = len(head) + body_length(head, self._limits.max_body_bytes)
        if len(buffer) < whole:
            return False
        data = bytes(buffer[:whole])
        del buffer[:whole]
        self._buffered -= whole
        connection.phase = SERVING
        self._selector.unregister(connection.sock)
        self._deliver(Arrived(connection, data, request_path(data), time.monotonic()))
        return True

    def _within_budget(self, reading: Connection) -> bool:
        """Close the oldest unfinished requests while the buffers are over budget; False
        when ``reading`` was one of them."""
        while self._buffered > self._limits.max_buffered_bytes:
            oldest = next((c for c in self._open if c.phase == READING and c.buffer), None)
            if oldest is None:
                break
            self._drop(oldest, "crowded")
        return reading in self._open

    def _answer_and_close(self, connection: Connection, status: int, why: str, reason: str) -> None:
        """A short answer, if the socket takes it at once, then close."""
        body = f"{why}\n".encode()
        answer = (
            f"HTTP/1.1 {status} {why}\r\nContent-Type: text/plain\r\nContent-Length:"
            f" {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        with contextlib.suppress(OSError, ssl.SSLError):
            connection.sock.send(answer)
        self._drop(connection, reason)

    # --- housekeeping -----------------------------------------------------------------

    def _sweep(self, now: float) -> None:
        for connection in list(self._open):
            if connection.phase == SERVING or now < connection.deadline:
                continue
            if connection.phase == HANDSHAKE:
                self._drop(connection, "tls_handshake")
            elif connection.phase == READING:
                window = self._limits.request_deadline_s
                self._answer_and_close(
                    connection, 408, f"the request did not arrive whole within {window:g} s",
                    "deadline",
                )  # fmt: skip
            else:
                self._close(connection)  # idle past request_timeout_s

    def _take_returned(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return
        while True:
            with self._lock:
                if not self._returned:
                    return
                connection, keep = self._returned.popleft()
            if not keep or self._stopping:
                self._close(connection)
                continue
            self._idle(connection)

    def _idle(self, connection: Connection) -> None:
        try:
            connection.sock.setblocking(False)
            self._selector.register(connection.sock, selectors.EVENT_READ, connection)
        except (OSError, ValueError, KeyError):
            self._close(connection)
            return
        connection.phase = IDLE
        connection.deadline = time.monotonic() + self._limits.request_timeout_s
        if connection.buffer:  # a pipelined request came with the last one
            connection.phase = READING
            connection.deadline = time.monotonic() + self._limits.request_deadline_s
            self._complete(connection)
        elif isinstance(connection.sock, ssl.SSLSocket) and connection.sock.pending():
            self._read(connection)

    def _drop(self, connection: Connection, reason: str) -> None:
        self._close(connection)
        self._refused(reason, connection.client)

    def _close(self, connection: Connection) -> None:
        if connection not in self._open:
            return  # already closed
        del self._open[connection]
        mine = self._by_host.get(connection.host)
        if mine is not None:
            mine.pop(connection, None)
            if not mine:
                del self._by_host[connection.host]
        self._buffered -= len(connection.buffer)
        connection.buffer.clear()
        if connection.phase != SERVING:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(connection.sock)
        with contextlib.suppress(OSError):
            connection.sock.close()


class Workers:
    """Up to ``size`` threads (started as needed, kept for the server's life) taking whole
    requests from a queue of ``max_waiting``; ``overflow`` gets one that finds it full."""

    def __init__(
        self,
        name: str,
        size: int,
        max_waiting: int,
        work: Callable[[Arrived], None],
        overflow: Callable[[Arrived], None],
    ) -> None:
        self._name = name
        self._size = size
        self._work = work
        self._overflow = overflow
        self._waiting: queue.Queue[Arrived | None] = queue.Queue(max_waiting)
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._unmatched = 0

    def threads(self) -> int:
        with self._lock:
            return self._threads

    def submit(self, item: Arrived) -> None:
        with self._lock:
            try:
                self._waiting.put_nowait(item)
            except queue.Full:
                full = True
            else:
                full = False
                # each queued request is matched with an idle thread, a new one, or (all
                # taken) the next thread that finishes
                if self._idle > 0:
                    self._idle -= 1
                elif self._threads < self._size:
                    self._threads += 1
                    name = f"{self._name}-{self._threads}"
                    threading.Thread(target=self._run, name=name, daemon=True).start()
                else:
                    self._unmatched += 1
        if full:
            self._overflow(item)

    def stop(self) -> None:
        """Let every thread end once the requests queued are done."""
        with self._lock:
            threads = self._threads
        for _ in range(threads):
            try:
                self._waiting.put_nowait(None)
            except queue.Full:
                break

    def _run(self) -> None:
        while True:
            item = self._waiting.get()
            if item is None:
                return
            try:
                self._work(item)
            finally:
                with self._lock:
                    if self._unmatched > 0:
                        self._unmatched -= 1  # this thread takes a waiting request next
                    else:
                        self._idle += 1


class SocketWriter(io.BufferedIOBase):
    """The answer's bytes straight to the socket (``sendall``), as ``wfile``."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.sendall(data)
        return len(data)
