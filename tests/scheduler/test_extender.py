"""kube-scheduler extender protocol: ``/filter`` and ``/prioritize`` answers (table-driven),
then the same handler behind the real HTTP server."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import struct
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from scheduler.api.objects import ANNOTATION_MAX_RUNQ_P99_US
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.ports import INFORMED_KINDS, DecisionSink
from scheduler.cycle.queue import SchedulingQueue
from scheduler.cycle.settings import CycleSettings, Profile
from scheduler.endpoint.http import HealthServer, HttpSettings, Status
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.entry import cli
from scheduler.extender.extender import NOT_SYNCED, UNKNOWN_NODE, Extender
from scheduler.extender.metrics import ExtenderMetrics
from scheduler.extender.pod_warnings import PodEvents
from scheduler.extender.protocol import MAX_EXTENDER_PRIORITY, HostPriorities, extender_scores
from scheduler.plugins.interference import RUNQ_EXCEEDED, SIGNALS_UNREADABLE
from scheduler.signals.table import NodeTable
from tests.builders import node_obj, pod_obj
from tests.scheduler.runtime_helpers import START, FakeClock, MemoryDecisions, MemorySignals

TOLERANT = {ANNOTATION_MAX_RUNQ_P99_US: "500"}
"""A pod that tolerates a run-queue p99 up to 500 µs."""
NODES = [
    node_obj("quiet", cpu="8"),
    node_obj("noisy", cpu="8"),
    node_obj("small", cpu="1"),
    node_obj("tainted", cpu="8", taints=[("dedicated", "db", "NoSchedule")]),
    node_obj("cordoned", cpu="8", unschedulable=True),
    node_obj("gpu", cpu="8", extra={"nvidia.com/gpu": "4"}),
]


class Harness:
    """An :class:`Extender` over a cache fed with ``NODES`` and two signal reports."""

    def __init__(
        self,
        settings: CycleSettings | None = None,
        pods_listed: bool = True,
        events: PodEvents | None = None,
        decisions: DecisionSink | None = None,
    ) -> None:
        """``decisions``: where the records go (else :attr:`decisions`, in memory)."""
        self.clock = FakeClock()
        self.signals = MemorySignals()
        self.signals.report("quiet", START - 1, runq_p99_us=50, index=5)
        self.signals.report("noisy", START - 1, runq_p99_us=900, index=90)
        self.decisions = MemoryDecisions()
        self.registry = CollectorRegistry()
        metrics = SchedulerMetrics(self.registry)
        self.cache = ClusterCache(NodeTable(), SchedulingQueue(), metrics, "interference-scheduler")
        self.cache.replace("Node", [dict(n) for n in NODES])
        for kind in INFORMED_KINDS:  # nothing else listed yet, pods maybe not even that
            if kind not in ("Node", "Pod"):
                self.cache.replace(kind, [])
        if pods_listed:
            self.cache.replace("Pod", [])
        self.extender = Extender(
            self.cache,
            self.signals,
            decisions or self.decisions,
            settings or CycleSettings(),
            metrics,
            ExtenderMetrics(self.registry),
            clock=self.clock,
            events=events,
        )

    def inform(self, pod: Mapping[str, Any]) -> None:
        """The informer delivers ``pod`` (kube-scheduler asks only about pods it watched)."""
        self.cache.apply("Pod", "ADDED", json.loads(json.dumps(pod)))

    def filter(
        self, pod: Mapping[str, Any], names: list[str], informed: bool = True
    ) -> tuple[int, dict[str, Any]]:
        if informed:
            self.inform(pod)
        body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
        code, answer, content_type = self.extender.filter_route(body)
        assert content_type == "application/json"
        return code, json.loads(answer)

    def prioritize(
        self, pod: Mapping[str, Any], names: list[str], informed: bool = True
    ) -> dict[str, int]:
        if informed:
            self.inform(pod)
        body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
        code, answer, _ = self.extender.prioritize_route(body)
        assert code == 200, answer
        priorities = json.loads(answer)
        assert [p["Host"] for p in priorities] == names  # one entry per node, in order
        return {p["Host"]: p["Score"] for p in priorities}

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


ALL = [n["metadata"]["name"] for n in NODES]
PVC_VOLUME = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
SPREAD = [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"app": "web"}}}]  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "names", "passed", "failed", "unresolvable"),
    [
        (
            pod_obj(requests={"cpu": "500m"}),
            ["quiet", "noisy", "small"],
            ["quiet", "noisy", "small"],
            {},
            {},
        ),
        (
            pod_obj(requests={"cpu": "2"}),
            ["quiet", "small"],
            ["quiet"],
            {"small": "Insufficient cpu"},
            {},
        ),
        (
            pod_obj(requests={"cpu": "1"}),
            ["quiet", "tainted", "cordoned"],
            ["quiet"],
            {},
            {"tainted": "taint", "cordoned": "unschedulable"},
        ),
        (
            pod_obj(requests={"cpu": "1"}, annotations=TOLERANT),
            ["quiet", "noisy"],
            ["quiet"],
            {},
            {"noisy": RUNQ_EXCEEDED},
        ),
        (
            pod_obj(requests={"cpu": "1"}, annotations=TOLERANT),
            ["quiet", "gone"],
            ["quiet"],
            {"gone": UNKNOWN_NODE},
            {},
        ),
        (
            pod_obj(requests={"cpu": "1", "nvidia.com/gpu": "2"}),
            ["quiet", "gpu"],
            ["gpu"],
            {"quiet": "Insufficient nvidia.com/gpu"},
            {},
        ),
        (
            pod_obj(requests={"cpu": "1"}, volumes=PVC_VOLUME, topologySpreadConstraints=SPREAD),
            ["quiet", "noisy"],
            ["quiet", "noisy"],
            {},
            {},
        ),
        (
            pod_obj(requests={"cpu": "2"}, annotations=TOLERANT),
            ["noisy", "small"],
            [],
            {"small": "Insufficient cpu"},
            {"noisy": RUNQ_EXCEEDED},
        ),
        (pod_obj(requests={"cpu": "1"}), [], [], {}, {}),
    ],
    ids=[
        "all-pass",
        "insufficient-cpu-preemption-may-help",
        "taint-and-cordon-unresolvable",
        "tolerance-keeps-pod-off-noisy-node",
        "node-not-in-cache-yet",
        "gpu-count",
        "volumes-and-spread-left-to-kube-scheduler",
        "nothing-passes",
        "no-nodes-offered",
    ],
)
def test_filter(
    pod: dict[str, Any],
    names: list[str],
    passed: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
) -> None:
    harness = Harness()
    code, answer = harness.filter(pod, names)
    assert code == 200
    assert "Error" not in answer
    assert answer["NodeNames"] == passed
    assert answer["FailedNodes"].keys() == failed.keys()
    assert answer["FailedAndUnresolvableNodes"].keys() == unresolvable.keys()
    for got, wanted in ((answer["FailedNodes"], failed), (answer["FailedAndUnresolvableNodes"],
                                                           unresolvable)):  # fmt: skip
        for node, fragment in wanted.items():
            assert fragment in got[node], (node, got[node])
    decision = harness.decisions.last("p")
    assert decision.result == ("filtered" if passed else "unschedulable")
    assert decision.node == ""  # kube-scheduler binds
    assert sum(decision.rejected_by_reason.values()) >= len(failed) + len(unresolvable)
    if not passed and names:
        assert decision.message.startswith(f"0/{len(names)} nodes are available")
    assert harness.sample("interference_scheduler_extender_requests_total",
                          verb="filter", result="ok") == 1  # fmt: skip
    assert harness.sample("interference_scheduler_extender_filtered_nodes_total",
                          outcome="passed") == len(passed)  # fmt: skip


@pytest.mark.parametrize(
    ("body", "code", "error"),
    [
        (b"{not json", 400, "not JSON"),
        (b"[]", 400, "JSON object"),
        (json.dumps({"nodenames": ["quiet"]}).encode(), 400, '"Pod"'),
        (json.dumps({"pod": pod_obj()}).encode(), 400, "nodeCacheCapable"),
        (json.dumps({"pod": pod_obj(), "nodenames": "quiet"}).encode(), 400, "list"),
        (
            json.dumps({"pod": pod_obj(requests={"cpu": "lots"}), "nodenames": ["quiet"]}).encode(),
            200,
            "cannot read the pod",
        ),
    ],
    ids=["not-json", "not-an-object", "no-pod", "no-nodes", "names-not-a-list", "bad-pod"],
)
def test_filter_rejects_bad_requests(body: bytes, code: int, error: str) -> None:
    harness = Harness()
    got_code, answer, _ = harness.extender.filter_route(body)
    assert got_code == code
    message = json.loads(answer)["Error"]
    assert error in message and "\n" not in message
    assert harness.sample("interference_scheduler_extender_requests_total",
                          verb="filter", result="error") == 1  # fmt: skip
    assert harness.decisions.items == []


def test_filter_answers_an_error_until_the_cache_has_listed_nodes_and_pods() -> None:
    harness = Harness(pods_listed=False)
    code, answer = harness.filter(pod_obj(), ["quiet"])
    assert code == 200 and answer == {"Error": NOT_SYNCED}
    harness.cache.replace("Pod", [])
    assert harness.filter(pod_obj(), ["quiet"])[1]["NodeNames"] == ["quiet"]


def test_filter_without_node_cache_answers_node_objects_and_reads_any_key_case() -> None:
    harness = Harness()
    offered = [n for n in NODES if n["metadata"]["name"] in ("quiet", "small")]
    body = {"pod": pod_obj(requests={"cpu": "2"}), "nodes": {"items": offered}}
    code, raw, _ = harness.extender.filter_route(json.dumps(body).encode())
    answer = json.loads(raw)
    assert code == 200 and "NodeNames" not in answer
    assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == ["quiet"]
    assert answer["FailedNodes"] == {"small": "Insufficient cpu"}


def test_unreadable_signals_fail_closed_for_tolerant_pods_until_relaxed() -> None:
    harness = Harness(CycleSettings(relax_after_s=30))
    harness.signals.is_healthy = False
    _, plain = harness.filter(pod_obj(name="plain"), ["quiet", "noisy"])
    assert plain["NodeNames"] == ["quiet", "noisy"]  # no tolerance: stale_policy neutral
    answers = []
    for seconds in (0, 29, 2):
        harness.clock.advance(seconds)
        answers.append(harness.filter(pod_obj(annotations=TOLERANT), ["quiet", "noisy"])[1])
    first, before, after = answers
    assert first["NodeNames"] == before["NodeNames"] == []
    refused = {**first["FailedNodes"], **first["FailedAndUnresolvableNodes"]}
    assert refused == {"quiet": SIGNALS_UNREADABLE, "noisy": SIGNALS_UNREADABLE}
    assert after["NodeNames"] == ["quiet", "noisy"]  # the relax rule, as for any refusal
    assert "relaxed" in harness.decisions.last("p").message
    assert harness.sample("interference_scheduler_signals_healthy") == 0
    assert harness.sample("interference_scheduler_interference_blind_attempts_total") == 4


def test_pod_refused_only_by_interference_is_relaxed_after_relax_after_s() -> None:
    harness = Harness(CycleSettings(relax_after_s=30))
    pod = pod_obj(annotations=TOLERANT)
    answers = []
    for seconds in (0, 29, 2):
        harness.clock.advance(seconds)
        harness.signals.report("noisy", harness.clock.now - 1, runq_p99_us=900)  # still noisy
        answers.append(harness.filter(pod, ["noisy"])[1])
    first, before, after = answers
    assert first["NodeNames"] == before["NodeNames"] == []
    assert after["NodeNames"] == ["noisy"]
    assert "relaxed" in harness.decisions.last("p").message
    assert harness.sample("interference_scheduler_extender_interference_relaxed_total") == 1


@pytest.mark.parametrize(
    ("profile", "names", "expected"),
    [
        (
            Profile(scores=(("Interference", 1), ("NodeResourcesFit", 0), ("GpuPacking", 0))),
            ["quiet", "noisy", "gone"],
            {"quiet": 10, "noisy": 1, "gone": 0},
        ),
        (
            Profile(scores=(("Interference", 0), ("NodeResourcesFit", 1), ("GpuPacking", 0))),
            ["quiet", "small"],
            {"quiet": 10, "small": 7},
        ),
        (
            Profile(scores=(("Interference", 0), ("NodeResourcesFit", 0), ("GpuPacking", 0))),
            ["quiet", "noisy"],
            {"quiet": 0, "noisy": 0},
        ),
    ],
    ids=["interference-only", "balance-only", "no-score-plugin"],
)
def test_prioritize(profile: Profile, names: list[str], expected: dict[str, int]) -> None:
    harness = Harness(CycleSettings(profile=profile))
    scores = harness.prioritize(pod_obj(requests={"cpu": "500m", "memory": "64Mi"}), names)
    assert scores == expected


def test_prioritize_default_weights_stay_in_range_and_prefer_quiet() -> None:
    harness = Harness()
    pod = pod_obj(requests={"cpu": "1"}, annotations=TOLERANT)
    harness.filter(pod, ["quiet", "noisy", "small"])
    scores = harness.prioritize(pod, ALL)
    assert all(0 <= s <= MAX_EXTENDER_PRIORITY for s in scores.values())
    assert scores["quiet"] > scores["noisy"]
    decision = harness.decisions.last("p")
    assert decision.result == "prioritized" and decision.node == ""
    assert decision.candidates[0].passed and decision.candidates[0].node == "quiet"
    rejected = {c.node: c.reasons for c in decision.candidates if not c.passed}
    (reason,) = rejected["noisy"]  # from the filter call before
    assert reason.startswith(RUNQ_EXCEEDED)
    assert harness.sample("interference_scheduler_extender_request_duration_seconds_count",
                          verb="prioritize") == 1  # fmt: skip


@pytest.mark.parametrize("removed", [None, "tainted"], ids=["no-change", "node-removed"])
def test_prioritize_after_filter_scores_as_without_it_when_nodes_come_and_go(
    removed: str | None,
) -> None:
    """The prioritize call reuses its filter call's table rows only while no node came or
    went: removing ``tainted`` moves the last row (``gpu``) into its place."""
    profile = Profile(scores=(("Interference", 0), ("NodeResourcesFit", 1), ("GpuPacking", 0)))
    pod = pod_obj(requests={"cpu": "500m", "memory": "64Mi"})
    offered = ["quiet", "small", "gpu"]
    after_filter, alone = (
        Harness(CycleSettings(profile=profile)),
        Harness(CycleSettings(profile=profile)),
    )
    code, answer = after_filter.filter(pod, offered)
    assert code == 200 and answer["NodeNames"] == offered
    if removed is not None:
        (node,) = (n for n in NODES if n["metadata"]["name"] == removed)
        for harness in (after_filter, alone):
            harness.cache.apply("Node", "DELETED", dict(node))
    expected = alone.prioritize(pod, offered)
    assert expected["quiet"] > expected["small"]  # the scores tell the nodes apart
    assert after_filter.prioritize(pod, offered) == expected


@pytest.mark.parametrize(
    ("total", "max_total", "score"),
    [
        (0, 300, 0),
        (300, 300, 10),
        (150, 300, 5),
        (149, 300, 5),
        (14, 300, 0),
        (16, 300, 1),
        (400, 300, 10),
        (-5, 300, 0),
        (50, 0, 0),
    ],
)
def test_extender_score(total: float, max_total: float, score: int) -> None:
    assert int(extender_scores(np.array([total]), max_total)[0]) == score


@pytest.mark.parametrize(
    ("names", "scores"),
    [
        ([], []),
        (["node-a"], [0]),
        (["node-a", "node-b", "node-c"], [10, 5, 0]),
        (['a","b', "back\\slash\\", 'quote"', "ünï", "", '","'], [1, 2, 3, 4, 5, 6]),
    ],
    ids=["no-nodes", "one-node", "plain-names", "names-needing-escapes"],
)
def test_prioritize_answer_decodes_as_host_priority_list(
    names: list[str], scores: list[int]
) -> None:
    """kube-scheduler decodes the answer into ``extenderv1.HostPriorityList``: one
    ``{"Host", "Score"}`` per offered node, in order, whatever the name holds."""
    answer = json.loads(HostPriorities(names, scores).json())
    assert answer == [{"Host": n, "Score": s} for n, s in zip(names, scores, strict=True)]


def test_served_over_http_with_keep_alive_and_metrics() -> None:
    harness = Harness()
    status = Status(synced=harness.cache.synced, config_error=lambda: "", leading=lambda: True)
    server = HealthServer(
        HttpSettings(port=0, host="127.0.0.1"),
        harness.registry,
        status,
        post_routes=harness.extender.routes(),
    )
    server.start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        pod = pod_obj(requests={"cpu": "2"}, annotations=TOLERANT)
        body = json.dumps({"Pod": pod, "NodeNames": ["quiet", "noisy", "small"]})
        connection.request("POST", "/filter", body, {"Content-Type": "application/json"})
        answer = json.loads(connection.getresponse().read())
        assert answer["NodeNames"] == ["quiet"]
        connection.request("POST", "/prioritize", body)  # the same connection, kept alive
        priorities = json.loads(connection.getresponse().read())
        assert {p["Host"] for p in priorities} == {"quiet", "noisy", "small"}
        connection.request("POST", "/bind", body)
        missing = connection.getresponse()
        assert missing.status == 404 and b"/filter, /prioritize" in missing.read()
        connection.request("GET", "/metrics")
        metrics = connection.getresponse().read().decode()
        for verb in ("filter", "prioritize"):
            assert (
                f'interference_scheduler_extender_request_duration_seconds_count{{verb="{verb}"}}'
                " 1.0" in metrics
            )
        assert 'extender_request_duration_seconds_bucket{le="0.005",verb="filter"}' in metrics
        connection.close()
    finally:
        server.stop()


def test_a_client_resetting_a_kept_alive_connection_is_no_error(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    harness = Harness()
    status = Status(synced=harness.cache.synced, config_error=lambda: "", leading=lambda: True)
    server = HealthServer(HttpSettings(port=0, host="127.0.0.1"), harness.registry, status)
    caplog.set_level(logging.DEBUG, logger="scheduler.endpoint.http")
    server.start()
    try:
        client = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        address = client.getsockname()
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.1 200")
        # close with RST while the server waits for the next request on this connection
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        deadline = time.monotonic() + 10
        while "dropped the connection" not in caplog.text:
            assert time.monotonic() < deadline, "the server never saw the reset"
            time.sleep(0.01)
    finally:
        server.stop()
    # socketserver's own report names the client; other tests' threads may write here too
    assert f"processing of request from {address}" not in capfd.readouterr().err
    assert any(str(address) in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
    own = [r for r in caplog.records if r.name == "scheduler.endpoint.http"]
    assert not [r for r in own if r.levelno >= logging.WARNING and str(address) in r.getMessage()]


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Put back the root logger's handlers and levels that ``main`` replaces (its stream
    handler would write to this test's captured stderr after the test)."""
    root, own = logging.getLogger(), logging.getLogger("scheduler")
    handlers, levels = list(root.handlers), (root.level, own.level)
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(levels[0])
    own.setLevel(levels[1])


