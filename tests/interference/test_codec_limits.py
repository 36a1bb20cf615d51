"""A report's decoding is bounded by its size before any object is built (issue 28,
item 2): the 15 MB msgpack array of empty arrays that took a reader over 1 GiB is refused
unread, and whatever fits under the size limit decodes in bounded memory."""

from __future__ import annotations

import time
import tracemalloc

import msgpack
import pytest

from interference import codec
from interference.codec import MAX_REPORT_BYTES, PayloadError, PayloadTooBig
from tests.shaped_reports import shaped_report


def _array_of_empty_arrays(size: int) -> bytes:
    """An array32 header and ``size - 5`` empty arrays (one byte each)."""
    count = size - 5
    return b"\xdd" + count.to_bytes(4, "big") + b"\x90" * count


def _nested_within_limits() -> bytes:
    """1,000 arrays of 1,000 empty arrays (every length at its limit): about 1 MB."""
    inner = b"\xdc" + (1000).to_bytes(2, "big") + b"\x90" * 1000
    return b"\xdc" + (1000).to_bytes(2, "big") + inner * 1000


# (case, payload, refused as too big, peak MiB allowed while refusing or decoding)
HOSTILE = [
    ("15 MB of empty arrays", _array_of_empty_arrays(15 << 20), True, 1),
    ("just over the size limit", _array_of_empty_arrays(MAX_REPORT_BYTES + 1), True, 1),
    ("an array longer than the pod limit", _array_of_empty_arrays(64 << 10), True, 8),
    ("a map of 100k keys", b"\xdf" + (100_000).to_bytes(4, "big"), True, 8),
    ("a 2 MB string", b"\xdb" + (2 << 20).to_bytes(4, "big") + b"a" * (2 << 20), True, 1),
    ("a binary value", b"\xc4\x03abc", True, 1),
    ("a million empty arrays, every length at its limit", _nested_within_limits(), False, 200),
]


@pytest.mark.parametrize(
    ("case", "payload", "too_big", "peak_mib"), HOSTILE, ids=[c[0] for c in HOSTILE]
)
def test_a_hostile_report_is_refused_in_bounded_memory(
    case: str, payload: bytes, too_big: bool, peak_mib: int
) -> None:
    started = time.perf_counter()
    with pytest.raises(PayloadError):
        codec.decode_report(payload)
    assert time.perf_counter() - started < 2, case
    tracemalloc.start()
    try:
        with pytest.raises(PayloadError) as caught:
            codec.decode_report(payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(caught.value, PayloadTooBig) == too_big, caught.value
    assert peak < peak_mib << 20, f"{case}: {peak / 2**20:.1f} MiB"


def test_the_largest_honest_report_decodes() -> None:
    report = shaped_report("node-0001", time.time(), pods=codec.MAX_PODS, gpus=8)
    payload = codec.encode_report(report)
    assert len(payload) < MAX_REPORT_BYTES // 2  # room for culprits and long names
    decoded = codec.decode_report(payload)
    assert (decoded.node, decoded.pods, decoded.gpus) == (report.node, report.pods, report.gpus)
    assert msgpack.unpackb(payload, **codec.UNPACK_LIMITS)["node"] == "node-0001"
