"""One agent with its own node's credentials cannot take Redis, or the scheduler's reads,
down (issue 28, items 1 and 2): the deployed Redis (shipped redis.conf, entrypoint, ACL
users) under the Redis Deployment's 512 MiB memory limit, each attack of the issue as its
own node's user, while an honest node keeps publishing and the scheduler's real readers,
logged in as the scheduler's Redis user, keep reading.

The memory limit: Redis is moved into a memory cgroup of 512 MiB where the machine allows
it (an overrun is then an OOM kill), and its peak resident size is checked either way."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from interference import keys
from interference.signals import PodMetrics
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.node_reports import RedisNodeReportSource
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.signal_metrics import SignalMetrics
from tests.deploy.conftest import DeployedRedis
from tests.deploy.test_redis_acl import SCHEDULER, agent_publisher, enrol, report

pytestmark = pytest.mark.redis

LIMIT_BYTES = 512 << 20
"""The Redis container's memory limit (deploy/base/redis/redis.yaml)."""
MIB = 1 << 20
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def peak_rss(pid: int) -> int:
    """The process' peak resident size (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@contextmanager
def memory_limited(pid: int) -> Iterator[None]:
    """``pid`` in a memory cgroup (v1) limited to :data:`LIMIT_BYTES` when this machine
    lets the test make one; otherwise only the peak RSS check applies."""
    group = CGROUP_ROOT / f"test-redis-limits-{os.getpid()}-{pid}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(LIMIT_BYTES))
        (group / "cgroup.procs").write_text(str(pid))
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # the process has exited
            (CGROUP_ROOT / "cgroup.procs").write_text(str(pid))
        group.rmdir()


class HonestNode:
    """Another node's real agent publisher, publishing every 0.1 s in a thread."""

    def __init__(self, server: DeployedRedis, node: str) -> None:
        self.node, self.server = node, server
        self.published = self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rows = [PodMetrics("shop", f"api-{i}", uid=f"u{i}") for i in range(30)]
        with agent_publisher(self.server, self.node) as publisher:
            while not self._stop.is_set():
                if publisher.publish(report(self.node, time.time(), rows)):
                    self.published += 1
                else:
                    self.failed += 1
                self._stop.wait(0.1)

    def __enter__(self) -> HonestNode:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture
def limited_redis(tmp_path: Path) -> Iterator[DeployedRedis]:
    server = DeployedRedis(workdir=tmp_path)
    server.start()
    assert server.proc is not None
    try:
        with memory_limited(server.proc.pid):
            yield server
    finally:
        server.stop()


def raw_login(server: DeployedRedis, username: str, password: str) -> socket.socket:
    """A plain socket logged in as ``username`` (an attacker needs no client library)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(f"AUTH {username} {password}\r\n".encode())
    assert sock.recv(100).startswith(b"+OK")
    return sock


def send_until_closed(sock: socket.socket, chunks: Iterator[bytes]) -> bool:
    """Send every chunk; True when Redis closed the connection on the way."""
    try:
        for chunk in chunks:
            sock.sendall(chunk)
    except OSError:
        return True
    sock.settimeout(5)
    try:
        return sock.recv(1 << 16) == b"" or True
    except OSError:
        return True


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def scheduler_connection(server: DeployedRedis) -> tuple[RedisSettings, object]:
    username, password = server.credentials(*SCHEDULER)
    settings = RedisSettings(url=server.url)
    return settings, connect(settings, {"REDIS_USERNAME": username, "REDIS_PASSWORD": password})


def assert_intact(server: DeployedRedis, honest: HonestNode, pid: int) -> None:
    """Redis is the same process, within its memory limit, every user still there, and the
    honest node's signals current."""
    assert server.proc is not None and server.proc.poll() is None and server.proc.pid == pid
    assert peak_rss(pid) < LIMIT_BYTES, f"peak RSS {peak_rss(pid) / MIB:.0f} MiB"
    admin = server.admin()
    users = set(admin.acl_users())
    assert {"agent:good", "agent:bad", "interference-scheduler"} <= users
    before = honest.published
    deadline = time.monotonic() + 10
    while honest.published < before + 3:
        assert time.monotonic() < deadline, "the honest node stopped publishing"
        time.sleep(0.05)
    assert admin.ttl(keys.sched_key("good")) > 0


def test_one_argument_longer_than_a_report_is_refused_at_its_header(
    limited_redis: DeployedRedis,
) -> None:
    _, password = enrol(limited_redis, "bad")
    assert limited_redis.proc is not None
    pid = limited_redis.proc.pid
    with HonestNode(limited_redis, "good") as honest:
        sock = raw_login(limited_redis, "agent:bad", password)
        key = keys.sched_key("bad").encode()
        header = b"*3\r\n$3\r\nSET\r\n" + bulk(key) + b"$%d\r\n" % (90 * MIB)
        sock.sendall(header)
        sock.settimeout(10)
        assert b"invalid bulk length" in sock.recv(1000)  # before one byte of it
        sock.close()
        assert_intact(limited_redis, honest, pid)
    assert limited_redis.admin().exists(keys.sched_key("bad")) == 0


