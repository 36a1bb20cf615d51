"""The scheduler's ``redis:`` settings, the Redis commands its ACL user needs, and the
connection the settings describe.

Connection (:mod:`interference_infra.redis_client`): one server, a master found through
Redis Sentinel (``sentinels``), or a Redis Cluster (``cluster``); credentials: the URL's,
overridden by ``REDIS_USERNAME`` / ``REDIS_PASSWORD``. The scheduler's ACL user needs
exactly :data:`ACL_COMMANDS`: read ``%R~intf:node:*``, write ``~intf:nodes``,
``~intf:nodes:updated`` and ``~intf:decision:*`` (placement records), read and write
``~intf:rebalance:*`` (the rebalancer's journal and rebalancing records).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from interference import keys
from interference.acl import CLUSTER_CLIENT_COMMANDS
from interference.index import IndexReferences
from interference_infra.redis_client import (
    DEFAULT_SENTINEL_MASTER,
    RedisConnection,
    RedisTarget,
    credentials_from_env,
    parse_sentinels,
    password_file_from_env,
)
from interference_infra.redis_tls import RedisTls
from interference_infra.strict import SettingsError
from scheduler.signals.records import MAX_CLOCK_SKEW_S, MAX_INTERVAL_S, MIN_INTERVAL_S

ACL_COMMANDS = ("mget", "scan", "zadd", "zrem", "zrange", "hset", "expire", "info", "xrevrange")
"""Every Redis command the scheduler sends (its ACL user needs ``+`` each of them;
``xrevrange`` is the rebalancer's read of the nodes' report streams,
:mod:`scheduler.adapters.node_reports`); on a Redis Cluster also :data:`CLUSTER_ACL_COMMANDS`."""
CLUSTER_ACL_COMMANDS = CLUSTER_CLIENT_COMMANDS
"""What the scheduler's Cluster client sends as it builds itself (slot map, command
table); granted only on a Cluster, neither reads nor changes data."""


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """Where the signals live and how the scheduler reads them."""

    url: str = "redis://127.0.0.1:6379/0"
    """``redis://`` or ``rediss://`` URL of the server, of one Redis Cluster node
    (``cluster``), or only the database and TLS choice (``sentinels``);
    ``REDIS_USERNAME``/``REDIS_PASSWORD`` (or ``REDIS_PASSWORD_FILE``) override its
    credentials."""
    sentinels: tuple[str, ...] = ()
    """Redis Sentinels as ``HOST:PORT`` (env ``REDIS_SENTINELS``, comma-separated); when
    set, the master comes from them and follows a failover."""
    sentinel_master: str = DEFAULT_SENTINEL_MASTER
    """Name of the master the sentinels monitor (env ``REDIS_SENTINEL_MASTER``)."""
    cluster: bool = False
    """``url`` names a node of a Redis Cluster (env ``REDIS_CLUSTER``)."""
    socket_timeout_s: float = 5.0
    """Timeout of every Redis call."""
    poll_interval_s: float = 0.5
    """How often every known node's scheduling record is read; adds at most this much to
    a signal's age (agents report every second)."""
    batch: int = 1000
    """Keys per MGET and per SCAN page."""
    ranking_interval_s: float = 5.0
    """How often ``intf:nodes`` / ``intf:nodes:updated`` are rewritten from the accepted
    records; 0 never (e.g. a read-only ACL user)."""
    stray_scan_interval_s: float = 60.0
    """How often records of names that are no Node are counted (a SCAN); 0 never."""
    max_clock_skew_s: float = MAX_CLOCK_SKEW_S
    """A record whose ``ts`` is further than this from the scheduler's clock is ignored."""
    max_agent_interval_s: float = 2.0
    """The longest report interval of the cluster's agents (their ``--interval``, 1 s by
    default): a record claiming a longer one is ignored (``reason="interval"``), so a node
    whose agent stops is stale within ``max(5, round(3 × this))`` seconds of its last
    record being read, whatever that record claimed (docs/design.md §7). At most 60."""
    index_references: IndexReferences = field(default_factory=IndexReferences)
    """The interference index's references, with which the scheduler computes every
    node's index from its record (set them like the agents' ``--index-ref``)."""
    retry_initial_s: float = 0.5
    """First reconnect delay after an error; doubles up to ``retry_max_s``."""
    retry_max_s: float = 10.0
    """Longest reconnect delay."""
    decision_ttl_s: int = keys.DECISION_TTL_S
    """Lifetime of the decision records: placement records (``intf:decision:{ns}/{pod}``)
    and rebalancing records (``intf:rebalance:decision:{ns}/{pod}``)."""
    log_interval_s: float = 30.0
    """At most one log line per this many seconds about malformed payloads."""
    decision_queue_size: int = 10_000
    """Decision records that may wait for the writer thread; when it is full (Redis slow
    or down) a write waits up to ``socket_timeout_s``, then the record is counted in
    ``interference_scheduler_decision_write_errors_total`` and skipped."""
    decision_memory_limit: float = 0.8
    """Decision records are not written (each counted as a write error) while Redis uses
    more than this share of its ``maxmemory`` (``INFO memory``, read at most every 5 s), so
    they never take the room the nodes' reports need (Redis never evicts: docs/design.md
    §4.3). 1: write until Redis refuses."""
    decision_batch: int = 500
    """Most decision records written in one pipeline."""
    decision_linger_s: float = 0.05
    """How long the writer waits for a batch to fill before writing what it has (records
    reach Redis at most this late; a pipeline per record would cost scheduling CPU)."""
    ca_file: str | None = None
    """CA certificate that signed the server's (``rediss://`` only; env ``REDIS_CA_FILE``);
    None trusts the system's CAs."""
    cert_file: str | None = None
    """Client certificate for TLS client authentication (env ``REDIS_CERT_FILE``)."""
    key_file: str | None = None
    """Its private key (env ``REDIS_KEY_FILE``)."""

    def __post_init__(self) -> None:
        try:
            parse_sentinels(",".join(self.sentinels), "sentinels")
        except SettingsError as exc:
            raise ValueError(str(exc)) from None
        if self.sentinels and self.cluster:
            raise ValueError("cluster: use either Redis Sentinel (sentinels) or Redis Cluster")
        try:
            self.target()
        except SettingsError as exc:
            raise ValueError(f"url: {exc}") from None
        for name in (
            "socket_timeout_s",
            "retry_initial_s",
            "retry_max_s",
            "decision_linger_s",
            "poll_interval_s",
            "max_clock_skew_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be a number > 0")
        if not MIN_INTERVAL_S <= self.max_agent_interval_s <= MAX_INTERVAL_S:
            raise ValueError(
                f"max_agent_interval_s: {self.max_agent_interval_s!r} must be the agents'"
                f" longest interval in seconds, {MIN_INTERVAL_S:g}–{MAX_INTERVAL_S:g}"
            )
        if not 0 < self.decision_memory_limit <= 1:
            raise ValueError(
                f"decision_memory_limit: {self.decision_memory_limit!r} must be a share of"
                " maxmemory, > 0 and ≤ 1 (e.g. 0.8)"
            )
        for name in ("ranking_interval_s", "stray_scan_interval_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be a number ≥ 0 (0: never)")
        for name in ("batch", "decision_ttl_s", "decision_queue_size", "decision_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be an integer ≥ 1")

    @property
    def tls(self) -> RedisTls:
        """The TLS options as the shared helper takes them."""
        return RedisTls(self.ca_file, self.cert_file, self.key_file)

    def target(self, env: Mapping[str, str] | None = None) -> RedisTarget:
        """Where Redis is, with the credentials of ``env`` (:class:`SettingsError` for a
        combination that cannot work)."""
        username, password = credentials_from_env(env or {})
        return RedisTarget(
            self.url,
            sentinels=parse_sentinels(",".join(self.sentinels), "sentinels"),
            sentinel_master=self.sentinel_master,
            cluster=self.cluster,
            tls=self.tls,
            username=username,
            password=password,
            password_file=password_file_from_env(env or {}),
        )


def connect(settings: RedisSettings, env: Mapping[str, str] | None = None) -> RedisConnection:
    """The connection to ``settings``' Redis, credentials from the environment when set;
    ``ValueError`` for a URL redis-py cannot parse."""
    env = os.environ if env is None else env
    return RedisConnection(settings.target(env), settings.socket_timeout_s)
