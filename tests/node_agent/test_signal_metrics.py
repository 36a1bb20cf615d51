"""The agent's signals on /metrics (node_agent/signal_metrics.py): per node and window,
the run-queue histogram from the log2 slots, and the bounded per-pod series."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from interference import hist
from interference.signals import NodeMetrics, NodeReport, PodMetrics, WindowMetrics
from node_agent.agent import Agent
from node_agent.cli import parser, settings_from_args
from node_agent.health import AgentMetrics
from node_agent.pods import StaticPodDirectory
from node_agent.settings import AgentSettings
from node_agent.signal_metrics import (
    NODE_SIGNALS,
    PODS_EXPORTED,
    PODS_LEFT_OUT,
    RUNQ_HISTOGRAM,
    SignalCollector,
    cumulative_buckets,
)
from node_agent.tolerances import PodTolerance, tolerance_of, tolerances_of_node

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(collector: SignalCollector) -> Samples:
    """Every sample of one scrape through the real exposition format."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def node(window: str, **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"node": "n1", "window": window, **extra}.items()))


def pod_labels(namespace: str, name: str) -> tuple[tuple[str, str], ...]:
    return (("namespace", namespace), ("node", "n1"), ("pod", name))


def report(
    *,
    metrics: NodeMetrics | None = None,
    pods: list[PodMetrics] | None = None,
    runq: list[int] | None = None,
    measured: tuple[str, ...] = ("net", "psi", "reclaim", "runq", "throttle"),
    windows: dict[str, WindowMetrics] | None = None,
) -> NodeReport:
    return NodeReport(
        node="n1",
        ts=100.0,
        interval_s=1.0,
        metrics=metrics or NodeMetrics(),
        histograms={"runq_us": runq or [], "reclaim_us": []},
        pods=pods or [],
        measured=measured,
        windows=windows or {},
    )


# --- per node -----------------------------------------------------------------------

NODE_CASES = [
    # metric, NodeMetrics field, WindowMetrics field, raw value, exported value
    ("interference_node_runq_p99_seconds", "runq_p99_us", "runq_p99_us", 1500.0, 0.0015),
    ("interference_node_runq_wait_ratio", "runq_wait_ratio", "runq_wait_ratio_mean", 0.4, 0.4),
    (
        "interference_node_reclaim_stall_ratio",
        "reclaim_stall_ms_per_s",
        "reclaim_stall_ms_per_s_mean",
        2.5,
        0.0025,
    ),
    (
        "interference_node_cpu_throttled_ratio",
        "throttled_ms_per_s",
        "throttled_ms_per_s_mean",
        50.0,
        0.05,
    ),
    ("interference_node_psi_cpu_some_ratio", "psi_cpu_some", "psi_cpu_some_mean", 30.0, 0.3),
    ("interference_node_psi_memory_some_ratio", "psi_mem_some", "psi_mem_some_mean", 4.0, 0.04),
    ("interference_node_psi_memory_full_ratio", "psi_mem_full", None, 2.0, 0.02),
    ("interference_node_psi_memory_some_avg10_ratio", "psi_mem_some_avg10", None, 4.5, 0.045),
    (
        "interference_node_network_drops_per_second",
        "net_drops_per_s",
        "net_drops_per_s_mean",
        12.0,
        12.0,
    ),
    ("interference_node_index", "interference_index", "index_mean", 42.0, 42.0),
]


def test_the_table_covers_every_node_signal() -> None:
    assert sorted(case[0] for case in NODE_CASES) == sorted(s.metric for s in NODE_SIGNALS)


@pytest.mark.parametrize(("metric", "latest", "window", "raw", "value"), NODE_CASES)
def test_node_signal_per_window_in_base_units(
    metric: str, latest: str, window: str | None, raw: float, value: float
) -> None:
    """The interval's value as ``latest``; each window with intervals under its name (the
    window's value doubled here to tell them apart); a window without any has none."""
    windows = {
        "10s": WindowMetrics(span_s=10, intervals=10, **({window: raw * 2} if window else {})),
        "60s": WindowMetrics(span_s=60),  # no interval yet
    }
    collector = SignalCollector("n1")
    collector.observe(report(metrics=NodeMetrics(**{latest: raw}), windows=windows), ncpu=2)
    found = {labels: v for (name, labels), v in scrape(collector).items() if name == metric}
    expected = {node("latest"): value}
    if window is not None:
        expected[node("10s")] = 2 * value
    assert found.keys() == expected.keys()
    for labels, want in expected.items():
        assert math.isclose(found[labels], want), labels


