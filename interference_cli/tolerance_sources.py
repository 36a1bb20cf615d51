"""Where ``interference recommend-tolerance`` reads its samples from: a recorded trace,
the agents' report streams in Redis, or Prometheus (the agents' ``/metrics`` scraped).

Each gives the same :class:`Samples`: the workload's pods' run-queue p99 per interval
(the pod rows of the reports; from Prometheus ``interference_pod_runq_p99_seconds``
with ``window="latest"``) and each node's run-queue p99 as the Interference filter reads
it (the ``signal_window``: ``10s``, ``60s`` or ``latest``; from Prometheus
``interference_node_runq_p99_seconds`` with that ``window``). Reports whose run-queue
family was not measured (degraded) are left out: the filter does not judge them either.
Pods are matched to the workload by name (:func:`owned_by`): neither the reports nor the
metrics carry a pod's labels or owner.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from interference import keys
from interference.codec import PayloadError, decode_report
from interference.signals import NodeReport
from interference_cli.errors import CliError
from interference_cli.store import Store
from interference_cli.tolerance_recommendation import owned_by
from node_agent.signal_metrics import LATEST, NODE_RUNQ_P99, POD_RUNQ_P99, POD_TOLERANCE_RUNQ_P99

PROMETHEUS_TIMEOUT_S = 30.0
MAX_PROMETHEUS_BYTES = 32 << 20
"""A query_range answer longer than this is refused, not read: a shorter --period (or a
Prometheus nearer the agents) answers within it."""
MAX_POINTS = 1000
"""Points per series a query_range asks for (Prometheus refuses more than 11,000)."""
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_PERIOD = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass
class Samples:
    """What a source measured for one workload over its period."""

    source: str
    window: str
    """The node series' window (the Interference filter's ``signal_window``)."""
    workload_p99s: list[float] = field(default_factory=list)
    """µs, one per pod and interval with a wait."""
    pods: set[str] = field(default_factory=set)
    node_p99s: dict[str, list[float]] = field(default_factory=dict)
    """µs, per node."""
    covered_s: float = 0.0
    """From the first sample to the last."""
    declared_us: float | None = None
    """The tolerance the workload's pods declare (Prometheus only: the tolerance metric)."""
    skipped: int = 0
    """Report stream entries that did not decode."""
    without_window: int = 0
    """Node samples taken from the latest interval: reports that lack ``window`` (as the
    filter reads them)."""


def parse_period(value: str) -> float:
    """``24h``, ``30m``, ``90s``, ``7d`` or plain seconds → seconds (> 0); ValueError."""
    found = _PERIOD.fullmatch(value.strip())
    seconds = float(found.group(1)) * _UNIT_S[found.group(2)] if found else 0.0
    if seconds <= 0:
        raise ValueError(f"{value!r} is not a period (e.g. 24h, 30m, 90s, 7d)")
    return seconds


def check_workload(namespace: str, workload: str) -> None:
    """:class:`CliError` unless both are Kubernetes names (they go into queries)."""
    for what, name in (("namespace", namespace), ("workload", workload)):
        if not _NAME.fullmatch(name):
            raise CliError(f"{what} {name!r} is not a Kubernetes name (lower case, digits, -, .)")


def from_reports(
    reports: Iterable[NodeReport], namespace: str, workload: str, window: str, source: str
) -> Samples:
    """The samples of ``reports`` (a trace, or what the streams hold)."""
    samples = Samples(source, window)
    times: list[float] = []
    for report in reports:
        if "runq" not in report.measured:
            continue
        times.append(report.ts)
        windowed = report.windows.get(window)
        if windowed is None or windowed.intervals == 0:  # the latest interval's, as the table
            samples.without_window += 1
            node_p99 = report.metrics.runq_p99_us
        else:
            node_p99 = windowed.runq_p99_us
        samples.node_p99s.setdefault(report.node, []).append(node_p99)
        for pod in report.pods:
            if pod.namespace == namespace and owned_by(workload, pod.name) and pod.runq_p99_us > 0:
                samples.workload_p99s.append(pod.runq_p99_us)
                samples.pods.add(pod.name)
    samples.covered_s = max(times) - min(times) if times else 0.0
    return samples


