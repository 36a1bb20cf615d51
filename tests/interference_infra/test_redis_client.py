"""The shared Redis connection: sentinel lists, target checks, what is logged, and whose
credentials log in (against a real redis-server with an ACL user)."""

from __future__ import annotations

import pytest
import redis

from interference_infra.redis_client import (
    RedisConnection,
    RedisTarget,
    credentials_from_env,
    parse_sentinels,
)
from interference_infra.redis_tls import RedisTls
from interference_infra.strict import SettingsError
from tests.conftest import RedisServer


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("", ()),
        ("s-0:26379", (("s-0", 26379),)),
        (" s-0:26379 , 10.0.0.7:26380,", (("s-0", 26379), ("10.0.0.7", 26380))),
        ("[fd00::1]:26379", (("fd00::1", 26379),)),
    ],
)
def test_parse_sentinels(value: str, parsed: tuple[tuple[str, int], ...]) -> None:
    assert parse_sentinels(value) == parsed


@pytest.mark.parametrize("entry", ["s-0", "s-0:", ":26379", "s-0:port", "s-0:70000"])
def test_parse_sentinels_names_the_bad_entry(entry: str) -> None:
    with pytest.raises(SettingsError, match=f"--redis-sentinels: entry '{entry}' is not HOST:PORT"):
        parse_sentinels(f"ok:1,{entry}", "--redis-sentinels")


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        (lambda: RedisTarget("localhost:6379"), "must start with redis://, rediss:// or unix://"),
        (
            lambda: RedisTarget("redis://h/0", sentinels=(("s", 1),), cluster=True),
            "not both",
        ),
        (lambda: RedisTarget("unix:///run/redis.sock", cluster=True), "not unix://"),
        (lambda: RedisTarget("redis://h/0", sentinels=(("s", 1),), sentinel_master=""), "empty"),
        (lambda: RedisTarget("redis://h/0", tls=RedisTls(ca_file="/ca.pem")), "not rediss://"),
        (
            lambda: RedisTarget("redis://h/cache", sentinels=(("s", 1),)),
            "its path must be a number",
        ),
    ],
)
def test_targets_that_cannot_work_are_refused(target: object, problem: str) -> None:
    with pytest.raises(SettingsError, match=problem):
        target()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("url", "secrets"),
    [
        ("redis://:Xq/7z@host:6379/0", ("Xq", "7z")),
        ("redis://u:Xq#7z@h:6379", ("Xq", "7z")),
        ("redis://u:Xq?7z@h/0", ("Xq", "7z")),
        ("redis://u:Xq@9w/7z@h/0", ("Xq", "9w", "7z")),
    ],
)
def test_a_password_with_unencoded_url_delimiters_is_refused_without_showing_it(
    url: str, secrets: tuple[str, ...]
) -> None:
    """urlsplit (and redis-py) would end the host early and read part of the password as
    the port or path, then print it in the parse error."""
    with pytest.raises(SettingsError, match="percent-encode") as raised:
        RedisTarget(url)
    assert not any(part in str(raised.value) for part in secrets)


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        (RedisTarget("redis://agent:s3cret@redis:6379/0"), "redis://agent:***@redis:6379/0"),
        (RedisTarget("rediss://:s3cret@r:6380", cluster=True), "cluster node rediss://:***@r:6380"),
        (
            RedisTarget("redis://:s3cret@x/0", sentinels=(("s-0", 26379), ("s-1", 26379))),
            "master 'mymaster' via sentinels s-0:26379,s-1:26379",
        ),
    ],
)
def test_describe_never_shows_a_password(target: RedisTarget, shown: str) -> None:
    assert target.describe() == shown


def test_credentials_from_env_treat_empty_as_unset() -> None:
    assert credentials_from_env({"REDIS_USERNAME": "", "REDIS_PASSWORD": "pw"}) == (None, "pw")


@pytest.mark.redis
def test_the_environments_credentials_win_over_the_urls(redis_server: RedisServer) -> None:
    """redis-py alone lets a URL's user and password win over keyword arguments; the
    shared connection lets REDIS_USERNAME/REDIS_PASSWORD win, and uses the URL's
    (percent-decoded, as redis-py reads them) when they are unset."""
    redis_server.client().acl_setuser(
        "scheduler", enabled=True, passwords=["+right", "+r@ght"], keys=["*"], commands=["+@all"]
    )
    wrong_in_url = f"redis://scheduler:wrong@127.0.0.1:{redis_server.port}/0"
    right_in_url = f"redis://scheduler:r%40ght@127.0.0.1:{redis_server.port}/0"  # r@ght
    env_wins = RedisConnection(RedisTarget(wrong_in_url, password="right"), 5.0)
    url_only = RedisConnection(RedisTarget(right_in_url), 5.0)
    url_wrong = RedisConnection(RedisTarget(wrong_in_url), 5.0)
    try:
        assert env_wins.client().acl_whoami() == "scheduler"
        assert url_only.client().acl_whoami() == "scheduler"
        with pytest.raises(redis.AuthenticationError):
            url_wrong.client().ping()
    finally:
        for connection in (env_wins, url_only, url_wrong):
            connection.close()
