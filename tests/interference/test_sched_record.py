"""The scheduling record (interference.sched_record): layout, round trips, refusals."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest

from interference import sched_record
from interference.codec import PayloadError
from interference.signals import (
    SIGNAL_FAMILIES,
    GpuDevice,
    NodeMetrics,
    NodeReport,
    WindowMetrics,
)

METRICS = NodeMetrics(
    runq_p99_us=1500.0,
    runq_wait_ratio=0.25,
    reclaim_stall_ms_per_s=3.5,
    throttled_ms_per_s=12.0,
    psi_cpu_some=7.5,
    psi_mem_some=1.25,
    psi_mem_some_avg10=3.75,
    net_drops_per_s=4.0,
    interference_index=42.0,
)


def window(span_s: float, scale: float) -> WindowMetrics:
    """A window whose every mean/σ differs from the others' (scale per window)."""
    return WindowMetrics(
        span_s=span_s,
        covered_s=span_s - 1,
        intervals=int(span_s) - 1,
        runq_p99_us=2000.0 * scale,
        runq_wait_ratio_mean=0.1 * scale,
        runq_wait_ratio_max=0.9,
        runq_wait_ratio_stddev=0.05 * scale,
        reclaim_stall_ms_per_s_mean=1.0 * scale,
        reclaim_stall_ms_per_s_stddev=0.5 * scale,
        throttled_ms_per_s_mean=11.0 * scale,
        throttled_ms_per_s_stddev=2.0 * scale,
        psi_cpu_some_mean=6.0 * scale,
        psi_cpu_some_stddev=1.5 * scale,
        psi_mem_some_mean=0.75 * scale,
        psi_mem_some_stddev=0.25 * scale,
        net_drops_per_s_mean=3.0 * scale,
        net_drops_per_s_stddev=1.0 * scale,
        index_mean=40.0,
    )


GPU_A = GpuDevice(0, "GPU-a", "NVIDIA H100 80GB HBM3", 81559.0, 1000.0, 30.0, 1)
GPU_B = GpuDevice(1, "GPU-b", "NVIDIA H100 80GB HBM3", 40960.0, 500.0, 50.0, 0)

BASE = NodeReport(
    node="gpu-node-1",
    ts=1_700_000_000.5,
    interval_s=1.0,
    metrics=METRICS,
    histograms={"runq_us": [0, 3, 1]},
    measured=("psi", "reclaim", "runq"),
    windows={"10s": window(10, 1.0), "60s": window(60, 2.0)},
)


def expected_fields(report: NodeReport) -> dict[str, float | int]:
    """What a record of ``report`` must decode to, spelled out field by field."""
    gpus = report.gpus
    out: dict[str, float | int] = {
        "version": sched_record.VERSION,
        "measured": sched_record.measured_mask(report.measured),
        "gpu_count": len(gpus),
        "reserved": 0,
        "node_id": sched_record.node_id(report.node),
        "ts": report.ts,
        "interval_s": report.interval_s,
        "gpu_memory_min_mib": min((g.memory_total_mib for g in gpus), default=0.0),
        "gpu_memory_used_mib": sum(g.memory_used_mib for g in gpus),
        "gpu_utilization_pct": sum(g.utilization_pct for g in gpus) / len(gpus) if gpus else 0.0,
        "psi_mem_some_avg10": report.metrics.psi_mem_some_avg10,
        "latest.covered_s": report.interval_s,
        "latest.intervals": 1 if sum(report.histograms.get("runq_us", [])) else 0,
        "latest.runq_p99_us": report.metrics.runq_p99_us,
    }
    for signal in sched_record.MEAN_SIGNALS:
        out[f"latest.{signal}_mean"] = getattr(report.metrics, signal)
        out[f"latest.{signal}_stddev"] = 0.0
    for name in ("10s", "60s"):
        w = report.windows.get(name, WindowMetrics(span_s=0.0))
        out[f"{name}.covered_s"] = w.covered_s
        out[f"{name}.intervals"] = w.intervals
        out[f"{name}.runq_p99_us"] = w.runq_p99_us
        for signal in sched_record.MEAN_SIGNALS:
            out[f"{name}.{signal}_mean"] = getattr(w, f"{signal}_mean")
            out[f"{name}.{signal}_stddev"] = getattr(w, f"{signal}_stddev")
    return out