def test_an_unmeasured_family_has_no_series_and_says_so() -> None:
    """0 would read as quiet: a family the interval did not measure is absent, and
    ``interference_node_signal_measured`` names it 0; the index is always there."""
    collector = SignalCollector("n1")
    collector.observe(report(metrics=NodeMetrics(psi_cpu_some=50), measured=("runq",)), ncpu=1)
    found = scrape(collector)
    names = {name for name, _ in found}
    assert "interference_node_runq_p99_seconds" in names
    assert "interference_node_index" in names
    assert not names & {
        "interference_node_psi_cpu_some_ratio",
        "interference_node_reclaim_stall_ratio",
        "interference_node_network_drops_per_second",
        "interference_node_cpu_throttled_ratio",
    }
    measured = {
        dict(labels)["family"]: v
        for (name, labels), v in found.items()
        if name == "interference_node_signal_measured"
    }
    assert measured == {
        "runq": 1.0,
        "reclaim": 0.0,
        "throttle": 0.0,
        "psi": 0.0,
        "net": 0.0,
        "memory_events": 0.0,
    }


def test_nothing_before_the_first_report() -> None:
    assert scrape(SignalCollector("n1")) == {}


# --- the run-queue histogram --------------------------------------------------------


@pytest.mark.parametrize(
    ("slots", "expected"),
    [
        ([], {"2e-06": 0, "+Inf": 0}),
        ([3], {"2e-06": 3, "4e-06": 3, "0.001024": 3, "+Inf": 3}),
        ([1, 2, 0, 4], {"2e-06": 1, "4e-06": 3, "8e-06": 3, "1.6e-05": 7, "+Inf": 7}),
        # the last slot also holds every longer wait: only +Inf counts it
        ([0] * 25 + [1, 5], {"33.554432": 0, "67.108864": 1, "+Inf": 6}),
        ([0] * 30 + [2], {"67.108864": 0, "+Inf": 2}),  # folded into the last slot
    ],
)
def test_cumulative_buckets_from_log2_slots(slots: list[int], expected: dict[str, int]) -> None:
    buckets = dict(cumulative_buckets(slots))
    assert len(buckets) == hist.MAX_SLOTS
    for le, count in expected.items():
        assert buckets[le] == count, le
    counts = list(buckets.values())
    assert counts == sorted(counts)  # cumulative: never decreasing
    assert buckets["+Inf"] == hist.total(slots)


def test_the_histogram_adds_every_interval_and_its_wait() -> None:
    """Counters since the agent started: each interval's slots are added (never re-observed
    samples); ``_sum`` is the run-queue wait (ratio · T · ncpu); ``+Inf`` = ``_count``."""
    collector = SignalCollector("n1")
    collector.observe(report(runq=[4, 0, 1], metrics=NodeMetrics(runq_wait_ratio=0.25)), ncpu=4)
    collector.observe(report(runq=[1, 2, 0, 0, 3], metrics=NodeMetrics(runq_wait_ratio=0.5)), 4)
    found = scrape(collector)
    labels = (("le", "+Inf"), ("node", "n1"))
    assert found[(RUNQ_HISTOGRAM + "_bucket", labels)] == 11
    assert found[(RUNQ_HISTOGRAM + "_count", (("node", "n1"),))] == 11
    assert found[(RUNQ_HISTOGRAM + "_sum", (("node", "n1"),))] == pytest.approx(3.0)
    bucket = {
        dict(lbl)["le"]: v for (name, lbl), v in found.items() if name == RUNQ_HISTOGRAM + "_bucket"
    }
    assert bucket["2e-06"] == 5 and bucket["4e-06"] == 7 and bucket["8e-06"] == 8
    assert bucket["1.6e-05"] == 8 and bucket["3.2e-05"] == 11  # slot 4: [16, 32) µs


