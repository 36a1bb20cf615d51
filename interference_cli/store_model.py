"""What the CLI's reads of the store return, and the parse of the hashes they read.

:class:`NodeRow` (``interference top``), :class:`NodeDetail` with a :class:`PodRow` per
pod (``interference node``) and :class:`PodRecords` (``interference explain``), and the
functions that make them from a node's or a pod's hash, raising :class:`CliError` for
a malformed one. No I/O: :class:`interference_cli.store.Store` reads the keys; the views
and the JSON output render these without importing the Redis client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from interference import freshness, keys
from interference.codec import (
    PayloadError,
    decoded_hash,
    parse_histogram_field,
    parse_node_signals,
    parse_pod_hash,
)
from interference.decision import Decision
from interference.signals import NodeMetrics, PodMetrics, WindowMetrics
from interference_cli.errors import CliError


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node as ``interference top`` shows it."""

    node: str
    metrics: NodeMetrics | None
    """None when the node's hash has expired (its agent stopped reporting)."""
    updated_at: float
    """Unix time of the node's latest report (0 when unknown)."""
    interval_s: float
    pod_count: int
    state: str
    """``ok``, ``stale`` (no report within the freshness window, or its hash expired) or
    ``degraded`` (fresh, but a core signal family was not measured: the scheduler treats
    it as stale), from :func:`interference.freshness.node_state`."""
    measured: tuple[str, ...] = ()
    """Signal families the latest report measured."""
    scheduler_index: float | None = None
    """The interference index the scheduler computed from the node's signals (its
    ranking ``intf:nodes``); None when the scheduler does not rank the node."""

    @property
    def stale(self) -> bool:
        """The scheduler does not act on this node's signals (stale or degraded)."""
        return self.state != "ok"

    def age_s(self, now: float) -> float:
        """Seconds since the node's latest report."""
        return max(0.0, now - self.updated_at) if self.updated_at else float("inf")


@dataclass(frozen=True, slots=True)
class PodRow:
    """One pod's metrics on a node."""

    metrics: PodMetrics
    updated_at: float


@dataclass(frozen=True, slots=True)
class NodeDetail:
    """Everything ``interference node NODE`` shows."""

    row: NodeRow
    histograms: dict[str, list[int]] = field(default_factory=dict)
    pods: list[PodRow] = field(default_factory=list)
    disabled_probes: str = ""
    windows: dict[str, WindowMetrics] = field(default_factory=dict)
    """The latest report's windowed signals (``10s``, ``60s``)."""


@dataclass(frozen=True, slots=True)
class PodRecords:
    """What ``interference explain`` shows of one pod: why it was placed where it is, and
    what the rebalancer last concluded about it; each kept 24 h, so either may be gone."""

    placement: Decision | None
    """Its placement record (``intf:decision:{ns}/{pod}``)."""
    rebalancing: Decision | None
    """Its rebalancing record (``intf:rebalance:decision:{ns}/{pod}``): the rebalancer's
    latest look, written only when it found a better node for a pod over its tolerance."""


def parse_pod_row(raw: dict[bytes, bytes], what: str) -> PodRow:
    """A pod's hash as its row; :class:`CliError` naming ``what`` when it is malformed."""
    try:
        metrics, _, updated_at = parse_pod_hash(raw)
    except PayloadError as exc:
        raise CliError(f"the hash of {what} is malformed: {exc}") from exc
    return PodRow(metrics=metrics, updated_at=updated_at)


def parse_node_row(
    node: str,
    raw: dict[bytes, bytes],
    updated_at: float,
    now: float,
    scheduler_index: float | None = None,
) -> NodeRow:
    """A node's hash as its row (``stale`` when the hash has expired); :class:`CliError`
    when it is malformed."""
    if not raw:
        return NodeRow(
            node, None, updated_at, 0.0, 0, state="stale", scheduler_index=scheduler_index
        )
    try:
        parsed = parse_node_signals(raw)
        interval_s = parsed.interval_s if parsed.interval_s is not None else 1.0
        pod_count = int(decoded_hash(raw).get("pods", "0"))
    except (PayloadError, ValueError) as exc:
        raise CliError(f"node hash {keys.node_key(node)} is malformed: {exc}") from exc
    state = freshness.node_state(parsed.updated_at, interval_s, parsed.measured, now)
    return NodeRow(
        node,
        parsed.metrics,
        parsed.updated_at,
        interval_s,
        pod_count,
        state=state,
        measured=parsed.measured,
        scheduler_index=scheduler_index,
    )


def split_pod_member(member: str) -> tuple[str, str]:
    """A member of a node's pod set as ``(namespace, name)``; the system bucket and
    UID-only pods are listed without a namespace (PodMetrics.key)."""
    namespace, sep, name = member.partition("/")
    return (namespace, name) if sep else ("", member)


def node_histograms(node: str, data: dict[str, str]) -> dict[str, list[int]]:
    """The histograms of a node's decoded hash by name (``hist_`` left off);
    :class:`CliError` naming the field that is malformed."""
    return {
        name.removeprefix("hist_"): _histogram(node, name, value)
        for name, value in sorted(data.items())
        if name.startswith("hist_")
    }


def _histogram(node: str, name: str, value: str) -> list[int]:
    try:
        return parse_histogram_field(value)
    except PayloadError as exc:
        raise CliError(f"field {name} of node {node!r} is malformed: {exc}") from exc


def node_windows(node: str, raw: dict[bytes, bytes]) -> dict[str, WindowMetrics]:
    """The latest report's windowed signals of a node's hash; :class:`CliError` when it is
    malformed."""
    try:
        return parse_node_signals(raw).windows
    except PayloadError as exc:
        raise CliError(f"node hash {keys.node_key(node)} is malformed: {exc}") from exc


def rank_index(row: NodeRow) -> float:
    """The index a row is ranked by: the scheduler's when it ranks the node, else the
    agent's own."""
    if row.scheduler_index is not None:
        return row.scheduler_index
    return row.metrics.interference_index if row.metrics else 0.0
