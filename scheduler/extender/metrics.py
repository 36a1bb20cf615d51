"""Extender mode's Prometheus metrics: its requests, answers, refusals and what it did not
write (:class:`ExtenderMetrics`, next to :class:`~scheduler.endpoint.metrics.SchedulerMetrics`
on one registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from scheduler.endpoint.http import REFUSALS
from scheduler.extender.bounds import TOO_COMPLEX
from scheduler.extender.decision_records import RECORD_CONFIRM_S
from scheduler.extender.pod_warnings import WAIT_FOR_INFORMER_S, WAITING_PODS
from scheduler.extender.protocol import VERBS

DURATION_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
"""Request-duration buckets: kube-scheduler's default extender timeout is 5 s."""


class ExtenderMetrics:
    """Extender-mode metrics (next to
    :class:`~scheduler.endpoint.metrics.SchedulerMetrics` on one registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.request_duration = Histogram(
            "interference_scheduler_extender_request_duration_seconds",
            "Time to answer one extender request, by verb (filter, prioritize).",
            ["verb"],
            buckets=DURATION_BUCKETS_S,
            registry=registry,
        )
        self.requests = Counter(
            "interference_scheduler_extender_requests",
            "Extender requests by verb and result (ok, error: the answer carried an error"
            " or was not 200).",
            ["verb", "result"],
            registry=registry,
        )
        self.filtered_nodes = Counter(
            "interference_scheduler_extender_filtered_nodes",
            "Nodes the filter verb answered about, by outcome (passed, failed).",
            ["outcome"],
            registry=registry,
        )
        self.relaxed = Counter(
            "interference_scheduler_extender_interference_relaxed",
            "Filter answers given with interference filters relaxed after the pod waited"
            " relax_after_s.",
            registry=registry,
        )
        self.refused = Counter(
            "interference_scheduler_extender_refused",
            "Connections or requests the extender's HTTPS port refused, by reason (busy: 503"
            " after waiting for a thread; queue_full: closed; too_large: 413; tls_handshake:"
            " no or an untrusted client certificate; too_complex: a pod or node list over"
            " the extender's bounds, answered an error before any scheduling work).",
            ["reason"],
            registry=registry,
        )
        self.unknown_pod_records = Counter(
            "interference_scheduler_extender_unknown_pod_records",
            "Decision records not written because the informers did not know the pod"
            f" (pending here, same namespace, name and UID) within {RECORD_CONFIRM_S:g} s of"
            " the request.",
            registry=registry,
        )
        self.unwritten_pod_warnings = Counter(
            "interference_scheduler_extender_unwritten_pod_warnings",
            "Pods whose warning Events (UnknownAnnotation, InvalidAnnotation) were not"
            f" written: more than {WAITING_PODS} waited, or the informers did not know the pod"
            f" within {WAIT_FOR_INFORMER_S:g} s.",
            registry=registry,
        )
        for reason in (*REFUSALS, TOO_COMPLEX):
            self.refused.labels(reason)
        for verb in VERBS:
            self.request_duration.labels(verb)
            for result in ("ok", "error"):
                self.requests.labels(verb, result)
        for outcome in ("passed", "failed"):
            self.filtered_nodes.labels(outcome)
