"""The private redis-server launcher shared by the lab, the benchmarks and the test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from interference_cli.redis_process import (
    RedisServerError,
    free_port,
    private_redis_server,
    start_redis_server,
    stop_redis_server,
)

pytestmark = pytest.mark.redis


def test_the_server_answers_inside_the_block_and_is_gone_after(tmp_path: Path) -> None:
    with private_redis_server(str(tmp_path)) as url:
        client = redis.Redis.from_url(url, socket_timeout=2)
        assert client.ping()
        assert client.config_get("appendonly") == {"appendonly": "no"}
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url, socket_timeout=2).ping()


def test_a_server_that_exits_at_start_is_a_clear_error(tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(RedisServerError, match=f"port {port} exited with status"):
        start_redis_server(port, str(tmp_path / "no-such-dir"))  # redis cannot chdir there
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=port, socket_timeout=2, retry=Retry(NoBackoff(), 0)).ping()


def test_stop_ends_the_server_by_pid(tmp_path: Path) -> None:
    proc = start_redis_server(free_port(), str(tmp_path))
    stop_redis_server(proc)
    assert proc.returncode is not None
    stop_redis_server(proc)  # a second stop is harmless


def test_a_missing_binary_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RedisServerError, match="redis-server is not installed; run `make setup`"):
        start_redis_server(free_port(), str(tmp_path))