# --- per pod -------------------------------------------------------------------------


def busy(namespace: str, name: str, **fields: object) -> PodMetrics:
    return PodMetrics(namespace, name, uid=f"uid-{namespace}-{name}", **fields)  # type: ignore[arg-type]


VICTIM = busy(
    "shop",
    "api",
    cpu_ms_per_s=300.0,
    runq_p99_us=8000.0,
    reclaim_stall_ms_per_s=1.5,
    neighbour_wait_ms_per_s=400.0,
    culprits=(("batch/hog", 300.0), ("system", 100.0)),
)
HOG = busy("batch", "hog", cpu_ms_per_s=1900.0, runq_p99_us=100.0)
QUIET = busy("shop", "db", runq_p99_us=50.0)
SYSTEM = PodMetrics("", "system", neighbour_wait_ms_per_s=900.0, cpu_ms_per_s=10.0)
UID_ONLY = PodMetrics("", "0f6c-uid", uid="0f6c-uid", neighbour_wait_ms_per_s=800.0)


def pods_of(found: Samples, metric: str, window: str = "latest") -> dict[str, float]:
    """``namespace/pod`` → value of ``metric`` (of ``window`` where it has one)."""
    return {
        f"{dict(labels)['namespace']}/{dict(labels)['pod']}": value
        for (name, labels), value in found.items()
        if name == metric and dict(labels).get("window", "latest") == window
    }


def test_victims_antagonists_and_pods_with_a_tolerance_with_their_values() -> None:
    """The victim (its wait behind neighbours) and the antagonist it waited behind are
    exported without a tolerance; a quiet pod only with one; the system bucket and a pod
    known only by UID never (no UID in a label)."""
    tolerances = {QUIET.uid: PodTolerance(max_runq_p99_us=500, max_index=40)}
    collector = SignalCollector("n1", tolerance_of=tolerances.get)
    collector.observe(report(pods=[VICTIM, HOG, QUIET, SYSTEM, UID_ONLY]), ncpu=2)
    found = scrape(collector)
    p99 = pods_of(found, "interference_pod_runq_p99_seconds")
    assert p99 == pytest.approx({"shop/api": 0.008, "batch/hog": 0.0001, "shop/db": 0.00005})
    assert pods_of(found, "interference_pod_reclaim_stall_ratio")["shop/api"] == 0.0015
    assert pods_of(found, "interference_pod_neighbour_wait_ratio")["shop/api"] == 0.4
    caused = pods_of(found, "interference_pod_caused_wait_ratio")
    assert caused == {"shop/api": 0.0, "batch/hog": 0.3, "shop/db": 0.0}
    assert pods_of(found, "interference_pod_tolerance_runq_p99_seconds") == {"shop/db": 0.0005}
    assert pods_of(found, "interference_pod_tolerance_index") == {"shop/db": 40.0}
    assert pods_of(found, "interference_pod_tolerance_reclaim_stall_ratio") == {}
    assert found[(PODS_EXPORTED, ())] == 3 and found[(PODS_LEFT_OUT, ())] == 0
    assert not any("uid" in str(labels) for _, labels in found)


def test_a_pod_throttled_by_its_own_limit_is_no_victim() -> None:
    throttled = replace(VICTIM, throttled_ms_per_s=900.0, culprits=())
    collector = SignalCollector("n1")
    collector.observe(report(pods=[throttled]), ncpu=2)
    assert pods_of(scrape(collector), "interference_pod_runq_p99_seconds") == {}


