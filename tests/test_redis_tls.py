"""TLS to Redis (``rediss://`` with a CA and a client certificate) for all three programs,
against a real redis-server with TLS and ``tls-auth-clients yes``; certificates are made
with openssl for each test session."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from interference import keys
from interference.signals import NodeReport
from interference_cli import main as cli_main
from interference_infra.redis_tls import RedisTls
from node_agent import cli as agent_cli
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.entry import cli as scheduler_cli
from scheduler.entry.config import SchedulerConfig, with_overrides
from scheduler.signals.frame import SignalFrame
from tests.conftest import free_port
from tests.scheduler.frames import stale_nodes
from tests.shaped_reports import shaped_report

pytestmark = pytest.mark.redis


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    """The client's certificate and key, signed by ``ca``."""
    server_cert: Path
    server_key: Path

    @property
    def tls(self) -> RedisTls:
        return RedisTls(str(self.ca), str(self.cert), str(self.key))


def openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def make_pki(directory: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all 1 day."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificates")
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=interference test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        cwd=directory,
    )
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, extra in (("server", ["-extfile", "san.cnf"]), ("client", [])):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=directory,
        )
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            f"{name}.pem",
            *extra,
            cwd=directory,
        )
    return Pki(
        directory / "ca.pem",
        directory / "client.pem",
        directory / "client.key",
        directory / "server.pem",
        directory / "server.key",
    )


@dataclass(frozen=True)
class TlsRedis:
    port: int
    pki: Pki

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis[bytes]:
        return redis.Redis.from_url(self.url, **self.pki.tls.client_kwargs())


