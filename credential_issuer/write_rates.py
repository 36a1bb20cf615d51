"""How fast each node reports, read from Redis' key events (the warden's rate bound,
:mod:`credential_issuer.warden`).

An agent adds one stream entry and sets its scheduling record once per report; a node
whose entries, or whose records set, pass ``bound`` within ``window_s`` writes faster than
any agent. Key events carry no time, and a reader that is behind reads many at once: each
write is dated by the latest **tick** before it in the event stream — a key the warden
sets every fraction of a second (:meth:`WriteRates.tick_key`), whose own event comes back
in order with the writes — never by when it was read. While no tick has come back for
``TICK_STALE_S`` (key events without ``$``, or a stalled reader) no write is counted.
"""

from __future__ import annotations

import math
import secrets
import threading
from collections import deque
from collections.abc import Callable

RATED_EVENTS = (b"xadd", b"set")
"""The events counted (each once per report)."""
TICK_PREFIX = "intf:warden:tick:"
"""``TICK_PREFIX<reader id>:<ms>``: one reader's tick keys (another replica's are not its
own: their clocks differ)."""
TICK_STALE_S = 2.0
"""No write is counted while this reader's own ticks have not come back for this long."""


class WriteRates:
    """Per node and event, the stream times of its latest writes (at most ``bound`` + 1).
    Thread-safe: the events thread notes, the checking thread asks."""

    def __init__(self, bound: int, window_s: float, clock: Callable[[], float]) -> None:
        self.bound, self.window_s = bound, window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._writes: dict[tuple[str, bytes], deque[float]] = {}
        self.tick_prefix = f"{TICK_PREFIX}{secrets.token_hex(4)}:"
        self._stream_time = 0.0
        """When the latest tick read back was set (the reader's clock)."""
        self._tick_read_at = -math.inf
        """When that tick was read."""

    def tick_key(self) -> str:
        """The key to set now (with a short TTL) as the next tick."""
        return f"{self.tick_prefix}{round(self._clock() * 1000)}"

    def ticked(self, key: str) -> bool:
        """Note ``key``'s event if it is one of this reader's ticks; whether it was."""
        if not key.startswith(self.tick_prefix):
            return False
        try:
            set_at = int(key[len(self.tick_prefix) :]) / 1000
        except ValueError:
            return True
        with self._lock:
            self._stream_time = set_at
            self._tick_read_at = self._clock()
        return True

    def noted(self, node: str, event: bytes) -> None:
        """Count one key event of ``node`` (only :data:`RATED_EVENTS`, only while ticking)."""
        if event not in RATED_EVENTS:
            return
        with self._lock:
            if self._clock() - self._tick_read_at > TICK_STALE_S:
                return
            seen = self._writes.get((node, event))
            if seen is None:
                seen = self._writes[node, event] = deque(maxlen=self.bound + 1)
            seen.append(self._stream_time)

    def too_fast(self) -> dict[str, str]:
        """Nodes that wrote more than ``bound`` within ``window_s``, each with why; their
        counts start again, and those of nodes quiet for a window are forgotten."""
        found: dict[str, str] = {}
        with self._lock:
            now = self._stream_time
            for (node, event), seen in list(self._writes.items()):
                if len(seen) > self.bound and seen[-1] - seen[0] <= self.window_s:
                    found.setdefault(
                        node,
                        f"writing_too_fast: {len(seen)} {event.decode()} events in "
                        f"{seen[-1] - seen[0]:.1f} s (at most {self.bound} in "
                        f"{self.window_s:g} s)",
                    )
                if not seen or now - seen[-1] > self.window_s:
                    del self._writes[node, event]
            for node in found:
                for event in RATED_EVENTS:
                    self._writes.pop((node, event), None)
        return found
