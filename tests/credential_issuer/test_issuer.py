"""The issuer's decisions, table-driven, with a stand-in reviewer (the real API server's
answers are in tests/e2e/test_credentials.py) and a real redis-server."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import redis
from prometheus_client import CollectorRegistry

from credential_issuer.issuer import REASONS, Issuer, IssuerMetrics
from credential_issuer.redis_users import AgentUsers
from credential_issuer.review import (
    NODE_NAME_EXTRA,
    POD_NAME_EXTRA,
    POD_UID_EXTRA,
    Identity,
    ReviewUnavailable,
    TokenRejected,
    identity_from_status,
)
from credential_issuer.settings import IssuerSettings, redis_target
from credential_issuer.warden import Warden, WardenLimits
from interference import keys
from tests.conftest import RedisServer

pytestmark = pytest.mark.redis

AGENT_SA = "system:serviceaccount:interference-agent:interference-agent"


def agent(node: str | None, pod: str = "agent-xyz") -> Identity:
    extra: dict[str, tuple[str, ...]] = {POD_NAME_EXTRA: (pod,), POD_UID_EXTRA: (f"uid-{pod}",)}
    if node is not None:
        extra[NODE_NAME_EXTRA] = (node,)
    return Identity(AGENT_SA, extra)


TOKENS: dict[str, Identity | Exception] = {
    "token-a": agent("node-a"),
    "token-b": agent("node-b"),
    "other-sa": Identity("system:serviceaccount:default:default", {NODE_NAME_EXTRA: ("node-a",)}),
    "no-node": agent(None),
    "two-nodes": Identity(AGENT_SA, {NODE_NAME_EXTRA: ("node-a", "node-b")}),
    "glob-node": agent("node-*"),
    "colon-node": agent("node:a"),
    "node-bound": Identity(AGENT_SA, {NODE_NAME_EXTRA: ("node-a",)}),  # a Node object's token
    "expired": TokenRejected("token has expired"),
    "api-down": ReviewUnavailable("connection refused"),
}


class FakeReviewer:
    def __init__(self) -> None:
        self.reviewed: list[str] = []

    def review(self, token: str) -> Identity:
        self.reviewed.append(token)
        answer = TOKENS.get(token, TokenRejected("invalid bearer token"))
        if isinstance(answer, Exception):
            raise answer
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def users(redis_server: RedisServer) -> Iterator[AgentUsers]:
    made = AgentUsers(redis_target(redis_server.url), 2.0)
    yield made
    made.close()


def make_issuer(users: AgentUsers, clock: Clock, **overrides: object) -> Issuer:
    settings = IssuerSettings(redis=redis_target("redis://127.0.0.1:1/0"), **overrides)  # type: ignore[arg-type]
    return Issuer(settings, FakeReviewer(), users, IssuerMetrics(CollectorRegistry()), clock)


def refused(issuer: Issuer, reason: str) -> float:
    return issuer.metrics.refused.labels(reason=reason)._value.get()


@pytest.mark.parametrize(
    ("authorization", "body", "status", "reason"),
    [
        (None, 0, 401, "no_token"),
        ("", 0, 401, "no_token"),
        ("Basic dXNlcjpwdw==", 0, 401, "no_token"),
        ("Bearer ", 0, 401, "no_token"),
        ("Bearer " + "x" * 20000, 0, 401, "token_too_long"),
        ("Bearer token-a", 5000, 413, "body_too_large"),
        ("Bearer garbage", 0, 401, "unauthenticated"),
        ("Bearer expired", 0, 401, "unauthenticated"),
        ("Bearer other-sa", 0, 403, "wrong_service_account"),
        ("Bearer no-node", 0, 403, "no_node_claim"),
        ("Bearer two-nodes", 0, 403, "no_node_claim"),
        ("Bearer glob-node", 0, 403, "bad_node_name"),
        ("Bearer colon-node", 0, 403, "bad_node_name"),
        ("Bearer node-bound", 0, 403, "no_pod_claim"),
        ("Bearer api-down", 0, 503, "review_unavailable"),
    ],
)
def test_refusals_create_no_user(
    users: AgentUsers,
    redis_server: RedisServer,
    authorization: str | None,
    body: int,
    status: int,
    reason: str,
) -> None:
    issuer = make_issuer(users, Clock())
    answer = issuer.handle(authorization, body)
    assert (answer.status, answer.body["error"]) == (status, reason)
    assert "password" not in answer.body
    assert refused(issuer, reason) == 1
    assert issuer.metrics.issued._value.get() == 0
    assert redis_server.client().execute_command("ACL", "USERS") == ["default"]
    assert reason in REASONS


def test_a_node_token_yields_its_own_user_only(
    users: AgentUsers, redis_server: RedisServer
) -> None:
    issuer = make_issuer(users, Clock())
    answer = issuer.handle("Bearer token-a", 0)
    assert answer.status == 200
    assert answer.body["node"] == "node-a"
    assert answer.body["username"] == "agent:node-a"
    assert len(answer.body["password"]) >= 43
    assert answer.headers["Cache-Control"] == "no-store"
    assert issuer.metrics.issued._value.get() == 1
    client = redis.Redis(
        port=redis_server.port, username="agent:node-a", password=answer.body["password"]
    )
    client.set(keys.sched_key("node-a"), b"x")
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.set(keys.sched_key("node-b"), b"x")


def test_one_issue_per_node_per_window(users: AgentUsers) -> None:
    clock = Clock()
    issuer = make_issuer(users, clock, min_reissue_s=5.0)
    first = issuer.handle("Bearer token-a", 0)
    assert first.status == 200
    clock.now += 2
    again = issuer.handle("Bearer token-a", 0)
    assert (again.status, again.body["error"]) == (429, "rate_limited")
    assert again.headers["Retry-After"] == "3"
    clock.now += 0.5
    assert issuer.handle("Bearer token-a", 0).headers["Retry-After"] == "3"  # 2.5 s: ceil
    assert issuer.handle("Bearer token-b", 0).status == 200  # another node is not held up
    clock.now += 2.5
    later = issuer.handle("Bearer token-a", 0)
    assert later.status == 200
    assert later.body["password"] != first.body["password"]


def test_redis_down_is_503_and_does_not_use_up_the_window(redis_server: RedisServer) -> None:
    users = AgentUsers(redis_target(redis_server.url), 0.5)
    issuer = make_issuer(users, Clock())
    redis_server.stop()
    try:
        answer = issuer.handle("Bearer token-a", 0)
        assert (answer.status, answer.body["error"]) == (503, "redis_unavailable")
        assert answer.headers["Retry-After"] == "5"
        assert users.ping().startswith("Redis at redis://127.0.0.1")
        redis_server.start()
        assert issuer.handle("Bearer token-a", 0).status == 200
        assert users.ping() == ""
    finally:
        users.close()


def test_a_redis_user_without_acl_rights_is_named(redis_server: RedisServer) -> None:
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "weak", "on", ">pw", "-@all", "+ping")
    users = AgentUsers(redis_target(redis_server.url, username="weak", password="pw"), 1.0)
    issuer = make_issuer(users, Clock())
    try:
        answer = issuer.handle("Bearer token-a", 0)
        assert answer.status == 503
        assert "+acl|setuser +client|kill +ping" in answer.body["message"]
    finally:
        users.close()


def test_each_kind_of_refusal_is_logged_once_per_interval(
    users: AgentUsers, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    issuer = make_issuer(users, clock, log_interval_s=60.0)
    with caplog.at_level(logging.INFO, logger="credential_issuer"):
        for _ in range(5):
            issuer.handle("Bearer garbage", 0)
            issuer.handle("Bearer other-sa", 0)
        clock.now += 61
        issuer.handle("Bearer garbage", 0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    assert len(lines) == 3, lines
    assert lines[0].startswith("refused (unauthenticated)")
    assert lines[1].startswith("refused (wrong_service_account)")
    assert "(4 more since the last such line)" in lines[2]
    assert refused(issuer, "unauthenticated") == 6


@pytest.mark.parametrize(
    ("status", "error"),
    [
        ({"authenticated": False, "error": "invalid bearer token"}, "invalid bearer token"),
        ({"user": {}, "error": "token audiences invalid"}, "token audiences invalid"),
        ({"authenticated": True, "user": {"username": "x"}}, "audience"),
        ({"authenticated": True, "audiences": ["other"], "user": {"username": "x"}}, "audience"),
    ],
)
def test_review_status_that_is_not_an_identity(status: dict[str, object], error: str) -> None:
    with pytest.raises(TokenRejected, match=error):
        identity_from_status(status, "interference-credentials")


def test_review_status_with_node_claim() -> None:
    status = {
        "authenticated": True,
        "audiences": ["interference-credentials"],
        "user": {
            "username": AGENT_SA,
            "extra": {NODE_NAME_EXTRA: ["node-a"], POD_NAME_EXTRA: ["agent-1"]},
        },
    }
    identity = identity_from_status(status, "interference-credentials")
    assert identity.username == AGENT_SA
    assert identity.claim(NODE_NAME_EXTRA) == ("node-a",)
    assert identity.claim("missing") == ()


class Binding:
    """What the API server would say of each pod: (reason, message) or none."""

    def __init__(self, answers: dict[str, tuple[str, str]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str, str, str]] = []

    def check(self, namespace: str, pod: str, uid: str, node: str) -> tuple[str, str]:
        self.asked.append((namespace, pod, uid, node))
        return self.answers.get(pod, ("", ""))


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        (("", ""), 200),
        (("pod_not_found", "gone"), 403),
        (("pod_not_on_node", "elsewhere"), 403),
        (("unknown_node", "no such node"), 403),
    ],
)
def test_the_pod_must_run_on_the_node_the_token_names(
    users: AgentUsers, answer: tuple[str, str], status: int
) -> None:
    binding = Binding({"agent-xyz": answer})
    settings = IssuerSettings(redis=redis_target("redis://127.0.0.1:1/0"))
    issuer = Issuer(
        settings, FakeReviewer(), users, IssuerMetrics(CollectorRegistry()), Clock(), binding
    )
    got = issuer.handle("Bearer token-a", 0)
    assert got.status == status
    assert binding.asked == [("interference-agent", "agent-xyz", "uid-agent-xyz", "node-a")]
    if answer[0]:
        assert got.body["error"] == answer[0] and refused(issuer, answer[0]) == 1
        assert "password" not in got.body


def test_a_reissue_closes_the_old_passwords_sessions(
    users: AgentUsers, redis_server: RedisServer
) -> None:
    """A session logged in with the first password is closed when the node's credentials
    are issued again (as Redis' CLIENT LIST shows); the new password logs in."""
    issuer = make_issuer(users, Clock(), min_reissue_s=0)
    admin = redis_server.client()

    def sessions() -> int:
        return sum(c["user"] == "agent:node-a" for c in admin.client_list())

    first = issuer.handle("Bearer token-a", 0).body
    old = redis.Redis(port=redis_server.port, username="agent:node-a", password=first["password"])
    with pytest.raises(redis.exceptions.NoPermissionError):
        old.ping()  # logged in (an agent may not PING): its connection stays open
    assert sessions() == 1
    answer = issuer.handle("Bearer token-a", 0)
    assert answer.status == 200 and answer.body["password"] != first["password"]
    assert sessions() == 0
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(
            port=redis_server.port, username="agent:node-a", password=first["password"]
        ).ping()
    old.close()


def test_a_node_the_warden_cut_off_gets_no_password_until_its_cool_down_ends(
    users: AgentUsers, redis_server: RedisServer
) -> None:
    """The cool-down is a key in Redis, so every issuer replica reads it."""
    metrics = IssuerMetrics(CollectorRegistry())
    warden = Warden(redis_target(redis_server.url), WardenLimits(), metrics.warden, cooldown_s=2.0)
    settings = IssuerSettings(redis=redis_target(redis_server.url), min_reissue_s=0)
    issuer = Issuer(settings, FakeReviewer(), users, metrics, cooldown=warden.cooldown_left)
    try:
        assert issuer.handle("Bearer token-a", 0).status == 200
        warden.cut_off("node-a", "no_expiry", "a test")
        user = redis_server.client().acl_getuser("agent:node-a")
        assert user is not None and "off" in user["flags"]
        held = issuer.handle("Bearer token-a", 0)
        assert (held.status, held.body["error"]) == (429, "cut_off")
        assert held.headers["Retry-After"] == "2"
        assert issuer.handle("Bearer token-b", 0).status == 200  # another node is not held
        time.sleep(2.1)
        assert issuer.handle("Bearer token-a", 0).status == 200
        user = redis_server.client().acl_getuser("agent:node-a")
        assert user is not None and "on" in user["flags"]
        assert metrics.warden.cutoffs.labels(reason="no_expiry")._value.get() == 1
        assert refused(issuer, "cut_off") == 1
    finally:
        warden.close()
