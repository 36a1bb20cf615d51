"""The Grafana dashboard (deploy/grafana/interference-scheduler.json) queries only series the
programs export: every PromQL expression of every panel is tokenized and each metric name in
it is looked up among the series of the metric classes the scheduler, the agent and the
credential issuer register (built here on fresh registries, so a renamed metric fails this
test). Every panel has a title and the templated Prometheus datasource, every registered
metric is on some panel, and deploy/grafana renders the dashboard as a ConfigMap the Grafana
sidecar loads."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
from prometheus_client import CollectorRegistry

from credential_issuer.issuer import IssuerMetrics
from node_agent.health import AgentMetrics
from scheduler.adapters.preemption import PreemptionMetrics
from scheduler.adapters.redis_signals import SignalMetrics
from scheduler.adapters.tracing import TracingMetrics
from scheduler.extender import ExtenderMetrics
from scheduler.metrics import SchedulerMetrics
from scheduler.rebalancer import RebalanceMetrics
from tests.deploy.manifests import DEPLOY, find, kustomizations, render

GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "interference-scheduler.json"
ROWS = [
    "Signal plane",
    "Decisions",
    "Redis",
    "Agents",
    "Credential issuer",
    "Configuration",
    "Evictions",
]
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

Panel = dict[str, Any]

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
    issuer = CollectorRegistry()
    IssuerMetrics(issuer)
    return {"scheduler": scheduler, "agent": agent, "issuer": issuer}


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
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}


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


def all_panels(panels: list[Panel]) -> Iterator[Panel]:
    """Every panel, those inside collapsed rows included."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL expression) of every target of every panel."""
    for panel in all_panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def unknown_metrics(dashboard: dict[str, Any]) -> list[str]:
    """'panel: name' for each metric name queried that no program exports."""
    exported = exported_series()
    return [
        f"{title}: {name}"
        for title, expr in queries(dashboard)
        for name in sorted(metric_names(expr))
        if name not in exported
    ]


@functools.cache
def load_text() -> str:
    return DASHBOARD.read_text(encoding="utf-8")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(load_text())
    return loaded


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


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    assert list(queries(dashboard())), "the dashboard has no queries"
    assert unknown_metrics(dashboard()) == []


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


def test_every_exported_metric_is_on_the_dashboard() -> None:
    """A new metric gets a panel (or is named here with the reason it has none)."""
    exported = exported_series()
    used = {exported[n] for _, e in queries(dashboard()) for n in metric_names(e) if n in exported}
    assert sorted(set(exported.values()) - used) == []


def test_the_registries_are_the_programs() -> None:
    """Each program's registry holds its own metrics, under the project's prefixes."""
    prefixes = {
        "scheduler": "interference_scheduler_",
        "agent": "interference_agent_",
        "issuer": "interference_credentials_",
    }
    for program, registry in program_registries().items():
        names = [family.name for family in registry.collect()]
        assert names and all(n.startswith(prefixes[program]) for n in names), program
    assert "interference_scheduler_signal_age_seconds_bucket" in exported_series()


def test_every_panel_has_a_title_and_the_templated_datasource() -> None:
    board = dashboard()
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
            for var in re.findall(r"\$\{?(\w+)", target["expr"]):
                assert var in BUILTIN_VARIABLES or var in variables, (panel["title"], var)


def test_every_datasource_is_the_variable() -> None:
    """No datasource uid of one Grafana instance is left in the file."""
    uids = set(re.findall(r'"uid":\s*"([^"]*)"', load_text()))
    assert uids == {"${DS_PROMETHEUS}", "-- Grafana --", "interference-scheduler"}


def test_rows_and_layout() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 36  # Grafana 9.0+; 39 is Grafana 10.4's
    assert board["uid"] == "interference-scheduler"
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ROWS
    assert "the rebalancer's evictions" in board["description"]
    panels = list(all_panels(board["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_deploy_grafana_renders_the_dashboard_configmap_for_the_sidecar() -> None:
    objects = render(GRAFANA)
    assert [o["kind"] for o in objects] == ["ConfigMap"]
    configmap = find(objects, "ConfigMap", "interference-scheduler-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "interference-system"
    assert json.loads(configmap["data"]["interference-scheduler.json"]) == dashboard()
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
