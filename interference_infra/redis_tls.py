"""TLS options of a Redis client (``rediss://``), shared by the three programs.

``REDIS_CA_FILE`` verifies the server against a private CA (default: the system's CAs);
``REDIS_CERT_FILE`` + ``REDIS_KEY_FILE`` authenticate the client when the server asks
for certificates (``tls-auth-clients yes``). The options only make sense with a
``rediss://`` URL; with ``redis://`` they would be ignored silently, so that is an error.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from interference_infra.strict import SettingsError, mask_url


@dataclass(frozen=True, slots=True)
class RedisTls:
    """Files of the TLS options; each None when not set."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @property
    def configured(self) -> bool:
        return any((self.ca_file, self.cert_file, self.key_file))

    def check(self, url: str) -> None:
        """:class:`SettingsError` for options that cannot work with ``url``: a missing or
        unreadable file, a certificate without its key (or the reverse), or TLS options
        with a URL that is not ``rediss://``."""
        if self.configured and not url.startswith("rediss://"):
            raise SettingsError(
                f"Redis TLS options are set but the URL {mask_url(url)} is not rediss://; "
                "use rediss://HOST:PORT/DB for TLS"
            )
        if bool(self.cert_file) != bool(self.key_file):
            raise SettingsError(
                "a Redis client certificate needs both REDIS_CERT_FILE (--redis-cert-file) "
                "and REDIS_KEY_FILE (--redis-key-file)"
            )
        for what, path in (
            ("REDIS_CA_FILE", self.ca_file),
            ("REDIS_CERT_FILE", self.cert_file),
            ("REDIS_KEY_FILE", self.key_file),
        ):
            if path and not os.access(path, os.R_OK):
                raise SettingsError(f"{what}={path!r} is not a readable file")

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of redis-py's ``Redis.from_url`` for a ``rediss://`` URL."""
        kwargs: dict[str, Any] = {}
        if self.ca_file:
            kwargs["ssl_ca_certs"] = self.ca_file
        if self.cert_file:
            kwargs["ssl_certfile"] = self.cert_file
        if self.key_file:
            kwargs["ssl_keyfile"] = self.key_file
        return kwargs


def plaintext_server_hint(url: str, timeout_s: float = 1.0) -> str | None:
    """Why a ``rediss://`` connection failed when the server at the URL's address speaks
    plain Redis, not TLS (redis-py then only says "Timeout connecting": the server waits
    for a command while the client waits for the TLS handshake); None otherwise.

    Called after a failure only: it sends ``PING`` in clear text and a server that
    answers like Redis (``+PONG``, or an error such as ``-NOAUTH``) is serving plaintext;
    a TLS server answers with a TLS alert or closes the connection."""
    if not url.startswith("rediss://"):
        return None
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "localhost", parts.port or 6379
    except ValueError:
        return None
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"PING\r\n")
            answer = sock.recv(64)
    except OSError:
        return None
    if answer[:1] not in (b"+", b"-"):
        return None
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return (
        f"the server at {where} did not complete a TLS handshake: is it serving TLS? "
        "(rediss:// needs a TLS port; use redis:// for a plaintext server)"
    )
