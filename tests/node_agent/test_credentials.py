"""The agent's enrolment for its own Redis user: requests to the issuer, backoff, and the
publisher logging in as the issued user and enrolling again when Redis forgets it.

The issuer here is the real ``credential_issuer`` HTTP server and Redis code with a
stand-in token reviewer (a token's text names its node); tests/e2e/test_credentials.py
runs the real TokenReview."""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from credential_issuer.issuer import Issuer, IssuerMetrics
from credential_issuer.redis_users import AgentUsers
from credential_issuer.server import IssuerServer
from credential_issuer.settings import IssuerSettings, redis_target
from interference import keys
from interference.signals import NodeMetrics, NodeReport
from interference_infra.server_tls import ServerTls
from node_agent import cli
from node_agent.agent import Agent
from node_agent.credentials import (
    Credentials,
    Enrolment,
    EnrolmentError,
    EnrolmentSettings,
    fetch_credentials,
)
from node_agent.pods import StaticPodDirectory
from node_agent.publisher import PublisherSettings, RedisPublisher, refuses_credentials
from node_agent.settings import AgentSettings
from tests.conftest import RedisServer, free_port
from tests.credential_issuer.test_issuer import FakeReviewer
from tests.credential_issuer.test_server import make_cert

pytestmark = pytest.mark.redis


@pytest.fixture
def issuer(redis_server: RedisServer) -> Iterator[IssuerServer]:
    """The issuer on loopback, creating users in the test's redis-server; no rate limit."""
    users = AgentUsers(redis_target(redis_server.url), 1.0)
    settings = IssuerSettings(redis=redis_target(redis_server.url), min_reissue_s=0)
    server = IssuerServer(
        Issuer(settings, FakeReviewer(), users, IssuerMetrics(CollectorRegistry())),
        "127.0.0.1",
        0,
        ready=lambda: "",
    )
    server.start()
    yield server
    server.stop()
    users.close()


def token_file(tmp_path: Path, token: str) -> str:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    return str(path)


def enrolment_settings(port: int, token: str, tmp_path: Path) -> EnrolmentSettings:
    return EnrolmentSettings(
        url=f"http://127.0.0.1:{port}",
        token_file=token_file(tmp_path, token),
        timeout_s=2.0,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )


def report(node: str = "node-a") -> NodeReport:
    return NodeReport(
        node=node, ts=time.time(), interval_s=1.0, metrics=NodeMetrics(), measured=("runq",)
    )


# --- one request -------------------------------------------------------------------------


def test_fetch_gets_the_nodes_user(issuer: IssuerServer, tmp_path: Path) -> None:
    issued = fetch_credentials(enrolment_settings(issuer.port, "token-a", tmp_path), "node-a")
    assert issued.username == "agent:node-a"
    assert "password=***" in repr(issued) and issued.password not in repr(issued)


@pytest.mark.parametrize(
    ("token", "node", "message"),
    [
        ("garbage", "node-a", "HTTP 401: the token was not accepted"),
        ("other-sa", "node-a", "HTTP 403"),
        ("no-node", "node-a", "names no node"),
        ("token-b", "node-a", "issued credentials for node 'node-b'"),
        ("api-down", "node-a", "HTTP 503"),
    ],
)
def test_fetch_says_why_it_got_nothing(
    issuer: IssuerServer, tmp_path: Path, token: str, node: str, message: str
) -> None:
    with pytest.raises(EnrolmentError, match=message):
        fetch_credentials(enrolment_settings(issuer.port, token, tmp_path), node)


