"""The issuer's HTTP(S) server and command line, on real sockets with a real redis-server
(the reviewer is a stand-in here; tests/e2e/test_credentials.py uses the real API server)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from credential_issuer import cli
from credential_issuer.issuer import Issuer, IssuerMetrics
from credential_issuer.redis_users import AgentUsers
from credential_issuer.server import IssuerServer
from credential_issuer.settings import DEFAULT_PORT, IssuerSettings, redis_target
from interference_infra.server_tls import ServerTls
from tests.conftest import RedisServer, free_port
from tests.credential_issuer.test_issuer import FakeReviewer

pytestmark = pytest.mark.redis


def make_cert(directory: Path, name: str = "issuer") -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def serve(
    redis_server: RedisServer, tls: ServerTls | None = None, **server_args: object
) -> tuple[IssuerServer, AgentUsers]:
    users = AgentUsers(redis_target(redis_server.url), 1.0)
    settings = IssuerSettings(redis=redis_target(redis_server.url))
    issuer = Issuer(settings, FakeReviewer(), users, IssuerMetrics(CollectorRegistry()))
    server = IssuerServer(
        issuer,
        "127.0.0.1",
        0,
        ready=cli.Readiness(users),
        tls=tls,
        **server_args,  # type: ignore[arg-type]
    )
    server.start()
    return server, users


@pytest.fixture
def plain(redis_server: RedisServer) -> Iterator[IssuerServer]:
    server, users = serve(redis_server)
    yield server
    server.stop()
    users.close()


def request(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    context: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        conn.close()


def test_credentials_endpoint(plain: IssuerServer) -> None:
    status, headers, body = request(
        plain.port, "POST", "/v1/credentials", {"Authorization": "Bearer token-a"}
    )
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    answer = json.loads(body)
    assert answer["node"] == "node-a" and answer["username"] == "agent:node-a"
    status, headers, body = request(
        plain.port, "POST", "/v1/credentials", {"Authorization": "Bearer other-sa"}
    )
    assert (status, json.loads(body)["error"]) == (403, "wrong_service_account")
    status, headers, body = request(plain.port, "POST", "/v1/credentials")
    assert status == 401 and "WWW-Authenticate" in headers


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("GET", "/healthz", {}, 200),
        ("GET", "/readyz", {}, 200),
        ("GET", "/v1/credentials", {}, 405),
        ("GET", "/nothing", {}, 404),
        ("POST", "/v1/other", {"Authorization": "Bearer token-a"}, 404),
        ("POST", "/v1/credentials", {"Content-Length": "-1"}, 400),
        ("POST", "/v1/credentials", {"Content-Length": "999999999"}, 413),
        ("POST", "/v1/credentials", {"Transfer-Encoding": "chunked"}, 411),
    ],
)
def test_routes(
    plain: IssuerServer, method: str, path: str, headers: dict[str, str], status: int
) -> None:
    assert request(plain.port, method, path, headers)[0] == status


def test_metrics_count_issued_and_refused(plain: IssuerServer) -> None:
    request(plain.port, "POST", "/v1/credentials", {"Authorization": "Bearer token-b"})
    request(plain.port, "POST", "/v1/credentials", {"Authorization": "Bearer no-node"})
    _, _, body = request(plain.port, "GET", "/metrics")
    text = body.decode()
    assert "interference_credentials_issued_total 1.0" in text
    assert 'interference_credentials_refused_total{reason="no_node_claim"} 1.0' in text
    assert 'interference_credentials_refused_total{reason="rate_limited"} 0.0' in text


def test_readyz_says_redis_is_away(redis_server: RedisServer) -> None:
    server, users = serve(redis_server)
    try:
        redis_server.stop()
        time.sleep(cli.READY_CACHE_S)
        status, _, body = request(server.port, "GET", "/readyz")
        assert status == 503 and b"does not answer" in body
    finally:
        server.stop()
        users.close()


def test_tls_and_certificate_renewal(redis_server: RedisServer, tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    server, users = serve(redis_server, ServerTls(str(cert), str(key)))
    try:
        trusted = ssl.create_default_context(cafile=str(cert))
        status, _, body = request(
            server.port, "POST", "/v1/credentials", {"Authorization": "Bearer token-a"},
            context=trusted,
        )  # fmt: skip
        assert status == 200 and json.loads(body)["username"] == "agent:node-a"
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            request(server.port, "GET", "/healthz")  # plain HTTP to a TLS port
        # A renewed pair is served from the next connection on, without a restart.
        new_cert, new_key = make_cert(tmp_path, "renewed")
        cert.write_bytes(new_cert.read_bytes())
        key.write_bytes(new_key.read_bytes())
        renewed = ssl.create_default_context(cafile=str(new_cert))
        assert request(server.port, "GET", "/healthz", context=renewed)[0] == 200
        with pytest.raises(ssl.SSLError):
            request(server.port, "GET", "/healthz", context=trusted)
    finally:
        server.stop()
        users.close()


def test_slow_clients_cannot_hold_every_thread(redis_server: RedisServer) -> None:
    """With one request thread, a client that connects and sends part of a request holds
    no thread: the next requests are answered at once, and it is cut off (408) at the
    request deadline."""
    server, users = serve(redis_server, max_connections=1, request_timeout_s=1.0)
    try:
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        idle.sendall(b"POST /v1/credentials HTTP/1.1\r\n")
        started = time.monotonic()
        assert request(server.port, "GET", "/healthz")[0] == 200
        status, _, body = request(
            server.port, "POST", "/v1/credentials", {"Authorization": "Bearer token-a"}
        )
        assert status == 200 and json.loads(body)["username"] == "agent:node-a"
        assert time.monotonic() - started < 1.0
        answer = b""
        while chunk := idle.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408")
        assert 0.5 < time.monotonic() - started < 5
        idle.close()
        _, _, metrics = request(server.port, "GET", "/metrics")
        assert b'interference_credentials_http_refused_total{reason="deadline"} 1.0' in metrics
    finally:
        server.stop()
        users.close()


def test_cli_settings_from_flags_and_env(tmp_path: Path) -> None:
    env = {
        "REDIS_URL": "redis://redis.interference:6379/0",
        "REDIS_USERNAME": "credentials",
        "REDIS_PASSWORD": "pw",
        "REDIS_CLUSTER": "true",
        "HTTP_PORT": "12345",
        "TLS_CERT_FILE": "/tls/tls.crt",
        "TLS_KEY_FILE": "/tls/tls.key",
    }
    args = cli.parser(env).parse_args([])
    settings = cli.settings_from_args(args, env)
    assert settings.port == 12345
    assert settings.redis.cluster and settings.redis.username == "credentials"
    assert settings.redis.password == "pw"
    assert (settings.tls_cert_file, settings.tls_key_file) == ("/tls/tls.crt", "/tls/tls.key")
    assert settings.audience == "interference-credentials"
    assert settings.agent_username == (
        "system:serviceaccount:interference-agent:interference-agent"
    )
    default = cli.settings_from_args(cli.parser({}).parse_args([]), {})
    assert default.port == DEFAULT_PORT == 10272 and default.tls_cert_file is None
    flags = ["--port", "0", "--agent-service-account", "ops/agent", "--audience", "x"]
    custom = cli.settings_from_args(cli.parser({}).parse_args(flags), {})
    assert custom.agent_username == "system:serviceaccount:ops:agent"
    assert custom.audience == "x" and custom.port == 0


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "70000"], {}, "--port/HTTP_PORT"),
        (["--agent-service-account", "agent"], {}, "NAMESPACE/NAME"),
        (["--tls-cert-file", "/x.crt"], {}, "both --tls-cert-file and --tls-key-file"),
        ([], {"REDIS_URL": "http://x"}, "redis://"),
        ([], {"REDIS_CLUSTER": "maybe"}, "REDIS_CLUSTER"),
        (["--min-reissue-interval", "-1"], {}, "MIN_REISSUE_S"),
    ],
)
def test_cli_refuses_bad_settings_in_one_line(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv, env)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_the_program_serves_tls_from_the_environment_and_stops_on_sigterm(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """``interference-credentials`` as deploy/ runs it: TLS from TLS_CERT_FILE/TLS_KEY_FILE,
    Redis from REDIS_URL; /readyz answers once Redis does; SIGTERM ends it with 0."""
    cert, key = make_cert(tmp_path)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "REDIS_URL": redis_server.url,
        "HTTP_ADDRESS": "127.0.0.1",
        "HTTP_PORT": str(port),
        "TLS_CERT_FILE": str(cert),
        "TLS_KEY_FILE": str(key),
        "KUBECONFIG": str(kubeconfig),
    }
    program = Path(sys.executable).parent / "interference-credentials"
    proc = subprocess.Popen(
        [str(program)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        trusted = ssl.create_default_context(cafile=str(cert))
        deadline = time.monotonic() + 20
        while True:
            try:
                status, _, _ = request(port, "GET", "/readyz", context=trusted)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "never served"
                time.sleep(0.1)
        assert status == 200
        # The API server in the kubeconfig is not there: a request is 503, not a crash.
        status, headers, body = request(
            port, "POST", "/v1/credentials", {"Authorization": "Bearer t"}, context=trusted
        )
        assert (status, json.loads(body)["error"]) == (503, "review_unavailable")
        assert headers["Retry-After"] == "5"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    text = out.decode()
    assert proc.returncode == 0, text
    assert f"serving https://127.0.0.1:{port}/v1/credentials" in text
    assert "Traceback" not in text