def test_unfinished_commands_over_many_connections_cost_the_sender_its_connections(
    limited_redis: DeployedRedis,
) -> None:
    """The issue's ~514 MiB of unfinished SETs over 6 connections, as the 1 MiB arguments
    the shipped config allows: 6 connections × 100 MiB of one command's arguments."""
    _, password = enrol(limited_redis, "bad")
    assert limited_redis.proc is not None
    pid = limited_redis.proc.pid
    admin = limited_redis.admin()
    with HonestNode(limited_redis, "good") as honest:
        value = b"x" * MIB
        key = keys.node_key("bad").encode()

        def attack(results: list[bool]) -> None:
            sock = raw_login(limited_redis, "agent:bad", password)
            head = b"*202\r\n$4\r\nHSET\r\n" + bulk(key)
            chunks = iter([head] + [bulk(b"f%d" % i) + bulk(value) for i in range(100)])
            results.append(send_until_closed(sock, chunks))
            sock.close()

        results: list[bool] = []
        threads = [threading.Thread(target=attack, args=(results,)) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert results == [True] * 6  # every attacking connection was closed by Redis
        assert int(admin.info("stats")["evicted_clients"]) >= 1
        assert_intact(limited_redis, honest, pid)
    assert honest.failed == 0
    assert admin.exists(keys.node_key("bad")) == 0


def test_a_stream_of_huge_entries_is_cut_for_its_reader_and_the_others_still_read(
    limited_redis: DeployedRedis,
) -> None:
    """The issue's ~300 MiB report stream read by the rebalancer and the decision page:
    here 8 entries of 16 MiB each (16 fields of 1 MiB, what one command may carry), read
    10 at a time. Redis cuts the reader's reply at 32 MB, the readers read every other
    node and count the one they could not."""
    _, password = enrol(limited_redis, "bad")
    assert limited_redis.proc is not None
    pid = limited_redis.proc.pid
    bad = redis.Redis(port=limited_redis.port, username="agent:bad", password=password)
    with HonestNode(limited_redis, "good") as honest:
        fields = {f"f{i}": os.urandom(MIB) for i in range(16)}
        for _ in range(8):
            bad.xadd(keys.reports_key("bad"), fields)  # type: ignore[arg-type]
        admin, deadline = limited_redis.admin(), time.monotonic() + 10
        while admin.xlen(keys.reports_key("good")) < keys.NODE_REPORTS_MAXLEN:  # a full stream
            assert time.monotonic() < deadline, "the honest node's stream never filled"
            time.sleep(0.05)
        settings, connection = scheduler_connection(limited_redis)
        registry = CollectorRegistry()
        metrics = SignalMetrics(registry)
        reader = RedisNodeReportSource(connection, metrics)  # type: ignore[arg-type]
        nodes = ["bad", "good"] + [f"quiet-{i}" for i in range(40)]
        for _ in range(3):  # the rebalancer's looks
            found = reader.recent(nodes)
            assert set(found) == {"good"} and len(found["good"]) == keys.NODE_REPORTS_MAXLEN
        assert reader.refused["unreadable"] == 3
        page = RedisDecisionSink(connection, settings, metrics)  # type: ignore[arg-type]
        assert page.index_history("bad") is None  # the decision page: chart left out
        assert page.index_history("good")
        refused = registry.get_sample_value(
            "interference_scheduler_node_reports_refused_total", {"reason": "unreadable"}
        )
        assert refused == 4
        assert_intact(limited_redis, honest, pid)
    bad.close()


def test_a_report_that_would_decode_into_a_gibibyte_is_refused_unread(
    limited_redis: DeployedRedis,
) -> None:
    """The issue's 15 MB msgpack array of empty arrays: a longer argument is refused by
    Redis; at the 1 MiB Redis allows, the readers refuse it by its array length before
    building anything, and count it."""
    _, password = enrol(limited_redis, "bad")
    bad = redis.Redis(port=limited_redis.port, username="agent:bad", password=password)
    forged = b"\xdd" + (MIB - 5).to_bytes(4, "big") + b"\x90" * (MIB - 5)
    with pytest.raises(redis.ConnectionError):
        bad.xadd(keys.reports_key("bad"), {keys.REPORTS_FIELD: forged + b"\x90" * (14 * MIB)})
    bad = redis.Redis(port=limited_redis.port, username="agent:bad", password=password)
    for _ in range(keys.NODE_REPORTS_MAXLEN):
        bad.xadd(keys.reports_key("bad"), {keys.REPORTS_FIELD: forged})
    settings, connection = scheduler_connection(limited_redis)
    registry = CollectorRegistry()
    metrics = SignalMetrics(registry)
    reader = RedisNodeReportSource(connection, metrics)  # type: ignore[arg-type]
    started = time.perf_counter()
    assert reader.recent(["bad"]) == {}
    assert time.perf_counter() - started < 2  # one entry refused unread, not ten decoded
    assert reader.refused["too_big"] == 1
    page = RedisDecisionSink(connection, settings, metrics)  # type: ignore[arg-type]
    assert page.index_history("bad") is None
    assert (
        registry.get_sample_value(
            "interference_scheduler_node_reports_refused_total", {"reason": "too_big"}
        )
        == 1 + keys.NODE_REPORTS_MAXLEN
    )
    bad.close()
