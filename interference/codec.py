"""Versioned msgpack codec for NodeReports and the human-readable hash layout (docs/design.md §4).

Stream entries carry the whole report as msgpack; hashes carry decimal strings so a
person can read them with ``redis-cli HGETALL``. Every decoder raises
:class:`PayloadError` (and nothing else) for input it cannot trust.

Versions: a report carries its schema version (``v``); this release reads only its own,
:data:`~interference.signals.SCHEMA_VERSION`, and refuses any other with a
:class:`PayloadError` saying to run the same release of agent and scheduler. Each pod's
culprits are ``own_wait_ms_per_s``, ``neighbour_wait_ms_per_s`` and ``culprits`` (the pod
hash's ``culprits`` field is ``key=ms_per_s`` pairs, comma-separated). A node hash's
``measured`` field lists the signal families measured; a hash without it measured none
(degraded).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import msgpack

from interference import hist
from interference.signals import (
    SCHEMA_VERSION,
    SIGNAL_FAMILIES,
    TOP_CULPRITS,
    GpuDevice,
    NodeMetrics,
    NodeReport,
    PodMetrics,
    WindowMetrics,
)


class PayloadError(ValueError):
    """A payload (stream entry, hash, annotation value) is malformed or of an unknown version."""


_NODE_METRIC_FIELDS = tuple(f.name for f in fields(NodeMetrics))
POD_HISTOGRAM_FIELD = "runq_us"
POD_CULPRITS_FIELD = "culprits"
_POD_FLOAT_FIELDS = tuple(
    f.name
    for f in fields(PodMetrics)
    if f.name not in ("namespace", "name", "uid", "qos", POD_HISTOGRAM_FIELD, POD_CULPRITS_FIELD)
)
_GPU_FIELDS = tuple(f.name for f in fields(GpuDevice))
_WINDOW_FIELDS = tuple(f.name for f in fields(WindowMetrics))
MAX_PODS = 1_000
"""Most pod rows a report may carry (the kubelet runs at most a few hundred pods)."""
MAX_GPUS = 64
MAX_HISTOGRAM_SLOTS = 64
"""Most slots a histogram may carry (log2 µs: 64 covers any duration)."""
MAX_REPORT_BYTES = 1 << 20
"""Longest msgpack NodeReport a reader decodes (1 MiB). A report of 1,000 pods
(:data:`MAX_PODS`) is ~360 KB. Checked before decoding: msgpack builds one Python object
per byte at worst (an array of empty arrays), ~60 bytes each, so a payload's size bounds
the memory its decoding takes (a 15 MB entry took over 1 GiB)."""
UNPACK_LIMITS: dict[str, int] = {
    "max_str_len": MAX_REPORT_BYTES,
    "max_bin_len": 0,
    "max_ext_len": 0,
    "max_array_len": MAX_PODS,
    "max_map_len": 256,
}
"""``msgpack.unpackb`` limits of a NodeReport: no container longer than the pod rows, no
map wider than a few times the widest record (21 fields), no binary or extension data
(strings cost about their length, so only the payload's size bounds them, leaving room
for a long probe error); msgpack itself bounds nesting depth."""


@dataclass(frozen=True, slots=True)
class NodeHashSignals:
    """What an ``intf:node:*`` hash says about a node."""

    metrics: NodeMetrics
    updated_at: float
    interval_s: float | None
    """None when the hash does not carry it."""
    measured: tuple[str, ...]
    windows: dict[str, WindowMetrics] = field(default_factory=dict)


def encode_report(report: NodeReport) -> bytes:
    """msgpack bytes of a report, schema version included as ``v``."""
    body = asdict(report)
    body["v"] = SCHEMA_VERSION
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


class PayloadTooBig(PayloadError):
    """A payload over its size or length limits: refused before (or while) decoding."""


def decode_report(payload: bytes) -> NodeReport:
    """Inverse of :func:`encode_report`; :class:`PayloadError` on anything else,
    :class:`PayloadTooBig` for more than :data:`MAX_REPORT_BYTES` or a length over
    :data:`UNPACK_LIMITS`."""
    if isinstance(payload, bytes | bytearray) and len(payload) > MAX_REPORT_BYTES:
        raise PayloadTooBig(
            f"NodeReport of {len(payload)} bytes is over the limit of {MAX_REPORT_BYTES}"
        )
    try:
        body = msgpack.unpackb(
            payload, raw=False, strict_map_key=True, use_list=False, **UNPACK_LIMITS
        )
    except ValueError as exc:  # what msgpack raises for a length over a limit
        if "exceeds max" in str(exc):
            raise PayloadTooBig(f"NodeReport over a length limit: {exc}") from exc
        raise PayloadError(f"not a msgpack NodeReport: {exc}") from exc
    except Exception as exc:  # msgpack raises several unrelated types
        raise PayloadError(f"not a msgpack NodeReport: {exc}") from exc
    if not isinstance(body, dict):
        raise PayloadError(f"NodeReport must be a map, got {type(body).__name__}")
    version = body.get("v")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise PayloadError(
            f"NodeReport schema version {version!r} is not supported (this release reads "
            f"{SCHEMA_VERSION}); run the same release of agent and scheduler"
        )
    try:
        metrics = NodeMetrics(**_floats(_mapping(body["metrics"], "metrics"), _NODE_METRIC_FIELDS))
        histograms = {
            str(name): [
                _count(c, f"histograms.{name}")
                for c in _list(buckets, f"histograms.{name}", MAX_HISTOGRAM_SLOTS)
            ]
            for name, buckets in _mapping(body.get("histograms", {}), "histograms").items()
        }
        measured = _families(_list(body["measured"], "measured"))
        windows = {
            str(name): _window(_mapping(w, f"windows.{name}"))
            for name, w in _mapping(body.get("windows", {}), "windows").items()
        }
        pods = [_pod(_mapping(p, "pods[]")) for p in _list(body.get("pods", []), "pods", MAX_PODS)]
        gpus = [_gpu(_mapping(g, "gpus[]")) for g in _list(body.get("gpus", []), "gpus", MAX_GPUS)]
        disabled = {
            str(k): str(v)
            for k, v in _mapping(body.get("disabled_probes", {}), "disabled_probes").items()
        }
        return NodeReport(
            node=_str(body["node"], "node"),
            ts=_float(body["ts"], "ts"),
            interval_s=_float(body["interval_s"], "interval_s"),
            metrics=metrics,
            histograms=histograms,
            pods=pods,
            gpus=gpus,
            disabled_probes=disabled,
            measured=measured,
            windows=windows,
        )
    except PayloadError:
        raise
    except (KeyError, TypeError, ValueError, OverflowError) as exc:  # int(inf) overflows
        raise PayloadError(f"NodeReport is missing or has a bad field: {exc!r}") from exc


def node_hash(report: NodeReport) -> dict[str, str]:
    """Fields of ``intf:node:{node}``: every NodeMetrics field (the index is
    ``interference_index``), ``v``, ``measured``
    (comma-separated families), ``updated_at``, ``interval_s``, ``pods`` (count), ``gpus``
    (count), ``hist_*`` and one ``{window}.{field}`` per windowed signal
    (``60s.runq_p99_us``), as decimal strings."""
    out = {name: _fmt(getattr(report.metrics, name)) for name in _NODE_METRIC_FIELDS}
    out["v"] = str(SCHEMA_VERSION)
    out["measured"] = ",".join(sorted(report.measured))
    for window_name, window in report.windows.items():
        for name in _WINDOW_FIELDS:
            out[f"{window_name}.{name}"] = _fmt(getattr(window, name))
    out["updated_at"] = _fmt(report.ts)
    out["interval_s"] = _fmt(report.interval_s)
    out["pods"] = str(len(report.pods))
    out["gpus"] = str(len(report.gpus))
    for name, buckets in report.histograms.items():
        out[f"hist_{name}"] = ",".join(str(c) for c in hist.normalize(buckets))
    if report.disabled_probes:
        out["disabled_probes"] = ",".join(sorted(report.disabled_probes))
    return out


def parse_node_hash(raw: Mapping[Any, Any]) -> tuple[NodeMetrics, float]:
    """NodeMetrics and ``updated_at`` from an ``intf:node:*`` hash (bytes or str keys)."""
    signals = parse_node_signals(raw)
    return signals.metrics, signals.updated_at


def parse_node_signals(raw: Mapping[Any, Any]) -> NodeHashSignals:
    """Everything an ``intf:node:*`` hash holds about the node's signals."""
    data = decoded_hash(raw)
    if not data:
        raise PayloadError("node hash is empty")
    try:
        metrics = NodeMetrics(**{n: _float(data[n], n) for n in _NODE_METRIC_FIELDS if n in data})
        updated_at = _float(data["updated_at"], "updated_at")
    except KeyError as exc:
        raise PayloadError(f"node hash lacks field {exc.args[0]!r}") from exc
    interval = _float(data["interval_s"], "interval_s") if "interval_s" in data else None
    measured = _families([f for f in data.get("measured", "").split(",") if f])
    by_window: dict[str, dict[str, float]] = {}
    for key, value in data.items():
        window, dot, name = key.partition(".")
        if dot and name in _WINDOW_FIELDS:
            by_window.setdefault(window, {})[name] = _float(value, key)
    parsed = {name: _window(values) for name, values in by_window.items()}
    return NodeHashSignals(metrics, updated_at, interval, measured, parsed)


