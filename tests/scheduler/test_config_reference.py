"""docs/configuration.md is generated from the settings dataclasses and committed: it must
be what the code generates now, name every key, and the config module's docstring
example must be a valid file that shows defaults only."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

import scheduler.entry.config
from scheduler.entry.cli_common import TLS_ENV
from scheduler.entry.config import (
    LIVE_SECTIONS,
    SchedulerConfig,
    StrictBoolLoader,
    parse_config,
    reference,
)
from scheduler.entry.config_reference import sections, type_name, yaml_value
from scheduler.plugins.registry import REGISTRY

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"


def test_the_committed_reference_is_what_the_code_generates() -> None:
    assert DOC.read_text() == reference(), (
        "docs/configuration.md is out of date: run `make config-reference` and commit it"
    )


def every_key() -> list[str]:
    keys = [
        k.path for s in sections(SchedulerConfig, SchedulerConfig(), LIVE_SECTIONS) for k in s.keys
    ]
    for plugin, args in REGISTRY.args_types().items():
        head = f"cycle.profile.plugin_config[{plugin}].args."
        keys += [k.path for s in sections(args, args(), (), head, top="cycle") for k in s.keys]
    return keys


def test_every_key_of_every_settings_dataclass_is_in_the_reference() -> None:
    text = DOC.read_text()
    keys = every_key()
    assert len(keys) > 55
    missing = [key for key in keys if f"| `{key}` |" not in text]
    assert missing == []
    assert f"{len(keys)} keys." in text


def test_every_key_has_a_description() -> None:
    """A new field without an attribute docstring would be a key the reference cannot
    explain."""
    undocumented = [
        key.path
        for cls, default in [
            (SchedulerConfig, SchedulerConfig()),
            *((args, args()) for args in REGISTRY.args_types().values()),
        ]
        for section in sections(cls, default, LIVE_SECTIONS)
        for key in section.keys
        if not key.description
    ]
    assert undocumented == []


def test_live_and_restart_follow_the_reload_rules() -> None:
    by_path = {
        k.path: k.live
        for s in sections(SchedulerConfig, SchedulerConfig(), LIVE_SECTIONS)
        for k in s.keys
    }
    assert by_path["cycle.profile.scores"] and by_path["loop.dry_run"]
    assert by_path["reload_interval_s"]
    assert not by_path["redis.url"] and not by_path["http.port"]
    assert not by_path["leader_election.lease_duration_s"]
    text = DOC.read_text()
    assert "| `cycle.profile.plugin_config[Interference].args.stale_policy` |" in text
    row = next(line for line in text.splitlines() if "args.stale_policy` |" in line)
    assert "| live |" in row


def test_every_environment_override_is_named() -> None:
    text = DOC.read_text()
    for variable, key in {
        **TLS_ENV,
        "REDIS_URL": "url",
        "REDIS_SENTINELS": "sentinels",
        "REDIS_SENTINEL_MASTER": "sentinel_master",
        "REDIS_CLUSTER": "cluster",
    }.items():
        assert f"`{variable}`" in text and f"`redis.{key}`" in text
    assert "`DRY_RUN`" in text and "`--kubeconfig`" in text


@pytest.mark.parametrize(
    ("hint", "words"),
    [
        (bool, "boolean"),
        (float | None, "number or null"),
        (tuple[str, ...], "list of strings"),
    ],
)
def test_type_names(hint: object, words: str) -> None:
    assert type_name(hint) == words


def test_defaults_are_written_as_yaml_the_loader_reads_back() -> None:
    for value in ("", "10s", "yes", "1.5", "redis://redis:6379/0", 5.0, 0.25, True, None, ()):
        assert yaml.load(f"k: {yaml_value(value)}", Loader=StrictBoolLoader)["k"] in (
            value,
            [],
            None,
        )


# --- the example in scheduler/entry/config.py's docstring ---------------------------------


def docstring_example() -> dict[str, object]:
    doc = scheduler.entry.config.__doc__ or ""
    found = re.search(r"::\n\n((?:    .*\n|\n)+)", doc)
    assert found, "scheduler/entry/config.py's docstring has no example block"
    lines = [line[4:] for line in found.group(1).splitlines()]
    example = yaml.load("\n".join(lines), Loader=StrictBoolLoader)
    assert isinstance(example, dict)
    return example


def test_the_docstring_example_parses() -> None:
    example = docstring_example()
    assert set(example) <= {f.name for f in dataclasses.fields(SchedulerConfig)}
    assert {"cycle", "loop", "redis"} <= set(example)
    parse_config(example, "scheduler/entry/config.py docstring")


def test_the_docstring_example_shows_defaults_only() -> None:
    """Every value the example sets is the default: an example is not read as a
    recommendation or mistaken for what an install runs with."""
    parsed = parse_config(docstring_example())
    defaults = SchedulerConfig()
    ours = {
        k.path: k.default for s in sections(SchedulerConfig, parsed, LIVE_SECTIONS) for k in s.keys
    }
    theirs = {
        k.path: k.default
        for s in sections(SchedulerConfig, defaults, LIVE_SECTIONS)
        for k in s.keys
    }
    ours.pop("cycle.profile.plugin_config")
    theirs.pop("cycle.profile.plugin_config")
    assert ours == theirs
    kinds = REGISTRY.args_types()
    for name, args in parsed.cycle.profile.plugin_config:
        assert args == kinds[name](), name
