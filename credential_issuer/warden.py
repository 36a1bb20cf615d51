"""The warden: what each node's agent may keep in Redis, enforced by the one party that
owns its user (docs/operations.md, "Trust model"; issue 28).

Redis' ACLs say which keys an agent may write, not how much or for how long, and a Redis
function would not help: Redis 7.0 checks the commands a script calls against the
caller's ACL, so an agent allowed ``FCALL`` could still write directly. The issuer already
holds the right to create and switch off every agent's user, so it also watches what
each user wrote and cuts off a node that keeps more than an honest agent does:

* **Events** (``notify-keyspace-events Etn$`` in deploy/base/redis/redis.conf), checked
  within ``warden_react_s``: a stream an entry was added to (``xadd``), by its size
  (``MEMORY USAGE``: one command, as every agent adds an entry a second); a key created
  (``new``), in full: its TTL (none, beyond ``agent_max_ttl_s``), its size, a stream's
  length and mean entry. Each report an agent publishes adds one stream entry and sets its
  scheduling record once (``set``): those two events are counted per node, and a node
  that writes either more than ``max_writes_per_s`` a second over ``rate_window_s`` is
  writing faster than any agent (its interval) and is cut off (``writing_too_fast``;
  dated by the warden's own ticks in the event stream, :mod:`credential_issuer.write_rates`).
* **Sweeps**, every ``warden_sweep_s`` and at once when Redis' memory passes
  ``warden_pressure`` of ``maxmemory``: every node key (``SCAN``), its TTL and size, and
  each node's total. Hashes, sets and strings written over (whose events are too many to
  follow: one per pod per interval), a ``SET`` without ``EX`` over an existing key and
  TTLs lengthened by ``EXPIRE`` are found here.

A node over a bound is cut off: its user is switched off (``ACL SETUSER agent:NODE off``),
its sessions closed (``CLIENT KILL USER``), its keys deleted, and a cool-down key
(``intf:warden:cutoff:NODE``, readable by every issuer replica) keeps the issuer from
issuing it a new password for ``warden_cooldown_s``. Counted in
``interference_credentials_cutoffs_total{reason}`` and logged once per cut-off.

A key without a TTL is given ``warden_grace_s`` before it counts: the agent's pipeline
writes a hash, then its ``EXPIRE``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from credential_issuer.write_rates import WriteRates
from interference import acl, keys
from interference_infra.redis_client import REDIS_ERRORS, RedisConnection, RedisTarget

log = logging.getLogger(__name__)

WARDEN_COMMANDS = (
    "scan",
    "type",
    "ttl",
    "memory|usage",
    "xlen",
    "del",
    "info",
    "subscribe",
    "set",
)
"""What the warden sends besides the issuer's own commands (``ACL SETUSER``, ``CLIENT
KILL``); on the node keys (``~intf:node:*``), its cool-down keys (``~intf:warden:*``) and
the key-event channels (``&__keyevent@0__:*``)."""
EVENTS = ("xadd", "new", "set")
"""The key events followed: a stream entry added (its stream's size checked), a key
created (all of it checked, its TTL after the grace), a string set (counted). An agent
adds one entry and sets one record an interval; its hash and set writes (one per pod per
interval), a ``SET`` without ``EX`` over an existing key and an ``EXPIRE`` are left to the
sweeps."""
CHANNEL_PREFIX = "__keyevent@0__:"
CUTOFF_PREFIX = "intf:warden:cutoff:"
REASONS = (
    "no_expiry",
    "ttl_too_long",
    "value_too_large",
    "stream_too_long",
    "stream_too_large",
    "entry_too_large",
    "node_too_large",
    "writing_too_fast",
)
"""Every label value of the cut-off counter."""
_NODE_PREFIX = keys.node_key("")
_FOLLOW_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, OSError)
"""What reading the events may raise."""


def cutoff_key(node: str) -> str:
    """The key that says ``node`` is cut off (its TTL: the cool-down left)."""
    return CUTOFF_PREFIX + node


@dataclass(frozen=True)
class WardenLimits:
    """What an honest agent keeps, with room (measured: a node of 110 pods keeps 115 keys,
    487 KB: its report stream of 10 entries 416 KB, its pod set 9 KB, every other key
    under 600 bytes; 250 pods: 1.15 MB, the stream 989 KB)."""

    agent_max_ttl_s: int = 180
    """The longest TTL an agent sets (its ``--ttl``: 3 × its interval, at least 5; the
    longest interval is 60 s)."""
    max_value_bytes: int = 64 << 10
    """One key other than the report stream (``MEMORY USAGE``)."""
    max_stream_length: int = keys.NODE_REPORTS_MAXLEN
    """Entries of the report stream (the agents' ``--stream-maxlen``)."""
    max_stream_bytes: int = 4 << 20
    """The report stream (``MEMORY USAGE``)."""
    max_entry_bytes: int = 1 << 20
    """A stream's mean entry (the largest report a reader decodes)."""
    max_node_bytes: int = 6 << 20
    """All of one node's keys together."""
    grace_s: float = 1.0
    """How long a key may be without a TTL (between an agent's write and its EXPIRE)."""
    max_writes_per_s: float = 10.0
    """Stream entries, and separately strings set, per second of one node (an agent writes
    one of each per report: 10 × the default 1 s interval, so any interval ≥ 0.1 s)."""
    rate_window_s: float = 5.0
    """The window ``max_writes_per_s`` is counted over (a burst within it is allowed)."""

    @property
    def max_writes_per_window(self) -> int:
        return math.ceil(self.max_writes_per_s * self.rate_window_s)

    def __post_init__(self) -> None:
        for name in (
            "agent_max_ttl_s",
            "max_value_bytes",
            "max_stream_length",
            "max_stream_bytes",
            "max_entry_bytes",
            "max_node_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        for name in ("grace_s", "max_writes_per_s", "rate_window_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class KeyState:
    """What Redis says of one node key."""

    key: str
    kind: str
    ttl: int
    """Seconds; -1 none, -2 gone."""
    size: int
    length: int = 0
    """Entries, for a stream."""


def node_of(key: str) -> str | None:
    """The node whose key ``key`` is (``intf:node:NODE`` or ``intf:node:NODE:…``)."""
    if not key.startswith(_NODE_PREFIX):
        return None
    node = key[len(_NODE_PREFIX) :].split(":", 1)[0]
    return node if keys.valid_node_name(node) else None


def violation(state: KeyState, limits: WardenLimits, without_ttl_since: float | None,
              now: float) -> str:  # fmt: skip
    """The reason ``state`` is over its bound, or "" (``without_ttl_since``: when the key
    was first seen without a TTL, None if it has one)."""
    if state.ttl == -2:
        return ""
    if state.kind == "stream":
        if state.length > limits.max_stream_length:
            return "stream_too_long"
        if state.size > limits.max_stream_bytes:
            return "stream_too_large"
        if state.length and state.size / state.length > limits.max_entry_bytes:
            return "entry_too_large"
    elif state.size > limits.max_value_bytes:
        return "value_too_large"
    if state.ttl == -1:
        late = without_ttl_since is not None and now - without_ttl_since >= limits.grace_s
        return "no_expiry" if late else ""
    return "ttl_too_long" if state.ttl > limits.agent_max_ttl_s else ""


class WardenMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.cutoffs = Counter(
            "interference_credentials_cutoffs",
            "Nodes cut off by the warden for keeping more in Redis than an agent may, by"
            " reason (user switched off, sessions closed, keys deleted, cool-down).",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:
            self.cutoffs.labels(reason=reason)
        self.errors = Counter(
            "interference_credentials_warden_errors",
            "Warden checks or sweeps that Redis did not answer.",
            registry=registry,
        )


class Warden:
    """Follows the key events in one thread and checks and sweeps in another."""

    def __init__(
        self,
        target: RedisTarget,
        limits: WardenLimits,
        metrics: WardenMetrics,
        *,
        react_s: float = 0.2,
        sweep_s: float = 10.0,
        pressure: float = 0.8,
        cooldown_s: float = 300.0,
        socket_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_cut_off: Callable[[str, str, float], None] | None = None,
    ) -> None:
        if target.cluster:
            raise ValueError("the warden follows one Redis server (not a Cluster)")
        self._redis = RedisConnection(target, socket_timeout_s)
        # Its own connection: a subscribed one sends nothing else.
        self._events = RedisConnection(target, 30.0)
        self.limits = limits
        self.metrics = metrics
        self._react_s, self._sweep_s = react_s, sweep_s
        self._pressure, self._cooldown_s = pressure, cooldown_s
        self._clock = clock
        self._on_cut_off = on_cut_off
        """Told ``(node, detail, cool-down s)`` after each cut-off (the Node's Event)."""
        self._lock = threading.Lock()
        self._pending: dict[str, bool] = {}
        """Keys named by an event since the last check → whether to check all of it (a
        new key) or a stream's size alone (an entry added)."""
        self._without_ttl: dict[str, float] = {}
        """Key → when it was first seen without a TTL."""
        self.rates = WriteRates(limits.max_writes_per_window, limits.rate_window_s, clock)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.sweeps = 0
        self.cutting_off = False
        """A cut-off is under way (its user may be off before it is counted)."""
        self._last_error = ""

    # --- the issuer's side -------------------------------------------------------------

    def cooldown_left(self, node: str) -> float:
        """Seconds until ``node`` may be issued a password again (0: now); raises one of
        ``REDIS_ERRORS`` when Redis does not answer."""
        return max(0.0, float(self._redis.client().ttl(cutoff_key(node))))

    # --- threads -----------------------------------------------------------------------

    def start(self) -> None:
        for target, name in (
            (self._follow, "warden-events"),
            (self._run, "warden-checks"),
            (self._tick, "warden-ticks"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        """Stop the threads (if started) and close the connections."""
        self._stop.set()
        for thread in self._threads:
            thread.join(10)  # the events are read with a 0.5 s timeout
        self._events.close()
        self._redis.close()

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self._events.client().pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(*(CHANNEL_PREFIX + event for event in EVENTS))
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is None:
                        continue
                    key = message["data"]
                    key = key.decode() if isinstance(key, bytes) else str(key)
                    if self.rates.ticked(key):
                        continue
                    node = node_of(key)
                    if node is not None:
                        channel = message["channel"]
                        event = (
                            channel if isinstance(channel, bytes) else str(channel).encode()
                        ).rsplit(b":", 1)[-1]
                        self._noted(key, node, event)
            except _FOLLOW_ERRORS as exc:
                if self._stop.is_set():
                    return
                self._error(f"key events: {exc}")
                self._events.reset()
                self._stop.wait(1.0)

    def _noted(self, key: str, node: str, event: bytes) -> None:
        """Note one key event of ``node`` (from the events thread)."""
        self.rates.noted(node, event)
        if event != b"set":  # a record is bounded by the sweeps; its rate here
            with self._lock:
                self._pending[key] = self._pending.get(key, False) or event == b"new"

    def _run(self) -> None:
        last_sweep = -self._sweep_s
        while not self._stop.wait(self._react_s):
            try:
                self.check_pending()
                now = self._clock()
                if now - last_sweep >= self._sweep_s or (
                    now - last_sweep >= 1.0 and self._under_pressure()
                ):
                    last_sweep = now
                    self.sweep()
            except REDIS_ERRORS as exc:
                self._error(str(exc))
                self._redis.reset()

    def _tick(self) -> None:
        """Set a tick key every ``react_s`` on its own thread, so a long sweep does not
        space the ticks out (each dates the writes read after it)."""
        while not self._stop.wait(self._react_s):
            try:
                self._redis.client().set(self.rates.tick_key(), b"", px=1000)
            except REDIS_ERRORS as exc:
                self._error(str(exc))

    def _error(self, message: str) -> None:
        self.metrics.errors.inc()
        if message != self._last_error:
            log.error("warden: Redis did not answer (%s); retrying", message)
            self._last_error = message

    def _under_pressure(self) -> bool:
        memory = self._redis.client().info("memory")
        limit = int(memory.get("maxmemory", 0))
        return limit > 0 and int(memory.get("used_memory", 0)) >= self._pressure * limit

    # --- checks ------------------------------------------------------------------------

    def check_pending(self) -> None:
        """Check every key named by an event since the last check, and every key still
        waiting for its TTL: a new key in full, a stream's entry by its size alone (one
        command: every agent adds one a second)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for node, why in self.rates.too_fast().items():
            self.cut_off(node, "writing_too_fast", why)
        for key in self._without_ttl:
            pending[key] = True
        full = [key for key, whole in pending.items() if whole]
        sized = [key for key, whole in pending.items() if not whole]
        if full or sized:
            self._judge(self._states(full, typed=True) + self._sizes(sized), totals=False)

    def sweep(self) -> None:
        """Every node key: its TTL, its size and each node's total."""
        found = list(self._redis.client().scan_iter(match=_NODE_PREFIX + "*", count=1000))
        names = [k.decode() if isinstance(k, bytes) else str(k) for k in found]
        self._judge(self._states(names, typed=False), totals=True)
        self.sweeps += 1

    def _sizes(self, streams: list[str]) -> list[KeyState]:
        """The size of each stream an entry was added to (its TTL is not read: 0)."""
        states: list[KeyState] = []
        client = self._redis.client()
        for start in range(0, len(streams), 1000):
            chunk = streams[start : start + 1000]
            with client.pipeline(transaction=False) as pipe:
                for key in chunk:
                    pipe.memory_usage(key)
                sizes = pipe.execute(raise_on_error=False)
            states += [
                KeyState(key, "stream", 0, size)
                for key, size in zip(chunk, sizes, strict=True)
                if isinstance(size, int)
            ]
        return states

    def _states(self, names: list[str], *, typed: bool) -> list[KeyState]:
        """TTL, size and (for a stream) length of each key; ``typed``: its type asked,
        else a node's report stream is its one stream (a stream elsewhere is a value)."""
        client = self._redis.client()
        states: list[KeyState] = []
        per_key = 3 if typed else 2
        for start in range(0, len(names), 500):
            chunk = names[start : start + 500]
            with client.pipeline(transaction=False) as pipe:
                for key in chunk:
                    if typed:
                        pipe.type(key)
                    pipe.ttl(key)
                    pipe.memory_usage(key)
                answers = pipe.execute(raise_on_error=False)
            streams: list[int] = []
            for i, key in enumerate(chunk):
                ttl, size = answers[per_key * i + per_key - 2 : per_key * (i + 1)]
                if typed:
                    kind = answers[per_key * i]
                    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
                else:
                    node = node_of(key)
                    kind = "stream" if node and key == keys.reports_key(node) else "value"
                if isinstance(ttl, Exception) or kind == "none" or ttl == -2:
                    continue
                if kind == "stream":
                    streams.append(len(states))
                states.append(KeyState(key, kind, int(ttl), size if isinstance(size, int) else 0))
            if streams:
                with client.pipeline(transaction=False) as pipe:
                    for index in streams:
                        pipe.xlen(states[index].key)
                    lengths = pipe.execute(raise_on_error=False)
                for index, length in zip(streams, lengths, strict=True):
                    if isinstance(length, int):
                        s = states[index]
                        states[index] = KeyState(s.key, s.kind, s.ttl, s.size, length)
        return states

    def _judge(self, states: Iterable[KeyState], *, totals: bool) -> None:
        now = self._clock()
        found: dict[str, str] = {}
        size: dict[str, int] = {}
        for state in states:
            node = node_of(state.key)
            if node is None:
                continue
            if state.ttl == -1:
                since = self._without_ttl.setdefault(state.key, now)
            else:
                since = None
                self._without_ttl.pop(state.key, None)
            size[node] = size.get(node, 0) + state.size
            reason = violation(state, self.limits, since, now)
            if reason and node not in found:
                found[node] = f"{reason} {state.key} ({state.kind}, TTL {state.ttl}, " \
                    f"{state.size} bytes, {state.length} entries)"  # fmt: skip
        if totals:
            for node, total in size.items():
                if node not in found and total > self.limits.max_node_bytes:
                    found[node] = f"node_too_large: {total} bytes in all"
        for node, why in found.items():
            self.cut_off(node, why.split(" ", 1)[0].rstrip(":"), why)

    def cut_off(self, node: str, reason: str, detail: str) -> None:
        """Switch ``node``'s user off, close its sessions, delete its keys and start its
        cool-down."""
        self.cutting_off = True
        try:
            self._cut_off(node, reason, detail)
        finally:
            self.cutting_off = False

    def _cut_off(self, node: str, reason: str, detail: str) -> None:
        username = acl.agent_username(node)
        client = self._redis.client()
        client.set(cutoff_key(node), reason, ex=max(1, round(self._cooldown_s)))
        client.execute_command("ACL", "SETUSER", username, "off")
        closed = int(client.execute_command("CLIENT", "KILL", "USER", username))
        deleted = 0
        for pattern in keys.node_key_patterns(node):
            batch = list(client.scan_iter(match=pattern, count=1000))
            for start in range(0, len(batch), 500):
                deleted += int(client.delete(*batch[start : start + 500]))
        for key in [k for k in self._without_ttl if node_of(k) == node]:
            del self._without_ttl[key]
        self.metrics.cutoffs.labels(reason=reason).inc()
        log.warning(
            "cut off node %s: %s; user %s switched off, %d session(s) closed, %d key(s) "
            "deleted, no new password for %.0f s",
            node, detail, username, closed, deleted, self._cooldown_s,
        )  # fmt: skip
        if self._on_cut_off is not None:
            self._on_cut_off(node, detail, self._cooldown_s)
