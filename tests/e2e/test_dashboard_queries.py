"""Every query of every dashboard in deploy/grafana against a real Prometheus (Debian's)
scraping a real agent (kernel probes, a pod that declares a tolerance beside a pod that
makes it wait) and a real scheduler (leading, rebalancing, on the real apiserver): each
panel target and annotation, its variables given concrete values, returns at least one
series, and each variable's values hold the node and pod under test. A panel that queries
a metric nobody exports, or a series the programs stopped exporting, has none. Of the
scheduler dashboard, the series of programs and modes not run here are named with why."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from interference_cli.redis_process import free_port
from node_agent.settings import detect_cgroup_v2_mount
from tests.deploy.dashboards import GRAFANA, Dashboard, concrete, dashboard_files, load, queries
from tests.e2e.conftest import start_scheduler
from tests.e2e.kube import SchedulerProcess
from tests.node_agent.bpf_workloads import BUSY_LOOP, many_started_in, require_root, started_in
from tests.node_agent.own_cgroups import cgroup_tree, unique_name
from tests.prometheus_server import MISSING, PrometheusServer, prometheus_missing

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.bpf,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.skipif(prometheus_missing(), reason=MISSING),
]

AGENT = str(Path(sys.executable).with_name("interference-agent"))
NAMESPACE = "test"
VICTIM = "victim"
"""The pod that declares a run-queue tolerance (and every other one, for their panels)."""
TOLERANCE = {
    "interference.io/max-runq-p99-us": "500",
    "interference.io/max-reclaim-stall-ms-per-s": "2.5",
    "interference.io/max-index": "40",
}
GRAFANA_INTERVALS = {"__rate_interval": "5s", "__interval": "2s", "__range": "5m"}
"""Grafana's built-in variables at a 1 s scrape interval (rate needs two samples)."""
SERIES_WITHIN_S = 60.0
SIGNALS = GRAFANA / "interference-signals.json"
NOT_HERE = {
    **dict.fromkeys(
        (
            "interference_scheduler_extender_interference_relaxed_total",
            "interference_scheduler_extender_requests_total",
            "interference_scheduler_extender_refused_total",
            "interference_scheduler_extender_unknown_pod_records_total",
            "interference_scheduler_extender_unwritten_pod_warnings_total",
            "interference_scheduler_extender_request_duration_seconds_bucket",
            "interference_scheduler_extender_filtered_nodes_total",
        ),
        "extender mode only",
    ),
    **dict.fromkeys(
        (
            "interference_credentials_issued_total",
            "interference_credentials_refused_total",
            "interference_credentials_http_refused_total",
            "interference_credentials_replica_failures_total",
            "interference_credentials_cutoffs_total",
            "interference_credentials_warden_errors_total",
            "interference_credentials_node_events_written_total",
            "interference_credentials_node_events_failed_total",
            "interference_credentials_request_duration_seconds_bucket",
        ),
        "the credential issuer's (tests/credential_issuer)",
    ),
    **dict.fromkeys(
        ("interference_scheduler_traces_total", "interference_scheduler_traces_dropped_total"),
        "only with tracing on",
    ),
    **dict.fromkeys(
        (
            "interference_scheduler_attempt_duration_seconds_bucket",
            "interference_scheduler_side_effect_errors_total",
            "interference_scheduler_malformed_objects_total",
            "interference_scheduler_preemptions_total",
            "interference_scheduler_preemption_call_errors_total",
        ),
        "a labelled series appears with its first event (no pod is scheduled here)",
    ),
    "interference_agent_probe_disabled": "only a disabled probe has a series (none is here)",
}
"""The scheduler dashboard's series this test's programs do not export, and why; every
query of the signals dashboard must return series."""
PROJECT_METRIC = re.compile(r"\binterference_\w+")


@pytest.fixture
def agent_under_load(tmp_path: Path, redis_url: str) -> Iterator[tuple[str, int]]:
    """A real ``interference-agent`` (kernel probes) limited to a cgroup subtree of its own
    in which the victim pod (one busy loop, a tolerance) shares CPU 0 with the hog pod (three
    busy loops); its node name and metrics port. Stopped and cleaned up by PID."""
    require_root()
    root = unique_name("intf-test-g")
    node = f"dash-node-{uuid.uuid4().hex[:6]}"
    hog_uid, victim_uid = str(uuid.uuid4()), str(uuid.uuid4())
    pods_file = tmp_path / "pods.yaml"
    annotations = ", ".join(f"{k}: '{v}'" for k, v in TOLERANCE.items())
    pods_file.write_text(
        f"{hog_uid}: {NAMESPACE}/hog\n"
        f"{victim_uid}:\n  pod: {NAMESPACE}/{VICTIM}\n  annotations: {{{annotations}}}\n"
    )
    port = free_port()
    with cgroup_tree(detect_cgroup_v2_mount(), root) as top:
        qos = top / "kubepods" / "besteffort"
        hog, victim = qos / f"pod{hog_uid}" / ("b" * 64), qos / f"pod{victim_uid}" / ("c" * 64)
        hog.mkdir(parents=True)
        victim.mkdir(parents=True)
        with (
            many_started_in(3, [hog / "cgroup.procs"], BUSY_LOOP, cpu=0),
            started_in([victim / "cgroup.procs"], BUSY_LOOP, cpu=0),
            (tmp_path / "agent.log").open("wb") as log,
        ):
            argv = [AGENT, "--node-name", node, "--no-kubernetes", "--redis-url", redis_url]
            argv += ["--cgroup-root", f"/{root}", "--pods-file", str(pods_file)]
            agent = subprocess.Popen(
                [*argv, "--http-port", str(port)], stdout=log, stderr=subprocess.STDOUT
            )
            try:
                yield node, port
            finally:
                os.kill(agent.pid, signal.SIGTERM)
                try:
                    agent.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.kill(agent.pid, signal.SIGKILL)
                    agent.wait()
                print("--- agent log (last 30 lines) ---")
                print("\n".join((tmp_path / "agent.log").read_text().splitlines()[-30:]))


