"""The cluster demo's manifests and its report feed (the acts themselves run on the real
two-node cluster: tests/cluster/e2e_cluster.sh)."""

from __future__ import annotations

import kubernetes.client
import pytest
import yaml
from rich.console import Console

from interference.codec import encode_report
from interference.signals import NodeMetrics, NodeReport, PodMetrics
from interference_cli.errors import CliError
from interference_demo.cluster_demo import AWARE, BLIND, PlacementResult, print_placement
from interference_demo.cluster_objects import (
    LATENCY_POD_FILE,
    NAMESPACE,
    STRESS_CPU_REQUEST,
    ReportFeed,
    busy_share,
    cache_pod,
    cpu_times,
    latency_deployment,
    millis,
    stress_pod,
)
from interference_demo.rebalance_act import TOLERANCE_ANNOTATION


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("200m", 200), ("1", 1000), ("0.5", 500), ("2", 2000), ("0", 0)],
)
def test_millis_reads_a_cpu_quantity(quantity: str, expected: int) -> None:
    assert millis(quantity) == expected


@pytest.mark.parametrize(
    ("scheduler", "tolerance", "annotation"),
    [
        ("interference-scheduler", 3000.0, "3000"),
        ("default-scheduler", None, None),
    ],
)
def test_latency_deployment_is_the_demo_pod_with_its_scheduler_and_tolerance(
    scheduler: str, tolerance: float | None, annotation: str | None
) -> None:
    pod = yaml.safe_load(LATENCY_POD_FILE.read_text())
    deployment = latency_deployment("web", "img:1", scheduler, tolerance)
    template = deployment["spec"]["template"]
    assert deployment["metadata"] == {"name": "web", "namespace": NAMESPACE}
    assert deployment["spec"]["replicas"] == 1
    assert set(template) == {"metadata", "spec"}  # a PodTemplateSpec, not a Pod
    assert deployment["spec"]["selector"]["matchLabels"] == template["metadata"]["labels"]
    assert template["spec"]["schedulerName"] == scheduler
    assert template["metadata"]["annotations"].get(TOLERANCE_ANNOTATION) == annotation
    container = template["spec"]["containers"][0]
    assert (container["image"], container["imagePullPolicy"]) == ("img:1", "Never")
    assert container["command"] == pod["spec"]["containers"][0]["command"]
    assert container["resources"] == pod["spec"]["containers"][0]["resources"]


@pytest.mark.parametrize(
    ("through_scheduler", "placement"),
    [
        (False, {"nodeName": "node-a"}),
        (True, {"nodeSelector": {"kubernetes.io/hostname": "node-a"}}),
    ],
)
def test_stress_pod_requests_cpu_bursts_unlimited_and_is_placed_directly_or_by_kube_scheduler(
    through_scheduler: bool, placement: dict[str, object]
) -> None:
    pod = stress_pod("hog", "node-a", "stress:1", through_scheduler=through_scheduler)
    spec = pod["spec"]
    assert {k: spec[k] for k in ("nodeName", "nodeSelector") if k in spec} == placement
    assert "schedulerName" not in spec  # the cluster's default scheduler
    (container,) = spec["containers"]
    # Burstable with no limit: a BestEffort hog (cpu.shares 2) barely delays its neighbours.
    assert container["resources"]["requests"]["cpu"] == STRESS_CPU_REQUEST
    assert "limits" not in container["resources"]
    assert container["command"][:3] == ["stress-ng", "--cpu", "4"]


def test_busy_share_is_each_cpus_busy_part_of_the_time_between_two_readings() -> None:
    before = {0: (100, 1000), 1: (50, 1000)}
    after = {0: (190, 1100), 1: (60, 1100)}
    assert busy_share(before, after) == {0: 0.9, 1: 0.1}
    assert set(cpu_times()) and all(b <= t for b, t in cpu_times().values())


def test_cache_pod_requests_what_it_limits_on_its_node() -> None:
    pod = cache_pod("node-b", 450)
    (container,) = pod["spec"]["containers"]
    assert pod["spec"]["nodeName"] == "node-b"
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert container["resources"]["requests"]["cpu"] == "450m"


class _Streams:
    """The two Store calls ReportFeed makes, over entries given up front."""

    def __init__(self, entries: list[tuple[str, str, bytes]]) -> None:
        self._entries = entries
        self.asked: list[dict[str, str]] = []

    def last_stream_ids(self, stream_keys: list[str]) -> dict[str, str]:
        return dict.fromkeys(stream_keys, "0-0")

    def streams_after(self, last_ids: dict[str, str]) -> list[tuple[str, str, bytes]]:
        self.asked.append(dict(last_ids))
        found = [e for e in self._entries if e[1] > last_ids[e[0]]]
        return found[:2]


