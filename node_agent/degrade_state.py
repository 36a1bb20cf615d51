"""The degrader's state file: what it wrote, the value before, and when it degraded.

The degrader records an entry here *before* it writes the cgroup file, and the write is
refused when the record cannot be made, so whatever happens to the agent the original
value is on disk first. :func:`save_state` is durable: a temporary file beside it,
fsynced, renamed over it, and the directory fsynced, so a crash at any point leaves
either the previous file or the new one, never a torn one.

Format (JSON object, ``version`` 2)::

    {"version": 2,
     "degraded": [{"uid", "namespace", "name", "resource", "path", "original",
                   "written"}, ...],
     "recent": [wall-clock time of each degradation in the rate-limit window, ...]}

The first release's file (a bare list of entries, no ``recent``) is still read. The file
is input from disk: its size, the number of entries, every path (an absolute, normalised
path ending in one of the four knob files) and every value (digits or ``max``) are
bounded and checked, so a tampered file cannot make the agent write anywhere else.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import logging
import math
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import cast

from node_agent.cgroup_knobs import (
    V1_CPU_SHARES,
    V1_MEMORY_SOFT_LIMIT,
    V2_CPU_WEIGHT,
    V2_MEMORY_HIGH,
    Knob,
    Resource,
    read_knob,
    write_knob,
)

log = logging.getLogger(__name__)

STATE_VERSION = 2
MAX_STATE_BYTES = 1 << 20
MAX_ENTRIES = 4096
MAX_RECENT = 4096
KNOB_FILES: dict[str, Resource] = {
    V2_CPU_WEIGHT: "cpu",
    V1_CPU_SHARES: "cpu",
    V2_MEMORY_HIGH: "memory",
    V1_MEMORY_SOFT_LIMIT: "memory",
}
"""The only files an entry may name, with the resource each holds."""
_VALUE = re.compile(r"\d{1,20}|max")
_NAME_LIMIT = 253


class StateUnreadable(ValueError):
    """The state file exists but cannot be trusted (unreadable, malformed, too large)."""


@dataclass(frozen=True)
class Entry:
    """One pod's knob degraded: the file, what was written and what to put back."""

    uid: str
    namespace: str
    name: str
    resource: Resource
    path: str
    original: str
    written: str

    @property
    def knob(self) -> Knob:
        return Knob(self.resource, self.path)


@dataclass
class DegradeState:
    entries: list[Entry] = field(default_factory=list)
    recent: list[float] = field(default_factory=list)
    """Wall-clock times (``time.time()``) of the degradations still in the rate-limit
    window, oldest first."""


