"""Acceptance table of issue 12: every bad input of the three programs gives one line on
stderr saying what is wrong and what to do, and exit status 2 (usage) or 1 (runtime);
never a traceback, never a silent fallback.

program · input → message (excerpt) → exit status:

- interference ``top --watch --interval -1`` → ``--interval: -1 is out of range; allowed:
  > 0`` → 2
- interference ``record --duration -1`` / ``--count -3`` → ``… is out of range; allowed:
  ≥ 0`` → 2
- interference ``top --redis-url URL`` (flag after the command), nothing listening →
  ``cannot reach Redis at URL`` → 1
- interference, a non-Redis endpoint → ``did not answer like a Redis server`` → 1
- interference ``redis://viewer:wrongpw@…`` → ``refused the credentials``, URL shown as
  ``viewer:***`` → 1
- interference, wrong REDIS_USERNAME/REDIS_PASSWORD → ``refused the credentials`` → 1
- interference, binary ``--pods`` file → ``is not text (UTF-8 YAML)`` → 1
- interference, truncated trace → ``is truncated … record it again`` → 1
- interference ``--redis-ca-file`` with ``redis://`` → ``is not rediss://`` → 2
- interference-agent ``REDIS_CLUSTER=Y`` → ``REDIS_CLUSTER='Y' is not a boolean`` → 2
- interference-agent ``--probes bogus,psi`` → ``unknown probe(s) bogus`` → 2
- interference-agent ``--cgroup-root /no-such`` → ``is not a cgroup`` → 2
- interference-agent ``INTERVAL_S=-1`` → ``INTERVAL_S=-1 is out of range; allowed: > 0`` → 2
- interference-agent ``--log-level loud`` → ``log level 'loud' is not one of`` → 2
- interference-agent, health port taken → ``pick another --http-port`` → 1
  (tests/node_agent/test_cli.py)
- interference-scheduler ``DRY_RUN=Y``/``enabled``/``maybe`` → ``DRY_RUN='Y' is not a
  boolean`` → 2
- interference-scheduler ``profile: {scores: {Interference: 500}}`` → ``allowed: 0–100`` → 2
- interference-scheduler ``relax_after_s: -5``, ``reload_interval_s: 0`` → ``allowed: > 0``
  → 2; ``stale_after_s: -1`` names ``stale_after_s`` → 2
- interference-scheduler ``--log-format xml`` → ``log format 'xml' is not one of json,
  text`` → 2; ``--log-level debug`` is accepted (any case)
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import redis

from interference.signals import NodeMetrics, NodeReport
from interference_cli import main as cli_main
from node_agent import cli as agent_cli
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.entry import cli as scheduler_cli
from tests.conftest import RedisServer, free_port

REPO = Path(__file__).resolve().parents[2]
LAB_TRACE = REPO / "tests" / "data" / "lab-trace.msgpack"
ARRIVALS = REPO / "deploy" / "demo" / "arrivals.yaml"
POLICY = REPO / "deploy" / "demo" / "policies" / "interference-aware.yaml"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The programs configure the root logger; give the next test the one it had."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def run(entry: Callable[[], int]) -> int:
    """The exit status of an entry point, whether it returns or exits."""
    try:
        return entry()
    except SystemExit as exc:
        return int(exc.code or 0)


def one_line(err: str) -> str:
    """The single line a bad input must give; fails on a traceback or several lines."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def interference(argv: Sequence[str], env: dict[str, str] | None = None) -> Callable[[], int]:
    return lambda: cli_main.main(list(argv), env or {})


def agent(argv: Sequence[str], env: dict[str, str] | None = None) -> Callable[[], int]:
    return lambda: agent_cli.main(["--no-kubernetes", *argv], env or {})


