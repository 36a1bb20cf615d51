"""The Redis connection of every program: one server, a master named by Redis Sentinel,
or a Redis Cluster; TLS; credentials.

* A single server: ``redis://HOST:PORT/DB``, ``rediss://`` (TLS) or ``unix:///path``.
* Sentinel: ``sentinels`` (``HOST:PORT`` pairs) find the master called
  ``sentinel_master``; the URL then only gives the database and ``rediss://`` for TLS to
  the master. The master is asked for again on every new connection, so a failover is
  followed without a restart.
* Cluster: ``cluster`` with the URL of any one node; the client reads the slot map from
  it and splits pipelines per shard.

Credentials: ``username``/``password`` (``REDIS_USERNAME``/``REDIS_PASSWORD``, see
:func:`credentials_from_env`) win over the URL's; redis-py on its own lets the URL win.
``password_file`` (``REDIS_PASSWORD_FILE``, a mounted Secret) is read again for every new
connection (:class:`PasswordFile`), so a rotated password is used without a restart.

:class:`RedisConnection` builds its client on first use and rebuilds it after a failure,
so an unreachable Redis (or Cluster, whose client needs a node to answer just to be
built) is an outage the caller retries, never a crash at start-up.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias
from urllib.parse import unquote, urlsplit, urlunsplit

import redis
from redis.cluster import RedisCluster
from redis.credentials import CredentialProvider
from redis.exceptions import RedisClusterException
from redis.sentinel import Sentinel

from interference_infra.redis_tls import RedisTls, plaintext_server_hint
from interference_infra.strict import SettingsError, mask_url

Client: TypeAlias = "redis.Redis[bytes] | RedisCluster[bytes]"

REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)
"""Every failure of a Redis call: redis-py's cluster errors do not derive from
``RedisError``."""

SCHEMES = ("redis", "rediss", "unix")
DEFAULT_SENTINEL_MASTER = "mymaster"


def parse_sentinels(value: str, what: str = "REDIS_SENTINELS") -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` as pairs; :class:`SettingsError` naming ``what`` and the
    entry that is wrong."""
    out: list[tuple[str, int]] = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise SettingsError(f"{what}: entry {item!r} is not HOST:PORT (port 1–65535)")
        out.append((host.strip("[]"), int(port)))
    return tuple(out)


