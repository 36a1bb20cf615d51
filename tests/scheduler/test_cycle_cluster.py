"""Acceptance 2: the cycle over an in-memory cluster, through the real scheduling loop.

Latency-sensitive pods avoid the noisy node; GPU pods pack; a burst does not all land on
the one quiet node; each stale policy behaves as documented; the relax-after-waiting
rule fires with an Event.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest

from scheduler.api.objects import ANNOTATION_MAX_INDEX, ANNOTATION_MAX_RUNQ_P99_US
from scheduler.plugins.interference import RUNQ_EXCEEDED, StalePolicy
from tests.builders import node_obj, pod_obj
from tests.scheduler.profiles import interference_settings
from tests.scheduler.runtime_helpers import LoopHarness

LATENCY_SENSITIVE = {ANNOTATION_MAX_RUNQ_P99_US: "500"}


def harness(**cycle: object) -> LoopHarness:
    return LoopHarness(cycle=interference_settings(**cycle))  # type: ignore[arg-type]


@pytest.fixture
def h() -> Iterator[LoopHarness]:
    harness_ = harness()
    yield harness_
    harness_.close()


def placements(h: LoopHarness) -> Counter[str]:
    return Counter(node for _, node in h.cluster.binds)


def test_latency_sensitive_pod_avoids_the_noisy_node(h: LoopHarness) -> None:
    # The noisy node is the emptiest and biggest, so without the tolerance it would win
    # on balance.
    h.cluster.add_node(node_obj("noisy", cpu="64", memory="256Gi"))
    h.cluster.add_node(node_obj("quiet-a", cpu="8", memory="32Gi"))
    h.cluster.add_node(node_obj("quiet-b", cpu="8", memory="32Gi"))
    h.cluster.add_pod(
        pod_obj("busy-a", requests={"cpu": "6", "memory": "128Mi"}, nodeName="quiet-a")
    )
    h.cluster.add_pod(
        pod_obj("busy-b", requests={"cpu": "6", "memory": "128Mi"}, nodeName="quiet-b")
    )
    reported = h.clock.now - 1
    h.signals.report("noisy", reported, runq_p99_us=5000, index=70)
    h.signals.report("quiet-a", reported, runq_p99_us=80, index=5)
    h.signals.report("quiet-b", reported, runq_p99_us=90, index=5)
    for i in range(6):
        h.cluster.add_pod(
            pod_obj(
                f"latency-{i}",
                requests={"cpu": "100m", "memory": "128Mi"},
                annotations=LATENCY_SENSITIVE,
                created_at=i,
            )
        )
    h.step()
    bound = {name: h.cluster.node_of("default", f"latency-{name}") for name in range(6)}
    assert None not in bound.values()
    assert "noisy" not in bound.values()
    record = h.decisions.last("latency-0")
    assert [c.node for c in record.candidates if c.passed]
    assert "noisy" not in {c.node for c in record.candidates if c.passed}
    (noisy,) = [c for c in record.candidates if c.node == "noisy"]
    assert [r.partition(" (measured ")[0] for r in noisy.reasons] == [RUNQ_EXCEEDED]
    assert "µs > tolerance" in noisy.reasons[0]
    assert record.rejected_by_reason == {RUNQ_EXCEEDED: 1}
    # A pod without a tolerance is free to use the big noisy node (score only).
    h.cluster.add_pod(pod_obj("batch", requests={"cpu": "4", "memory": "128Mi"}))
    h.step()
    assert h.cluster.node_of("default", "batch") == "noisy"


def test_gpu_pods_pack(h: LoopHarness) -> None:
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        h.cluster.add_node(
            node_obj(
                name,
                cpu="64",
                memory="512Gi",
                extra={"nvidia.com/gpu": "8"},
                labels={"nvidia.com/gpu.product": "H100"},
            )
        )
        h.signals.report(name, h.clock.now - 1, index=10)
    h.cluster.add_node(node_obj("cpu-only", cpu="64", memory="32Gi"))
    h.signals.report("cpu-only", h.clock.now - 1, index=10)
    for i in range(4):
        h.cluster.add_pod(
            pod_obj(
                f"train-{i}",
                requests={"cpu": "4", "memory": "128Mi", "nvidia.com/gpu": "2"},
                created_at=i,
            )
        )
    h.cluster.add_pod(pod_obj("web", requests={"cpu": "1", "memory": "128Mi"}, created_at=10))
    h.step()
    gpu_nodes = [h.cluster.node_of("default", f"train-{i}") for i in range(4)]
    assert len(set(gpu_nodes)) == 1, f"GPU pods spread out: {gpu_nodes}"
    assert gpu_nodes[0] != "cpu-only"
    assert h.cluster.node_of("default", "web") == "cpu-only"  # keeps GPU nodes free
    # The packed node is full now: a 2-GPU pod goes to a fresh one, an 8-GPU pod still fits.
    h.cluster.add_pod(
        pod_obj(
            "whole-node",
            requests={"cpu": "4", "memory": "128Mi", "nvidia.com/gpu": "8"},
            created_at=20,
        )
    )
    h.step()
    assert h.cluster.node_of("default", "whole-node") not in (None, gpu_nodes[0])


def test_burst_does_not_all_land_on_the_one_quiet_node(h: LoopHarness) -> None:
    reported = h.clock.now - 0.5
    h.cluster.add_node(node_obj("quiet", cpu="32", memory="128Gi"))
    h.signals.report("quiet", reported, index=0)
    for i in range(4):
        h.cluster.add_node(node_obj(f"busy-{i}", cpu="32", memory="128Gi"))
        h.signals.report(f"busy-{i}", reported, index=40)
    for i in range(20):
        h.cluster.add_pod(
            pod_obj(f"burst-{i}", requests={"cpu": "1", "memory": "128Mi"}, created_at=i)
        )
    assert h.step() == 20
    counts = placements(h)
    assert sum(counts.values()) == 20
    assert counts["quiet"] < 20, "the whole burst piled onto the quiet node"
    assert counts["quiet"] == max(counts.values()), "the quiet node should still get the most"
    assert len(counts) > 1
    assert h.loop.cache.table.recent_cpu_m.sum() == 20_000  # 20 pods × 1 CPU, in millicores
    # A newer report (that includes the burst's load) replaces the recent-load estimate.
    h.clock.advance(1.0)
    for node in counts:
        h.signals.report(node, h.clock.now, index=0 if node == "quiet" else 40)
    h.cluster.add_pod(
        pod_obj("after-report", requests={"cpu": "1", "memory": "128Mi"}, created_at=100)
    )
    h.step()
    assert h.loop.cache.table.recent_cpu_m.sum() == 0


def test_without_recent_load_the_burst_would_pile_up() -> None:
    """The control for the burst test: with recent load ignored, the quiet node gets all."""
    h = harness(recent_load_weight=0.0)
    try:
        h.cluster.add_node(node_obj("quiet", cpu="32", memory="128Gi"))
        h.signals.report("quiet", h.clock.now - 0.5, index=0)
        for i in range(4):
            h.cluster.add_node(node_obj(f"busy-{i}", cpu="32", memory="128Gi"))
            h.signals.report(f"busy-{i}", h.clock.now - 0.5, index=40)
        for i in range(20):
            h.cluster.add_pod(
                pod_obj(f"burst-{i}", requests={"cpu": "1", "memory": "128Mi"}, created_at=i)
            )
        h.step()
        assert placements(h) == Counter({"quiet": 20})
    finally:
        h.close()


def stale_cluster(policy: StalePolicy) -> LoopHarness:
    """``fresh`` reports a middling quietness 60 (interference index 40); ``stale`` reported
    a minute ago (older than stale_after_s = 10 s); ``silent`` never reported."""
    h = harness(stale_policy=policy)
    for name in ("fresh", "stale", "silent"):
        h.cluster.add_node(node_obj(name, cpu="16", memory="32Gi"))
    h.signals.report("fresh", h.clock.now - 1, index=60)
    h.signals.report("stale", h.clock.now - 60, index=0)
    return h


@pytest.mark.parametrize(
    ("policy", "plain_nodes", "tolerant_nodes"),
    [
        # neutral: stale/missing score 50 > fresh 40, and pass tolerance filters.
        pytest.param("neutral", {"stale", "silent"}, {"stale", "silent"}, id="neutral"),
        # avoid: stale/missing score 0 < 40, so the fresh node wins; they still pass filters,
        # so a pod whose tolerance excludes the fresh node lands on them.
        pytest.param("avoid", {"fresh"}, {"stale", "silent"}, id="avoid"),
        # reject: stale/missing nodes are filtered for every pod.
        pytest.param("reject", {"fresh"}, set(), id="reject"),
    ],
)
def test_stale_policies(
    policy: StalePolicy, plain_nodes: set[str], tolerant_nodes: set[str]
) -> None:
    h = stale_cluster(policy)
    try:
        h.cluster.add_pod(pod_obj("plain", requests={"cpu": "1", "memory": "128Mi"}))
        # Tolerates at most score 50: the fresh node (60) is out.
        h.cluster.add_pod(
            pod_obj(
                "picky",
                requests={"cpu": "1", "memory": "128Mi"},
                annotations={ANNOTATION_MAX_INDEX: "50"},
            )
        )
        h.step()
        assert h.cluster.node_of("default", "plain") in plain_nodes
        picky = h.cluster.node_of("default", "picky")
        if tolerant_nodes:
            assert picky in tolerant_nodes
        else:
            assert picky is None
            record = h.decisions.last("picky")
            assert record.result == "unschedulable"
            assert record.message == (
                "0/3 nodes are available: "
                "1 node(s) had an interference index above the pod's interference tolerance, "
                "2 node(s) had stale or missing interference signals."
            )
    finally:
        h.close()


def test_relax_after_waiting_only_for_interference() -> None:
    h = harness(relax_after_s=30.0)
    try:
        for name in ("loud-a", "loud-b"):
            h.cluster.add_node(node_obj(name, cpu="16", memory="32Gi"))
        h.cluster.add_pod(
            pod_obj(
                "patient", requests={"cpu": "1", "memory": "128Mi"}, annotations=LATENCY_SENSITIVE
            )
        )
        h.cluster.add_pod(
            pod_obj(
                "too-big", requests={"cpu": "64", "memory": "128Mi"}, annotations=LATENCY_SENSITIVE
            )
        )

        def report() -> None:  # keep the signals fresh while time passes
            for name in ("loud-a", "loud-b"):
                h.signals.report(name, h.clock.now - 1, runq_p99_us=4000, index=50)

        report()
        h.step()
        first = h.decisions.last("patient")
        assert first.result == "unschedulable"
        # The Event says what to do: the nearest node against the tolerance, when the pod
        # is relaxed and how far to raise its tolerance.
        relax_at = time.strftime("%H:%M:%S UTC", time.gmtime(h.clock.now + 30))
        told = (
            "0/2 nodes are available: "
            "2 node(s) had run-queue p99 above the pod's interference tolerance. "
            "Nearest node: loud-a, run-queue p99 4000 µs against the tolerance 500 µs "
            f"(10s window). Relaxed to interference-blind in 30 s (at {relax_at}). "
            "Hint: raise interference.io/max-runq-p99-us to at least 4000 µs."
        )
        assert first.message == told
        [event] = h.cluster.events_for("default", "patient")
        assert (event.type, event.reason, event.message) == ("Warning", "FailedScheduling", told)
        relaxed_events = []
        while h.clock.now < 1_800_000_000.0 + 29:
            h.clock.advance(1.0)
            report()
            h.step()
            relaxed_events = [
                e
                for e in h.cluster.events_for("default", "patient")
                if e.reason == "InterferenceRelaxed"
            ]
            assert h.cluster.node_of("default", "patient") is None, "relaxed too early"
        for _ in range(15):
            h.clock.advance(1.0)
            report()
            h.step()
        assert h.cluster.node_of("default", "patient") in ("loud-a", "loud-b")
        relaxed_events = [
            e
            for e in h.cluster.events_for("default", "patient")
            if e.reason == "InterferenceRelaxed"
        ]
        assert len(relaxed_events) == 1
        assert relaxed_events[0].type == "Warning"
        assert "blocked only by interference filters" in relaxed_events[0].message
        assert h.metric("interference_scheduler_interference_relaxed_total") == 1
        # A pod that also lacks resources is not blocked by interference alone: never relaxed.
        assert h.cluster.node_of("default", "too-big") is None
        assert not [
            e
            for e in h.cluster.events_for("default", "too-big")
            if e.reason == "InterferenceRelaxed"
        ]
    finally:
        h.close()
