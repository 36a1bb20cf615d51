"""A private redis-server on a free loopback port: for the lab, the benchmarks and the tests.

The server keeps nothing on disk (no RDB, no AOF) and listens on 127.0.0.1 only. Whoever
starts it ends it by PID (:func:`stop_redis_server`).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

START_TIMEOUT_S = 10.0
"""How long a new server may take to answer PING (generous: the host may be busy)."""
STOP_GRACE_S = 10.0
"""How long a server gets between SIGTERM and SIGKILL."""


class RedisServerError(RuntimeError):
    """redis-server is missing or did not start; the message says which and what to do."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_argv(port: int, workdir: str) -> list[str]:
    """The command line of a loopback-only, diskless redis-server working in ``workdir``."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisServerError("redis-server is not installed; run `make setup`")
    return [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", workdir]  # fmt: skip


def wait_until_answering(
    port: int, proc: subprocess.Popen[bytes], timeout_s: float = START_TIMEOUT_S
) -> None:
    """Return once the server on ``port`` answers PING; :class:`RedisServerError` if ``proc``
    exits or ``timeout_s`` passes first."""
    # The loop is the retry: redis-py's own backoff would only delay noticing an exit.
    client = redis.Redis(port=port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
    finally:
        client.close()
    state = f"exited with status {proc.returncode}" if proc.poll() is not None else "is silent"
    raise RedisServerError(f"redis-server on port {port} {state} after starting")


def start_redis_server(
    port: int, workdir: str, log: IO[bytes] | int = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    """Start a server (:func:`redis_server_argv`) and wait until it answers; its output
    goes to ``log``. :class:`RedisServerError` (with nothing left running) if it cannot."""
    proc = subprocess.Popen(
        redis_server_argv(port, workdir),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until_answering(port, proc)
    except BaseException:
        stop_redis_server(proc)
        raise
    return proc


def stop_redis_server(proc: subprocess.Popen[bytes]) -> None:
    """End the server by PID: SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def private_redis_server(workdir: str) -> Iterator[str]:
    """A server on a free port for the duration of the block; yields its ``redis://`` URL."""
    port = free_port()
    proc = start_redis_server(port, workdir)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_redis_server(proc)