def credentials_from_env(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """``REDIS_USERNAME`` and ``REDIS_PASSWORD``, each None when unset or empty."""
    return env.get("REDIS_USERNAME") or None, env.get("REDIS_PASSWORD") or None


def password_file_from_env(env: Mapping[str, str]) -> str | None:
    """``REDIS_PASSWORD_FILE``, None when unset or empty."""
    return env.get("REDIS_PASSWORD_FILE") or None


class PasswordFile(CredentialProvider):
    """The ACL user and the password held in a file, read when a connection logs in.

    A Secret volume's file changes in place when the Secret does (the kubelet swaps it
    within a minute or so), so after a rotation every new connection, and every retry
    after a refused login, uses the new password with no restart; connections already
    logged in keep working (Redis does not close them when a password is removed).
    One small read per new connection, not per command."""

    def __init__(self, username: str | None, path: str) -> None:
        self.username = username
        self.path = path

    def password(self) -> str:
        """The file's content without its trailing line break; a
        :class:`redis.AuthenticationError` (an outage the caller retries) when it cannot
        be read or is empty."""
        try:
            with open(self.path, encoding="utf-8") as file:
                password = file.read().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise redis.AuthenticationError(
                f"cannot read the Redis password file {self.path} (REDIS_PASSWORD_FILE): {exc}"
            ) from None
        if not password:
            raise redis.AuthenticationError(
                f"the Redis password file {self.path} (REDIS_PASSWORD_FILE) is empty"
            )
        return password

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        password = self.password()
        return (self.username, password) if self.username else (password,)


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """Where Redis is and how to log in; :class:`ValueError` (a :class:`SettingsError`)
    for a combination that cannot work."""

    url: str
    """The server, one cluster node, or (with ``sentinels``) the database and TLS choice."""
    sentinels: tuple[tuple[str, int], ...] = ()
    """Sentinel ``(host, port)`` pairs; when set, the master comes from them."""
    sentinel_master: str = DEFAULT_SENTINEL_MASTER
    """Name of the master the sentinels monitor."""
    cluster: bool = False
    """``url`` names a node of a Redis Cluster."""
    tls: RedisTls = field(default_factory=RedisTls)
    """CA and client certificate for ``rediss://``."""
    username: str | None = None
    """ACL user; None: the URL's, else ``default``."""
    password: str | None = None
    """Its password; None: the URL's."""
    password_file: str | None = None
    """A file holding the password, read at every login (:class:`PasswordFile`); wins
    over the URL's password, and excludes ``password``."""

    def __post_init__(self) -> None:
        scheme = self.url.partition("://")[0] if "://" in self.url else ""
        if scheme not in SCHEMES:
            raise SettingsError(
                f"{mask_url(self.url)!r} must start with redis://, rediss:// or unix://,"
                " e.g. redis://redis.interference:6379/0"
            )
        userinfo, at, _ = self.url.partition("://")[2].rpartition("@")
        if at and not urlsplit(self.url).netloc.startswith(f"{userinfo}@"):
            # urlsplit and redis-py would read part of the password as host, port or path
            raise SettingsError(
                f"{mask_url(self.url)!r}: the user name or password holds /, ?, # or @: "
                "percent-encode it in the URL, or give the password in REDIS_PASSWORD"
            )
        if self.sentinels and self.cluster:
            raise SettingsError("use either Redis Sentinel or Redis Cluster, not both")
        if scheme == "unix" and (self.sentinels or self.cluster):
            raise SettingsError(
                "Redis Sentinel and Redis Cluster need a redis:// or rediss:// URL, not unix://"
            )
        if self.sentinels and not self.sentinel_master:
            raise SettingsError("the Sentinel master name must not be empty, e.g. mymaster")
        database = urlsplit(self.url).path.strip("/")
        if self.sentinels and database and not database.isdigit():
            raise SettingsError(
                f"with Redis Sentinel the URL {mask_url(self.url)!r} gives only the database: "
                "its path must be a number, e.g. redis://sentinel/0"
            )
        if self.password_file is not None:
            if self.password is not None:
                raise SettingsError(
                    "REDIS_PASSWORD and REDIS_PASSWORD_FILE are both set: give the password "
                    "one way (the file, a mounted Secret, is re-read after a rotation)"
                )
            if not os.access(self.password_file, os.R_OK):
                raise SettingsError(
                    f"REDIS_PASSWORD_FILE={self.password_file!r} is not a readable file"
                )
        self.tls.check(self.url)

    def describe(self) -> str:
        """Where Redis is, for "Redis at …" in logs and errors (never a password)."""
        if self.sentinels:
            sentinels = ",".join(f"{host}:{port}" for host, port in self.sentinels)
            return f"master {self.sentinel_master!r} via sentinels {sentinels}"
        return ("cluster node " if self.cluster else "") + mask_url(self.url)


def connect(target: RedisTarget, socket_timeout_s: float, **client_kwargs: Any) -> Client:
    """A client for ``target`` (:class:`RedisConnection` builds it lazily). A Cluster client
    asks its node for the slot map here, so this raises one of :data:`REDIS_ERRORS` when
    that node is unreachable; the others connect on their first command. ``client_kwargs``
    go to every connection (e.g. ``retry``)."""
    url, username, password = _credentials(target)
    kwargs: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s,
        **target.tls.client_kwargs(),
        **client_kwargs,
    }
    if target.password_file is not None:
        kwargs["credential_provider"] = PasswordFile(username, target.password_file)
    else:
        if username is not None:
            kwargs["username"] = username
        if password is not None:
            kwargs["password"] = password
    if target.cluster:
        return RedisCluster.from_url(url, **kwargs)
    if target.sentinels:
        parts = urlsplit(url)
        sentinel = Sentinel(
            list(target.sentinels),
            sentinel_kwargs={
                "socket_timeout": socket_timeout_s,
                "socket_connect_timeout": socket_timeout_s,
            },
        )
        master: redis.Redis[bytes] = sentinel.master_for(
            target.sentinel_master,
            db=int(parts.path.strip("/") or 0),
            ssl=parts.scheme == "rediss",
            **kwargs,
        )
        return master
    return redis.Redis.from_url(url, **kwargs)