@pytest.mark.parametrize(
    ("case", "report"),
    [
        ("signals and both windows", BASE),
        ("one GPU", replace(BASE, gpus=[GPU_A])),
        ("two GPUs: smallest memory, summed use, mean utilisation",
         replace(BASE, gpus=[GPU_A, GPU_B])),
        ("warming up: no windows yet", replace(BASE, windows={})),
        ("only the 10 s window", replace(BASE, windows={"10s": window(10, 1.0)})),
        ("no run-queue wake-up in the interval", replace(BASE, histograms={"runq_us": [0, 0]})),
        ("no histogram at all", replace(BASE, histograms={})),
        ("nothing measured", replace(BASE, measured=())),
        ("every family measured", replace(BASE, measured=SIGNAL_FAMILIES)),
        ("a long interval, another node",
         replace(BASE, node="ip-10-0-0-1.ec2.internal", interval_s=60.0)),
        ("all zero", NodeReport(node="n", ts=0.0, interval_s=0.1, metrics=NodeMetrics())),
    ],
)  # fmt: skip
def test_encode_decode_round_trips_every_field(case: str, report: NodeReport) -> None:
    payload = sched_record.encode(report)
    assert len(payload) == sched_record.SIZE, case
    decoded = sched_record.decode(payload)
    assert list(decoded) == [name for name, _ in sched_record.FIELDS], case
    assert decoded == pytest.approx(expected_fields(report)), case


def test_layout_is_fixed_little_endian_and_packed() -> None:
    codes = "".join(code for _, code in sched_record.FIELDS)
    assert struct.calcsize("<" + codes) == sched_record.SIZE
    names = [name for name, _ in sched_record.FIELDS]
    assert len(set(names)) == len(names)
    assert names[0] == "version"
    payload = sched_record.encode(BASE)
    assert int.from_bytes(payload[:2], "little") == sched_record.VERSION
    # Every window carries the same fields, in the same order.
    for window_name in sched_record.RECORD_WINDOWS:
        assert [n.partition(".")[2] for n in names if n.startswith(f"{window_name}.")] == [
            n for n, _ in sched_record.WINDOW_FIELDS
        ]


@pytest.mark.parametrize("size", [0, 1, sched_record.SIZE - 1, sched_record.SIZE + 1, 4096])
def test_decode_refuses_a_payload_of_another_size(size: int) -> None:
    payload = (sched_record.encode(BASE) * 10)[:size]
    with pytest.raises(PayloadError, match=f"{sched_record.SIZE} bytes, got {size}"):
        sched_record.decode(payload)


@pytest.mark.parametrize("version", [0, sched_record.VERSION + 1, 0xFFFF])
def test_decode_refuses_another_version(version: int) -> None:
    payload = version.to_bytes(2, "little") + sched_record.encode(BASE)[2:]
    with pytest.raises(PayloadError, match=f"version {version} is not"):
        sched_record.decode(payload)


def test_record_error_is_a_value_error() -> None:
    assert issubclass(PayloadError, ValueError)


@pytest.mark.parametrize(
    ("families", "mask"),
    [
        ((), 0),
        (("runq",), 0b1),
        (("reclaim",), 0b10),
        (("runq", "psi"), 0b1001),
        (("memory_events",), 0b100000),
        (SIGNAL_FAMILIES, 0b111111),
        (("runq", "no-such-family"), 0b1),  # an unknown name has no bit
        (["net", "throttle"], 0b10100),  # a list works as a tuple
    ],
)
def test_measured_mask(families: tuple[str, ...], mask: int) -> None:
    assert sched_record.measured_mask(families) == mask
    assert sched_record.families_of(mask) == tuple(f for f in SIGNAL_FAMILIES if f in families)


@pytest.mark.parametrize(
    ("mask", "families"),
    [
        (0, ()),
        (0b111111, SIGNAL_FAMILIES),
        (0b1000000, ()),  # bits beyond the known families are ignored
        (0xFFFF, SIGNAL_FAMILIES),
    ],
)
def test_families_of_ignores_unknown_bits(mask: int, families: tuple[str, ...]) -> None:
    assert sched_record.families_of(mask) == families


def test_measured_mask_is_in_the_record() -> None:
    report = replace(BASE, measured=("net", "runq"))
    decoded = sched_record.decode(sched_record.encode(report))
    assert sched_record.families_of(int(decoded["measured"])) == ("runq", "net")


@pytest.mark.parametrize(
    ("node", "other"), [("a", "b"), ("gpu-node-1", "gpu-node-2"), ("a.b", "a")]
)
def test_node_id_tells_nodes_apart_and_is_stable(node: str, other: str) -> None:
    assert sched_record.node_id(node) == sched_record.node_id(node)
    assert sched_record.node_id(node) != sched_record.node_id(other)
    assert 0 <= sched_record.node_id(node) < 2**64