@pytest.mark.parametrize(
    ("with_tolerance", "max_pods", "exported", "left_out"),
    # besides the pods with a tolerance, the victim and its antagonist qualify
    [(110, 50, 50, 62), (110, 0, 0, 112), (30, 50, 32, 0), (48, 50, 50, 0), (49, 50, 50, 1)],
)
def test_per_pod_series_are_capped_and_the_rest_counted_and_logged_once(
    with_tolerance: int,
    max_pods: int,
    exported: int,
    left_out: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pods = [busy("ns", f"web-{i:03d}", runq_p99_us=100.0 + i) for i in range(110)]
    declared = {p.uid: PodTolerance(max_runq_p99_us=1000) for p in pods[:with_tolerance]}
    collector = SignalCollector("n1", max_pods=max_pods, tolerance_of=declared.get)
    collector.observe(report(pods=[VICTIM, HOG, *pods]), ncpu=2)
    with caplog.at_level(logging.WARNING, logger="node_agent.signal_metrics"):
        first, second = scrape(collector), scrape(collector)
    assert first == second
    p99 = pods_of(first, "interference_pod_runq_p99_seconds")
    assert len(p99) == exported
    # the victim and the antagonist come first, then pods with a tolerance by name
    assert list(p99) == ["shop/api", "batch/hog", *(p.key for p in pods)][:exported]
    tolerance = pods_of(first, "interference_pod_tolerance_runq_p99_seconds")
    assert len(tolerance) == max(0, exported - 2)
    assert first[(PODS_EXPORTED, ())] == exported
    assert first[(PODS_LEFT_OUT, ())] == left_out
    warnings = [r for r in caplog.records if "--metrics-max-pods" in r.getMessage()]
    assert len(warnings) == (1 if left_out else 0)


def test_a_pod_that_leaves_loses_its_series_at_the_next_scrape() -> None:
    declared = {QUIET.uid: PodTolerance(max_runq_p99_us=500), VICTIM.uid: PodTolerance(2000)}
    collector = SignalCollector("n1", tolerance_of=declared.get)
    collector.observe(report(pods=[VICTIM, HOG, QUIET]), ncpu=2)
    assert set(pods_of(scrape(collector), "interference_pod_runq_p99_seconds")) == {
        "shop/api",
        "batch/hog",
        "shop/db",
    }
    collector.observe(report(pods=[QUIET]), ncpu=2)  # the victim and the hog are gone
    found = scrape(collector)
    for metric in (
        "interference_pod_runq_p99_seconds",
        "interference_pod_reclaim_stall_ratio",
        "interference_pod_caused_wait_ratio",
        "interference_pod_tolerance_runq_p99_seconds",
    ):
        assert set(pods_of(found, metric)) == {"shop/db"}, metric


def test_a_pods_run_queue_p99_per_window_merges_its_intervals_histograms() -> None:
    """Like the node's: the p99 of the pod's slots merged over the intervals that ended in
    the last 10 s and 60 s (every wake-up counts once), beside the interval's own."""
    declared = {QUIET.uid: PodTolerance(max_runq_p99_us=500)}
    collector = SignalCollector("n1", tolerance_of=declared.get)

    def at(ts: float, slots: tuple[int, ...], p99_us: float) -> NodeReport:
        pod = replace(QUIET, runq_us=slots, runq_p99_us=p99_us)
        return replace(report(pods=[pod]), ts=ts)

    collector.observe(at(40.0, (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 100), 1900.0), ncpu=1)  # gone at 100
    collector.observe(at(60.0, (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5), 4000.0), ncpu=1)
    collector.observe(at(95.0, (100,), 1.0), ncpu=1)
    collector.observe(at(100.0, (100,), 1.0), ncpu=1)
    found = scrape(collector)
    assert pods_of(found, "interference_pod_runq_p99_seconds") == {"shop/db": 1e-6}
    # 10 s: 200 waits of 0-1 µs; 60 s: 205 waits, 5 of them in [2048, 4096) µs
    assert pods_of(found, "interference_pod_runq_p99_seconds", "10s")["shop/db"] < 2e-6
    sixty = pods_of(found, "interference_pod_runq_p99_seconds", "60s")["shop/db"]
    expected = hist.percentile([200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5], 0.99)
    assert sixty == pytest.approx(expected * 1e-6) and sixty > 0.002


# --- tolerances, as the agent reads them ----------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (None, None),
        ({"interference.io/rebalance": "false"}, None),
        ({"interference.io/max-runq-p99-us": "500"}, PodTolerance(max_runq_p99_us=500)),
        (
            {
                "interference.io/max-reclaim-stall-ms-per-s": "2.5",
                "interference.io/max-index": "40",
            },
            PodTolerance(max_reclaim_stall_ms_per_s=2.5, max_index=40),
        ),
        ({"interference.io/max-score": "30"}, None),  # vocabulary: former name
        ({"interference.io/max-index": "101"}, None),  # out of range: the scheduler warns
        ({"interference.io/max-runq-p99-us": "fast"}, None),
        ({"interference.io/max-runq-p99-us": "-1"}, None),
        ({"interference.io/max-runq-p99-us": "nan"}, None),
    ],
)
def test_tolerance_of_annotations(
    annotations: dict[str, str] | None, expected: PodTolerance | None
) -> None:
    assert tolerance_of(annotations) == expected


