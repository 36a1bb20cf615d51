"""``interference`` with Sentinel/Cluster settings that cannot work: exit 2 and one line
naming the setting, before anything is contacted."""

from __future__ import annotations

import pytest

from interference_cli.main import main


@pytest.mark.parametrize(
    ("argv", "env", "line"),
    [
        (
            ["top"],
            {"REDIS_SENTINELS": "s-0:26379", "REDIS_CLUSTER": "true"},
            "use either Redis Sentinel or Redis Cluster, not both",
        ),
        (["top"], {"REDIS_SENTINELS": "s-0"}, "REDIS_SENTINELS: entry 's-0' is not HOST:PORT"),
        (["top"], {"REDIS_CLUSTER": "perhaps"}, "REDIS_CLUSTER"),
        (
            ["--redis-url", "unix:///run/redis.sock", "top"],
            {"REDIS_CLUSTER": "yes"},
            "Redis Sentinel and Redis Cluster need a redis:// or rediss:// URL",
        ),
        (["--redis-url", "localhost:6379", "top"], {}, "must start with redis://"),
    ],
)
def test_a_topology_that_cannot_work_is_one_line_and_exit_2(
    argv: list[str], env: dict[str, str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv, env) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err and "Traceback" not in err