def parse_histogram_field(value: str) -> list[int]:
    """A ``hist_*`` hash field back into buckets."""
    try:
        return [int(x) for x in value.split(",") if x != ""]
    except ValueError as exc:
        raise PayloadError(f"bad histogram field {value[:40]!r}") from exc


def pod_hash(pod: PodMetrics, node: str, ts: float) -> dict[str, str]:
    """Fields of ``intf:node:{node}:pod:{ns}/{name}``: the pod's metrics, ``hist_runq_us`` (its
    run-queue histogram, comma-separated), ``culprits`` (``key=ms_per_s`` pairs,
    comma-separated), ``node`` and ``updated_at``."""
    out = {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid, "qos": pod.qos}
    out.update({n: _fmt(getattr(pod, n)) for n in _POD_FLOAT_FIELDS})
    out[f"hist_{POD_HISTOGRAM_FIELD}"] = ",".join(str(c) for c in pod.runq_us)
    out[POD_CULPRITS_FIELD] = ",".join(f"{key}={_fmt(ms)}" for key, ms in pod.culprits)
    out["node"] = node
    out["updated_at"] = _fmt(ts)
    return out


def parse_pod_hash(raw: Mapping[Any, Any]) -> tuple[PodMetrics, str, float]:
    """PodMetrics, node and ``updated_at`` from a pod hash (``intf:node:*:pod:*``)."""
    data = decoded_hash(raw)
    try:
        pod = PodMetrics(
            namespace=data["namespace"],
            name=data["name"],
            uid=data.get("uid", ""),
            qos=data.get("qos", ""),
            runq_us=tuple(parse_histogram_field(data.get(f"hist_{POD_HISTOGRAM_FIELD}", ""))),
            culprits=parse_culprits_field(data.get(POD_CULPRITS_FIELD, "")),
            **{n: _float(data[n], n) for n in _POD_FLOAT_FIELDS if n in data},
        )
        return pod, data["node"], _float(data["updated_at"], "updated_at")
    except KeyError as exc:
        raise PayloadError(f"pod hash lacks field {exc.args[0]!r}") from exc


