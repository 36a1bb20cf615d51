"""Real Redis Sentinel and Redis Cluster set-ups for tests: redis-server processes on free
loopback ports, each ended by pid afterwards."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import redis

from node_agent.publisher import PublisherSettings, RedisPublisher
from tests.conftest import free_port


@contextmanager
def redis_process(args: list[str], port: int) -> Iterator[None]:
    """A redis-server (or sentinel) this test owns, answering PING; ended by pid after."""
    proc = subprocess.Popen(
        ["redis-server", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                redis.Redis(port=port, socket_timeout=0.5).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"redis-server {args} did not start on port {port}")
                time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def sentinel(workdir: Path, master: str, master_port: int | None) -> Iterator[int]:
    """A Redis Sentinel monitoring ``master`` at ``127.0.0.1:master_port`` (None: it
    monitors nothing); yields its port."""
    port = free_port()
    conf = workdir / f"sentinel-{port}.conf"
    monitor = f"sentinel monitor {master} 127.0.0.1 {master_port} 1\n" if master_port else ""
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {workdir}\n{monitor}")
    with redis_process([str(conf), "--sentinel"], port):
        yield port


def sentinel_publisher(port: int, master: str) -> RedisPublisher:
    """The agent's publisher writing to the master named ``master`` by the Sentinel on
    ``port``."""
    settings = PublisherSettings(
        redis_url="redis://127.0.0.1/0", sentinels=(("127.0.0.1", port),), sentinel_master=master
    )
    return RedisPublisher(settings)


@contextmanager
def replica_of(workdir: Path, master_port: int) -> Iterator[int]:
    """A redis-server replicating ``127.0.0.1:master_port`` and in sync with it; yields
    its port."""
    port = free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), "--save", ""]
    args += ["--appendonly", "no", "--replicaof", "127.0.0.1", str(master_port)]
    with redis_process(args, port):
        deadline = time.monotonic() + 30
        while redis.Redis(port=port).info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced with its master"
            time.sleep(0.1)
        yield port


@contextmanager
def redis_cluster(workdir: Path, shards: int = 3) -> Iterator[list[int]]:
    """A Redis Cluster of ``shards`` primaries (no replicas) with every slot assigned;
    yields the nodes' ports."""
    ports = [free_port() for _ in range(shards)]
    # Explicit bus ports: the default (port + 10000) may be taken or out of range.
    bus_ports = [free_port() for _ in range(shards)]
    with ExitStack() as nodes:
        for port, bus in zip(ports, bus_ports, strict=True):
            nodes.enter_context(
                redis_process(
                    [
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-port",
                        str(bus),
                        "--cluster-config-file",
                        f"nodes-{port}.conf",
                        "--dir",
                        str(workdir),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ],
                    port,
                )
            )
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        # Every node must agree before a client reads the slot map from any one of them.
        deadline = time.monotonic() + 30
        for port in ports:
            while b"cluster_state:ok" not in redis.Redis(port=port).execute_command(
                "CLUSTER", "INFO"
            ):
                assert time.monotonic() < deadline, "the test cluster never became ready"
                time.sleep(0.2)
        yield ports
