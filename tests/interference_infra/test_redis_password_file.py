"""REDIS_PASSWORD_FILE: the password read from a file at every login, on a real
redis-server (tests/conftest.py's), so a file replaced between logins is used by the next
one while a connection already logged in keeps working."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import redis

from interference_infra.redis_client import (
    PasswordFile,
    RedisConnection,
    RedisTarget,
    password_file_from_env,
)
from interference_infra.strict import SettingsError
from tests.conftest import RedisServer


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("s3cret-password-0001\n", ("app", "s3cret-password-0001")),
        ("s3cret-password-0001\r\n", ("app", "s3cret-password-0001")),
        ("  spaces kept  ", ("app", "  spaces kept  ")),
    ],
)
def test_the_file_gives_the_password_without_its_line_break(
    tmp_path: Path, content: str, expected: tuple[str, str]
) -> None:
    path = tmp_path / "password"
    path.write_text(content)
    assert PasswordFile("app", str(path)).get_credentials() == expected
    assert PasswordFile(None, str(path)).get_credentials() == expected[1:]


@pytest.mark.parametrize(("content", "message"), [(None, "cannot read"), ("\n", "is empty")])
def test_a_missing_or_empty_file_is_a_refused_login_naming_it(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "password"
    if content is not None:
        path.write_text(content)
    with pytest.raises(
        redis.AuthenticationError,
        match=f"REDIS_PASSWORD_FILE.*{message}|{message}.*REDIS_PASSWORD_FILE",
    ):
        PasswordFile("app", str(path)).get_credentials()


def test_the_target_refuses_two_passwords_or_an_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "password"
    path.write_text("s3cret-password-0001")
    with pytest.raises(SettingsError, match="both set"):
        RedisTarget("redis://h:6379/0", password="x", password_file=str(path))
    with pytest.raises(SettingsError, match="not a readable file"):
        RedisTarget("redis://h:6379/0", password_file=str(tmp_path / "missing"))
    assert password_file_from_env({"REDIS_PASSWORD_FILE": str(path)}) == str(path)
    assert password_file_from_env({"REDIS_PASSWORD_FILE": ""}) is None


@pytest.mark.redis
def test_a_replaced_file_is_used_by_the_next_login(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    admin = redis_server.client()
    first, second = "first-password-00001", "second-password-0002"
    admin.execute_command(
        "ACL", "SETUSER", "rotating", "on", f"#{hashlib.sha256(first.encode()).hexdigest()}",
        "~*", "+get", "+acl|whoami",
    )  # fmt: skip
    path = tmp_path / "password"
    path.write_text(first)
    target = RedisTarget(redis_server.url, username="rotating", password_file=str(path))
    connection = RedisConnection(target, 5.0)
    try:
        assert connection.client().execute_command("ACL", "WHOAMI") in (b"rotating", "rotating")
        path.write_text(second)  # not yet known to Redis: the next login is refused
        connection.reset()
        with pytest.raises(redis.AuthenticationError):
            connection.client().get("k")
        admin.execute_command(
            "ACL",
            "SETUSER",
            "rotating",
            "resetpass",
            f"#{hashlib.sha256(second.encode()).hexdigest()}",
        )
        connection.reset()
        assert connection.client().get("k") is None  # logged in with the new file
    finally:
        connection.close()
        admin.execute_command("ACL", "DELUSER", "rotating")
