"""One request for credentials, from bearer token to answer (no HTTP here).

1. The token is reviewed by the API server (:mod:`credential_issuer.review`): invalid,
   expired, revoked, another audience, its pod gone → 401.
2. Its user must be the agents' ServiceAccount, and it must carry a node-name claim that
   is a Kubernetes node name and a pod claim (a pod-bound token of a pod scheduled to a
   node, not one bound to a Node object) → else 403. With a :class:`PodBinding` (the
   program always has one) the pod must exist with that UID on that node, and the Node
   must exist → else 403.
3. Not a node the warden cut off, within its cool-down (:mod:`credential_issuer.warden`),
   and at most one issue per node per ``min_reissue_s`` → else 429 with ``Retry-After``.
4. ``ACL SETUSER agent:NODE`` with a fresh random password on every Redis node, then
   ``CLIENT KILL USER`` of the old password's sessions
   (:mod:`credential_issuer.redis_users`) → 200 ``{"node", "username", "password"}``; a
   Redis or API server that cannot be reached → 503, and the agent retries.

Every answer is counted (``interference_credentials_issued_total``,
``interference_credentials_refused_total{reason}``); each kind of refusal is logged at most
once per ``log_interval_s``, with how many were not logged.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

from credential_issuer.node_events import NodeEventMetrics
from credential_issuer.redis_users import AgentUsers, RedisUnavailable
from credential_issuer.review import (
    NODE_NAME_EXTRA,
    POD_NAME_EXTRA,
    POD_UID_EXTRA,
    PodBinding,
    ReviewUnavailable,
    TokenRejected,
    TokenReviewer,
)
from credential_issuer.settings import IssuerSettings
from credential_issuer.warden import WardenMetrics
from interference import acl, keys
from interference_infra.http import REFUSALS
from interference_infra.redis_client import REDIS_ERRORS

log = logging.getLogger(__name__)

REASONS = (
    "no_token",
    "token_too_long",
    "body_too_large",
    "unauthenticated",
    "wrong_service_account",
    "no_node_claim",
    "bad_node_name",
    "no_pod_claim",
    "pod_not_found",
    "pod_not_on_node",
    "unknown_node",
    "rate_limited",
    "cut_off",
    "review_unavailable",
    "redis_unavailable",
)
"""Every label value of the refusal counter."""

_PRUNE_AT = 4096
"""Entries of the rate limit's table before expired ones are dropped."""

PASSWORD_BYTES = 32
"""Random bytes in each password (``secrets.token_urlsafe``: 43 characters)."""


@dataclass(frozen=True)
class Answer:
    """What to send back."""

    status: int
    body: dict[str, str]
    headers: dict[str, str] = field(default_factory=dict)

    def encoded(self) -> bytes:
        return json.dumps(self.body).encode() + b"\n"