@pytest.fixture(scope="module")
def tls_redis() -> Iterator[TlsRedis]:
    """redis-server listening only on TLS, requiring client certificates."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed; run `make setup`")
    with tempfile.TemporaryDirectory() as workdir:
        directory = Path(workdir)
        pki = make_pki(directory)
        port = free_port()
        proc = subprocess.Popen(
            [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
             "--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key),
             "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "yes",
             "--save", "", "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        server = TlsRedis(port, pki)
        try:
            deadline = time.monotonic() + 15
            while True:
                assert proc.poll() is None, "redis-server with TLS exited (built without TLS?)"
                try:
                    server.client().ping()
                    break
                except redis.ConnectionError:
                    assert time.monotonic() < deadline, "redis-server with TLS did not answer"
                    time.sleep(0.05)
            yield server
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def report(node: str) -> NodeReport:
    """A report shaped as the agent writes it (pods with histograms, windows, runq)."""
    return shaped_report(node, time.time(), pods=5)


def follow(settings: RedisSettings, node: str) -> SignalFrame:
    """The frame of the scheduler's signal cache following ``node`` with ``settings``,
    after one poll that accepted its record."""
    connection = connect(settings, {})
    try:
        cache = RedisSignalCache(
            connection, settings, SignalMetrics(CollectorRegistry()), known_nodes=lambda: [node]
        )
        assert cache.poll_once() == 1
        # The ranking `interference top` lists is the scheduler's to write.
        assert cache.write_ranking()
        return cache.snapshot()
    finally:
        connection.close()


def test_the_agent_publishes_over_tls_with_a_client_certificate(tls_redis: TlsRedis) -> None:
    args = agent_cli.parser({}).parse_args(
        [
            "--no-kubernetes",
            "--redis-url", tls_redis.url,
            "--redis-ca-file", str(tls_redis.pki.ca),
            "--redis-cert-file", str(tls_redis.pki.cert),
            "--redis-key-file", str(tls_redis.pki.key),
        ]
    )  # fmt: skip
    settings = agent_cli.settings_from_args(args, {})
    assert settings.redis_tls == tls_redis.pki.tls
    publisher = RedisPublisher(PublisherSettings(settings.redis_url, tls=settings.redis_tls))
    try:
        assert publisher.publish(report("tls-node-1"))
    finally:
        publisher.close()
    assert tls_redis.client().exists(keys.sched_key("tls-node-1"), keys.node_key("tls-node-1")) == 2


def test_without_the_client_certificate_the_agent_drops_and_says_so(
    tls_redis: TlsRedis, caplog: pytest.LogCaptureFixture
) -> None:
    publisher = RedisPublisher(
        PublisherSettings(tls_redis.url, tls=RedisTls(ca_file=str(tls_redis.pki.ca)))
    )
    try:
        assert not publisher.publish(report("tls-node-2"))
    finally:
        publisher.close()
    assert "unreachable" in caplog.text or "Redis error" in caplog.text


def test_the_scheduler_reads_signals_over_tls_from_its_environment(tls_redis: TlsRedis) -> None:
    pki = tls_redis.pki
    env = {
        "REDIS_URL": tls_redis.url,
        "REDIS_CA_FILE": str(pki.ca),
        "REDIS_CERT_FILE": str(pki.cert),
        "REDIS_KEY_FILE": str(pki.key),
    }
    args = scheduler_cli.build_parser().parse_args([])
    config = with_overrides(SchedulerConfig(), **scheduler_cli.overrides(args, env))
    assert (config.redis.ca_file, config.redis.cert_file) == (str(pki.ca), str(pki.cert))
    publisher = RedisPublisher(PublisherSettings(tls_redis.url, tls=pki.tls))
    sent = report("tls-node-3")
    try:
        assert publisher.publish(sent)
    finally:
        publisher.close()
    frame = follow(config.redis, "tls-node-3")
    row = frame.row("tls-node-3")
    assert row is not None
    assert frame.columns["signals_at"][row] == sent.ts
    assert stale_nodes(frame, sent.ts) == []
    assert frame.columns["index_mean@latest"][row] > 0  # computed by the scheduler


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        status = cli_main.main(argv, {})
    except SystemExit as exc:
        status = int(exc.code or 0)
    out = capsys.readouterr()
    return status, out.out, out.err


def test_the_cli_reads_over_tls(tls_redis: TlsRedis, capsys: pytest.CaptureFixture[str]) -> None:
    publisher = RedisPublisher(PublisherSettings(tls_redis.url, tls=tls_redis.pki.tls))
    try:
        assert publisher.publish(report("tls-node-4"))
    finally:
        publisher.close()
    pki = tls_redis.pki
    settings = RedisSettings(url=tls_redis.url, ca_file=str(pki.ca), cert_file=str(pki.cert),
                             key_file=str(pki.key))  # fmt: skip
    follow(settings, "tls-node-4")
    status, out, err = run_cli(
        ["top", "--redis-url", tls_redis.url, "--redis-ca-file", str(pki.ca),
         "--redis-cert-file", str(pki.cert), "--redis-key-file", str(pki.key)],
        capsys,
    )  # fmt: skip
    assert status == 0, err
    assert "tls-node-4" in out and tls_redis.url in out


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["ca"], "cannot reach Redis at rediss://"),  # no client certificate: refused
        (["cert", "key"], "certificate verify failed"),  # the system CAs do not know ours
    ],
)
def test_the_cli_says_why_tls_fails(
    tls_redis: TlsRedis, options: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = tls_redis.pki
    flags = {"ca": ["--redis-ca-file", str(pki.ca)], "cert": ["--redis-cert-file", str(pki.cert)],
             "key": ["--redis-key-file", str(pki.key)]}  # fmt: skip
    argv = ["top", "--redis-url", tls_redis.url, *[f for o in options for f in flags[o]]]
    status, _, err = run_cli(argv, capsys)
    assert status == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err


def test_plain_redis_to_a_tls_port_is_one_line(
    tls_redis: TlsRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run_cli(
        ["top", "--redis-url", f"redis://127.0.0.1:{tls_redis.port}/0"], capsys
    )
    assert status == 1
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
