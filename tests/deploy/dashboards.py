"""The Grafana dashboards of deploy/grafana as tests read them: every PromQL query a panel
or an annotation runs, and that query with the dashboard's variables given concrete values
(what Grafana sends to Prometheus)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.deploy.manifests import DEPLOY

GRAFANA = DEPLOY / "grafana"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")

Panel = dict[str, Any]
Dashboard = dict[str, Any]


def dashboard_files() -> list[Path]:
    return sorted(GRAFANA.glob("*.json"))


def load(path: Path) -> Dashboard:
    loaded: Dashboard = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def all_panels(panels: list[Panel]) -> Iterator[Panel]:
    """Every panel, those inside collapsed rows included."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def panel_queries(board: Dashboard) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL expression) of every target of every panel."""
    for panel in all_panels(board["panels"]):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def annotation_queries(board: Dashboard) -> Iterator[tuple[str, str]]:
    """('annotation NAME', PromQL expression) of every Prometheus annotation."""
    for annotation in board.get("annotations", {}).get("list", []):
        if annotation.get("datasource", {}).get("type") == "prometheus":
            yield f"annotation {annotation['name']}", annotation["expr"]


def queries(board: Dashboard) -> Iterator[tuple[str, str]]:
    """Every query the dashboard runs: its panels' targets, then its annotations."""
    yield from panel_queries(board)
    yield from annotation_queries(board)


def variables_in(expr: str) -> set[str]:
    """The names of the variables ``$x``, ``${x}``, ``${x:fmt}`` and ``[[x]]`` in ``expr``."""
    return {next(g for g in m.groups() if g) for m in VARIABLE.finditer(expr)}


def concrete(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with every variable replaced by its value in ``values`` (a KeyError names a
    variable that has none)."""
    return VARIABLE.sub(lambda m: values[next(g for g in m.groups() if g)], expr)
