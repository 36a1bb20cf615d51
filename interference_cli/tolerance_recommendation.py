"""The recommended ``interference.io/max-runq-p99-us`` of a workload (``interference
recommend-tolerance``; docs/operations.md, "Choosing a tolerance"), as the Vertical Pod
Autoscaler's recommender gives a target and bounds for requests. All functions are pure.

From two sets of samples over a period — the workload's own run-queue p99 (one per pod and
interval) and each node's run-queue p99 as the Interference filter reads it (its
``signal_window``) — :func:`recommend` computes::

    level[n]     = nearest_rank(node_p99s[n], node_quantile)   the value node n stays at or
                                                               under for that share of the period
    lower_bound  = max(min_n level[n], nearest_rank(workload_p99s, 0.5))
    target       = round_up_two_digits((1 + margin) · lower_bound)
    upper_bound  = max_n level[n]
    passing(T)   = |{n : level[n] ≤ T}| / |nodes|

Below ``lower_bound`` a tolerance is either met by no node for ``node_quantile`` of the
period (the quietest node's level) or is under what the workload's own pods measure in
half of their intervals (a node running them shows their waits too). At or above
``upper_bound`` every node passes: the tolerance filters nothing. The margin covers that
the next period is not this one: a window's p99 is a sample of a few thousand wake-ups
and moves from one window to the next (VPA adds 15 % to its target for the same reason).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_MARGIN = 0.15
"""Added to the lower bound: the next period's quantiles are not this period's."""
DEFAULT_NODE_QUANTILE = 0.9
"""A node's level is the run-queue p99 it stays at or under for this share of the period."""

_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
"""The letters Kubernetes makes generated names of (no vowels, no 0, 1 or 3), so the pods
of ``web-api`` are not taken for those of ``web``."""
_OWNED_SUFFIXES = (
    re.compile(f"{_SAFE}{{1,10}}-{_SAFE}{{5}}"),  # Deployment: ReplicaSet hash, pod suffix
    re.compile(f"{_SAFE}{{5}}"),  # ReplicaSet, DaemonSet, Job
    re.compile(r"[0-9]+"),  # StatefulSet ordinal
    re.compile(f"[0-9]+-{_SAFE}{{5}}"),  # CronJob: the Job's scheduled time, pod suffix
)


def owned_by(workload: str, pod: str) -> bool:
    """Whether ``pod`` is named as Kubernetes names the pods of ``workload``: the name
    itself (a bare pod), or ``WORKLOAD-`` followed by a Deployment's ``HASH-xxxxx``, a
    ReplicaSet's, DaemonSet's or Job's ``xxxxx``, a StatefulSet's ordinal or a CronJob's
    ``TIME-xxxxx``."""
    if pod == workload:
        return True
    prefix = f"{workload}-"
    if not pod.startswith(prefix):
        return False
    suffix = pod[len(prefix) :]
    return any(pattern.fullmatch(suffix) for pattern in _OWNED_SUFFIXES)


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0 < q ≤ 1) by nearest rank: the ``⌈q·N⌉``-th smallest of the
    ``N`` values (a value that was measured, never one between two)."""
    if not values:
        raise ValueError("no values")
    if not 0.0 < q <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {q}")
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])


def round_up_two_digits(value: float) -> int:
    """``value`` rounded up to two significant digits (7147 → 7200, 95.2 → 96), so the
    annotation reads as the estimate it is; at least 1."""
    if value <= 1:
        return 1
    step = 10 ** max(0, math.floor(math.log10(value)) - 1)
    return int(math.ceil(value / step - 1e-9) * step)


@dataclass(frozen=True, slots=True)
class NodeLevel:
    """One node's run-queue p99 over the period (µs)."""

    node: str
    samples: int
    p50_us: float
    level_us: float
    """At the node quantile: what the recommendation compares."""
    max_us: float


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A recommended tolerance and everything it was computed from."""

    target_us: int
    lower_bound_us: float
    upper_bound_us: float
    margin: float
    node_quantile: float
    bound_by: str
    """``"quietest node"`` or ``"workload"``: which of the two made the lower bound."""
    quietest_node: str
    workload_samples: int
    workload_p50_us: float
    workload_p90_us: float
    workload_max_us: float
    nodes: tuple[NodeLevel, ...]
    """Quietest first."""
    declared_us: float | None

    def passing(self, tolerance_us: float) -> int:
        """Nodes whose level is at or under ``tolerance_us``."""
        return sum(1 for node in self.nodes if node.level_us <= tolerance_us)


def recommend(
    workload_p99s: Sequence[float],
    node_p99s: Mapping[str, Sequence[float]],
    *,
    margin: float = DEFAULT_MARGIN,
    node_quantile: float = DEFAULT_NODE_QUANTILE,
    declared_us: float | None = None,
) -> Recommendation:
    """The recommended tolerance (the module docstring's formula); :class:`ValueError`
    when the workload or the nodes have no sample."""
    if not workload_p99s:
        raise ValueError("the workload has no run-queue p99 sample")
    measured = {node: values for node, values in node_p99s.items() if values}
    if not measured:
        raise ValueError("no node has a run-queue p99 sample")
    if margin < 0:
        raise ValueError(f"margin must be ≥ 0, got {margin}")
    nodes = sorted(
        (
            NodeLevel(
                node,
                len(values),
                nearest_rank(values, 0.5),
                nearest_rank(values, node_quantile),
                max(values),
            )
            for node, values in measured.items()
        ),
        key=lambda level: (level.level_us, level.node),
    )
    workload_p50 = nearest_rank(workload_p99s, 0.5)
    quietest = nodes[0]
    lower = max(quietest.level_us, workload_p50)
    return Recommendation(
        target_us=round_up_two_digits((1 + margin) * lower),
        lower_bound_us=lower,
        upper_bound_us=nodes[-1].level_us,
        margin=margin,
        node_quantile=node_quantile,
        bound_by="quietest node" if quietest.level_us >= workload_p50 else "workload",
        quietest_node=quietest.node,
        workload_samples=len(workload_p99s),
        workload_p50_us=workload_p50,
        workload_p90_us=nearest_rank(workload_p99s, 0.9),
        workload_max_us=max(workload_p99s),
        nodes=tuple(nodes),
        declared_us=declared_us,
    )