@pytest.fixture
def prometheus(
    tmp_path: Path,
    agent_under_load: tuple[str, int],
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
) -> Iterator[PrometheusServer]:
    """Prometheus scraping the agent and a leading scheduler that looks every second."""
    _, agent_port = agent_under_load
    scheduler = start_scheduler(
        schedulers,
        tmp_path,
        scheduler_kubeconfig,
        redis_url,
        "dashboard-scheduler",
        extra={"rebalancer": {"mode": "dry_run", "interval_s": 1.0}},
    )
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    server = PrometheusServer(
        workdir,
        {
            "interference-agent": [f"127.0.0.1:{agent_port}"],
            "interference-scheduler": [f"127.0.0.1:{scheduler.http_port}"],
        },
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def variable_values(board: Dashboard, node: str) -> dict[str, str]:
    """One concrete value per variable: the node and the pod under test, the rebalancer's
    default window, Grafana's intervals."""
    values = {**GRAFANA_INTERVALS, "node": node, "namespace": NAMESPACE, "pod": VICTIM}
    values["window"] = "60s"
    values["DS_PROMETHEUS"] = "prometheus"
    names = {v["name"] for v in board["templating"]["list"]}
    assert names <= values.keys(), f"no test value for {names - values.keys()}"
    return values


def empty_queries(server: PrometheusServer, node: str) -> list[str]:
    """'dashboard: panel: query' for each query that returns no series now, but those of
    the scheduler dashboard whose every metric is one :data:`NOT_HERE` names."""
    empty = []
    for path in dashboard_files():
        board = load(path)
        values = variable_values(board, node)
        for title, expr in queries(board):
            promql = concrete(expr, values)
            if server.query(promql):
                continue
            if path.stem == "interference-scheduler" and not_here(promql):
                continue
            empty.append(f"{path.name}: {title}: {promql}")
    return empty


def not_here(promql: str) -> bool:
    return set(PROJECT_METRIC.findall(promql)) <= NOT_HERE.keys()


def test_every_dashboard_query_returns_series_from_the_real_programs(
    prometheus: PrometheusServer, agent_under_load: tuple[str, int]
) -> None:
    node, _ = agent_under_load
    deadline = time.monotonic() + SERIES_WITHIN_S
    empty = empty_queries(prometheus, node)
    while empty and time.monotonic() < deadline:
        time.sleep(1.0)
        empty = empty_queries(prometheus, node)
    assert prometheus.targets_health() == {
        "interference-agent": "up",
        "interference-scheduler": "up",
    }
    assert empty == [], "\n".join(empty)
    asked = [expr for path in dashboard_files() for _, expr in queries(load(path))]
    assert len(asked) > 60  # both dashboards' panels and annotations were asked
    named = {name for expr in asked for name in PROJECT_METRIC.findall(expr)}
    assert NOT_HERE.keys() <= named, "NOT_HERE names a metric no dashboard queries"
    signals = load(SIGNALS)
    values = variable_values(signals, node)
    # a renamed metric has no series: the check above would name its panel
    heatmap = next(e for t, e in queries(signals) if t == "Run-queue delay on $node")
    renamed = heatmap.replace("runq_delay_seconds_bucket", "runq_delay_bucket")
    assert renamed != heatmap and not prometheus.query(concrete(renamed, values))
    # each variable's values (Grafana's label_values) hold the node and pod under test
    for variable in signals["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match, label = parse_label_values(concrete(variable["query"]["query"], values))
        assert values[variable["name"]] in prometheus.label_values(label, match), variable


def parse_label_values(query: str) -> tuple[str, str]:
    """``(selector, label)`` of Grafana's ``label_values(selector, label)``."""
    assert query.startswith("label_values(") and query.endswith(")"), query
    selector, _, label = query[len("label_values(") : -1].rpartition(",")
    return selector.strip(), label.strip()