def from_redis(store: Store, namespace: str, workload: str, window: str) -> Samples:
    """The samples of every report the nodes' streams hold (their last
    ``NODE_REPORTS_MAXLEN``); entries that do not decode are counted, not used."""
    streams = store.report_streams()
    entries = store.streams_after(dict.fromkeys(streams.values(), "0-0"))
    reports: list[NodeReport] = []
    skipped = 0
    for _, _, payload in entries:
        try:
            reports.append(decode_report(payload))
        except PayloadError:
            skipped += 1
    source = f"the report streams in Redis at {store.where} (the last {keys.NODE_REPORTS_MAXLEN}"
    samples = from_reports(reports, namespace, workload, window, source + " per node)")
    samples.skipped = skipped
    return samples


def from_prometheus(
    url: str, namespace: str, workload: str, window: str, period_s: float, now: float | None = None
) -> Samples:
    """The samples of ``query_range`` over the ``period_s`` before ``now``."""
    address = urllib.parse.urlsplit(url)
    if address.scheme not in ("http", "https") or not address.netloc:
        raise CliError(f"--prometheus {url!r}: give Prometheus' URL, http://HOST:9090")
    end = time.time() if now is None else now
    query = _RangeQuery(url.rstrip("/"), end - period_s, end, max(1.0, period_s / MAX_POINTS))
    samples = Samples(f"Prometheus at {url}", window)
    times: list[float] = []
    for labels, points in query.series(f'{NODE_RUNQ_P99}{{window="{window}"}}'):
        node = labels.get("node", "")
        samples.node_p99s.setdefault(node, []).extend(v * 1e6 for _, v in points)
        times += [t for t, _ in points]
    selector = f'{{namespace="{namespace}",window="{LATEST}"}}'
    for labels, points in query.series(POD_RUNQ_P99 + selector):
        if owned_by(workload, labels.get("pod", "")):
            samples.workload_p99s += [v * 1e6 for _, v in points if v > 0]
            samples.pods.add(labels["pod"])
    declared: list[tuple[float, float]] = []
    for labels, points in query.series(f'{POD_TOLERANCE_RUNQ_P99}{{namespace="{namespace}"}}'):
        if owned_by(workload, labels.get("pod", "")) and points:
            declared.append(points[-1])
    if declared:
        samples.declared_us = max(declared)[1] * 1e6  # the newest pod's
    samples.covered_s = max(times) - min(times) if times else 0.0
    return samples


@dataclass(frozen=True)
class _RangeQuery:
    url: str
    start: float
    end: float
    step_s: float

    def series(self, promql: str) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """``(labels, [(t, value)])`` of each series of a matrix answer (finite values)."""
        params = urllib.parse.urlencode(
            {"query": promql, "start": self.start, "end": self.end, "step": self.step_s}
        )
        body = _get(f"{self.url}/api/v1/query_range?{params}", self.url)
        try:
            answer = json.loads(body)
            if answer.get("status") != "success":
                raise CliError(
                    f"Prometheus at {self.url} refused {promql}: {answer.get('error', answer)}"
                )
            result = answer["data"]["result"]
            return [
                (
                    {str(k): str(v) for k, v in _mapping(item["metric"]).items()},
                    [(float(t), float(v)) for t, v in item["values"] if math.isfinite(float(v))],
                )
                for item in result
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CliError(
                f"Prometheus at {self.url} gave an answer that is not a query_range matrix: {exc}"
            ) from exc


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise TypeError("labels are not an object")
    return value


def _get(address: str, shown: str) -> bytes:
    """The body of a GET, at most :data:`MAX_PROMETHEUS_BYTES`; CliError saying why not."""
    try:
        with urllib.request.urlopen(address, timeout=PROMETHEUS_TIMEOUT_S) as answer:
            body: bytes = answer.read(MAX_PROMETHEUS_BYTES + 1)
    except urllib.error.HTTPError as exc:
        detail = exc.read(4096).decode("utf-8", "replace")
        raise CliError(f"Prometheus at {shown} answered HTTP {exc.code}: {detail}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CliError(f"cannot reach Prometheus at {shown}: {reason}; check --prometheus") from exc
    if len(body) > MAX_PROMETHEUS_BYTES:
        raise CliError(
            f"Prometheus at {shown} answered more than {MAX_PROMETHEUS_BYTES:,} bytes; "
            "ask for a shorter --period"
        )
    return body
