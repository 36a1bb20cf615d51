"""Logging for the long-running programs (agent, scheduler): text or JSON lines on stderr.

* ``json``: one object per line — ``time`` (RFC 3339, UTC), ``level``, ``logger``,
  ``message``, and ``exception`` when there is one — for log collectors.
* ``text``: ``time level logger: message`` for people.

Either way, credentials in URLs are masked in every message (``redis://u:***@host``),
the Kubernetes client's leader-election chatter (one INFO line per lease renewal) is
demoted to DEBUG, and Python warnings (urllib3's ``InsecureRequestWarning``, once per
request otherwise) are logged once per distinct message.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from interference_infra.strict import PASSWORD_IN_QUERY, parse_log_format, parse_log_level

_CREDENTIALS_IN_URL = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s:/@]*:)\S*@", re.IGNORECASE)
"""Up to the last ``@`` of the word: a password may hold an unencoded ``/``, ``?``, ``#``
or ``@``."""
LEADER_ELECTION_LOGGER = "leaderelection"
"""The logger of ``kubernetes.leaderelection``, which logs every renewal at INFO."""
MAX_REMEMBERED_WARNINGS = 1000


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
    logging.captureWarnings(True)
    warnings_logger = logging.getLogger("py.warnings")
    if not any(isinstance(f, _Once) for f in warnings_logger.filters):
        warnings_logger.addFilter(_Once())
