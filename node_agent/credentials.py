"""The agent's own Redis user, from the credential issuer (docs/design.md §4.2).

With ``--credentials-url`` the agent proves which node it runs on with its pod-bound
ServiceAccount token (``--token-file``, a projected volume the kubelet renews) and gets
back ``agent:NODE`` and a password: ``POST {url}/v1/credentials`` with
``Authorization: Bearer TOKEN`` → ``{"node", "username", "password"}``. Redis then lets
it write only its own node's keys.

It enrols on a thread of its own from start-up (the measure loop never waits on the
issuer), and again whenever Redis refuses the credentials (``WRONGPASS``/``NOAUTH``: Redis
restarted and lost its runtime users, or another enrolment for this node replaced the
password; ``NOPERM``: the user's rules changed). Failed attempts back off exponentially
with jitter up to ``backoff_max_s``, honouring the issuer's ``Retry-After``; the first
re-enrolment after credentials that worked waits only a random part of
``backoff_initial_s``. While it holds no credentials ``/readyz`` says why and reports are
dropped (never queued).
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger(__name__)

CREDENTIALS_PATH = "/v1/credentials"
"""The issuer's endpoint, appended to a URL that names only the server."""
DEFAULT_TOKEN_FILE = "/var/run/secrets/interference/token"
MAX_ANSWER_BYTES = 16 * 1024
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class EnrolmentSettings:
    """Where the agent gets its Redis credentials."""

    url: str
    """The issuer: ``https://host:port`` (``/v1/credentials`` is appended when the URL has
    no path) or the full endpoint URL; ``http://`` sends the token unencrypted."""
    token_file: str = DEFAULT_TOKEN_FILE
    """The projected ServiceAccount token (audience ``interference-credentials``), read
    again at every enrolment (the kubelet rotates it)."""
    ca_file: str | None = None
    """CA that signed the issuer's certificate; None: the system's CAs."""
    server_name: str | None = None
    """The name the issuer's certificate must carry when ``url`` names it otherwise (an
    address, where the cluster has no DNS); None: the URL's host."""
    timeout_s: float = 5.0
    """Connect and read timeout of one request."""
    backoff_initial_s: float = 1.0
    """Wait after the first failed attempt, doubling per failure..."""
    backoff_max_s: float = 60.0
    """...up to this."""

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in ("http", "https") or not urlsplit(self.url).hostname:
            raise ValueError(
                f"--credentials-url/CREDENTIALS_URL {self.url!r} must be an http:// or "
                "https:// URL, e.g. https://interference-credentials.interference-system:10272"
            )
        if self.ca_file and scheme != "https":
            raise ValueError("--credentials-ca-file/CREDENTIALS_CA_FILE needs an https:// URL")
        if self.server_name and scheme != "https":
            raise ValueError(
                "--credentials-server-name/CREDENTIALS_SERVER_NAME needs an https:// URL"
            )
        for name in ("timeout_s", "backoff_initial_s", "backoff_max_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")

    @property
    def endpoint(self) -> str:
        """The full URL POSTed to."""
        parts = urlsplit(self.url)
        if parts.path in ("", "/"):
            return urlunsplit(parts._replace(path=CREDENTIALS_PATH))
        return self.url


