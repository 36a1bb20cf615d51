"""Server-side TLS from PEM files: a certificate, its key and, for client authentication, the
CA that must have signed every client's certificate.

:class:`ServerTls` builds an :class:`ssl.SSLContext` (TLS 1.2 or newer) and builds it again
when any of its files changes (modification time, size or inode: a Secret volume's symlink
swap counts), so a renewed certificate — cert-manager's, or the install script's
``--rotate`` — is served without a restart. A broken new set keeps the previous context
and is logged once per change; an unusable set at start raises, so a process never
starts serving with no certificate.

With ``client_ca_file`` the context requires a client certificate (``CERT_REQUIRED``)
that chains to that CA: a client without one, or with one from another CA, fails the
handshake and never reaches a handler.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading

log = logging.getLogger(__name__)

_FileStamp = tuple[int, int, int]


class ServerTls:
    """A server's TLS context from ``cert_file`` and ``key_file`` (PEM), requiring client
    certificates signed by ``client_ca_file`` when it is given. ``OSError`` or
    ``ssl.SSLError`` at construction when the files cannot be used."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str = "") -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self._lock = threading.Lock()
        self._stamp = self._files_stamp()
        self._context = self._load()

    @property
    def client_auth(self) -> bool:
        """Whether a client must present a certificate."""
        return bool(self.client_ca_file)

    def context(self) -> ssl.SSLContext:
        """The current context (rebuilt first when a file changed since the last call)."""
        stamp = self._files_stamp()
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._context = self._load()
                    log.info("TLS: loaded the changed certificate files %s", self._files())
                except (OSError, ssl.SSLError) as exc:
                    log.error(
                        "TLS: cannot load the changed files %s (%s); serving the previous ones",
                        self._files(),
                        exc,
                    )
            return self._context

    def _files(self) -> str:
        return ", ".join(
            path for path in (self.cert_file, self.key_file, self.client_ca_file) if path
        )

    def _files_stamp(self) -> tuple[_FileStamp, ...]:
        stamps = []
        for path in (self.cert_file, self.key_file, self.client_ca_file):
            try:
                stat = os.stat(path) if path else None
            except OSError:
                stat = None
            stamps.append(
                (-1, -1, -1) if stat is None else (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            )
        return tuple(stamps)

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            context.load_verify_locations(cafile=self.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context
