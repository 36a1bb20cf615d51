"""`interference recommend-tolerance --prometheus`: a real Prometheus scrapes two exporters
that serve the agent's own :class:`node_agent.signal_metrics.SignalCollector` (a quiet node
and a noisy one, each with a pod of the workload that declares a tolerance), and the
command reads the series back with query_range."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from interference.signals import NodeMetrics, NodeReport, PodMetrics, WindowMetrics
from interference_cli import tolerance_sources
from interference_cli.errors import CliError
from interference_cli.main import main
from interference_cli.redis_process import free_port
from interference_cli.tolerance_sources import from_prometheus
from node_agent.signal_metrics import SignalCollector
from node_agent.tolerances import PodTolerance
from tests.prometheus_server import MISSING, PrometheusServer, prometheus_missing

pytestmark = [pytest.mark.slow, pytest.mark.skipif(prometheus_missing(), reason=MISSING)]
DECLARED_US = 500.0
NODES = {
    # node: (its 10 s window's run-queue p99 µs, {the workload's pods on it: their p99 µs})
    "node-quiet": (2000.0, {"web-0": 1500.0, "web-2": 1500.0}),
    "node-noisy": (40000.0, {"web-1": 30000.0}),
}


def _report(node: str, now: float) -> NodeReport:
    node_p99, pods = NODES[node]
    return NodeReport(
        node,
        now,
        1.0,
        NodeMetrics(runq_p99_us=node_p99 / 2),
        pods=[
            PodMetrics("shop", pod, uid=f"uid-{pod}", runq_p99_us=p99, cpu_ms_per_s=100)
            for pod, p99 in pods.items()
        ],
        measured=("runq",),
        windows={"10s": WindowMetrics(10.0, covered_s=10.0, intervals=10, runq_p99_us=node_p99)},
    )


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prometheus at its URL, scraping both exporters every second, once both are in."""
    servers = []
    targets = []
    for node in NODES:
        registry = CollectorRegistry()
        collector = SignalCollector(
            node, tolerance_of=lambda _uid: PodTolerance(max_runq_p99_us=DECLARED_US)
        )
        collector.observe(_report(node, time.time()), ncpu=4)
        registry.register(collector)
        port = free_port()
        servers.append(start_http_server(port, "127.0.0.1", registry))
        targets.append(f"127.0.0.1:{port}")
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"),
                              {"interference-agent": targets})  # fmt: skip
    try:
        server.start()
        _await_series(server)
        yield server.url
    finally:
        server.stop()
        for http_server, thread in servers:
            http_server.shutdown()
            http_server.server_close()
            thread.join(timeout=5)


def _await_series(server: PrometheusServer) -> None:
    """Until every pod's series have been scraped a few times; fails with the log."""
    deadline = time.monotonic() + 60
    query = 'count_over_time(interference_pod_runq_p99_seconds{window="latest"}[1m])'
    while time.monotonic() < deadline:
        result = server.query(query)
        if len(result) == 3 and all(float(r["value"][1]) >= 3 for r in result):
            return
        time.sleep(0.5)
    pytest.fail(f"Prometheus did not scrape both exporters: {server.log()[-2000:]}")


def test_prometheus_series_give_the_workload_the_nodes_and_the_declared_tolerance(
    prometheus: str,
) -> None:
    samples = from_prometheus(prometheus, "shop", "web", "10s", period_s=120)
    assert samples.pods == {"web-0", "web-1", "web-2"}
    assert set(samples.node_p99s) == set(NODES)
    # the node series of the 10s window, not the latest interval's (half of it)
    for node, (node_p99, _) in NODES.items():
        assert {round(v) for v in samples.node_p99s[node]} == {round(node_p99)}
    assert {round(v) for v in samples.workload_p99s} == {1500, 30000}
    assert samples.declared_us == pytest.approx(DECLARED_US)
    assert samples.covered_s > 0


def test_the_command_recommends_from_prometheus(
    prometheus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "recommend-tolerance",
            "shop/web",
            "--prometheus",
            prometheus,
            "--period",
            "2m",
            "-o",
            "json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    document = json.loads(out)
    # two of the workload's three pods measure 1500 µs (its p50), under the quiet node's
    # 2000 µs level, which bounds: 2000 · 1.15
    assert document["target_us"] == 2300 and document["bound_by"] == "quietest node"
    assert document["workload_p99"]["p50_us"] == pytest.approx(1500)
    assert document["declared_us"] == pytest.approx(DECLARED_US)
    assert document["passing_at_declared"] == 0
    assert document["nodes"][0]["node"] == "node-quiet"
    assert document["source"] == f"Prometheus at {prometheus}"


def test_an_answer_over_the_size_bound_is_refused_unread(
    prometheus: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tolerance_sources, "MAX_PROMETHEUS_BYTES", 100)
    with pytest.raises(CliError, match="more than 100 bytes; ask for a shorter --period"):
        from_prometheus(prometheus, "shop", "web", "10s", period_s=120)


def test_an_unreachable_prometheus_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code = main(["recommend-tolerance", "shop/web", "--prometheus", url])
    _, err = capsys.readouterr()
    assert code == 1 and err.count("\n") == 1 and f"cannot reach Prometheus at {url}" in err
