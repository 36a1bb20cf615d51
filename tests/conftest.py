"""Shared fixtures: a real redis-server on a random loopback port; logging restored after
every test (the programs' ``main()`` reconfigure the root logger and their own levels); the
collector's frozen objects and thresholds restored after every test (a synced cache
freezes the heap)."""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from interference_cli.redis_process import (
    RedisServerError,
    free_port,
    start_redis_server,
    stop_redis_server,
)

__all__ = ["RedisServer", "free_port", "redis_server"]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Undo what a program's ``configure_logging`` did to the root handlers and levels, so
    one test's ``--log-level debug`` does not make later tests capture every DEBUG line."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {
        name: logger.level
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            logger.setLevel(levels.get(name, logging.NOTSET))


COLLECTOR_THRESHOLDS = gc.get_threshold()
"""The interpreter's own, before any cache froze the heap."""


@pytest.fixture(autouse=True)
def _unfreeze_heap() -> Iterator[None]:
    """A cache that finishes its list freezes every object alive and makes full
    collections rarer (``freeze_listed_heap``); in a test process that would keep each
    earlier test's garbage cycles for good. (A module-scoped fixture's cache may have
    done so before the test, hence the thresholds of the session's start.)"""
    yield
    gc.unfreeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


@dataclass
class RedisServer:
    """A redis-server process this test session started; restartable on the same port."""

    port: int
    workdir: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        try:
            self.proc = start_redis_server(self.port, self.workdir)
        except RedisServerError as exc:
            pytest.fail(str(exc))

    def stop(self) -> None:
        if self.proc is not None:
            stop_redis_server(self.proc)
            self.proc = None

    def client(self) -> redis.Redis[str]:
        return redis.Redis(port=self.port, decode_responses=True)


@contextmanager
def running_redis_server() -> Iterator[RedisServer]:
    """A fresh, empty redis-server on a free port for the block, in its own directory."""
    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(port=free_port(), workdir=workdir)
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh, empty redis-server per test (marker ``redis``)."""
    with running_redis_server() as server:
        yield server


# A background job of a script starts with SIGINT ignored, and its children inherit that:
# the tests that press Ctrl-C on a program (the demo, ``top --watch``) need it delivered as
# a terminal delivers it, wherever the suite was started from.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


KERNEL_TESTS = Path(__file__).parent / "node_agent"
"""The agent's tests: they measure the kernel's scheduling and reclaim, so they run alone."""


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``alone`` every ``bpf`` test and every test of the agent (``make test`` runs
    them after the rest, which shares the machine between workers); skip ``bpf`` tests
    when not root, saying so (CI runs as root, so they run there)."""
    skip = pytest.mark.skip(reason="bpf tests need root")
    for item in items:
        if "bpf" in item.keywords or item.path.is_relative_to(KERNEL_TESTS):
            item.add_marker(pytest.mark.alone)
        if "bpf" in item.keywords and os.geteuid() != 0:
            item.add_marker(skip)
