"""Prometheus metrics of the scheduler (served on ``/metrics``).

Every metric is registered on the registry passed in, so tests and several schedulers
in one process never collide on the global default registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

ATTEMPT_RESULTS = ("scheduled", "unschedulable", "dry_run", "error")
"""Values of the ``result`` label of ``interference_scheduler_attempts_total``."""

CONFIG_RELOAD_RESULTS = (
    "applied",
    "invalid",
    "confirmed",
    "rolled_back",
    "would_roll_back",
    "undecided",
)
"""Values of the ``result`` label of ``interference_scheduler_config_reloads_total``:
a valid file applied, an invalid one left unapplied (the last valid one serves), a
reload kept after its watch, rolled back by the Pending-rate guard, one it would have
rolled back in dry run, or a watch whose time ran out without the evidence to decide
(scheduler.entry.config_reload)."""

BIND_ERROR_REASONS = ("conflict", "error", "dropped")
"""``conflict``: 409/404, the pod is dropped; ``error``: other API error, requeued with
backoff; ``dropped``: not sent because this replica stopped leading, requeued."""


class SchedulerMetrics:
    """The scheduler's counters, gauges and histograms."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.attempts = Counter(
            "interference_scheduler_attempts",
            "Scheduling attempts by result.",
            ["result"],
            registry=registry,
        )
        self.attempt_duration = Histogram(
            "interference_scheduler_attempt_duration_seconds",
            "Time from popping a pod to the cycle's verdict (filter + score + assume).",
            ["result"],
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0),
            registry=registry,
        )
        self.pending_pods = Gauge(
            "interference_scheduler_pending_pods",
            "Pods waiting in the scheduling queue, by queue state.",
            ["queue"],
            registry=registry,
        )
        self.preemptions = Counter(
            "interference_scheduler_preemptions",
            "Preemptions started (victims evicted for a pod nominated to their node), by"
            " rule: priority, or antagonists (the opt-in interference rule named a victim).",
            ["rule"],
            registry=registry,
        )
        self.binds = Counter(
            "interference_scheduler_binds",
            "Pods bound through the Binding subresource.",
            registry=registry,
        )
        self.bind_errors = Counter(
            "interference_scheduler_bind_errors",
            "Binds that did not happen, by reason (conflict, error, dropped).",
            ["reason"],
            registry=registry,
        )
        self.signals_healthy = Gauge(
            "interference_scheduler_signals_healthy",
            "1 while the interference signal source can be read, else 0.",
            registry=registry,
        )
        self.interference_blind_attempts = Counter(
            "interference_scheduler_interference_blind_attempts",
            "Attempts made without interference signals because the source was unhealthy.",
            registry=registry,
        )
        self.stale_nodes = Gauge(
            "interference_scheduler_stale_nodes",
            "Nodes whose interference signals are missing or older than the stale limit.",
            registry=registry,
        )
        self.leader = Gauge(
            "interference_scheduler_leader",
            "1 while this replica holds the leader lease and may bind.",
            registry=registry,
        )
        self.relaxed = Counter(
            "interference_scheduler_interference_relaxed",
            "Pods scheduled with interference filters relaxed after waiting too long.",
            registry=registry,
        )
        self.malformed_objects = Counter(
            "interference_scheduler_malformed_objects",
            "Kubernetes objects skipped because they could not be parsed, by kind.",
            ["kind"],
            registry=registry,
        )
        self.side_effect_errors = Counter(
            "interference_scheduler_side_effect_errors",
            "Events, conditions or decision records that could not be written, by kind.",
            ["kind"],
            registry=registry,
        )
        self.config_reloads = Counter(
            "interference_scheduler_config_reloads",
            "Configuration file changes by result (applied, invalid, confirmed, rolled_back,"
            " would_roll_back, undecided).",
            ["result"],
            registry=registry,
        )
        self.config_rejected = Gauge(
            "interference_scheduler_config_rejected",
            "1 while the configuration file on disk is not what serves (invalid, or rolled"
            " back by the Pending-rate guard), else 0.",
            registry=registry,
        )
        self.reload_pending_rate = Gauge(
            "interference_scheduler_reload_pending_rate",
            "Share of the pods attempted in the guard's window left Pending, while a reload"
            " is watched (NaN otherwise).",
            registry=registry,
        )
        self.reload_pending_rate.set(float("nan"))
        for result in CONFIG_RELOAD_RESULTS:
            self.config_reloads.labels(result)
        for result in ATTEMPT_RESULTS:
            self.attempts.labels(result)
        for reason in BIND_ERROR_REASONS:
            self.bind_errors.labels(reason)
