"""Trace files: NodeReports recorded from the nodes' report streams for offline policy
comparison.

A trace is a sequence of msgpack objects: a header map ``{"format": "interference-trace",
"version": 1, ...}``, then each report exactly as the agent put it on its node's stream
``intf:node:NODE:reports`` (the msgpack bytes of :func:`interference.codec.encode_report`),
so reading a trace goes through the same versioned decoder as the scheduler.

``record`` finds the streams (:meth:`~interference_cli.store.Store.report_streams`: the
ranked nodes' and every one ``SCAN`` finds when the user may scan) again every
:data:`RESCAN_S`, so nodes that start reporting later are recorded too, and reads them
with ``XREAD``, many streams per command. It appends to an existing trace file (a
trace is a plain sequence of msgpack objects, so reports written after the last one keep
it one trace with one header), and refuses a file that is not one. It never leaves a
trace it appended to shorter than it found it, nor with half an entry at its end: a
failed write is cut back to the last whole report; a file it created and wrote no report
to is removed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from interference.codec import PayloadError, decode_report
from interference.signals import NodeReport
from interference_cli.errors import CliError
from interference_cli.store import Store

TRACE_FORMAT = "interference-trace"
TRACE_VERSION = 1
RESCAN_S = 5.0
"""Seconds between two looks for report streams (nodes that started reporting)."""
IDLE_S = 0.25
"""Pause after a read that found nothing new, so Ctrl-C and --duration are noticed
promptly and an idle Redis is not polled hard."""


@dataclass(frozen=True, slots=True)
class RecordResult:
    """What a recording wrote."""

    written: int
    skipped: list[str]
    """``"<stream key> <entry id>: <why>"`` of every malformed stream entry left out."""
    appended: bool = False
    """The file was an existing trace the reports were added to."""
    streams: int = 0
    """Report streams found in Redis (the nodes that ever published) by the end."""
    duration_s: float = 0.0
    """How long it recorded."""


def record_to_file(
    store: Store,
    out: str | Path,
    *,
    duration_s: float = 0.0,
    max_reports: int = 0,
    from_start: bool = False,
    progress: Callable[[int], None] = lambda _: None,
    clock: Callable[[], float] = time.monotonic,
) -> RecordResult:
    """Append the nodes' reports to a trace file until the duration or count is reached,
    or Ctrl-C. A new (or empty) file gets a header; an existing trace is appended to; a
    file that is not a whole trace is refused (:class:`CliError`), never overwritten.

    Without ``from_start`` only reports added after the start are recorded: a stream
    found later is read from the start time on (its entry ids are the Redis server's
    clock in ms, so a client clock ahead of the server's by more than the rescan period
    could miss a new node's first reports). Each round's reports are
    written in stream-id order and flushed; an entry the codec rejects is skipped and
    counted (the trace holds only reports the simulator can replay)."""
    path = Path(out)
    appending = _check_existing(path)
    started = clock()
    deadline = started + duration_s if duration_s > 0 else float("inf")
    written = 0
    skipped: list[str] = []
    first_id = "0-0" if from_start else f"{int(time.time() * 1000)}-0"
    streams = store.report_streams()
    last_ids = (
        dict.fromkeys(streams.values(), "0-0")
        if from_start
        else store.last_stream_ids(sorted(streams.values()))
    )
    scanned_at = clock()
    created = not path.exists()
    try:
        # Unbuffered: a round's bytes go to the file in one write call (or fail), so no
        # buffered tail can reach the file after a failure has cut it back.
        with path.open("ab", buffering=0) as handle:
            whole = handle.tell()  # bytes that are whole entries: what a failure cuts back to
            try:
                if not appending:
                    _write_all(handle, msgpack.packb(_header(store.shown_url), use_bin_type=True))
                    whole = handle.tell()
                while clock() < deadline and not (max_reports and written >= max_reports):
                    if clock() - scanned_at >= RESCAN_S:
                        for key in store.report_streams().values():
                            last_ids.setdefault(key, first_id)  # new since the last look
                        scanned_at = clock()
                    entries = store.streams_after(last_ids)
                    chunk = bytearray()
                    taken = 0
                    for key, entry_id, payload in entries:
                        last_ids[key] = entry_id
                        try:
                            decode_report(payload)
                        except PayloadError as exc:
                            skipped.append(f"{key} {entry_id}: {exc}")
                            continue
                        chunk += msgpack.packb(payload, use_bin_type=True)
                        taken += 1
                        if max_reports and written + taken >= max_reports:
                            break
                    _write_all(handle, bytes(chunk))
                    whole, written = handle.tell(), written + taken
                    progress(written)
                    if not entries:
                        time.sleep(max(0.0, min(IDLE_S, deadline - clock())))
            except KeyboardInterrupt:
                pass  # Ctrl-C ends a recording; everything read so far is in the file
            finally:
                # Whole entries only, whatever ended the recording (Ctrl-C in a write, a
                # full disk, Redis gone); a new trace with no report is not kept.
                handle.truncate(whole if written or appending else 0)
        if written == 0 and created:
            path.unlink()
    except OSError as exc:
        raise CliError(f"cannot write trace file {out}: {exc}") from exc
    return RecordResult(
        written,
        skipped,
        appended=appending,
        streams=len(last_ids),
        duration_s=clock() - started,
    )


def _write_all(handle: BinaryIO, data: bytes) -> None:
    """Write all of ``data`` to an unbuffered file (a raw write may take only part)."""
    view = memoryview(data)
    while view:
        count = handle.write(view)
        view = view[count or 0 :]


def _check_existing(path: Path) -> bool:
    """True when ``path`` is a whole trace to append to, False when it is absent or
    empty; :class:`CliError` for anything else (a file that is not a trace, one cut
    short), which ``record`` must not overwrite or extend."""
    try:
        if not path.exists() or (path.is_file() and path.stat().st_size == 0):
            return False
    except OSError as exc:
        raise CliError(f"cannot read trace file {path}: {exc}") from exc
    if not path.is_file():
        raise CliError(f"{path} is not a file; pass a trace file to --out")
    try:
        load_trace(path)
    except CliError as exc:
        raise CliError(
            f"will not write to {path}: {exc}; pass a new file to --out (record appends "
            "only to a whole trace)"
        ) from exc
    return True


def write_trace(path: str | Path, payloads: list[bytes], source: str) -> None:
    """Write already-encoded reports as a trace file."""
    with Path(path).open("wb") as handle:
        handle.write(msgpack.packb(_header(source), use_bin_type=True))
        for payload in payloads:
            handle.write(msgpack.packb(payload, use_bin_type=True))


def load_trace(path: str | Path) -> list[NodeReport]:
    """Every report of a trace file in recorded order; :class:`CliError` saying what is
    wrong with a file that is not a readable trace."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read trace file {path}: {exc}") from exc
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    try:
        objects = list(unpacker)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
        raise CliError(f"trace file {path} is not msgpack: {exc}") from exc
    if unpacker.tell() != len(data):
        # The unpacker stops silently at an incomplete object: a file cut short.
        raise CliError(
            f"trace file {path} is truncated: {len(data) - unpacker.tell()} bytes after "
            f"entry {max(len(objects) - 1, 0)} are an incomplete entry; record it again "
            "(or cut it at the last complete entry)"
        )
    if not objects or not _is_header(objects[0]):
        raise CliError(
            f"{path} is not an interference trace (no {TRACE_FORMAT} header); "
            "record one with `interference record --out FILE`"
        )
    reports = []
    for index, payload in enumerate(objects[1:], start=1):
        if not isinstance(payload, bytes):
            raise CliError(f"trace file {path}: entry {index} is not a report payload")
        try:
            reports.append(decode_report(payload))
        except PayloadError as exc:
            raise CliError(f"trace file {path}: entry {index}: {exc}") from exc
    return reports


def _header(source: str) -> dict[str, Any]:
    return {
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "recorded_at": time.time(),
        "source": source,
    }


def _is_header(obj: Any) -> bool:
    if not isinstance(obj, dict) or obj.get("format") != TRACE_FORMAT:
        return False
    if obj.get("version") != TRACE_VERSION:
        raise CliError(
            f"trace version {obj.get('version')!r} is not supported (expected {TRACE_VERSION})"
        )
    return True