def parse_culprits_field(value: str) -> tuple[tuple[str, float], ...]:
    """A pod hash's ``culprits`` field (``key=ms_per_s,…``) back into pairs."""
    pairs = []
    for item in (part for part in value.split(",") if part):
        key, equals, ms = item.rpartition("=")
        if not equals or not key:
            raise PayloadError(f"bad culprits field {value[:60]!r}: {item!r} is not key=ms_per_s")
        pairs.append((key, _non_negative(ms, "culprits")))
    if len(pairs) > TOP_CULPRITS:
        raise PayloadError(f"culprits holds {len(pairs)} entries, more than {TOP_CULPRITS}")
    return tuple(pairs)


def gpu_hash(gpus: list[GpuDevice]) -> dict[str, str]:
    """Fields of ``intf:node:{node}:gpu``: ``count`` and ``{index}.{field}`` per device."""
    out = {"count": str(len(gpus))}
    for gpu in gpus:
        for name in _GPU_FIELDS:
            if name != "index":
                out[f"{gpu.index}.{name}"] = _fmt(getattr(gpu, name))
    return out


def parse_gpu_hash(raw: Mapping[Any, Any]) -> list[GpuDevice]:
    """Inverse of :func:`gpu_hash`."""
    data = decoded_hash(raw)
    try:
        count = int(data.get("count", "0"))
        return [
            GpuDevice(
                index=i,
                uuid=data[f"{i}.uuid"],
                model=data[f"{i}.model"],
                memory_total_mib=_float(data[f"{i}.memory_total_mib"], "memory_total_mib"),
                memory_used_mib=_float(data[f"{i}.memory_used_mib"], "memory_used_mib"),
                utilization_pct=_float(data[f"{i}.utilization_pct"], "utilization_pct"),
                process_count=int(data[f"{i}.process_count"]),
            )
            for i in range(count)
        ]
    except (KeyError, ValueError) as exc:
        raise PayloadError(f"bad GPU hash: {exc!r}") from exc


def _fmt(value: float | int | str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.3f}".rstrip("0").rstrip(".")


def decoded_hash(raw: Mapping[Any, Any]) -> dict[str, str]:
    """A Redis hash reply (bytes or str) as str → str; PayloadError on non-UTF-8."""
    try:
        return {
            (k.decode() if isinstance(k, bytes) else str(k)): (
                v.decode() if isinstance(v, bytes) else str(v)
            )
            for k, v in raw.items()
        }
    except UnicodeDecodeError as exc:
        raise PayloadError(f"hash holds non-UTF-8 data: {exc}") from exc


def _float(value: Any, name: str) -> float:
    if isinstance(value, bool):
        raise PayloadError(f"{name} must be a number, got a boolean")
    try:
        out = float(value)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"{name} must be a number, got {value!r}") from exc
    if math.isnan(out) or math.isinf(out):
        raise PayloadError(f"{name} must be finite, got {value!r}")
    return out