def _report(node: str, ts: float, uids: list[str]) -> bytes:
    pods = [
        PodMetrics(namespace="ns", name=uid, uid=uid, runq_p99_us=100.0, runq_us=(0, 5, 1))
        for uid in uids
    ]
    return encode_report(
        NodeReport(node=node, ts=ts, interval_s=1.0, metrics=NodeMetrics(), pods=pods)
    )


def test_report_feed_keeps_each_pods_rows_by_report_time_across_polls() -> None:
    entries = [
        ("intf:node:a:reports", "1-1", _report("a", 10.0, ["u1"])),
        ("intf:node:a:reports", "1-2", b"not msgpack"),
        ("intf:node:a:reports", "1-3", _report("a", 11.0, ["u1", "u2"])),
        ("intf:node:b:reports", "1-1", _report("b", 10.5, ["u3"])),
    ]
    streams = _Streams(entries)
    feed = ReportFeed(streams, ["a", "b"])  # type: ignore[arg-type]
    feed.poll()
    assert sorted(feed.of("u1").rows) == [10.0, 11.0]
    assert sorted(feed.of("u2").rows) == [11.0]
    assert sorted(feed.of("u3").rows) == [10.5]
    assert feed.of("nobody").rows == {}
    assert streams.asked[-1] == {"intf:node:a:reports": "1-3", "intf:node:b:reports": "1-1"}


class _FlakyStreams(_Streams):
    """Reads that time out ``failures`` times before answering."""

    def __init__(self, entries: list[tuple[str, str, bytes]], failures: int) -> None:
        super().__init__(entries)
        self.failures = failures

    def streams_after(self, last_ids: dict[str, str]) -> list[tuple[str, str, bytes]]:
        if self.failures > 0:
            self.failures -= 1
            raise CliError("cannot reach Redis (Timeout reading from socket)")
        return super().streams_after(last_ids)


def test_report_feed_retries_a_failed_read_and_tells_it_once() -> None:
    streams = _FlakyStreams([("intf:node:a:reports", "1-1", _report("a", 10.0, ["u1"]))], 2)
    told: list[str] = []
    feed = ReportFeed(streams, ["a"], told.append)  # type: ignore[arg-type]
    feed.poll()
    feed.poll()
    assert feed.of("u1").rows == {} and feed.failed_reads == 2
    feed.poll()
    assert sorted(feed.of("u1").rows) == [10.0]
    assert len(told) == 1 and "Timeout reading from socket" in told[0]


def test_report_feed_gives_up_when_redis_stays_unreachable() -> None:
    feed = ReportFeed(_FlakyStreams([], 5), ["a"], lambda _line: None)  # type: ignore[arg-type]
    feed.UNREACHABLE_LIMIT_S = -1.0
    with pytest.raises(CliError):
        feed.poll()


@pytest.mark.parametrize(
    ("manifest", "model"),
    [
        (latency_deployment("web", "img:1", "interference-scheduler", 3000.0), "V1Deployment"),
        (stress_pod("hog", "node-a", "stress:1", through_scheduler=True), "V1Pod"),
        (cache_pod("node-b", 300), "V1Pod"),
    ],
)
def test_manifests_are_what_the_kubernetes_client_sends(
    manifest: dict[str, object], model: str
) -> None:
    """The client validates a dict body against its model before sending it (a Pod's
    apiVersion/kind inside a Deployment's template is refused there, not by the cluster)."""
    getattr(kubernetes.client, model).model_validate(manifest)


def test_the_placement_table_shows_both_schedulers_figures_and_their_ratio() -> None:
    aware = PlacementResult(AWARE, "latency-aware", node="b", p99_us=500.0, intervals=20)
    aware.waited_behind = [("system", 1.25)]
    blind = PlacementResult(BLIND, "latency-blind", node="a", p99_us=6000.0, intervals=20)
    console = Console(record=True, width=200)
    print_placement({AWARE: aware, BLIND: blind}, console)
    text = console.export_text()
    assert "interference-scheduler" in text and "kube-scheduler" in text
    assert "system 1.2" in text and "—" in text  # culprits; none for the blind side
    assert "12.0× higher run-queue p99" in text
