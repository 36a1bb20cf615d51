"""The rebalancer's Prometheus metrics (:class:`RebalanceMetrics`, on the scheduler's
registry) and the results of its evictions they count by.

Both the look (:mod:`scheduler.rebalancing.rebalancer`: looks, holds, refused reports,
skewed agents, pods over their tolerance) and the move (:mod:`scheduler.rebalancing.mover`:
evictions by result) count here, so the two share one set of counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from scheduler.rebalancing.evictable import REFUSALS
from scheduler.rebalancing.evidence import REPORT_REFUSALS
from scheduler.rebalancing.rebalance import HOLD_REASONS

EVICTED = "evicted"
WOULD_EVICT = "would_evict"
BLOCKED = "eviction_blocked"
FAILED = "eviction_failed"
EVICTION_RESULTS = (EVICTED, WOULD_EVICT, BLOCKED, FAILED)
"""Values of the ``result`` label of ``interference_scheduler_rebalance_evictions_total``
(and, but ``eviction_failed``, of the rebalancing record's ``result``)."""


class RebalanceMetrics:
    """The rebalancer's metrics (on the scheduler's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.evictions = Counter(
            "interference_scheduler_rebalance_evictions",
            "Victims the rebalancer acted on, by result (evicted, would_evict in a dry run,"
            " eviction_blocked by a PodDisruptionBudget, eviction_failed).",
            ["result"],
            registry=registry,
        )
        self.holds = Counter(
            "interference_scheduler_rebalance_holds",
            "Victims kept where they are, by guard rail (own_limit, own_tasks, cooldown,"
            " move_budget, move_did_not_help, node_limit, namespace_limit, cluster_limit,"
            " no_better_node, retry_later); once per streak and reason.",
            ["reason"],
            registry=registry,
        )
        self.refused_reports = Counter(
            "interference_scheduler_rebalance_refused_reports",
            "Agents' reports whose rows the rebalancer left out, by reason (clock_ahead:"
            " dated beyond the clock skew; unmeasured: no run-queue family); each once.",
            ["reason"],
            registry=registry,
        )
        self.skewed_agents = Gauge(
            "interference_scheduler_rebalance_skewed_agents",
            "Nodes with a tolerant pod whose agent publishes with a clock off by more than"
            " its reports' freshness window (a Warning each time one becomes skewed).",
            registry=registry,
        )
        self.over_tolerance = Gauge(
            "interference_scheduler_rebalance_over_tolerance_pods",
            "Bound pods whose window breaks their interference tolerance at the latest look.",
            registry=registry,
        )
        self.looks = Counter(
            "interference_scheduler_rebalance_looks",
            "Looks the leader took at the pods with a tolerance (one per interval_s while"
            " the rebalancer is not off).",
            registry=registry,
        )
        for result in EVICTION_RESULTS:
            self.evictions.labels(result)
        for reason in (*HOLD_REASONS, *REFUSALS):
            self.holds.labels(reason)
        for reason in REPORT_REFUSALS:
            self.refused_reports.labels(reason)