def _non_negative(value: Any, name: str) -> float:
    out = _float(value, name)
    if out < 0:
        raise PayloadError(f"{name} must be ≥ 0, got {value!r}")
    return out


def _floats(data: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, float]:
    unknown = set(data) - set(names)
    if unknown:
        raise PayloadError(f"unknown fields {sorted(unknown)}")
    return {n: _float(data[n], n) for n in names if n in data}


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise PayloadError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise PayloadError(f"{name} must be a map, got {type(value).__name__}")
    return value


def _list(value: Any, name: str, limit: int | None = None) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise PayloadError(f"{name} must be a list, got {type(value).__name__}")
    if limit is not None and len(value) > limit:
        raise PayloadError(f"{name} holds {len(value)} entries, more than {limit}")
    return list(value)


def _families(names: list[Any]) -> tuple[str, ...]:
    out = set()
    for name in names:
        if not isinstance(name, str) or name not in SIGNAL_FAMILIES:
            raise PayloadError(
                f"measured: unknown signal family {name!r} (known: {', '.join(SIGNAL_FAMILIES)})"
            )
        out.add(name)
    return tuple(sorted(out))


def _window(data: Mapping[str, Any]) -> WindowMetrics:
    unknown = set(data) - set(_WINDOW_FIELDS)
    if unknown:
        raise PayloadError(f"unknown window fields {sorted(unknown)}")
    if "span_s" not in data:
        raise PayloadError("window lacks span_s")
    values = {n: _float(data[n], n) for n in _WINDOW_FIELDS if n in data}
    intervals = int(values.pop("intervals", 0))
    return WindowMetrics(intervals=intervals, **values)


def _pod(data: Mapping[str, Any]) -> PodMetrics:
    unknown = set(data) - {f.name for f in fields(PodMetrics)}
    if unknown:
        raise PayloadError(f"unknown pod fields {sorted(unknown)}")
    return PodMetrics(
        namespace=str(data.get("namespace", "")),
        name=_str(data.get("name"), "pods[].name"),
        uid=str(data.get("uid", "")),
        qos=str(data.get("qos", "")),
        runq_us=tuple(
            _count(c, f"pods[].{POD_HISTOGRAM_FIELD}")
            for c in _list(
                data.get(POD_HISTOGRAM_FIELD, []),
                f"pods[].{POD_HISTOGRAM_FIELD}",
                MAX_HISTOGRAM_SLOTS,
            )
        ),
        culprits=tuple(
            _culprit(_list(pair, "pods[].culprits[]"))
            for pair in _list(data.get(POD_CULPRITS_FIELD, []), "pods[].culprits", TOP_CULPRITS)
        ),
        **{n: _float(data[n], n) for n in _POD_FLOAT_FIELDS if n in data},
    )


def _culprit(pair: list[Any]) -> tuple[str, float]:
    if len(pair) != 2:
        raise PayloadError(f"pods[].culprits[] must be [key, ms_per_s], got {pair!r}")
    return _str(pair[0], "pods[].culprits[].key"), _non_negative(pair[1], "pods[].culprits[]")


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PayloadError(f"{name} must hold counts (integers ≥ 0), got {value!r}")
    return value


def _gpu(data: Mapping[str, Any]) -> GpuDevice:
    try:
        return GpuDevice(
            index=int(data["index"]),
            uuid=str(data["uuid"]),
            model=str(data["model"]),
            memory_total_mib=_float(data["memory_total_mib"], "memory_total_mib"),
            memory_used_mib=_float(data["memory_used_mib"], "memory_used_mib"),
            utilization_pct=_float(data["utilization_pct"], "utilization_pct"),
            process_count=int(data["process_count"]),
        )
    except KeyError as exc:
        raise PayloadError(f"gpu entry lacks {exc.args[0]!r}") from exc


def index_history(
    entries: Iterable[tuple[Any, Mapping[Any, Any]]],
    field_name: str,
    refused: Callable[[PayloadError], None] | None = None,
) -> list[tuple[float, float]]:
    """``(unix time, interference index)`` of each report in a node's report stream
    entries (``XRANGE``/``XREVRANGE`` replies, the report in ``field_name``), oldest first;
    entries that do not decode (:class:`PayloadTooBig` included) are left out, each passed
    to ``refused``."""
    history = []
    for _, entry in entries:
        payload = entry.get(field_name.encode(), entry.get(field_name))
        try:
            report = decode_report(payload)
        except PayloadError as exc:
            if refused is not None:
                refused(exc)
            continue
        except TypeError as exc:
            if refused is not None:
                refused(PayloadError(f"not a report: {exc}"))
            continue
        history.append((report.ts, report.metrics.interference_index))
    return sorted(history)