@pytest.fixture
def not_redis() -> Iterator[str]:
    """A TCP server that answers every request like a web server, as a wrong port would."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(4096)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["top", "--watch", "--interval", "-1"], "--interval: -1 is out of range; allowed: > 0"),
        (["top", "--interval", "soon"], "'soon' is not a number"),
        (["record", "--out", "x", "--duration", "-1"], "--duration: -1 is out of range"),
        (["record", "--out", "x", "--count", "-3"], "--count: -3 is out of range; allowed: ≥ 0"),
        (["record", "--out", "x", "--count", "2.5"], "'2.5' is not a whole number"),
        (["explain"], "the following arguments are required: NS/POD"),
        (["bogus"], "invalid choice: 'bogus'"),
    ],
)
def test_interference_usage_errors_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(interference(argv)) == 2
    line = one_line(capsys.readouterr().err)
    assert message in line and "--help" in line


def test_tls_options_need_a_rediss_url(capsys: pytest.CaptureFixture[str]) -> None:
    status = run(interference(["top", "--redis-ca-file", str(ARRIVALS)]))
    assert status == 2
    assert "is not rediss://; use rediss://HOST:PORT/DB for TLS" in one_line(
        capsys.readouterr().err
    )


def test_redis_url_after_the_command_is_used(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    assert run(interference(["top", "--redis-url", url])) == 1
    assert f"cannot reach Redis at {url}" in one_line(capsys.readouterr().err)
    # …and before it, too; the later one wins.
    assert (
        run(interference(["--redis-url", "redis://elsewhere:1/0", "node", "n", "--redis-url", url]))
        == 1
    )
    assert f"cannot reach Redis at {url}" in one_line(capsys.readouterr().err)


def test_a_non_redis_endpoint_is_one_line(
    not_redis: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(interference(["top", "--redis-url", not_redis])) == 1
    line = one_line(capsys.readouterr().err)
    assert "did not answer like a Redis server" in line and "check --redis-url" in line


@pytest.fixture
def acl_redis(redis_server: RedisServer) -> RedisServer:
    """The test Redis with a password-protected read-only user ``viewer``."""
    redis_server.client().execute_command(
        "ACL", "SETUSER", "viewer", "on", ">s3cret", "~intf:*", "-@all", "+@read"
    )
    return redis_server


@pytest.mark.redis
def test_credentials_are_never_printed(
    acl_redis: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://viewer:wrongpw@127.0.0.1:{acl_redis.port}/0"
    assert run(interference(["top"], {"REDIS_URL": url})) == 1
    line = one_line(capsys.readouterr().err)
    assert "refused the credentials" in line and "REDIS_USERNAME" in line
    assert f"redis://viewer:***@127.0.0.1:{acl_redis.port}/0" in line
    assert "wrongpw" not in line


@pytest.mark.redis
def test_redis_username_and_password_are_honoured(
    acl_redis: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = acl_redis.url
    wrong = {"REDIS_URL": url, "REDIS_USERNAME": "viewer", "REDIS_PASSWORD": "nope"}
    assert run(interference(["top"], wrong)) == 1
    assert "refused the credentials" in one_line(capsys.readouterr().err)
    right = {**wrong, "REDIS_PASSWORD": "s3cret"}
    assert run(interference(["top"], right)) == 1  # logged in: the store is just empty
    line = one_line(capsys.readouterr().err)
    assert "no node reports in Redis" in line and "s3cret" not in line
    # The viewer may read but not write: the ACL, not the CLI, enforces it.
    viewer = redis.Redis(port=acl_redis.port, username="viewer", password="s3cret")
    with pytest.raises(redis.exceptions.NoPermissionError):
        viewer.hset("intf:node:x", "a", "1")


def test_a_binary_pods_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = tmp_path / "pods.yaml"
    pods.write_bytes(bytes(range(256)) * 4)
    argv = ["simulate", "--trace", str(LAB_TRACE), "--pods", str(pods), "--policy", str(POLICY)]
    assert run(interference(argv)) == 1
    assert "is not text (UTF-8 YAML); see deploy/demo/arrivals.yaml" in one_line(
        capsys.readouterr().err
    )


def test_a_truncated_trace_is_an_error_not_a_shorter_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "cut.msgpack"
    data = LAB_TRACE.read_bytes()
    trace.write_bytes(data[: len(data) // 2])
    argv = ["simulate", "--trace", str(trace), "--pods", str(ARRIVALS), "--policy", str(POLICY)]
    assert run(interference(argv)) == 1
    line = one_line(capsys.readouterr().err)
    assert "is truncated" in line and "record it again" in line


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {"REDIS_CLUSTER": "Y"}, "REDIS_CLUSTER='Y' is not a boolean; use one of true/false"),
        ([], {"REDIS_CLUSTER": "enabled"}, "REDIS_CLUSTER='enabled' is not a boolean"),
        (["--probes", "bogus,psi"], {}, "unknown probe(s) bogus in --probes/PROBES; choose from"),
        (["--cgroup-root", "/intf-no-such-cgroup"], {}, "is not a cgroup"),
        ([], {"INTERVAL_S": "-1"}, "INTERVAL_S=-1 is out of range; allowed: > 0"),
        ([], {"HTTP_PORT": "65536"}, "HTTP_PORT=65536 is out of range; allowed: 0–65535"),
        (["--log-level", "loud"], {}, "log level 'loud' is not one of DEBUG, INFO"),
        (["--log-format", "xml"], {}, "log format 'xml' is not one of json, text"),
    ],
)
def test_agent_usage_errors_exit_2(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(agent(argv, env)) == 2
    assert message in one_line(capsys.readouterr().err)


def test_agent_log_level_is_case_insensitive(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--once", "--probes", "psi", "--interval", "0.1", "--log-level", "debug"]
    assert run(agent(argv)) == 0
    assert '"node"' in capsys.readouterr().out


@pytest.mark.parametrize("value", ["Y", "enabled", "maybe", "2", "on"])
def test_a_mistyped_dry_run_never_binds(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DRY_RUN", value)
    assert run(lambda: scheduler_cli.main([])) == 2
    assert f"DRY_RUN={value!r} is not a boolean" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("cycle:\n  profile: {scores: {Interference: 500}}\n", "allowed: 0–100"),
        ("cycle:\n  profile: {scores: {NodeResourcesFit: -1}}\n", "allowed: 0–100"),
        ("cycle:\n  relax_after_s: -5\n", "relax_after_s: -5.0 is out of range; allowed: > 0"),
        ("reload_interval_s: 0\n", "reload_interval_s: 0.0 is out of range; allowed: > 0"),
        ("cycle:\n  stale_after_s: -1\n", "stale_after_s"),
        ("cycle: [1, 2]\n", "cycle: must be a mapping"),
        ("\x00\x01", "not valid YAML"),
    ],
)
def test_scheduler_config_errors_exit_2(
    config: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text(config)
    assert run(lambda: scheduler_cli.main(["--config", str(path)])) == 2
    assert message in one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--log-format", "xml"], "log format 'xml' is not one of json, text"),
        (["--log-level", "verbose"], "log level 'verbose' is not one of"),
        (["--log-level", "debug", "--kubeconfig", "/no/such/kubeconfig"], "Kubernetes"),
    ],
)
def test_scheduler_flags(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(lambda: scheduler_cli.main(argv)) == 2
    assert message in one_line(capsys.readouterr().err)


def test_every_subcommand_has_help_with_a_description_and_an_example(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for command in ("top", "node", "explain", "record", "simulate", "recommend-tolerance"):
        assert run(interference([command, "--help"])) == 0
        out = capsys.readouterr().out
        assert "example:" in out and f"interference {command}" in out
        description = out.split("\n\n")[1]
        assert len(description.split()) >= 8, description
    for entry in (lambda: agent_cli.main(["--help"], {}), lambda: scheduler_cli.main(["--help"])):
        assert run(entry) == 0
        assert "example:" in capsys.readouterr().out


@pytest.mark.redis
def test_the_top_title_masks_the_password(
    acl_redis: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    publisher = RedisPublisher(PublisherSettings(acl_redis.url))
    try:
        assert publisher.publish(
            NodeReport(node="n1", ts=time.time(), interval_s=1.0, metrics=NodeMetrics())
        )
    finally:
        publisher.close()
    url = f"redis://viewer:s3cret@127.0.0.1:{acl_redis.port}/0"
    assert run(interference(["top", "--redis-url", url])) == 0
    out = capsys.readouterr().out
    assert f"redis://viewer:***@127.0.0.1:{acl_redis.port}/0" in out and "n1" in out
    assert "s3cret" not in out