def test_tolerances_from_the_kubelet_pod_list() -> None:
    def item(uid: str, node: str, annotations: object) -> dict[str, object]:
        meta = {"uid": uid, "namespace": "ns", "name": uid, "annotations": annotations}
        return {"metadata": meta, "spec": {"nodeName": node}}

    body = {
        "items": [
            item("a", "n1", {"interference.io/max-runq-p99-us": "800"}),
            item("b", "n2", {"interference.io/max-runq-p99-us": "800"}),  # another node's
            item("c", "n1", None),
            item("d", "n1", {"interference.io/max-index": "x"}),
            "junk",
        ]
    }
    assert tolerances_of_node(body, "n1") == {"a": PodTolerance(max_runq_p99_us=800)}
    assert tolerances_of_node({"items": None}, "n1") == {}


def test_pods_file_entries_may_carry_annotations(tmp_path: Path) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text(
        "u1: shop/api\n"
        "u2:\n  pod: shop/db\n  annotations:\n    interference.io/max-runq-p99-us: '750'\n"
    )
    directory = StaticPodDirectory.from_file(path)
    assert directory.lookup("u2") == ("shop", "db")
    assert directory.tolerance("u2") == PodTolerance(max_runq_p99_us=750)
    assert directory.tolerance("u1") is None


# --- the setting, and the agent's own path -----------------------------------------------


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        ([], {}, 50),
        (["--metrics-max-pods", "0"], {}, 0),
        ([], {"METRICS_MAX_PODS": "200"}, 200),
        (["--metrics-max-pods", "7"], {"METRICS_MAX_PODS": "200"}, 7),
        (["--metrics-max-pods", "-1"], {}, "--metrics-max-pods"),
        ([], {"METRICS_MAX_PODS": "many"}, "METRICS_MAX_PODS"),
    ],
)
def test_metrics_max_pods_flag_and_env(
    argv: list[str], environ: dict[str, str], expected: int | str
) -> None:
    args = parser(environ).parse_args(["--node-name", "n1", *argv])
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            settings_from_args(args, environ)
    else:
        assert settings_from_args(args, environ).metrics_max_pods == expected


def test_the_agent_exports_what_it_measured_on_its_registry() -> None:
    """A real agent (the PSI probe, real /proc/pressure) on its own registry: after one
    interval its node series are there, with the values of its report."""
    if not Path("/proc/pressure/cpu").exists():
        pytest.skip("no PSI on this kernel")
    registry = CollectorRegistry()
    settings = AgentSettings(node_name="n1", probes=("psi",), ncpu=1, kubernetes=False)
    agent = Agent(settings, StaticPodDirectory(), metrics=AgentMetrics(registry))
    try:
        agent.start()
        measured = agent.measure()
    finally:
        agent.close()
    text = generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    expected = measured.metrics.psi_cpu_some / 100
    assert samples[("interference_node_psi_cpu_some_ratio", node("latest"))] == pytest.approx(
        expected
    )
    assert samples[("interference_node_signal_measured", node_family("psi"))] == 1.0
    assert samples[("interference_node_signal_measured", node_family("runq"))] == 0.0
    assert ("interference_node_runq_p99_seconds", node("latest")) not in samples


def node_family(family: str) -> tuple[tuple[str, str], ...]:
    return (("family", family), ("node", "n1"))