@dataclass(frozen=True)
class Credentials:
    """A Redis user and its password (``repr`` hides the password)."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=***)"


class EnrolmentError(Exception):
    """No credentials this time; ``retry_after_s`` is the issuer's ``Retry-After``."""

    def __init__(self, message: str, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class _VerifiedHttps(urllib.request.HTTPSHandler):
    """HTTPS whose certificate is verified against ``context``'s CA for ``server_name``
    (the URL's host when None)."""

    def __init__(self, context: ssl.SSLContext, server_name: str | None) -> None:
        super().__init__(context=context)
        self._tls = context
        self._server_name = server_name

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        context, name = self._tls, self._server_name

        class Connection(http.client.HTTPSConnection):
            def connect(self) -> None:
                http.client.HTTPConnection.connect(self)
                self.sock = context.wrap_socket(self.sock, server_hostname=name or self.host)

        return self.do_open(Connection, req)


def fetch_credentials(settings: EnrolmentSettings, node: str) -> Credentials:
    """One request to the issuer; :class:`EnrolmentError` saying why it gave none."""
    try:
        with open(settings.token_file, encoding="utf-8") as token_file:
            token = token_file.read().strip()
    except OSError as exc:
        raise EnrolmentError(
            f"cannot read the ServiceAccount token {settings.token_file} ({exc.strerror}); "
            "mount a projected token with audience interference-credentials there"
        ) from exc
    if not token:
        raise EnrolmentError(f"the ServiceAccount token file {settings.token_file} is empty")
    request = urllib.request.Request(
        settings.endpoint,
        data=b"",
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    handlers: list[urllib.request.BaseHandler] = []
    if settings.endpoint.startswith("https://"):
        context = ssl.create_default_context(cafile=settings.ca_file)
        handlers.append(_VerifiedHttps(context, settings.server_name))
    try:
        opener = urllib.request.build_opener(*handlers)
        with opener.open(request, timeout=settings.timeout_s) as got:
            body = got.read(MAX_ANSWER_BYTES)
    except urllib.error.HTTPError as exc:
        raise _refusal(exc) from exc
    except (OSError, ValueError) as exc:  # URLError, timeouts, TLS failures
        reason = getattr(exc, "reason", exc)
        raise EnrolmentError(
            f"the credential issuer at {settings.endpoint} cannot be reached ({reason})"
        ) from exc
    try:
        answer = json.loads(body)
        issued = Credentials(str(answer["username"]), str(answer["password"]))
        issued_node = str(answer["node"])
    except (ValueError, KeyError, TypeError) as exc:
        raise EnrolmentError(
            f"the credential issuer at {settings.endpoint} answered something that is not "
            f"credentials ({exc!r})"
        ) from exc
    if issued_node != node:
        raise EnrolmentError(
            f"the credential issuer issued credentials for node {issued_node!r}, but this "
            f"agent reports as {node!r}: set NODE_NAME from spec.nodeName"
        )
    return issued


def _refusal(exc: urllib.error.HTTPError) -> EnrolmentError:
    try:
        detail = json.loads(exc.read(MAX_ANSWER_BYTES)).get("message", "")
    except (ValueError, AttributeError, OSError):
        detail = ""
    retry_after = 0.0
    header = exc.headers.get("Retry-After") if exc.headers else None
    if header and header.strip().isdigit():
        retry_after = float(header.strip())
    hint = {
        401: "the token was not accepted (expired, wrong audience, or its pod is gone)",
        403: "the token is not the agents' ServiceAccount's, or names no node",
        429: "asked too often",
    }.get(exc.code, "")
    text = f"the credential issuer refused with HTTP {exc.code}"
    text += f": {hint}" if hint else ""
    text += f" ({detail})" if detail else ""
    return EnrolmentError(text, retry_after)


class Enrolment:
    """Holds the agent's current credentials; a thread of its own (:meth:`start`) gets new
    ones whenever there are none, so neither the measure loop nor ``/readyz`` ever waits on
    the issuer. Threads may share it."""

    def __init__(
        self,
        settings: EnrolmentSettings,
        node: str,
        *,
        fetch: Callable[[EnrolmentSettings, str], Credentials] = fetch_credentials,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
        count: Callable[[str], None] | None = None,
    ) -> None:
        """``count`` is called with ``issued``, ``failed`` or ``refused_by_redis`` for
        each event (the agent's ``interference_agent_credentials_total``)."""
        self.settings = settings
        self._count = count or (lambda _event: None)
        self._node = node
        self._fetch = fetch
        self._clock = clock
        self._rng = rng
        self._changed = threading.Condition()
        self._current: Credentials | None = None
        self._failures = 0
        """Attempts that failed, and credentials Redis refused, since credentials last
        worked (:meth:`confirm`)."""
        self._next_try = 0.0
        self._problem = "not enrolled yet"
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.enrolments = 0
        """Credentials obtained (since start)."""

    def start(self) -> None:
        """Enrol now and whenever the credentials are dropped, on a daemon thread."""
        if self._thread is None:
            host = urlsplit(self.settings.endpoint).hostname or ""
            if self.settings.endpoint.startswith("http://") and host not in _LOOPBACK:
                log.warning(
                    "CREDENTIALS_URL %s is plain HTTP: the token and the issued Redis password "
                    "cross the network unencrypted (serve the issuer with TLS and use https://)",
                    self.settings.url,
                )
            self._thread = threading.Thread(target=self._run, name="enrolment", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End the thread (an attempt in flight ends within the request timeout)."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(self.settings.timeout_s * 3)

    def credentials(self) -> Credentials | None:
        """The current credentials, None while there are none (:meth:`problem` says why).
        Never waits."""
        with self._changed:
            return self._current

    def wait(self, timeout_s: float) -> Credentials | None:
        """The credentials once there are some, None after ``timeout_s`` without."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._current is None and not self._stopped:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            return self._current

    def refused(self, credentials: Credentials, reason: str) -> None:
        """Redis refused ``credentials`` (``WRONGPASS``, ``NOAUTH``, ``NOPERM``): drop
        them and enrol again — within ``backoff_initial_s`` the first time (jittered), with
        backoff while each new set is refused too."""
        with self._changed:
            if self._current != credentials:
                return  # already replaced
            self._current = None
            self._failures += 1
            # The first refusal after credentials that worked: within backoff_initial_s.
            self._next_try = self._clock() + self._backoff(self._failures - 1)
            self._problem = f"Redis refused the credentials of {credentials.username} ({reason})"
            log.warning("%s; enrolling again", self._problem)
            self._changed.notify_all()
        self._count("refused_by_redis")

    def confirm(self) -> None:
        """A publish with the current credentials went through: reset the backoff."""
        with self._changed:
            self._failures = 0

    def problem(self) -> str:
        """ "" while credentials are held, else why there are none (for ``/readyz``)."""
        with self._changed:
            if self._current is not None:
                return ""
            return f"no Redis credentials from {self.settings.endpoint}: {self._problem}"

    def attempt(self) -> bool:
        """One enrolment now (the thread's step; tests call it directly); True when it
        got credentials."""
        try:
            issued = self._fetch(self.settings, self._node)
        except EnrolmentError as exc:
            self._count("failed")
            with self._changed:
                self._failures += 1
                delay = max(self._backoff(self._failures), exc.retry_after_s)
                self._next_try = self._clock() + delay
                if self._failures == 1 or str(exc) != self._problem:
                    log.warning("no Redis credentials: %s; trying again in %.1f s", exc, delay)
                self._problem = str(exc)
            return False
        with self._changed:
            self._current = issued
            self._problem = ""
            self.enrolments += 1
            self._changed.notify_all()
        self._count("issued")
        log.info("enrolled: writing to Redis as %s", issued.username)
        return True

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._stopped:
                    if self._current is not None:
                        self._changed.wait()
                        continue
                    delay = self._next_try - self._clock()
                    if delay <= 0:
                        break
                    self._changed.wait(delay)
                if self._stopped:
                    return
            try:
                self.attempt()
            except Exception:  # a bug must not end enrolment for good
                log.exception("enrolment failed unexpectedly; trying again")
                with self._changed:
                    self._failures += 1
                    self._next_try = self._clock() + self._backoff(self._failures)

    def _backoff(self, failures: int) -> float:
        """Wait after ``failures`` failures in a row: for 0 a random part of
        ``backoff_initial_s`` (every agent loses its user at once when Redis restarts:
        spread them), then ``backoff_initial_s`` doubling up to ``backoff_max_s``, ±20 %
        jitter."""
        if failures <= 0:
            return self.settings.backoff_initial_s * self._rng()
        base = min(
            self.settings.backoff_max_s,
            self.settings.backoff_initial_s * 2.0 ** (failures - 1),
        )
        return base * (0.8 + 0.4 * self._rng())