def _credentials(target: RedisTarget) -> tuple[str, str | None, str | None]:
    """The URL without its user and password, and the user and password to log in with
    (the target's, else the URL's)."""
    parts = urlsplit(target.url)
    if "@" not in parts.netloc:
        return target.url, target.username, target.password
    host = parts.netloc.rpartition("@")[2]
    url = urlunsplit(parts._replace(netloc=host))
    url_username = unquote(parts.username) if parts.username else None
    url_password = unquote(parts.password) if parts.password is not None else None
    return (
        url,
        target.username if target.username is not None else url_username,
        target.password if target.password is not None else url_password,
    )


CREDENTIALS_REFUSED = ("WRONGPASS", "NOAUTH", "invalid password", "invalid username-password")
"""Redis' words for a login it refused (in case redis-py hands them on as a plain
``ResponseError``)."""


def credentials_refused(error: BaseException) -> bool:
    """Whether ``error`` (or one it wraps: a Cluster client built on a refused login) is
    Redis refusing the password or the ACL user, not an outage: redis-py's
    ``AuthenticationError`` is a ``ConnectionError``, so a caller that only tells
    connection errors from others would say "cannot reach" for a wrong password."""
    seen: BaseException | None = error
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(
            seen,
            redis.AuthenticationError | redis.exceptions.AuthenticationWrongNumberOfArgsError,
        ):
            return True
        if isinstance(seen, redis.ResponseError) and str(seen).startswith(CREDENTIALS_REFUSED):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def refused_credentials_reason(target: RedisTarget) -> str:
    """What to tell of a login Redis refused: where, and which settings to fix."""
    username = _credentials(target)[1]
    user = f"ACL user {username!r}" if username else "the default user"
    return (
        f"Redis at {target.describe()} answers but refused the credentials ({user}): the"
        " password (REDIS_PASSWORD or REDIS_PASSWORD_FILE) or the ACL user (REDIS_USERNAME)"
        " is wrong or disabled"
    )


def unreachable_reason(target: RedisTarget, error: BaseException) -> str:
    """Why ``target`` could not be reached, for a message: redis-py's own words, unless
    the URL is ``rediss://`` and the server speaks plaintext Redis (then says so, since
    redis-py only reports a timeout)."""
    if isinstance(error, redis.ConnectionError | redis.TimeoutError) and not target.sentinels:
        hint = plaintext_server_hint(target.url)
        if hint is not None:
            return hint
    return str(error)


class RedisConnection:
    """The client of one :class:`RedisTarget`; :meth:`reset` after a failed call drops
    half-read connections (and a Cluster client, which then reads the slot map again on
    its next use).

    A single-server or Sentinel client is built here, which connects nothing yet but
    raises ``ValueError`` for a URL redis-py cannot parse; a Cluster client is built on
    first use, since building it needs a node to answer. Threads may share it."""

    def __init__(self, target: RedisTarget, socket_timeout_s: float, **client_kwargs: Any):
        self.target = target
        self.socket_timeout_s = socket_timeout_s
        self._client_kwargs = client_kwargs
        self._client: Client | None = None
        self._lock = threading.Lock()
        if not target.cluster:
            self.client()

    def client(self) -> Client:
        """The client, built now if needed (may raise one of :data:`REDIS_ERRORS`)."""
        with self._lock:
            if self._client is None:
                self._client = connect(self.target, self.socket_timeout_s, **self._client_kwargs)
            return self._client

    def reset(self) -> None:
        """Forget the connections after a failure; the next call connects afresh."""
        with self._lock:
            client = self._client
            if isinstance(client, RedisCluster):
                self._client = None
        if isinstance(client, RedisCluster):
            client.close()
        elif client is not None:
            client.connection_pool.disconnect()  # the pool reconnects on the next call

    def close(self) -> None:
        """Close the connections; safe to call twice."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
