"""The Grafana dashboards (deploy/grafana/*.json) query only series the programs export:
every PromQL expression of every panel and annotation is tokenized and each metric name in
it is looked up among the series of the metric classes the scheduler, the agent and the
credential issuer register and of the agent's signal collector (built here on fresh
registries, so a renamed metric fails this test). Every panel has a title and the templated
Prometheus datasource, every registered metric is on some panel, each dashboard has what
Grafana needs to import it, and deploy/grafana renders each as a ConfigMap the Grafana
sidecar loads. tests/e2e/test_dashboard_queries.py runs every query against a real
Prometheus scraping the real programs."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from prometheus_client import CollectorRegistry

from credential_issuer.issuer import IssuerMetrics
from interference.signals import SIGNAL_FAMILIES, NodeMetrics, NodeReport, PodMetrics
from node_agent.health import AgentMetrics
from node_agent.signal_metrics import SignalCollector
from node_agent.tolerances import PodTolerance
from scheduler.adapters.preemption import PreemptionMetrics
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.adapters.tracing import TracingMetrics
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.extender.metrics import ExtenderMetrics
from scheduler.rebalancing.metrics import RebalanceMetrics
from tests.deploy.dashboards import (
    BUILTIN_VARIABLES,
    DATASOURCE,
    GRAFANA,
    Dashboard,
    all_panels,
    annotation_queries,
    dashboard_files,
    load,
    queries,
    variables_in,
)
from tests.deploy.manifests import find, kustomizations, render

SCHEDULER_DASHBOARD = GRAFANA / "interference-scheduler.json"
SIGNALS_DASHBOARD = GRAFANA / "interference-signals.json"
ROWS = {
    "interference-scheduler": [
        "Signal plane",
        "Decisions",
        "Redis",
        "Agents",
        "Credential issuer",
        "Configuration",
        "Evictions",
    ],
    "interference-signals": [
        "Nodes",
        "Pods with a tolerance",
        "Antagonists",
        "Scheduler and agents",
    ],
}
CONFIGMAPS = {
    "interference-scheduler.json": "interference-scheduler-dashboard",
    "interference-signals.json": "interference-signals-dashboard",
}
DASHBOARDS = [pytest.param(path, id=path.stem) for path in dashboard_files()]

# --- what the programs register -----------------------------------------------------

SERIES_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
"""The series names a family of each type is exposed as (counters only with ``_total``)."""


def program_registries() -> dict[str, CollectorRegistry]:
    """Each program's registry with the metric classes it registers, as its CLI builds it
    (the extender CLI puts the scheduler's, the extender's and the signal metrics on one)."""
    scheduler = CollectorRegistry()
    SchedulerMetrics(scheduler)
    ExtenderMetrics(scheduler)
    SignalMetrics(scheduler)
    TracingMetrics(scheduler)
    RebalanceMetrics(scheduler)
    PreemptionMetrics(scheduler)
    agent = CollectorRegistry()
    AgentMetrics(agent)
    agent.register(signal_collector())
    issuer = CollectorRegistry()
    IssuerMetrics(issuer)
    return {"scheduler": scheduler, "agent": agent, "issuer": issuer}


def signal_collector() -> SignalCollector:
    """The agent's signal collector after a report in which every family was measured and
    a pod declares every tolerance, so that each of its families has samples."""
    tolerance = PodTolerance(max_runq_p99_us=500, max_reclaim_stall_ms_per_s=2.5, max_index=40)
    collector = SignalCollector("n1", tolerance_of=lambda _uid: tolerance)
    pod = PodMetrics("shop", "api", uid="uid-1", runq_us=(5,))
    report = NodeReport("n1", 100.0, 1.0, NodeMetrics(), pods=[pod], measured=SIGNAL_FAMILIES)
    collector.observe(report, ncpu=1)
    return collector


@functools.cache
def exported_series() -> dict[str, str]:
    """Series name → metric family name, for every series the programs can expose: each
    family's names by type (a labelled metric with no child yet has no sample) and every
    sample a collect returns (the custom BulkHistogram collector's included)."""
    series: dict[str, str] = {}
    for registry in program_registries().values():
        for family in registry.collect():
            for suffix in SERIES_SUFFIXES[family.type]:
                series[family.name + suffix] = family.name
            for sample in family.samples:
                series[sample.name] = family.name
    return series


# --- what the dashboard queries -----------------------------------------------------

FUNCTIONS = {
    # aggregation operators
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
    # functions
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max",
    "clamp_min", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "delta",
    "deriv", "exp", "floor", "histogram_avg", "histogram_count", "histogram_fraction",
    "histogram_quantile", "histogram_stddev", "histogram_stdvar", "histogram_sum",
    "double_exponential_smoothing", "holt_winters", "hour", "idelta", "increase", "irate",
    "label_join", "label_replace", "ln", "log2", "log10", "minute", "month",
    "predict_linear", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc",
    "sort_by_label", "sort_by_label_desc", "sqrt", "time", "timestamp", "vector", "year",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
    "quantile_over_time", "stddev_over_time", "stdvar_over_time", "last_over_time",
    "present_over_time", "mad_over_time", "acos", "acosh", "asin", "asinh", "atan",
    "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh", "deg", "rad", "pi",
}  # fmt: skip
"""PromQL's aggregation operators and functions: names called with ``(``."""

KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "atan2", "offset", "inf", "nan",
}  # fmt: skip
"""PromQL's keywords and word operators: never a metric name."""

GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
MATCHERS = re.compile(r"\{[^{}]*\}")
RANGE = re.compile(r"\[[^\[\]]*\]")
VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
IDENTIFIER = re.compile(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Strings, label matchers ``{…}``, ranges ``[…]``, Grafana variables and the clauses
    ``by (…)``, ``without (…)``, ``on (…)``, ``ignoring (…)``, ``group_left (…)`` and
    ``group_right (…)`` are dropped;
    of the identifiers left, keywords are skipped, one followed by ``(`` must be a PromQL
    function (else the expression is reported, so a misspelt function is no metric), and
    every other one is a metric name.
    """
    text = STRING.sub(" ", expr)
    text = MATCHERS.sub(" ", text)
    text = RANGE.sub(" ", text)
    text = VARIABLE.sub(" ", text)
    text = GROUPING.sub(" ", text)
    names = set()
    for match in IDENTIFIER.finditer(text):
        word, call = match.group(1), match.group(2)
        if word in KEYWORDS:
            continue
        if call:
            assert word in FUNCTIONS, f"{word}( is no PromQL function in {expr!r}"
        else:
            names.add(word)
    return names


def unknown_metrics(board: Dashboard) -> list[str]:
    """'panel: name' for each metric name queried that no program exports."""
    exported = exported_series()
    return [
        f"{title}: {name}"
        for title, expr in queries(board)
        for name in sorted(metric_names(expr))
        if name not in exported
    ]


@functools.cache
def load_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def dashboard(path: Path = SCHEDULER_DASHBOARD) -> Dashboard:
    return load(path)


# --- tests --------------------------------------------------------------------------


def test_the_tokenizer_finds_the_metric_names() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, verb) (rate(a_bucket{verb="filter",le!~"1.*"}'
        "[$__rate_interval])))"
        " / on (instance) group_left (node) max without (pod) (b_info offset 5m) > bool 1e3"
        " and count(c:recorded) unless sum(rate(d_total[${window}:1m]))"
    )
    assert metric_names(expr) == {"a_bucket", "b_info", "c:recorded", "d_total"}
    with pytest.raises(AssertionError, match="rtae"):
        metric_names("rtae(a_total[5m])")


@pytest.mark.parametrize("path", DASHBOARDS)
def test_every_metric_the_dashboard_queries_is_exported(path: Path) -> None:
    assert list(queries(dashboard(path))), "the dashboard has no queries"
    assert unknown_metrics(dashboard(path)) == []


def test_a_made_up_or_renamed_metric_is_reported() -> None:
    broken = dashboard()
    panel = next(p for p in all_panels(broken["panels"]) if p.get("targets"))
    panel["targets"] = [
        {
            **panel["targets"][0],
            "expr": "sum(rate(interference_scheduler_made_up_total[$__rate_interval]))"
            " / sum(rate(interference_scheduler_attempts[5m]))",  # the family, no _total
        }
    ]
    assert unknown_metrics(broken) == [
        f"{panel['title']}: interference_scheduler_attempts",
        f"{panel['title']}: interference_scheduler_made_up_total",
    ]


def test_a_made_up_metric_in_an_annotation_is_reported() -> None:
    broken = dashboard(SIGNALS_DASHBOARD)
    annotation = broken["annotations"]["list"][1]
    annotation["expr"] = "sum(increase(interference_scheduler_rebalance_made_up_total[5m]))"
    assert unknown_metrics(broken) == [
        f"annotation {annotation['name']}: interference_scheduler_rebalance_made_up_total"
    ]


def test_every_exported_metric_is_on_a_dashboard() -> None:
    """A new metric gets a panel (or is named here with the reason it has none)."""
    exported = exported_series()
    used = {
        exported[name]
        for path in dashboard_files()
        for _, expr in queries(dashboard(path))
        for name in metric_names(expr)
        if name in exported
    }
    assert sorted(set(exported.values()) - used) == []


def test_the_registries_are_the_programs() -> None:
    """Each program's registry holds its own metrics, under the project's prefixes."""
    prefixes = {
        "scheduler": ("interference_scheduler_",),
        "agent": ("interference_agent_", "interference_node_", "interference_pod_"),
        "issuer": ("interference_credentials_",),
    }
    for program, registry in program_registries().items():
        names = [family.name for family in registry.collect()]
        assert names and all(n.startswith(prefixes[program]) for n in names), program
    assert "interference_scheduler_signal_age_seconds_bucket" in exported_series()
    assert "interference_node_runq_delay_seconds_bucket" in exported_series()
    assert "interference_pod_tolerance_runq_p99_seconds" in exported_series()


@pytest.mark.parametrize("path", DASHBOARDS)
def test_every_panel_has_a_title_and_the_templated_datasource(path: Path) -> None:
    board = dashboard(path)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for panel in all_panels(board["panels"]):
        assert panel.get("title"), f"panel {panel.get('id')} has no title"
        if panel["type"] == "row":
            continue
        assert panel.get("datasource") == DATASOURCE, panel["title"]
        assert panel.get("targets"), panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource") == DATASOURCE, panel["title"]
            assert target.get("expr"), panel["title"]
    for title, expr in queries(board):
        for var in variables_in(expr):
            assert var in BUILTIN_VARIABLES or var in variables, (title, var)


@pytest.mark.parametrize("path", DASHBOARDS)
def test_every_datasource_is_the_variable(path: Path) -> None:
    """No datasource uid of one Grafana instance is left in the file."""
    uids = set(re.findall(r'"uid":\s*"([^"]*)"', load_text(path)))
    assert uids == {"${DS_PROMETHEUS}", "-- Grafana --", path.stem}


@pytest.mark.parametrize("path", DASHBOARDS)
def test_rows_and_layout(path: Path) -> None:
    board = dashboard(path)
    assert board["uid"] == path.stem
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ROWS[path.stem]
    cells: dict[tuple[int, int], str] = {}
    for panel in all_panels(board["panels"]):
        pos = panel["gridPos"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_the_scheduler_dashboard_says_what_it_holds() -> None:
    assert "the rebalancer's evictions" in dashboard()["description"]


def test_the_signals_dashboard_has_what_a_user_looks_at() -> None:
    """A heatmap of the node's run-queue histogram per node; each pod with a tolerance its
    own panel with the tolerance as a second series; evictions and the rebalancer's looks
    as annotations; antagonists per node; the scheduler's health beside (a row, and a
    link to its dashboard, which links back)."""
    board = dashboard(SIGNALS_DASHBOARD)
    panels = {p["title"]: p for p in all_panels(board["panels"])}
    heatmap = panels["Run-queue delay on $node"]
    assert heatmap["type"] == "heatmap" and heatmap["repeat"] == "node"
    (target,) = heatmap["targets"]
    assert target["format"] == "heatmap" and target["legendFormat"] == "{{le}}"
    assert "rate(interference_node_runq_delay_seconds_bucket{" in target["expr"]
    assert target["expr"].startswith("sum by (le) (")
    pod = panels["$pod: run-queue p99 and its tolerance"]
    assert pod["repeat"] == "pod"
    exprs = [t["expr"] for t in pod["targets"]]
    assert "interference_pod_runq_p99_seconds{" in exprs[0]
    assert "interference_pod_tolerance_runq_p99_seconds{" in exprs[1]
    annotations = dict(annotation_queries(board))
    assert "interference_scheduler_rebalance_evictions_total" in annotations["annotation Evictions"]
    assert (
        "interference_scheduler_rebalance_looks_total" in annotations["annotation Rebalancer looks"]
    )
    assert "topk by (node)" in panels["Top antagonists per node now"]["targets"][0]["expr"]
    variables = [v["name"] for v in board["templating"]["list"]]
    assert variables == ["DS_PROMETHEUS", "node", "namespace", "pod", "window"]
    assert [link["url"] for link in board["links"]] == ["/d/interference-scheduler"]
    assert [link["url"] for link in dashboard()["links"]] == ["/d/interference-signals"]


# --- what Grafana needs to import a dashboard -------------------------------------------

# No offline validator exists: Grafana's schema is CUE inside Grafana, and the Python
# SDK that mirrors it (grafana-foundation-sdk) reads any JSON without a complaint. So this
# checks what an import needs: the fields Grafana reads, their types, unique ids and refIds,
# grid positions on its 24 columns, repeats of variables that hold several values, and
# dashboard links to dashboards that exist here.
PANEL_TYPES = {"row", "timeseries", "stat", "table", "heatmap", "gauge", "bargauge", "text"}
VARIABLE_TYPES = {"datasource", "query", "custom", "constant", "interval", "textbox"}
UID = re.compile(r"[A-Za-z0-9_-]{1,40}")


def import_problems(board: Dashboard) -> list[str]:
    """What would keep Grafana from importing ``board`` as it is meant (empty when none)."""
    problems: list[str] = []

    def need(ok: object, problem: str) -> None:
        if not ok:
            problems.append(problem)

    need(isinstance(board.get("uid"), str) and UID.fullmatch(board["uid"]), "uid")
    need(isinstance(board.get("title"), str) and board["title"], "title")
    need(isinstance(board.get("schemaVersion"), int) and board["schemaVersion"] >= 36,
         "schemaVersion (36 is Grafana 9.0's)")  # fmt: skip
    need(isinstance(board.get("time"), dict) and {"from", "to"} <= board["time"].keys(), "time")
    need(all(isinstance(t, str) for t in board.get("tags", [])), "tags")
    variables = board.get("templating", {}).get("list")
    need(isinstance(variables, list), "templating.list")
    names = [v.get("name") for v in variables or []]
    need(len(names) == len(set(names)), f"variable names repeat: {names}")
    several = set()
    for variable in variables or []:
        name = variable.get("name")
        need(variable.get("type") in VARIABLE_TYPES, f"variable {name}: type")
        if variable.get("type") == "query":
            need(variable.get("datasource") == DATASOURCE, f"variable {name}: datasource")
            need(variable.get("query", {}).get("query"), f"variable {name}: query")
        if variable.get("type") == "custom":
            values = [o["value"] for o in variable.get("options", [])]
            need(variable.get("query") == ",".join(values), f"variable {name}: options")
            need(variable.get("current", {}).get("value") in values, f"variable {name}: current")
        if variable.get("multi") or variable.get("includeAll"):
            several.add(name)
    annotations = board.get("annotations", {}).get("list")
    need(isinstance(annotations, list), "annotations.list")
    for annotation in annotations or []:
        name = annotation.get("name")
        need(name and isinstance(annotation.get("enable"), bool), f"annotation {name}")
        if not annotation.get("builtIn"):
            need(annotation.get("datasource") == DATASOURCE, f"annotation {name}: datasource")
            need(annotation.get("expr"), f"annotation {name}: expr")
    uids = {p.stem for p in dashboard_files()}
    for link in board.get("links", []):
        need(link.get("type") in {"link", "dashboards"}, f"link {link.get('title')}: type")
        url = link.get("url", "")
        if link.get("type") == "link":
            need(url.removeprefix("/d/") in uids, f"link {link.get('title')}: {url}")
    ids = []
    for panel in all_panels(board.get("panels") or []):
        title = panel.get("title")
        ids.append(panel.get("id"))
        need(isinstance(panel.get("id"), int), f"{title}: id")
        need(panel.get("type") in PANEL_TYPES, f"{title}: type {panel.get('type')}")
        pos = panel.get("gridPos", {})
        need(
            all(isinstance(pos.get(k), int) for k in "hwxy")
            and pos["w"] > 0
            and pos["h"] > 0
            and pos["x"] >= 0
            and pos["x"] + pos["w"] <= 24,
            f"{title}: gridPos {pos}",
        )
        if "repeat" in panel:
            need(panel["repeat"] in several, f"{title}: repeats {panel['repeat']}")
            need(panel.get("repeatDirection") in {"h", "v"}, f"{title}: repeatDirection")
        if panel.get("type") == "row":
            continue
        refs = [t.get("refId") for t in panel.get("targets", [])]
        need(refs and all(refs) and len(refs) == len(set(refs)), f"{title}: refIds {refs}")
        need(
            isinstance(panel.get("fieldConfig", {}).get("defaults"), dict), f"{title}: fieldConfig"
        )
    need(len(ids) == len(set(ids)), f"panel ids repeat: {ids}")
    return problems


@pytest.mark.parametrize("path", DASHBOARDS)
def test_the_dashboard_has_what_grafana_needs_to_import_it(path: Path) -> None:
    assert import_problems(dashboard(path)) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda b: b.pop("uid"), "uid"),
        (lambda b: b.update(uid="no spaces allowed"), "uid"),
        (lambda b: b.update(schemaVersion="39"), "schemaVersion"),
        (lambda b: b["panels"][2].update(id=b["panels"][1]["id"]), "panel ids repeat"),
        (lambda b: b["panels"][1]["gridPos"].update(x=20), "gridPos"),
        (lambda b: b["panels"][1].update(type="graph-of-my-own"), "type graph-of-my-own"),
        (lambda b: b["panels"][1].update(repeat="window"), "repeats window"),
        (lambda b: b["panels"][2]["targets"][1].update(refId="A"), "refIds"),
        (lambda b: b["links"][0].update(url="/d/made-up"), "/d/made-up"),
        (lambda b: b["templating"]["list"][4]["current"].update(value="5m"), "window: current"),
        (lambda b: b["annotations"]["list"][1].pop("expr"), "annotation Evictions: expr"),
    ],
)
def test_the_import_check_can_fail(change: Any, problem: str) -> None:
    board = dashboard(SIGNALS_DASHBOARD)
    change(board)
    assert any(problem in found for found in import_problems(board)), import_problems(board)


def test_deploy_grafana_renders_each_dashboard_as_a_configmap_for_the_sidecar() -> None:
    objects = render(GRAFANA)
    assert [o["kind"] for o in objects] == ["ConfigMap"] * len(CONFIGMAPS)
    assert sorted(CONFIGMAPS) == [p.name for p in dashboard_files()]
    for file, name in CONFIGMAPS.items():
        configmap = find(objects, "ConfigMap", name)
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["namespace"] == "interference-system"
        assert json.loads(configmap["data"][file]) == dashboard(GRAFANA / file)
        kubernetes_validate.validate(configmap, "1.33", strict=True)


@pytest.mark.parametrize("name", sorted(kustomizations()))
def test_the_dashboard_is_not_installed_by_the_base_or_an_overlay(name: str) -> None:
    """Optional: not every cluster runs Grafana."""
    labelled = [
        o["metadata"]["name"]
        for o in render(kustomizations()[name])
        if "grafana_dashboard" in o["metadata"].get("labels", {})
    ]
    assert labelled == []
