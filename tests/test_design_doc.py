"""docs/design.md §5.1 matches the plugins the registry holds: every plugin has a row,
and each row's status, events and args are the plugin's own declarations."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from scheduler.plugins.base import Code
from scheduler.plugins.registry import REGISTRY

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def plugin_rows() -> dict[str, list[str]]:
    """Plugin name → the cells of its row in §5.1's plugin table."""
    text = DESIGN.read_text()
    section = text[text.index("### 5.1 Plugins and the profile") : text.index("## 6.")]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| plugin") or line.startswith("|---"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[re.sub(r" \(ours\)$", "", cells[0])] = cells[1:]
    return rows


def test_every_plugin_has_a_row_and_every_row_a_plugin() -> None:
    names = {p.name for p in REGISTRY.filters} | {p.name for p in REGISTRY.scores}
    assert set(plugin_rows()) == names


def test_each_rows_status_events_and_args_are_the_plugins_declarations() -> None:
    rows = plugin_rows()
    for plugin in REGISTRY.filters:
        _, status, events, args, _ = rows[plugin.name]
        default = "Unschedulable" if plugin.status is Code.UNSCHEDULABLE else "Unresolvable"
        assert status.split(" (")[0] == default, plugin.name
        for reason, code in plugin.statuses.items():
            assert code is not plugin.status and "(" in status, (plugin.name, reason)
        named = set(re.findall(r"[A-Z][A-Za-z]+", events))
        assert named == {interest.resource for interest in plugin.events}, plugin.name
        assert ("(hint)" in events) == any(i.hint for i in plugin.events), plugin.name
        fields = [f.name for f in dataclasses.fields(plugin.args)] if plugin.args else []
        assert args == (", ".join(fields) if fields else "—"), plugin.name
    for score in REGISTRY.scores:
        cell = rows[score.name][4]
        assert f"({score.default_weight:g})" in cell, score.name
        if score.args is not None and REGISTRY.filter_named(score.name) is None:
            fields = ", ".join(f.name for f in dataclasses.fields(score.args))
            assert rows[score.name][3] == fields, score.name


def test_the_cycle_module_the_design_names_runs_every_mode() -> None:
    text = DESIGN.read_text()
    assert "scheduler/cycle/cycle.py" in text and "SchedulingCycle" in text
    for module in ("standalone/loop", "extender/extender"):
        source = (DESIGN.parents[1] / "scheduler" / f"{module}.py").read_text()
        assert "SchedulingCycle(" in source, module
