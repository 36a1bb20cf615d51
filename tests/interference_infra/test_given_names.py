"""Errors name what the user actually gave: ``REDIS_URL`` when the value came from the
environment, ``--redis-url`` or the config key otherwise; and a ``rediss://`` URL on a
plaintext Redis says so instead of "Timeout" (issue 19)."""

from __future__ import annotations

import socket
from pathlib import Path
from types import ModuleType

import pytest
import redis

from credential_issuer import cli as issuer_cli
from interference_cli.main import main as interference_main
from interference_infra.redis_client import RedisConnection, RedisTarget, unreachable_reason
from interference_infra.redis_tls import plaintext_server_hint
from interference_infra.strict import SettingsError
from node_agent import cli as agent_cli
from scheduler.entry.cli import main as scheduler_main
from tests.conftest import RedisServer, free_port

BAD_URL = "htp://redis:6379/0"
TLS_HINT = "did not complete a TLS handshake: is it serving TLS?"


@pytest.mark.parametrize("argv", [[], ["extender"]], ids=["standalone", "extender"])
def test_the_scheduler_names_redis_url_when_the_environment_gave_it(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDIS_URL", BAD_URL)
    assert scheduler_main(argv) == 2
    err = capsys.readouterr().err
    assert f"REDIS_URL (redis.url): {BAD_URL!r} must start with redis://" in err
    assert err.count("\n") == 1


def test_the_scheduler_names_the_config_key_when_the_file_gave_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    path = tmp_path / "scheduler.yaml"
    path.write_text(f"redis:\n  url: {BAD_URL}\n")
    assert scheduler_main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: invalid configuration: redis.url: {BAD_URL!r}" in err
    assert "REDIS_URL" not in err


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["top"], {"REDIS_URL": BAD_URL}, "REDIS_URL: "),
        (["--redis-url", BAD_URL, "top"], {}, "--redis-url: "),
        (
            ["--redis-url", BAD_URL, "top"],
            {"REDIS_URL": "redis://elsewhere:6379/0"},
            "--redis-url: ",
        ),
    ],
)
def test_the_cli_names_the_variable_or_the_flag(
    argv: list[str], env: dict[str, str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert interference_main(argv, env) == 2
    err = capsys.readouterr().err
    assert f"interference: error: {named}{BAD_URL!r} must start with redis://" in err


@pytest.mark.parametrize("program", [agent_cli, issuer_cli], ids=["agent", "credentials"])
@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        ([], {"REDIS_URL": BAD_URL}, "REDIS_URL: "),
        (["--redis-url", BAD_URL], {}, "--redis-url: "),
    ],
)
def test_the_agent_and_the_issuer_name_the_variable_or_the_flag(
    program: ModuleType, argv: list[str], env: dict[str, str], named: str
) -> None:
    args = program.parser(env).parse_args(argv)
    with pytest.raises(SettingsError) as caught:
        program.settings_from_args(args, env)
    assert str(caught.value).startswith(f"{named}{BAD_URL!r} must start with redis://")


@pytest.mark.redis
def test_rediss_to_a_plaintext_server_says_so(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"rediss://127.0.0.1:{redis_server.port}/0"
    assert interference_main(["--redis-url", url, "top"], {}) == 1
    err = capsys.readouterr().err
    assert f"the server at 127.0.0.1:{redis_server.port} {TLS_HINT}" in err
    assert "use redis:// for a plaintext server" in err and "Timeout" not in err
    # The scheduler's and the agent's path: the same words from the same connection.
    connection = RedisConnection(RedisTarget(url), socket_timeout_s=1.0)
    try:
        with pytest.raises((redis.ConnectionError, redis.TimeoutError)) as caught:
            connection.client().ping()
        assert TLS_HINT in unreachable_reason(connection.target, caught.value)
    finally:
        connection.close()


@pytest.mark.redis
def test_no_tls_hint_for_redis_urls_or_closed_ports(redis_server: RedisServer) -> None:
    assert plaintext_server_hint(f"redis://127.0.0.1:{redis_server.port}/0") is None
    assert plaintext_server_hint(f"rediss://127.0.0.1:{free_port()}/0") is None
    # A server that is not Redis (here: one that says nothing and closes) is not blamed.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert plaintext_server_hint(f"rediss://127.0.0.1:{port}/0", timeout_s=0.2) is None
