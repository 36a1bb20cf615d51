"""A warning logged at most once per interval, saying how many were left out between."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """Logs one line per interval and says how many were suppressed in between."""

    def __init__(self, logger: logging.Logger, interval_s: float) -> None:
        self.interval_s = interval_s
        self._logger = logger
        self._last = -float("inf")
        self._suppressed = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            self._suppressed += 1
            return
        if self._suppressed:
            message += f" ({self._suppressed} similar messages suppressed)"
        self._logger.warning(message, *args)
        self._last, self._suppressed = now, 0
