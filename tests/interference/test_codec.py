"""The versioned msgpack codec and the hash codecs: round trips and PayloadError (acceptance 6)."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interference import codec, hist
from interference.codec import PayloadError
from interference.signals import (
    SCHEMA_VERSION,
    GpuDevice,
    NodeMetrics,
    NodeReport,
    PodMetrics,
    WindowMetrics,
)

REPORT = NodeReport(
    node="gpu-node-1",
    ts=1_700_000_000.25,
    interval_s=1.0,
    metrics=NodeMetrics(
        runq_p50_us=12.5,
        runq_p99_us=900.0,
        runq_wait_ratio=0.25,
        bpf_lost_entries=7.0,
        interference_index=41.5,
    ),
    histograms={"runq_us": [0, 3, 5, 1], "reclaim_us": []},
    pods=[
        PodMetrics(
            namespace="ml",
            name="trainer-0",
            uid="0b6f6d2e-6a43-4f8e-9c1a-1f2e3d4c5b6a",
            qos="guaranteed",
            cpu_ms_per_s=950.0,
            runq_wait_ms_per_s=120.5,
            runq_us=(0, 0, 4, 7, 1),
        ),
        PodMetrics(namespace="", name="system", cpu_ms_per_s=30.0),
    ],
    gpus=[GpuDevice(0, "GPU-abc", "NVIDIA H100", 81559.0, 1024.0, 37.0, 2)],
    disabled_probes={"reclaim": "tracefs is not mounted"},
    measured=("psi", "runq"),
    windows={
        "10s": WindowMetrics(
            span_s=10.0,
            covered_s=9.5,
            intervals=10,
            runq_p99_us=1200.0,
            runq_wait_ratio_mean=0.2,
            runq_wait_ratio_max=0.6,
            index_mean=30.0,
            index_stddev=12.5,
            index_max=60.0,
        )
    },
)


def packed(body: Any) -> bytes:
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


def valid_body() -> dict[str, Any]:
    body = asdict(REPORT)
    body["v"] = SCHEMA_VERSION
    return body


def with_change(path: tuple[str | int, ...], value: Any) -> bytes:
    """The valid report with one nested field replaced (``value is DELETE`` removes it)."""
    body = valid_body()
    target: Any = body
    for step in path[:-1]:
        target = target[step]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return packed(body)


DELETE = object()


def test_report_round_trips() -> None:
    assert codec.decode_report(codec.encode_report(REPORT)) == REPORT


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "not a msgpack"),
        (b"\xc1", "not a msgpack"),
        (b"\x92\x01", "not a msgpack"),  # truncated array
        (packed([1, 2]), "must be a map"),
        (packed(7), "must be a map"),
        (packed({"node": "n"}), "schema version None"),
        (with_change(("v",), SCHEMA_VERSION + 1), f"version {SCHEMA_VERSION + 1}"),
        (with_change(("v",), SCHEMA_VERSION - 1), f"version {SCHEMA_VERSION - 1}"),
        (with_change(("v",), 1), "version 1 is not supported (this release reads 3)"),
        (with_change(("v",), str(SCHEMA_VERSION)), f"version '{SCHEMA_VERSION}'"),
        (with_change(("v",), True), "version True"),
        (with_change(("measured",), DELETE), "missing or has a bad field"),
        (with_change(("measured",), ["runq", "gpu"]), "unknown signal family 'gpu'"),
        (with_change(("measured",), "runq"), "measured must be a list"),
        (with_change(("windows", "10s", "bogus"), 1.0), "unknown window fields ['bogus']"),
        (with_change(("windows", "10s", "span_s"), DELETE), "window lacks span_s"),
        (with_change(("windows", "10s", "index_mean"), float("nan")), "index_mean must be finite"),
        (with_change(("v",), DELETE), "version None"),
        (with_change(("metrics",), DELETE), "missing or has a bad field"),
        (with_change(("metrics",), [1.0]), "metrics must be a map"),
        (with_change(("metrics", "bogus_ms"), 1.0), "unknown fields ['bogus_ms']"),
        (with_change(("metrics", "interference_index"), "high"), "index must be a number"),
        (with_change(("metrics", "interference_index"), float("nan")), "index must be finite"),
        (with_change(("metrics", "interference_index"), True), "got a boolean"),
        (with_change(("metrics", "score"), 1.0), "unknown fields ['score']"),
        (with_change(("metrics", "bpf_lost_entries"), "many"), "entries must be a number"),
        (with_change(("metrics", "bpf_lost_entries"), float("inf")), "entries must be finite"),
        (with_change(("node",), ""), "node must be a non-empty string"),
        (with_change(("node",), 5), "node must be a non-empty string"),
        (with_change(("ts",), DELETE), "missing or has a bad field"),
        (with_change(("ts",), "yesterday"), "ts must be a number"),
        (with_change(("interval_s",), float("inf")), "interval_s must be finite"),
        (with_change(("histograms",), [1, 2]), "histograms must be a map"),
        (with_change(("histograms", "runq_us"), 3), "must be a list"),
        (with_change(("histograms", "runq_us"), ["x"]), "must hold counts"),
        (with_change(("histograms", "runq_us"), [float("inf")]), "must hold counts"),
        (with_change(("histograms", "runq_us"), [3, -1]), "must hold counts (integers ≥ 0)"),
        (with_change(("histograms", "runq_us"), [1] * 65), "65 entries, more than 64"),
        (with_change(("pods", 0, "runq_us"), [1] * 65), "65 entries, more than 64"),
        (
            with_change(("pods",), [{"name": f"p{i}"} for i in range(1001)]),
            "1001 exceeds max_array_len(1000)",
        ),
        (with_change(("gpus",), [{}] * 65), "gpus holds 65 entries, more than 64"),
        (with_change(("pods",), {"a": 1}), "pods must be a list"),
        (with_change(("pods", 0), "trainer-0"), "pods[] must be a map"),
        (with_change(("pods", 0, "name"), DELETE), "pods[].name must be a non-empty"),
        (with_change(("pods", 0, "gpu_ms"), 1.0), "unknown pod fields ['gpu_ms']"),
        (with_change(("pods", 0, "cpu_ms_per_s"), None), "cpu_ms_per_s must be a number"),
        (with_change(("gpus", 0, "uuid"), DELETE), "gpu entry lacks 'uuid'"),
        (with_change(("gpus", 0, "index"), "first"), "missing or has a bad field"),
        (with_change(("gpus", 0, "process_count"), float("inf")), "missing or has a bad field"),
        (with_change(("disabled_probes",), ["reclaim"]), "disabled_probes must be a map"),
    ],
)
def test_malformed_or_unknown_version_reports_raise_payload_error(
    payload: bytes, message: str
) -> None:
    with pytest.raises(PayloadError) as caught:
        codec.decode_report(payload)
    assert message in str(caught.value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_only_ever_raise_payload_error(payload: bytes) -> None:
    try:
        report = codec.decode_report(payload)
    except PayloadError:
        return
    assert report.v == SCHEMA_VERSION  # the rare random input that is a valid report


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
_field_names = st.sampled_from(
    ["node", "ts", "interval_s", "metrics", "histograms", "pods", "gpus", "disabled_probes"]
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_field_names, _values, max_size=8), st.data())
def test_current_version_maps_with_random_fields_only_raise_payload_error(
    fields: dict[str, Any], data: st.DataObject
) -> None:
    body = valid_body()
    body.update(fields)
    # Also corrupt one field inside a nested entry now and then.
    if data.draw(st.booleans()) and body.get("pods"):
        pods = body["pods"]
        if isinstance(pods, list) and pods and isinstance(pods[0], dict) and pods[0]:
            pods[0][data.draw(st.sampled_from(list(pods[0])))] = data.draw(_values)
    with contextlib.suppress(PayloadError):  # a valid report is fine too
        codec.decode_report(packed(body))


def test_node_hash_is_readable_and_round_trips() -> None:
    fields = codec.node_hash(REPORT)
    assert fields["interference_index"] == "41.5"
    assert "score" not in fields  # the index has one name
    assert fields["v"] == str(SCHEMA_VERSION)
    assert fields["measured"] == "psi,runq"
    assert fields["10s.index_stddev"] == "12.5"
    assert fields["10s.intervals"] == "10"
    assert fields["runq_p99_us"] == "900"
    assert fields["bpf_lost_entries"] == "7"
    assert fields["updated_at"] == "1700000000.25"
    assert fields["pods"] == "2"
    assert fields["gpus"] == "1"
    assert fields["disabled_probes"] == "reclaim"
    assert codec.parse_histogram_field(fields["hist_runq_us"]) == hist.normalize([0, 3, 5, 1])
    as_bytes = {k.encode(): v.encode() for k, v in fields.items()}
    assert codec.parse_node_hash(as_bytes) == (REPORT.metrics, REPORT.ts)
    parsed = codec.parse_node_signals(as_bytes)
    assert parsed.measured == REPORT.measured
    assert parsed.windows == REPORT.windows
    assert parsed.interval_s == 1.0


@pytest.mark.parametrize(
    ("case", "lost_entries", "published"),
    [("no losses", 0.0, "0"), ("losses", 12.0, "12"), ("absent (older agent)", None, None)],
)
def test_bpf_lost_entries_travels_in_the_stream_and_the_hash(
    case: str, lost_entries: float | None, published: str | None
) -> None:
    """``bpf_lost_entries`` round-trips; a report or hash without it (an older agent)
    reads 0, and its ``measured`` list still decides degraded (interference.freshness)."""
    body = valid_body()
    if lost_entries is None:
        del body["metrics"]["bpf_lost_entries"]
    else:
        body["metrics"]["bpf_lost_entries"] = lost_entries
    report = codec.decode_report(packed(body))
    assert report.metrics.bpf_lost_entries == (lost_entries or 0.0), case
    fields = codec.node_hash(report)
    assert fields["bpf_lost_entries"] == (published or "0"), case
    if lost_entries is None:
        del fields["bpf_lost_entries"]
    parsed = codec.parse_node_signals(fields)
    assert parsed.metrics.bpf_lost_entries == (lost_entries or 0.0), case


@pytest.mark.parametrize(
    ("case", "fields", "measured"),
    [
        ("nothing measured", {"measured": ""}, ()),
        ("run queue", {"measured": "runq"}, ("runq",)),
        ("two families", {"measured": "runq,psi"}, ("psi", "runq")),
        ("no measured field: nothing measured (degraded)", {"hist_runq_us": "0,3,1"}, ()),
    ],
)
def test_node_hash_measured_families(
    case: str, fields: dict[str, str], measured: tuple[str, ...]
) -> None:
    raw = {"interference_index": "12", "updated_at": "5", **fields}
    parsed = codec.parse_node_signals(raw)
    assert parsed.measured == measured, case
    assert parsed.metrics.interference_index == 12.0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "node hash is empty"),
        ({"interference_index": "1"}, "lacks field 'updated_at'"),
        ({"interference_index": "high", "updated_at": "1"}, "index must be a number"),
        ({"interference_index": "nan", "updated_at": "1"}, "index must be finite"),
        ({"updated_at": "1", "measured": "runq,gpu"}, "unknown signal family 'gpu'"),
        ({"updated_at": "1", "10s.index_mean": "x"}, "10s.index_mean must be a number"),
        ({"updated_at": "1", "10s.index_mean": "3"}, "window lacks span_s"),
        ({b"interference_index": b"\xff", b"updated_at": b"1"}, "non-UTF-8"),
    ],
)
def test_bad_node_hashes_raise_payload_error(raw: dict[Any, Any], message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        codec.parse_node_hash(raw)


def test_pod_hash_round_trips() -> None:
    pod = REPORT.pods[0]
    fields = codec.pod_hash(pod, "gpu-node-1", 5.0)
    assert fields["runq_wait_ms_per_s"] == "120.5"
    assert fields["hist_runq_us"] == "0,0,4,7,1"
    assert codec.parse_pod_hash(fields) == (pod, "gpu-node-1", 5.0)


@pytest.mark.parametrize("counts", [[-1], [1.5], ["3"], [True]])
def test_pod_histograms_hold_only_counts(counts: list[Any]) -> None:
    body = asdict(REPORT)
    body["pods"][0]["runq_us"] = counts
    with pytest.raises(PayloadError, match="runq_us"):
        codec.decode_report(msgpack.packb(body, use_bin_type=True))


@pytest.mark.parametrize(
    "raw",
    [
        {"name": "p", "node": "n", "updated_at": "1"},
        {"namespace": "ns", "name": "p", "updated_at": "1"},
        {"namespace": "ns", "name": "p", "node": "n", "updated_at": "soon"},
        {"namespace": "ns", "name": "p", "node": "n", "updated_at": "1", "cpu_ms_per_s": "x"},
    ],
)
def test_bad_pod_hashes_raise_payload_error(raw: dict[str, str]) -> None:
    with pytest.raises(PayloadError):
        codec.parse_pod_hash(raw)


def test_gpu_hash_round_trips_and_empty_inventory_counts_zero() -> None:
    assert codec.parse_gpu_hash(codec.gpu_hash(REPORT.gpus)) == REPORT.gpus
    assert codec.gpu_hash([]) == {"count": "0"}
    assert codec.parse_gpu_hash({}) == []


@pytest.mark.parametrize(
    "raw",
    [
        {"count": "many"},
        {"count": "1"},
        {"count": "1", "0.uuid": "u", "0.model": "m", "0.memory_total_mib": "x"},
    ],
)
def test_bad_gpu_hashes_raise_payload_error(raw: dict[str, str]) -> None:
    with pytest.raises(PayloadError):
        codec.parse_gpu_hash(raw)


@pytest.mark.parametrize("value", ["1,x,3", "1.5", "a"])
def test_bad_histogram_fields_raise_payload_error(value: str) -> None:
    with pytest.raises(PayloadError):
        codec.parse_histogram_field(value)
