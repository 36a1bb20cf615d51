"""Logging for the long-running programs (agent, scheduler): text or JSON lines on stderr.

* ``json``: one object per line — ``time`` (RFC 3339, UTC), ``level``, ``logger``,
  ``message``, and ``exception`` when there is one — for log collectors.
* ``text``: ``time level logger: message`` for people.

Either way, credentials in URLs are masked in every message (``redis://u:***@host``),
the Kubernetes client's leader-election chatter (one INFO line per lease renewal) is
demoted to DEBUG, Python warnings (urllib3's ``InsecureRequestWarning``, once per
request otherwise) are logged once per distinct message, and urllib3's retry warnings
(``Retrying (Retry(total=2, …)) after connection broken …``, one per retry of every
request the Kubernetes client makes while the API server is down: 164 lines in 28 s) are
let through once per kind per :data:`RETRY_LOG_INTERVAL_S`, the next line saying how many
were left out (:class:`RateLimited`).
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from interference_infra.strict import PASSWORD_IN_QUERY, parse_log_format, parse_log_level

_CREDENTIALS_IN_URL = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s:/@]*:)\S*@", re.IGNORECASE)
"""Up to the last ``@`` of the word: a password may hold an unencoded ``/``, ``?``, ``#``
or ``@``."""
LEADER_ELECTION_LOGGER = "leaderelection"
"""The logger of ``kubernetes.leaderelection``, which logs every renewal at INFO."""
MAX_REMEMBERED_WARNINGS = 1000
RATE_LIMITED_LOGGERS = ("urllib3.connectionpool",)
"""Loggers whose lines repeat per request while a server is down (the Kubernetes client's
retries)."""
RETRY_LOG_INTERVAL_S = 30.0
"""One line per kind of message per this long from :data:`RATE_LIMITED_LOGGERS`."""


def mask_credentials(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` and every
    ``?password=`` (or ``&password=``) replaced by ``***``."""
    return PASSWORD_IN_QUERY.sub(r"\1***", _CREDENTIALS_IN_URL.sub(r"\1***@", text))


class MaskingFormatter(logging.Formatter):
    """The text format, with credentials masked."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return mask_credentials(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, credentials masked."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": mask_credentials(record.getMessage()),
        }
        if record.exc_info:
            entry["exception"] = mask_credentials(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


class _DemoteToDebug(logging.Filter):
    """Rewrites records to DEBUG and drops them unless DEBUG is enabled."""

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self.threshold = threshold

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return record.levelno >= self.threshold


class _Once(logging.Filter):
    """Passes each distinct message once (bounded memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        if len(self.seen) < MAX_REMEMBERED_WARNINGS:
            self.seen.add(message)
        return True


class RateLimited(logging.Filter):
    """Passes one record per kind (its logger and unformatted message, so ``Retrying
    (%r) after connection broken by '%r': %s`` is one kind whatever the retry count, error
    and path) per ``interval_s``; the first passed after some were dropped says how many
    (``… (163 more like it in the last 58 s not logged)``). Bounded: at most
    :data:`MAX_REMEMBERED_WARNINGS` kinds are remembered."""

    def __init__(
        self, interval_s: float = RETRY_LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[tuple[str, str], tuple[float, int]] = {}
        """Kind → (when one last passed, how many dropped since)."""

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, str(record.msg))
        now = self._clock()
        with self._lock:
            passed, dropped = self._kinds.get(kind, (-math.inf, 0))
            if now - passed < self.interval_s:
                self._kinds[kind] = (passed, dropped + 1)
                return False
            if kind in self._kinds or len(self._kinds) < MAX_REMEMBERED_WARNINGS:
                self._kinds[kind] = (now, 0)
        if dropped:
            record.msg = (
                f"{record.getMessage()} ({dropped} more like it in the last"
                f" {now - passed:.0f} s not logged)"
            )
            record.args = None
        return True


def configure_logging(
    level: str, fmt: str, *, own: Sequence[str] = (), stream: TextIO | None = None
) -> None:
    """Set up the root logger of a program; ``level`` and ``fmt`` are validated
    (:class:`~interference_infra.strict.SettingsError`). The loggers named in ``own`` get
    ``level``; everything else stays at INFO or above even when ``level`` is DEBUG
    (libraries' DEBUG is per-request noise)."""
    threshold = logging.getLevelName(parse_log_level(level))
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if parse_log_format(fmt) == "json" else MaskingFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(max(threshold, logging.INFO))
    for name in own:
        logging.getLogger(name).setLevel(threshold)
    election = logging.getLogger(LEADER_ELECTION_LOGGER)
    for old_filter in list(election.filters):
        if isinstance(old_filter, _DemoteToDebug):
            election.removeFilter(old_filter)
    election.setLevel(logging.DEBUG if threshold <= logging.DEBUG else logging.INFO)
    election.addFilter(_DemoteToDebug(threshold))
    for name in RATE_LIMITED_LOGGERS:  # afresh: a new configuration forgets what passed
        limited = logging.getLogger(name)
        for old_filter in [f for f in limited.filters if isinstance(f, RateLimited)]:
            limited.removeFilter(old_filter)
        limited.addFilter(RateLimited())
    logging.captureWarnings(True)
    warnings_logger = logging.getLogger("py.warnings")
    if not any(isinstance(f, _Once) for f in warnings_logger.filters):
        warnings_logger.addFilter(_Once())