def _text(raw: object, what: str, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(raw, str) or len(raw) > _NAME_LIMIT:
        raise StateUnreadable(f"{what} is not a string of at most {_NAME_LIMIT} characters")
    if pattern is not None and not pattern.fullmatch(raw):
        raise StateUnreadable(f"{what} {raw!r} is not a knob value")
    return raw


def _entry(raw: object) -> Entry:
    if not isinstance(raw, dict):
        raise StateUnreadable("an entry is not an object")
    fields = cast(dict[str, object], raw)
    path = fields.get("path")
    if not isinstance(path, str) or len(path) > 4096:
        raise StateUnreadable("an entry has no path")
    resource = KNOB_FILES.get(os.path.basename(path))
    if not os.path.isabs(path) or os.path.normpath(path) != path or resource is None:
        raise StateUnreadable(f"{path!r} is not a pod's cpu or memory knob")
    if fields.get("resource") != resource:
        raise StateUnreadable(f"{path!r} does not hold {fields.get('resource')!r}")
    return Entry(
        uid=_text(fields.get("uid"), "uid"),
        namespace=_text(fields.get("namespace"), "namespace"),
        name=_text(fields.get("name"), "name"),
        resource=resource,
        path=path,
        original=_text(fields.get("original"), "original", _VALUE),
        written=_text(fields.get("written"), "written", _VALUE),
    )


def parse_state(text: str) -> DegradeState:
    """The state in ``text`` (``StateUnreadable`` saying what is wrong)."""
    if len(text) > MAX_STATE_BYTES:
        raise StateUnreadable(f"over {MAX_STATE_BYTES} bytes")
    try:
        raw: object = json.loads(text)
    except ValueError as exc:
        raise StateUnreadable(f"not JSON: {exc}") from exc
    recent_raw: object = []
    if isinstance(raw, list):  # the first release's format
        entries_raw: object = raw
    elif isinstance(raw, dict) and raw.get("version") == STATE_VERSION:
        entries_raw, recent_raw = raw.get("degraded"), raw.get("recent", [])
    else:
        raise StateUnreadable(f"neither a list nor a version {STATE_VERSION} object")
    if not isinstance(entries_raw, list) or len(entries_raw) > MAX_ENTRIES:
        raise StateUnreadable(f"'degraded' is not a list of at most {MAX_ENTRIES} entries")
    if not isinstance(recent_raw, list) or len(recent_raw) > MAX_RECENT:
        raise StateUnreadable(f"'recent' is not a list of at most {MAX_RECENT} times")
    recent: list[float] = []
    for stamp in recent_raw:
        if isinstance(stamp, bool) or not isinstance(stamp, int | float):
            raise StateUnreadable("'recent' holds something other than a time")
        if not math.isfinite(stamp):
            raise StateUnreadable("'recent' holds a time that is not finite")
        recent.append(float(stamp))
    return DegradeState([_entry(e) for e in entries_raw], sorted(recent))


def load_state(path: str) -> DegradeState | None:
    """The state in ``path``, None when there is no file; ``StateUnreadable`` when the
    file is there but cannot be read or trusted. Removes temporary files a crash left
    beside it (never renamed, so never the state)."""
    for stale in glob.glob(
        os.path.join(glob.escape(_directory(path)), glob.escape(_temp_prefix(path)) + "*")
    ):
        with contextlib.suppress(OSError):
            os.unlink(stale)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise StateUnreadable(str(exc)) from exc
    return parse_state(text)


def save_state(path: str, state: DegradeState) -> None:
    """Replace ``path`` with ``state``, durably (module docstring); ``OSError`` when it
    could not (the previous file is then untouched)."""
    directory = _directory(path)
    os.makedirs(directory, exist_ok=True)
    body = json.dumps(
        {
            "version": STATE_VERSION,
            "degraded": [asdict(entry) for entry in state.entries],
            "recent": state.recent,
        }
    )
    fd, temp = tempfile.mkstemp(prefix=_temp_prefix(path), dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    # The rename is durable only once the directory is.
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _directory(path: str) -> str:
    return os.path.dirname(path) or "."


def _temp_prefix(path: str) -> str:
    return f".{os.path.basename(path)}.tmp."


def gone(knob: Knob, exc: OSError) -> bool:
    """Whether a failed write means the pod's cgroup is gone (nothing left to restore)."""
    return exc.errno in (errno.ENOENT, errno.ENODEV) or not os.path.isdir(knob.directory)


def put_back(entries: list[Entry], done: Callable[[Entry], None]) -> list[Entry]:
    """Write each entry's original back where the file still holds what was written,
    calling ``done`` for each; returns the entries that could not be written back. An
    entry whose file holds anything else (the write never happened, it was put back
    already, or the kubelet changed it since) or whose cgroup is gone is done with."""
    left: list[Entry] = []
    for entry in entries:
        knob = entry.knob
        try:
            if read_knob(knob) != entry.written:
                log.info("not restoring %s: it no longer holds %s", knob.path, entry.written)
                continue
            write_knob(knob, entry.original)
        except OSError as exc:
            if gone(knob, exc):
                log.info("not restoring %s: the pod's cgroup is gone", knob.path)
            else:
                log.info("cannot put back %s yet (%s): kept in the state file", knob.path, exc)
                left.append(entry)
            continue
        done(entry)
    return left


def put_back_file(path: str, done: Callable[[Entry], None]) -> None:
    """:func:`put_back` what the state file at ``path`` lists and keep there what could
    not be written back and the rate limit's times; an unreadable file is left alone."""
    try:
        state = load_state(path)
    except StateUnreadable as exc:
        log.warning("the state file %s is unreadable (%s): nothing restored", path, exc)
        return
    if state is None or not state.entries:
        return
    left = put_back(state.entries, done)
    warn_left(left)
    try:
        save_state(path, DegradeState(left, state.recent))
    except OSError as exc:
        # Harmless: what was put back no longer holds the value written, so it is skipped.
        log.warning("cannot update %s (%s)", path, exc)


def left_degraded(path: str) -> bool:
    """Whether the state file at ``path`` lists anything a previous run may have left
    degraded."""
    try:
        state = load_state(path)
    except StateUnreadable:
        return False
    return state is not None and bool(state.entries)


def warn_left(left: list[Entry]) -> None:
    """A warning naming what a previous run degraded and could not be put back (the
    degrader retries every interval and does not degrade those knobs meanwhile)."""
    if left:
        paths = ", ".join(entry.path for entry in left)
        log.warning(
            "%d knob(s) a previous run degraded could not be put back: %s", len(left), paths
        )
