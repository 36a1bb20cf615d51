"""The Redis connection flags every program that writes to Redis takes, once: their
names, environment variables and help, and what they parse into (the agent's and the
credential issuer's command lines).

``--redis-url`` (``REDIS_URL``), ``--redis-ca-file`` / ``--redis-cert-file`` /
``--redis-key-file`` (``REDIS_CA_FILE`` …), ``--redis-sentinels`` (``REDIS_SENTINELS``),
``--redis-sentinel-master`` (``REDIS_SENTINEL_MASTER``) and ``--redis-cluster``
(``REDIS_CLUSTER``); the ACL user and password always come from ``REDIS_USERNAME`` /
``REDIS_PASSWORD`` (never a flag: a flag shows in ``ps``).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

from interference_infra.redis_client import DEFAULT_SENTINEL_MASTER, RedisTarget, parse_sentinels
from interference_infra.redis_tls import RedisTls
from interference_infra.strict import SettingsError, parse_bool

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def add_redis_arguments(
    parser: argparse.ArgumentParser, environ: Mapping[str, str], user: str, cluster: str = ""
) -> None:
    """Add the flags; ``user`` says what the ACL user may do, ``cluster`` what this
    program does on a Cluster (both end up in the help)."""
    parser.add_argument(
        "--redis-url",
        default=environ.get("REDIS_URL", DEFAULT_URL),
        help="redis:// or rediss:// (TLS) URL (env REDIS_URL; default %(default)s); the ACL "
        f"user ({user}) and password come from env REDIS_USERNAME / REDIS_PASSWORD",
    )
    parser.add_argument(
        "--redis-ca-file",
        default=environ.get("REDIS_CA_FILE") or None,
        metavar="PEM",
        help="CA certificate that signed the Redis server's (env REDIS_CA_FILE; rediss:// "
        "only; default: the system's CAs)",
    )
    parser.add_argument(
        "--redis-cert-file",
        default=environ.get("REDIS_CERT_FILE") or None,
        metavar="PEM",
        help="client certificate for Redis TLS client authentication (env REDIS_CERT_FILE)",
    )
    parser.add_argument(
        "--redis-key-file",
        default=environ.get("REDIS_KEY_FILE") or None,
        metavar="PEM",
        help="private key of that certificate (env REDIS_KEY_FILE)",
    )
    parser.add_argument(
        "--redis-sentinels",
        default=environ.get("REDIS_SENTINELS", ""),
        metavar="HOST:PORT,…",
        help="find the master through these Redis Sentinels (env REDIS_SENTINELS); "
        "--redis-url then only gives the database number and rediss:// for TLS",
    )
    parser.add_argument(
        "--redis-sentinel-master",
        default=environ.get("REDIS_SENTINEL_MASTER", DEFAULT_SENTINEL_MASTER),
        help="master name the sentinels monitor (env REDIS_SENTINEL_MASTER; default %(default)s)",
    )
    parser.add_argument(
        "--redis-cluster",
        action="store_true",
        default=None,
        help=f"--redis-url names a Redis Cluster node{cluster} (env REDIS_CLUSTER=true)",
    )


@dataclass(frozen=True, slots=True)
class RedisArguments:
    """What the flags say (credentials are the environment's)."""

    url: str
    tls: RedisTls
    sentinels: tuple[tuple[str, int], ...]
    sentinel_master: str
    cluster: bool


def redis_arguments(args: argparse.Namespace, environ: Mapping[str, str]) -> RedisArguments:
    """The parsed flags; :class:`~interference_infra.strict.SettingsError` (a ``ValueError``)
    naming the flag or variable for a value that cannot work."""
    cluster = args.redis_cluster
    if cluster is None:
        raw = environ.get("REDIS_CLUSTER", "")
        cluster = parse_bool("REDIS_CLUSTER", raw) if raw.strip() else False
    check_url(args.redis_url, environ)
    tls = RedisTls(args.redis_ca_file, args.redis_cert_file, args.redis_key_file)
    tls.check(args.redis_url)
    return RedisArguments(
        url=args.redis_url,
        tls=tls,
        sentinels=parse_sentinels(args.redis_sentinels, "--redis-sentinels"),
        sentinel_master=args.redis_sentinel_master,
        cluster=cluster,
    )


def url_given_as(url: str, environ: Mapping[str, str]) -> str:
    """What the user gave ``url`` as: ``REDIS_URL`` when the value is the variable's (the
    flag's default), else ``--redis-url``."""
    return "REDIS_URL" if environ.get("REDIS_URL") == url else "--redis-url"


def check_url(url: str, environ: Mapping[str, str]) -> None:
    """:class:`SettingsError` naming ``REDIS_URL`` or ``--redis-url`` (whichever gave it)
    for a URL no Redis client can use (wrong scheme, unencoded password)."""
    try:
        RedisTarget(url)
    except SettingsError as exc:
        raise SettingsError(f"{url_given_as(url, environ)}: {exc}") from None
