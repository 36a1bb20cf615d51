"""A wrong Redis password, or a wrong ACL user, is told as refused credentials — never as
Redis that "cannot be reached" or is "unavailable" — against a real redis-server with
``requirepass`` and an ACL user (issue 31)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis
from prometheus_client import CollectorRegistry

from interference_cli.main import main as cli_main
from interference_infra.redis_client import RedisConnection, RedisTarget, credentials_refused
from scheduler.adapters.kubernetes import KubernetesCluster
from scheduler.adapters.redis_settings import connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.entry.cli_common import report_reachability
from tests.conftest import RedisServer
from tests.scheduler.test_redis_signals import SETTINGS

pytestmark = pytest.mark.redis

PASSWORD = "right-password"


@pytest.fixture
def guarded(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The server with ``requirepass`` and an ACL user ``viewer`` (password ``vpass``)."""
    redis_server.client().config_set("requirepass", PASSWORD)
    admin = redis.Redis(port=redis_server.port, password=PASSWORD)
    admin.execute_command("ACL", "SETUSER", "viewer", "on", ">vpass", "~*", "+@all")
    admin.close()
    yield redis_server


class _Cluster:
    def list_page(self, kind: str, token: str) -> Any:
        return {"items": []}


CREDENTIALS = [
    pytest.param(None, "wrong", id="wrong-password"),
    pytest.param("viewer", "wrong", id="acl-user-wrong-password"),
    pytest.param("nobody", "vpass", id="unknown-acl-user"),
    pytest.param(None, None, id="no-password"),
]


@pytest.mark.parametrize(("username", "password"), CREDENTIALS)
def test_the_start_up_check_says_the_credentials_were_refused(
    guarded: RedisServer,
    username: str | None,
    password: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    target = RedisTarget(guarded.url, username=username, password=password)
    connection = RedisConnection(target, 2.0)
    with caplog.at_level(logging.ERROR, logger="scheduler"):
        report_reachability(cast(KubernetesCluster, _Cluster()), connection, "waiting")
    lines = [r.getMessage() for r in caplog.records if "Redis" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "refused the credentials" in lines[0]
    assert "REDIS_PASSWORD" in lines[0] and "REDIS_USERNAME" in lines[0]
    assert "cannot reach" not in lines[0]
    assert PASSWORD not in lines[0] and "wrong" not in lines[0].replace("is wrong", "")


def test_the_signal_poller_says_the_credentials_were_refused(
    guarded: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Its password changed under it (a rotation gone wrong): the poller, healthy until
    then, says the login was refused, not that Redis is unavailable."""
    settings = dataclasses.replace(SETTINGS, url=guarded.url)
    env = {"REDIS_USERNAME": "viewer", "REDIS_PASSWORD": "vpass"}
    cache = RedisSignalCache(
        connect(settings, env=env), settings, SignalMetrics(CollectorRegistry()), lambda: ("a",)
    )
    stop = threading.Event()
    thread = threading.Thread(target=cache.run, args=(stop,), daemon=True)
    with caplog.at_level(logging.WARNING, logger="scheduler"):
        thread.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not cache.healthy():
            time.sleep(0.05)
        assert cache.healthy()
        admin = redis.Redis(port=guarded.port, password=PASSWORD)
        admin.execute_command("ACL", "SETUSER", "viewer", "resetpass", ">rotated")
        admin.execute_command("CLIENT", "KILL", "USER", "viewer")
        admin.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any("Redis" in r.message for r in caplog.records):
            time.sleep(0.05)
        stop.set()
        thread.join(10)
    lines = [r.getMessage() for r in caplog.records if "Redis" in r.getMessage()]
    assert lines and "refused the credentials (ACL user 'viewer')" in lines[0], lines
    assert "unavailable" not in lines[0]


def test_credentials_refused_tells_a_login_refusal_from_an_outage() -> None:
    assert credentials_refused(redis.AuthenticationError("invalid username-password pair"))
    assert credentials_refused(redis.exceptions.AuthenticationWrongNumberOfArgsError("x"))
    assert credentials_refused(redis.ResponseError("WRONGPASS invalid username-password pair"))
    assert credentials_refused(redis.ResponseError("NOAUTH Authentication required."))
    wrapped = redis.exceptions.RedisClusterException("cannot build the slot map")
    wrapped.__cause__ = redis.AuthenticationError("invalid password")
    assert credentials_refused(wrapped)
    assert not credentials_refused(redis.ConnectionError("Connection refused"))
    assert not credentials_refused(redis.TimeoutError("Timeout reading from socket"))
    assert not credentials_refused(redis.exceptions.NoPermissionError("NOPERM no ZRANGE"))


@pytest.mark.parametrize(("username", "password"), CREDENTIALS)
def test_the_cli_says_the_credentials_were_refused(
    guarded: RedisServer,
    username: str | None,
    password: str | None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {"REDIS_URL": guarded.url}
    env.update({"REDIS_USERNAME": username} if username else {})
    env.update({"REDIS_PASSWORD": password} if password else {})
    assert cli_main(["top"], environ=env) == 1
    err = capsys.readouterr().err
    assert "refused the credentials" in err and "REDIS_PASSWORD" in err, err
    assert "cannot reach" not in err


def test_the_ranking_writer_says_the_credentials_were_refused(
    guarded: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    settings = dataclasses.replace(SETTINGS, url=guarded.url)
    env = {"REDIS_USERNAME": "viewer", "REDIS_PASSWORD": "wrong"}
    cache = RedisSignalCache(
        connect(settings, env=env), settings, SignalMetrics(CollectorRegistry()), lambda: ("a",)
    )
    with caplog.at_level(logging.WARNING, logger="scheduler"):
        assert not cache.write_ranking(time.time())
    lines = [r.getMessage() for r in caplog.records if "ranking" in r.getMessage()]
    assert len(lines) == 1 and "refused the credentials (ACL user 'viewer')" in lines[0], lines
    assert "unreachable" not in lines[0]