@pytest.mark.usefixtures("root_logging")
@pytest.mark.parametrize(
    ("argv", "config", "message"),
    [
        (["extender", "--bogus"], None, "unrecognized arguments: --bogus"),
        (["extender", "--config"], None, "expected one argument"),
        (
            ["extender"],
            "cycle: {profile: {scores: {Interference: lots}}}",
            "invalid configuration",
        ),
    ],
    ids=["unknown-flag", "missing-value", "bad-config"],
)
def test_extender_subcommand_refuses_bad_input_in_one_line(
    argv: list[str],
    config: str | None,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if config is not None:
        path = tmp_path / "scheduler.yaml"
        path.write_text(config)
        argv = [*argv, "--config", str(path)]
    try:
        status = cli.main(argv)
    except SystemExit as exc:
        status = int(exc.code or 0)
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert err.startswith("interference-scheduler extender")


def test_a_new_resource_version_of_the_pod_is_read_again() -> None:
    harness = Harness()
    pod = pod_obj(annotations=TOLERANT)
    pod["metadata"]["resourceVersion"] = "1"
    assert harness.filter(pod, ["quiet", "noisy"])[1]["NodeNames"] == ["quiet"]
    assert harness.filter(pod, ["quiet", "noisy"])[1]["NodeNames"] == ["quiet"]  # remembered
    pod["metadata"]["annotations"] = {}
    pod["metadata"]["resourceVersion"] = "2"  # the tolerance was removed
    assert harness.filter(pod, ["quiet", "noisy"])[1]["NodeNames"] == ["quiet", "noisy"]
