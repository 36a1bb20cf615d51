"""Small pre-serialised JSON writes to the API server over kept-alive connections.

Binds, Events and the ``PodScheduled`` condition are the per-pod cost of scheduling, so
they skip the generated client: :class:`JsonWriter` serialises each body once with
``json.dumps`` and sends it over a kept-alive HTTP/1.1 connection per thread
(:mod:`scheduler.adapters.http11`), built from the client's ``Configuration`` (host and
path prefix, CA, client certificate, ``verify_ssl``, ``assert_hostname``, default headers
such as the User-Agent, and the bearer token read through ``get_api_key_with_prefix`` on
every request so its ``refresh_api_key_hook`` still rotates expiring tokens). That costs
a small part of the CPU of the generated client's call (its per-call parameter
validation, serialisation and urllib3's pool and retry layers); a ``Configuration`` with
a proxy or ``tls_server_name`` uses the client's own urllib3 pool manager instead.
Answers go through the same error mapping as the generated client's
(:class:`~kubernetes.client.exceptions.ApiException`). Lists, watches and the Lease stay
on the real client.
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.parse
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.util.wait import wait_for_read

from scheduler.adapters.http11 import Http11Connection


class JsonWriter:
    """Sends small pre-serialised JSON writes to the API server (see the module docstring).

    :meth:`send` is thread-safe: each thread keeps its own kept-alive connection. A
    connection the server has closed while idle is noticed before reuse (the socket is
    readable at EOF) and replaced, so no request is ever sent twice.
    """

    def __init__(self, api_client: client.ApiClient, timeout_s: float) -> None:
        configuration = api_client.configuration
        self._configuration = configuration
        self._timeout_s = timeout_s
        self._base = str(configuration.host).rstrip("/")
        url = urllib.parse.urlsplit(self._base)
        self._https = url.scheme == "https"
        self._hostname = url.hostname or "localhost"
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path
        self._headers: dict[str, str] = {
            **{str(k): str(v) for k, v in api_client.default_headers.items()},
            "Accept": "application/json",
        }
        self._pool: urllib3.PoolManager | None = None
        self._ssl: ssl.SSLContext | None = None
        if configuration.proxy or configuration.tls_server_name:
            self._pool = api_client.rest_client.pool_manager
        elif self._https:
            self._ssl = ssl_context(configuration)
        self._local = threading.local()

    def send(self, method: str, path: str, body: bytes, content_type: str) -> None:
        """``method`` ``path`` (below the host's path prefix) with a JSON ``body``.

        Raises :class:`~kubernetes.client.exceptions.ApiException` for a non-2xx answer
        and ``OSError``/``http.client.HTTPException``/``urllib3`` errors when the server
        cannot be reached or breaks the connection (nothing is retried here: the caller's
        backoff decides).
        """
        headers = dict(self._headers)
        headers["Content-Type"] = content_type
        token = self._configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        if self._pool is not None:
            answer = self._pool.urlopen(
                method,
                self._base + path,
                body=body,
                headers=headers,
                retries=False,
                timeout=urllib3.Timeout(total=self._timeout_s),
            )
            status, reason, data = answer.status, answer.reason, answer.data
            response_headers: Any = answer.headers
        else:
            status, reason, data, response_headers = self._send_direct(
                method, self._prefix + path, body, headers
            )
        if not 200 <= status < 300:
            error = ApiException(status=status, reason=reason or "")
            error.body = data.decode("utf-8", "replace")
            error.headers = response_headers
            raise error

    def _send_direct(
        self, method: str, target: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, str, bytes, dict[str, str]]:
        connection = self._connection()
        try:
            answer = connection.exchange(method, target, headers, body)
        except BaseException:
            connection.close()
            self._local.connection = None
            raise
        if answer.will_close:
            connection.close()
            self._local.connection = None
        return answer.status, answer.reason, answer.body, answer.headers

    def _connection(self) -> Http11Connection:
        connection: Http11Connection | None = getattr(self._local, "connection", None)
        if connection is not None and wait_for_read(connection.sock, timeout=0.0):
            connection.close()  # closed by the server while idle
            # Forget it before reconnecting: if the server is down the new connection
            # fails, and this thread must not be left holding a closed socket.
            self._local.connection = connection = None
        if connection is None:
            connection = Http11Connection(
                self._hostname, self._port, self._timeout_s, self._ssl if self._https else None
            )
            self._local.connection = connection
        return connection


def ssl_context(configuration: client.Configuration) -> ssl.SSLContext:
    """The TLS settings of a client ``Configuration`` as an ``ssl`` context."""
    context = ssl.create_default_context(
        cafile=configuration.ssl_ca_cert or None, cadata=configuration.ca_cert_data or None
    )
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif configuration.assert_hostname is False:
        context.check_hostname = False
    return context


def json_body(body: Any) -> bytes:
    """``body`` as compact JSON."""
    return json.dumps(body, separators=(",", ":")).encode()


def path_part(value: str) -> str:
    """``value`` quoted for one segment of a request path."""
    return urllib.parse.quote(value, safe="")