class IssuerMetrics:
    """The issuer's Prometheus metrics, in the registry passed in."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.issued = Counter(
            "interference_credentials_issued",
            "Agent credentials issued (an ACL user created or reset with a new password).",
            registry=registry,
        )
        self.refused = Counter(
            "interference_credentials_refused",
            "Requests for credentials refused, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:
            self.refused.labels(reason=reason)
        self.http_refused = Counter(
            "interference_credentials_http_refused",
            "Connections or requests the HTTP server refused before the issuer saw them, by"
            " reason (slow, too many from one address, too large, failed TLS handshake).",
            ["reason"],
            registry=registry,
        )
        for reason in REFUSALS:
            self.http_refused.labels(reason=reason)
        self.replicas_missed = Counter(
            "interference_credentials_replica_failures",
            "Redis Cluster replicas that did not take an agent user (primaries all did).",
            registry=registry,
        )
        self.warden = WardenMetrics(registry)
        self.node_events = NodeEventMetrics(registry)
        self.duration = Histogram(
            "interference_credentials_request_duration_seconds",
            "Time to answer one request for credentials (review and Redis included).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        )


class _RefusalLog:
    """Logs each kind of refusal at most once per interval, with the count skipped."""

    def __init__(self, interval_s: float, clock: Callable[[], float]) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}
        self._lock = threading.Lock()

    def log(self, reason: str, level: int, message: str) -> None:
        now = self._clock()
        with self._lock:
            last = self._last.get(reason)
            if last is not None and now - last < self._interval_s:
                self._skipped[reason] = self._skipped.get(reason, 0) + 1
                return
            self._last[reason] = now
            skipped = self._skipped.pop(reason, 0)
        more = f" ({skipped} more since the last such line)" if skipped else ""
        log.log(level, "refused (%s): %s%s", reason, message, more)


class Issuer:
    """Answers requests for credentials; threads may share it."""

    def __init__(
        self,
        settings: IssuerSettings,
        reviewer: TokenReviewer,
        users: AgentUsers,
        metrics: IssuerMetrics,
        clock: Callable[[], float] = time.monotonic,
        binding: PodBinding | None = None,
        cooldown: Callable[[str], float] | None = None,
    ) -> None:
        self._settings = settings
        self._reviewer = reviewer
        self._binding = binding
        self._cooldown = cooldown
        """Seconds until a node the warden cut off may have a password again."""
        self._users = users
        self.metrics = metrics
        self._clock = clock
        self._refusals = _RefusalLog(settings.log_interval_s, clock)
        self._issued_at: dict[str, float] = {}
        """Node → when its latest issue began (monotonic): the per-node rate limit."""
        self._prune_at = _PRUNE_AT
        self._lock = threading.Lock()

    def handle(self, authorization: str | None, body_bytes: int) -> Answer:
        """The answer to one ``POST /v1/credentials`` with this ``Authorization`` header
        and a body of ``body_bytes`` (never read)."""
        with self.metrics.duration.time():
            return self._handle(authorization, body_bytes)

    def _handle(self, authorization: str | None, body_bytes: int) -> Answer:
        if body_bytes > self._settings.max_body_bytes:
            return self._refuse(
                413, "body_too_large", f"a body of {body_bytes} bytes", level=logging.INFO
            )
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return self._refuse(
                401,
                "no_token",
                "no Authorization: Bearer header",
                headers={"WWW-Authenticate": 'Bearer realm="interference-credentials"'},
                level=logging.INFO,
            )
        if len(token) > self._settings.max_token_bytes:
            return self._refuse(401, "token_too_long", f"a token of {len(token)} bytes")
        try:
            identity = self._reviewer.review(token)
        except TokenRejected as exc:
            return self._refuse(
                401,
                "unauthenticated",
                f"the API server does not accept the token: {exc}",
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        except ReviewUnavailable as exc:
            return self._refuse(
                503,
                "review_unavailable",
                str(exc),
                headers={"Retry-After": "5"},
                level=logging.ERROR,
            )
        who = identity.username
        if who != self._settings.agent_username:
            return self._refuse(
                403,
                "wrong_service_account",
                f"{who!r} is not the agents' ServiceAccount ({self._settings.agent_username})",
            )
        pods = identity.claim(POD_NAME_EXTRA)
        pod = pods[0] if pods else "(no pod claim)"
        nodes = identity.claim(NODE_NAME_EXTRA)
        if len(nodes) != 1:
            return self._refuse(
                403,
                "no_node_claim",
                f"the token of {who} (pod {pod}) names no node: it must be a projected token "
                "of a pod scheduled to a node",
            )
        node = nodes[0]
        if not keys.valid_node_name(node):
            return self._refuse(
                403, "bad_node_name", f"the token names {node[:80]!r}, not a node name"
            )
        uids = identity.claim(POD_UID_EXTRA)
        if len(pods) != 1 or len(uids) != 1:
            return self._refuse(
                403,
                "no_pod_claim",
                f"the token of {who} names node {node} but no pod: it must be bound to the"
                " agent's pod, not to a Node object",
            )
        if self._binding is not None:
            try:
                reason, message = self._binding.check(
                    self._settings.agent_service_account[0], pods[0], uids[0], node
                )
            except ReviewUnavailable as exc:
                return self._refuse(
                    503, "review_unavailable", str(exc), headers={"Retry-After": "5"},
                    level=logging.ERROR,
                )  # fmt: skip
            if reason:
                return self._refuse(403, reason, message)
        if self._cooldown is not None:
            try:
                left = self._cooldown(node)
            except REDIS_ERRORS as exc:
                return self._refuse(
                    503, "redis_unavailable", f"could not read the cool-down of node {node}: "
                    f"{exc}", headers={"Retry-After": "5"}, level=logging.ERROR,
                )  # fmt: skip
            if left > 0:
                return self._refuse(
                    429,
                    "cut_off",
                    f"node {node} was cut off for keeping more in Redis than an agent may;"
                    f" no new password for {left:.0f} s",
                    headers={"Retry-After": str(max(1, math.ceil(left)))},
                )
        retry_after = self._reserve(node)
        if retry_after > 0:
            return self._refuse(
                429,
                "rate_limited",
                f"node {node} asked again within {self._settings.min_reissue_s:g} s",
                headers={"Retry-After": str(max(1, math.ceil(retry_after)))},
                level=logging.INFO,
            )
        password = secrets.token_urlsafe(PASSWORD_BYTES)
        try:
            applied = self._users.set_user(node, password)
        except RedisUnavailable as exc:
            self._release(node)
            return self._refuse(
                503,
                "redis_unavailable",
                f"could not create the user of node {node}: {exc}",
                headers={"Retry-After": "5"},
                level=logging.ERROR,
            )
        if applied.failed_replicas:
            self.metrics.replicas_missed.inc(len(applied.failed_replicas))
        self.metrics.issued.inc()
        username = acl.agent_username(node)
        log.info(
            "issued %s to pod %s (%d Redis node(s), %d old session(s) closed)",
            username, pod, applied.nodes, applied.sessions_closed,
        )  # fmt: skip
        return Answer(
            200,
            {"node": node, "username": username, "password": password},
            {"Cache-Control": "no-store"},
        )

    def _reserve(self, node: str) -> float:
        """0 and the node's slot taken, else the seconds until it may ask again."""
        now = self._clock()
        window = self._settings.min_reissue_s
        with self._lock:
            last = self._issued_at.get(node)
            if last is not None and now - last < window:
                return window - (now - last)
            self._issued_at[node] = now
            if len(self._issued_at) > self._prune_at:
                # Forget nodes whose window has passed; amortised O(1) per issue.
                for name, at in list(self._issued_at.items()):
                    if now - at >= window:
                        del self._issued_at[name]
                self._prune_at = max(_PRUNE_AT, 2 * len(self._issued_at))
        return 0.0

    def _release(self, node: str) -> None:
        """A failed issue does not count against the node's rate."""
        with self._lock:
            self._issued_at.pop(node, None)

    def _refuse(
        self,
        status: int,
        reason: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        level: int = logging.WARNING,
    ) -> Answer:
        self.metrics.refused.labels(reason=reason).inc()
        self._refusals.log(reason, level, message)
        return Answer(status, {"error": reason, "message": message}, headers or {})
