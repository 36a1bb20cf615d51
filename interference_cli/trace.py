"""Trace files: NodeReports recorded from ``intf:stream`` for offline policy comparison.

A trace is a sequence of msgpack objects: a header map ``{"format": "interference-trace",
"version": 1, ...}``, then each report exactly as the agent put it on the stream (the
msgpack bytes of :func:`interference.codec.encode_report`), so reading a trace goes
through the same versioned decoder as the scheduler.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from interference.codec import PayloadError, decode_report
from interference.signals import NodeReport
from interference_cli.store import CliError, Store

TRACE_FORMAT = "interference-trace"
TRACE_VERSION = 1
READ_BLOCK_MS = 500
"""How long one stream read waits, so Ctrl-C and --duration are noticed promptly."""


@dataclass(frozen=True, slots=True)
class RecordResult:
    """What a recording wrote."""

    written: int
    skipped: list[str]
    """``"<stream id>: <why>"`` of every malformed stream entry left out."""


def record_to_file(
    store: Store,
    out: str | Path,
    *,
    duration_s: float = 0.0,
    max_reports: int = 0,
    from_start: bool = False,
    progress: Callable[[int], None] = lambda _: None,
) -> RecordResult:
    """Append stream reports to a new trace file until the duration or count is reached,
    or Ctrl-C. Each report is flushed as it arrives; an entry the codec rejects is
    skipped and counted (the trace holds only reports the simulator can replay)."""
    last_id = "0-0" if from_start else store.last_stream_id()
    deadline = time.monotonic() + duration_s if duration_s > 0 else float("inf")
    written = 0
    skipped: list[str] = []
    try:
        with Path(out).open("wb") as handle:
            handle.write(msgpack.packb(_header(store.shown_url), use_bin_type=True))
            try:
                while time.monotonic() < deadline and not (max_reports and written >= max_reports):
                    for entry_id, payload in store.stream_after(last_id, block_ms=READ_BLOCK_MS):
                        last_id = entry_id
                        try:
                            decode_report(payload)
                        except PayloadError as exc:
                            skipped.append(f"{entry_id}: {exc}")
                            continue
                        handle.write(msgpack.packb(payload, use_bin_type=True))
                        written += 1
                        if max_reports and written >= max_reports:
                            break
                    handle.flush()
                    progress(written)
            except KeyboardInterrupt:
                pass  # Ctrl-C ends a recording; everything read so far is in the file
    except OSError as exc:
        raise CliError(f"cannot write trace file {out}: {exc}") from exc
    return RecordResult(written, skipped)


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
