"""The list-then-watch loop of every Kubernetes informer (the scheduler's per kind, the
agent's pods on its node), written once.

A :class:`ListWatch` lists everything (handing the objects over) and returns the list's
resourceVersion, then follows a watch from it until the stream ends, returning the
resourceVersion to continue from. :func:`list_and_watch` runs it until ``stop``:

* ``410 Gone`` (:class:`Gone`: the resourceVersion or a continue token expired) relists
  at once; a second one in a row backs off first;
* a failure the source expects (``expected``: the API server down, throttling, a
  connection reset) backs off with jitter, at least as long as its ``retry_after_s``
  says; the first failure of a streak is a warning, the rest DEBUG, and the recovery is
  logged, so an API server down for an hour is one warning and one line when it is back;
* anything else (a bug in the code that applies the objects) is logged with its
  traceback and relists from scratch after a backoff: the informer never dies;
* a watch that ends within :data:`MIN_QUIET_WATCH_S` without any event backs off too, so
  a server that closes every watch at once is not hammered.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from time import monotonic
from typing import Protocol

log = logging.getLogger(__name__)

MIN_QUIET_WATCH_S = 1.0
"""A watch that ends sooner without any event is retried with backoff."""


class Gone(Exception):
    """410 Gone: the resourceVersion or continue token expired; relist."""


class Backoff:
    """Capped exponential backoff with jitter: delay n is uniform in
    [c/2, c] with c = min(cap, b·2ⁿ)."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self, at_least_s: float = 0.0) -> float:
        ceiling = min(self.max_s, self.initial_s * 2**self.failures)
        self.failures += 1
        return max(at_least_s, self._rng.uniform(ceiling / 2, ceiling))

    def reset(self) -> None:
        self.failures = 0


class ListWatch(Protocol):
    """One informed resource."""

    def relist(self) -> str:
        """List every object and hand them over; the list's resourceVersion."""
        ...

    def follow(self, resource_version: str, stop: threading.Event) -> tuple[str, int]:
        """Apply watch events from ``resource_version`` until the stream ends or ``stop``
        is set: the resourceVersion to continue from and how many events arrived.
        Raises :class:`Gone` for 410."""
        ...


def list_and_watch(
    source: ListWatch,
    stop: threading.Event,
    backoff: Backoff,
    *,
    name: str,
    expected: tuple[type[Exception], ...],
    hint: str = "",
    logger: logging.Logger = log,
    on_failure: Callable[[Exception], None] | None = None,
) -> None:
    """Run ``source`` until ``stop`` is set (see the module docstring). ``name`` (e.g.
    "pods informer") starts each log line; ``hint`` ends the first warning of a streak
    (what to check); ``on_failure`` sees every failure but a 410 (e.g. to count them)."""
    resource_version = ""
    gone_in_a_row = 0
    failures = 0
    while not stop.is_set():
        try:
            if not resource_version:
                resource_version = source.relist()
            started = monotonic()
            resource_version, events = source.follow(resource_version, stop)
            logger.debug("%s: watch ended after %d event(s); rewatching", name, events)
            gone_in_a_row = 0
            if failures:
                logger.info("%s: working again after %d failed attempt(s)", name, failures)
                failures = 0
            if events or monotonic() - started > MIN_QUIET_WATCH_S:
                backoff.reset()
            else:
                stop.wait(backoff.next_delay())
        except Gone as exc:
            logger.info("%s: resourceVersion expired (%s); relisting", name, exc)
            resource_version = ""
            gone_in_a_row += 1
            if gone_in_a_row > 1:
                stop.wait(backoff.next_delay())
        except expected as exc:
            if on_failure is not None:
                on_failure(exc)
            delay = backoff.next_delay(getattr(exc, "retry_after_s", 0.0))
            if not stop.is_set():
                level = logging.DEBUG if failures else logging.WARNING
                suffix = f"; {hint}" if hint and not failures else ""
                logger.log(level, "%s: %s (next try in %.1f s)%s", name, exc, delay, suffix)
            failures += 1
            stop.wait(delay)
        except Exception as exc:
            if on_failure is not None:
                on_failure(exc)
            delay = backoff.next_delay()
            logger.exception("%s failed; relisting in %.1f s", name, delay)
            resource_version = ""
            failures += 1
            stop.wait(delay)
