"""``interference-credentials``: issue each node agent its own Redis ACL user.

Every flag falls back to an environment variable (named in ``--help``); the Redis target is
configured exactly as for the other programs (``REDIS_URL``, ``REDIS_USERNAME``,
``REDIS_PASSWORD`` or ``REDIS_PASSWORD_FILE``, ``REDIS_CLUSTER``, ``REDIS_SENTINELS``,
``REDIS_CA_FILE``, …).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from types import FrameType

from prometheus_client import CollectorRegistry

from credential_issuer.issuer import Issuer, IssuerMetrics
from credential_issuer.node_events import KubernetesNodeEvents
from credential_issuer.redis_users import AgentUsers
from credential_issuer.review import KubernetesPodBinding, KubernetesTokenReviewer, api_client
from credential_issuer.server import IssuerServer
from credential_issuer.settings import (
    CREDENTIALS_PATH,
    DEFAULT_AGENT_SERVICE_ACCOUNT,
    DEFAULT_AUDIENCE,
    DEFAULT_PORT,
    IssuerSettings,
    parse_service_account,
    redis_target,
)
from credential_issuer.warden import Warden, WardenLimits
from interference_infra.cliparse import RUNTIME_EXIT, OneLineParser
from interference_infra.logsetup import configure_logging
from interference_infra.redis_arguments import add_redis_arguments, redis_arguments
from interference_infra.redis_client import credentials_from_env, password_file_from_env
from interference_infra.server_tls import ServerTls
from interference_infra.strict import parse_number
from interference_infra.version import add_version_argument

log = logging.getLogger("credential_issuer")

READY_CACHE_S = 2.0
"""``/readyz`` pings Redis at most this often."""


def parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="interference-credentials",
        description="Issue each node agent its own Redis ACL user (agent:NODE, allowed only "
        "its node's keys) after a TokenReview of the agent's pod-bound ServiceAccount token: "
        f"POST {CREDENTIALS_PATH} with 'Authorization: Bearer TOKEN' answers "
        '{"node", "username", "password"}. Every flag falls back to the environment '
        "variable named in its help.",
    )
    add_version_argument(p)
    p.add_argument(
        "--address",
        default=environ.get("HTTP_ADDRESS", "0.0.0.0"),
        help="listen address (env HTTP_ADDRESS; default %(default)s)",
    )
    p.add_argument(
        "--port",
        default=environ.get("HTTP_PORT") or str(DEFAULT_PORT),
        help="listen port, 0–65535 (env HTTP_PORT; default %(default)s)",
    )
    p.add_argument(
        "--tls-cert-file",
        default=environ.get("TLS_CERT_FILE") or None,
        metavar="PEM",
        help="serve HTTPS with this certificate chain (env TLS_CERT_FILE; reloaded when it "
        "changes); without it plain HTTP",
    )
    p.add_argument(
        "--tls-key-file",
        default=environ.get("TLS_KEY_FILE") or None,
        metavar="PEM",
        help="private key of that certificate (env TLS_KEY_FILE)",
    )
    p.add_argument(
        "--audience",
        default=environ.get("TOKEN_AUDIENCE") or DEFAULT_AUDIENCE,
        help="the audience agents' tokens must be issued for (env TOKEN_AUDIENCE; default "
        "%(default)s)",
    )
    p.add_argument(
        "--agent-service-account",
        default=environ.get("AGENT_SERVICE_ACCOUNT") or DEFAULT_AGENT_SERVICE_ACCOUNT,
        metavar="NAMESPACE/NAME",
        help="the agents' ServiceAccount, the only one whose tokens are accepted (env "
        "AGENT_SERVICE_ACCOUNT; default %(default)s)",
    )
    p.add_argument(
        "--min-reissue-interval",
        default=environ.get("MIN_REISSUE_S") or "5",
        metavar="SECONDS",
        help="at most one issue per node per this many seconds, more is answered 429 (env "
        "MIN_REISSUE_S; default %(default)s)",
    )
    p.add_argument(
        "--warden",
        default=environ.get("WARDEN") or "on",
        choices=("on", "off"),
        help="cut off a node that keeps more in Redis than an agent may (env WARDEN; default "
        "%(default)s; off on a Redis Cluster, which it cannot follow)",
    )
    p.add_argument(
        "--agent-max-ttl",
        default=environ.get("AGENT_MAX_TTL_S") or str(WardenLimits.agent_max_ttl_s),
        metavar="SECONDS",
        help="the longest TTL an agent may give its keys, its --ttl (env AGENT_MAX_TTL_S; "
        "default %(default)s)",
    )
    p.add_argument(
        "--kubeconfig",
        default=environ.get("KUBECONFIG") or None,
        help="kubeconfig for the TokenReviews (env KUBECONFIG; default: the in-cluster "
        "ServiceAccount, which needs create on tokenreviews.authentication.k8s.io)",
    )
    add_redis_arguments(
        p, environ, user="allowed ACL SETUSER and PING", cluster="; users are created on every node"
    )
    p.add_argument(
        "--log-level",
        default=environ.get("LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR (env LOG_LEVEL; default INFO)",
    )
    p.add_argument(
        "--log-format",
        default=environ.get("LOG_FORMAT", "text"),
        help="json or text (env LOG_FORMAT; default text)",
    )
    return p


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> IssuerSettings:
    """Settings from parsed flags and the environment; ``ValueError`` naming what is wrong."""
    redis = redis_arguments(args, environ)
    port = parse_number("--port/HTTP_PORT", args.port, minimum=0, maximum=65535, integer=True)
    reissue = parse_number(
        "--min-reissue-interval/MIN_REISSUE_S", args.min_reissue_interval, minimum=0
    )
    username, password = credentials_from_env(environ)
    target = redis_target(
        redis.url,
        username=username,
        password=password,
        password_file=password_file_from_env(environ),
        cluster=redis.cluster,
        sentinels=redis.sentinels,
        sentinel_master=redis.sentinel_master,
        tls=redis.tls,
    )
    max_ttl = parse_number(
        "--agent-max-ttl/AGENT_MAX_TTL_S", args.agent_max_ttl, minimum=1, integer=True
    )
    return IssuerSettings(
        redis=target,
        warden=args.warden == "on" and not redis.cluster,
        limits=WardenLimits(agent_max_ttl_s=int(max_ttl)),
        address=args.address,
        port=int(port),
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        audience=args.audience,
        agent_service_account=parse_service_account(args.agent_service_account),
        kubeconfig=args.kubeconfig,
        min_reissue_s=reissue,
    )


class Readiness:
    """``/readyz``: Redis answers (pinged at most every :data:`READY_CACHE_S`)."""

    def __init__(self, users: AgentUsers) -> None:
        self._users = users
        self._lock = threading.Lock()
        self._checked = -READY_CACHE_S
        self._problem = ""

    def __call__(self) -> str:
        with self._lock:
            now = time.monotonic()
            if now - self._checked >= READY_CACHE_S:
                self._problem = self._users.ping()
                self._checked = now
            return self._problem


def build(
    settings: IssuerSettings, registry: CollectorRegistry
) -> tuple[IssuerServer, AgentUsers, Warden | None]:
    """The server and the warden (neither started) and the Redis users; ``ValueError`` for
    unusable settings (Kubernetes credentials), ``OSError``/``ssl.SSLError`` when it
    cannot bind or read its certificate."""
    kubernetes = api_client(settings.kubeconfig, settings.max_connections)
    reviewer = KubernetesTokenReviewer(kubernetes, settings.audience, settings.review_timeout_s)
    binding = KubernetesPodBinding(kubernetes, settings.review_timeout_s)
    users = AgentUsers(settings.redis, settings.redis_socket_timeout_s)
    metrics = IssuerMetrics(registry)
    warden = None
    if settings.warden:
        node_events = KubernetesNodeEvents(
            kubernetes, metrics.node_events, settings.review_timeout_s
        )
        warden = Warden(
            settings.redis,
            settings.limits,
            metrics.warden,
            react_s=settings.warden_react_s,
            sweep_s=settings.warden_sweep_s,
            pressure=settings.warden_pressure,
            cooldown_s=settings.warden_cooldown_s,
            socket_timeout_s=settings.redis_socket_timeout_s,
            on_cut_off=node_events.cut_off,
        )
    issuer = Issuer(
        settings,
        reviewer,
        users,
        metrics,
        binding=binding,
        cooldown=warden.cooldown_left if warden else None,
    )
    tls = None
    try:
        if settings.tls_cert_file and settings.tls_key_file:
            tls = ServerTls(settings.tls_cert_file, settings.tls_key_file)
        server = IssuerServer(
            issuer,
            settings.address,
            settings.port,
            ready=Readiness(users),
            tls=tls,
            max_connections=settings.max_connections,
            request_timeout_s=settings.request_timeout_s,
            max_body_bytes=settings.max_body_bytes,
        )
    except BaseException:
        users.close()
        if warden:
            warden.close()
        raise
    return server, users, warden


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Entry point; 2 for a bad flag or variable, 1 when it cannot serve, 0 after SIGTERM."""
    env = os.environ if environ is None else environ
    arg_parser = parser(env)
    args = arg_parser.parse_args(argv)
    try:
        configure_logging(args.log_level, args.log_format, own=["credential_issuer"])
        settings = settings_from_args(args, env)
    except ValueError as exc:
        arg_parser.error(str(exc))
    try:
        server, users, warden = build(settings, CollectorRegistry())
    except ValueError as exc:
        arg_parser.error(str(exc))
    except (OSError, ssl.SSLError) as exc:
        log.error("cannot serve on %s:%d: %s", settings.address, settings.port, exc)
        return RUNTIME_EXIT
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    server.start()
    if warden:
        warden.start()
    namespace, name = settings.agent_service_account
    log.info(
        "serving %s://%s:%d%s for ServiceAccount %s/%s (audience %s); agent users go to "
        "Redis at %s",
        server.scheme,
        settings.address,
        server.port,
        CREDENTIALS_PATH,
        namespace,
        name,
        settings.audience,
        users.where,
    )
    try:
        stop.wait()
    finally:
        server.stop()
        if warden:
            warden.close()
        users.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