def test_fetch_over_https_trusting_the_issuers_ca(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    cert, key = make_cert(tmp_path)
    users = AgentUsers(redis_target(redis_server.url), 1.0)
    settings = IssuerSettings(redis=redis_target(redis_server.url))
    server = IssuerServer(
        Issuer(settings, FakeReviewer(), users, IssuerMetrics(CollectorRegistry())),
        "127.0.0.1",
        0,
        ready=lambda: "",
        tls=ServerTls(str(cert), str(key)),
    )
    server.start()
    try:
        url = f"https://127.0.0.1:{server.port}"
        trusting = EnrolmentSettings(url=url, token_file=token_file(tmp_path, "token-a"),
                                     ca_file=str(cert))  # fmt: skip
        assert fetch_credentials(trusting, "node-a").username == "agent:node-a"
        system_cas = EnrolmentSettings(url=url, token_file=token_file(tmp_path, "token-b"))
        with pytest.raises(EnrolmentError, match="CERTIFICATE_VERIFY_FAILED"):
            fetch_credentials(system_cas, "node-b")
    finally:
        server.stop()
        users.close()


def test_fetch_without_token_or_issuer(tmp_path: Path) -> None:
    missing = EnrolmentSettings(url="http://127.0.0.1:1", token_file=str(tmp_path / "none"))
    with pytest.raises(EnrolmentError, match="cannot read the ServiceAccount token"):
        fetch_credentials(missing, "node-a")
    away = EnrolmentSettings(
        url=f"http://127.0.0.1:{free_port()}", token_file=token_file(tmp_path, "t")
    )
    with pytest.raises(EnrolmentError, match="cannot be reached"):
        fetch_credentials(away, "node-a")


def test_retry_after_of_a_429_is_kept(tmp_path: Path) -> None:
    class TooSoon(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.dumps({"error": "rate_limited", "message": "slow down"}).encode()
            self.send_response(429)
            self.send_header("Retry-After", "4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TooSoon)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        settings = enrolment_settings(server.server_address[1], "t", tmp_path)
        with pytest.raises(EnrolmentError, match="HTTP 429: asked too often") as refused:
            fetch_credentials(settings, "node-a")
        assert refused.value.retry_after_s == 4
        clock = [100.0]
        enrolment = Enrolment(settings, "node-a", clock=lambda: clock[0], rng=lambda: 0.5)
        assert not enrolment.attempt()
        assert enrolment._next_try == 104.0
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("http://interference-credentials:10272", "http://interference-credentials:10272/v1/credentials"),
        ("https://issuer.example:10272/", "https://issuer.example:10272/v1/credentials"),
        ("https://issuer.example/custom/path", "https://issuer.example/custom/path"),
    ],
)  # fmt: skip
def test_endpoint(url: str, endpoint: str) -> None:
    assert EnrolmentSettings(url=url).endpoint == endpoint


@pytest.mark.parametrize(
    ("url", "ca_file"),
    [("redis://x", None), ("issuer:10272", None), ("http://", None), ("http://x", "/ca.pem")],
)
def test_unusable_urls(url: str, ca_file: str | None) -> None:
    with pytest.raises(ValueError, match="CREDENTIALS"):
        EnrolmentSettings(url=url, ca_file=ca_file)


# --- backoff -----------------------------------------------------------------------------


def test_backoff_doubles_to_the_cap_and_resets_after_a_good_publish(tmp_path: Path) -> None:
    clock = [0.0]
    outcomes: list[Credentials | EnrolmentError] = [EnrolmentError("down")] * 5
    good = Credentials("agent:node-a", "pw")

    def fetch(_settings: EnrolmentSettings, _node: str) -> Credentials:
        answer = outcomes.pop(0) if outcomes else good
        if isinstance(answer, EnrolmentError):
            raise answer
        return answer

    settings = EnrolmentSettings(
        url="http://x", backoff_initial_s=1.0, backoff_max_s=4.0, token_file="/t"
    )
    events: list[str] = []
    enrolment = Enrolment(
        settings,
        "node-a",
        fetch=fetch,
        clock=lambda: clock[0],
        rng=lambda: 0.5,
        count=events.append,
    )
    waits = []
    for _ in range(5):
        assert not enrolment.attempt()
        waits.append(enrolment._next_try - clock[0])
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert "down" in enrolment.problem()
    assert enrolment.attempt() and enrolment.credentials() == good and enrolment.problem() == ""
    # Refused once after working: enrol again at once; refused again: back off.
    enrolment.confirm()
    enrolment.refused(good, "WRONGPASS")
    assert enrolment.credentials() is None and enrolment._next_try == clock[0] + 0.5
    assert "Redis refused the credentials of agent:node-a (WRONGPASS)" in enrolment.problem()
    assert enrolment.attempt()
    enrolment.refused(good, "NOPERM")
    assert enrolment._next_try == clock[0] + 1.0
    enrolment.refused(good, "again")  # the same set twice: counted once
    assert enrolment._next_try == clock[0] + 1.0
    assert events == ["failed"] * 5 + ["issued", "refused_by_redis", "issued", "refused_by_redis"]


@pytest.mark.parametrize(
    ("error", "refuses"),
    [
        (redis.AuthenticationError("WRONGPASS invalid username-password pair"), True),
        (redis.exceptions.NoPermissionError("NOPERM this user has no permissions"), True),
        (redis.ResponseError("NOAUTH Authentication required."), True),
        (redis.ResponseError("WRONGTYPE Operation against a key"), False),
        (redis.ConnectionError("Connection closed by server."), False),
        (redis.TimeoutError("Timeout reading from socket"), False),
    ],
)
def test_which_errors_mean_new_credentials(error: Exception, refuses: bool) -> None:
    assert refuses_credentials(error) is refuses
    wrapped = redis.exceptions.RedisClusterException("cannot connect")
    wrapped.__cause__ = error
    assert refuses_credentials(wrapped) is refuses


# --- the publisher with an enrolment, against a real redis-server ------------------------


def test_publisher_enrols_and_enrols_again_when_redis_forgets_the_user(
    issuer: IssuerServer,
    redis_server: RedisServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    admin = redis_server.client()
    enrolment = Enrolment(enrolment_settings(issuer.port, "token-a", tmp_path), "node-a")
    publisher = RedisPublisher(PublisherSettings(redis_url=redis_server.url), enrolment)
    try:
        assert not publisher.publish(report()), "no credentials before enrolling"
        assert "not enrolled yet" in enrolment.problem()
        enrolment.start()
        first = enrolment.wait(10)
        assert first is not None and first.username == "agent:node-a"
        assert publisher.publish(report())
        assert admin.exists(keys.sched_key("node-a"))
        # The issued user is held to its node: another node's report is refused by Redis
        # (and does not cost the credentials a re-enrolment loop: NOPERM re-enrols once).
        # Redis restarted and lost its runtime users (ACL DELUSER does the same to them).
        with caplog.at_level(logging.WARNING, logger="node_agent"):
            admin.execute_command("ACL", "DELUSER", "agent:node-a")
            deadline = time.monotonic() + 15
            while not publisher.publish(report()):
                assert time.monotonic() < deadline, enrolment.problem()
                time.sleep(0.05)
        second = enrolment.credentials()
        assert second is not None and second.password != first.password
        assert enrolment.enrolments == 2
        assert any("refused the credentials of agent:node-a" in r.getMessage()
                   for r in caplog.records)  # fmt: skip
        assert admin.execute_command("ACL", "USERS") == ["agent:node-a", "default"]
    finally:
        publisher.close()
        enrolment.stop()


def test_static_credentials_still_work(redis_server: RedisServer) -> None:
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "interference-agent", "on", ">static", "~*", "+@all")
    publisher = RedisPublisher(
        PublisherSettings(
            redis_url=redis_server.url, username="interference-agent", password="static"
        )
    )
    try:
        assert publisher.publish(report())
    finally:
        publisher.close()


def test_readyz_says_why_there_are_no_credentials(tmp_path: Path) -> None:
    settings = AgentSettings(
        node_name="node-a",
        probes=("taskstats", "psi"),
        ncpu=1,
        credentials_url=f"http://127.0.0.1:{free_port()}",
        token_file=token_file(tmp_path, "t"),
    )
    enrolment_config = settings.enrolment()
    assert enrolment_config is not None
    enrolment = Enrolment(enrolment_config, "node-a")
    agent = Agent(settings, StaticPodDirectory(), enrolment=enrolment)
    try:
        agent.start()
        agent.measure()
        agent.measure()
        deadline = time.monotonic() + 10
        while "cannot be reached" not in agent.readiness_problem():
            assert time.monotonic() < deadline, agent.readiness_problem()
            time.sleep(0.05)
        assert agent.readiness_problem().startswith(
            f"no Redis credentials from {enrolment_config.endpoint}"
        )
    finally:
        agent.close()


def test_cli_flags_and_environment(tmp_path: Path) -> None:
    env = {
        "NODE_NAME": "node-a",
        "CREDENTIALS_URL": "https://interference-credentials:10272",
        "CREDENTIALS_CA_FILE": "/ca.pem",
        "REDIS_USERNAME": "ignored",
    }
    args = cli.parser(env).parse_args(["--no-kubernetes"])
    settings = cli.settings_from_args(args, env)
    enrolment = settings.enrolment()
    assert enrolment is not None
    assert enrolment.endpoint == "https://interference-credentials:10272/v1/credentials"
    assert enrolment.token_file == "/var/run/secrets/interference/token"
    assert enrolment.ca_file == "/ca.pem"
    assert "as this node's own user from https://" in cli.redis_description(settings)
    flags = ["--credentials-url", "http://127.0.0.1:1", "--token-file", "/tok"]
    custom = cli.settings_from_args(cli.parser({}).parse_args(flags), {})
    assert custom.enrolment() == EnrolmentSettings(url="http://127.0.0.1:1", token_file="/tok")
    assert cli.settings_from_args(cli.parser({}).parse_args([]), {}).enrolment() is None


def test_cli_refuses_a_bad_credentials_url(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--credentials-url", "issuer:10272", "--no-kubernetes"], {})
    assert exited.value.code == 2
    assert "CREDENTIALS_URL" in capsys.readouterr().err
