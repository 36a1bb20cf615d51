"""Config loading, validation errors that name the field and the fix, and live reload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scheduler.cycle.settings import CycleSettings, Profile
from scheduler.entry.config import (
    ConfigError,
    SchedulerConfig,
    load_config,
    parse_config,
    with_overrides,
)
from scheduler.plugins.gpu_packing import GpuPackingArgs
from scheduler.plugins.interference import InterferenceArgs
from scheduler.plugins.registry import REGISTRY

FULL = """
cycle:
  profile:
    scores: {Interference: 3, NodeResourcesFit: 1.5, GpuPacking: 0}
    plugin_config:
      - name: Interference
        args: {stale_policy: avoid, signal_window: 60s}
      - name: GpuPacking
        args: {resource: example.com/gpu}
loop:
  scheduler_name: my-scheduler
  dry_run: true
  ignore_namespaces: [kube-system, monitoring]
redis:
  url: redis://redis.interference:6379/1
kubernetes:
  kubeconfig: /etc/kube/config
  page_size: 1000
leader_election:
  lease_duration_s: 20
  renew_deadline_s: 15
  retry_period_s: 3
http:
  port: 9090
reload_interval_s: 2
"""


def interference_args(cycle: CycleSettings) -> InterferenceArgs:
    """The Interference plugin's args in ``cycle``'s profile (its defaults when unset)."""
    found = dict(cycle.profile.plugin_config).get("Interference", InterferenceArgs())
    assert isinstance(found, InterferenceArgs)
    return found


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_loads_every_section(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL))
    assert config.cycle.profile == Profile(
        scores=(("Interference", 3.0), ("NodeResourcesFit", 1.5), ("GpuPacking", 0.0)),
        plugin_config=(
            ("Interference", InterferenceArgs(stale_policy="avoid", signal_window="60s")),
            ("GpuPacking", GpuPackingArgs(resource="example.com/gpu")),
        ),
    )
    assert interference_args(config.cycle).stale_policy == "avoid"
    assert interference_args(config.cycle).signal_window == "60s"
    assert config.loop.scheduler_name == "my-scheduler"
    assert config.loop.dry_run is True
    assert config.loop.ignore_namespaces == ("kube-system", "monitoring")
    assert config.redis.url == "redis://redis.interference:6379/1"
    assert config.kubernetes.kubeconfig == "/etc/kube/config"
    assert config.kubernetes.page_size == 1000
    assert config.leader_election.lease_duration_s == 20
    assert config.http.port == 9090
    assert config.reload_interval_s == 2.0


@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}\n"])
def test_empty_file_means_defaults(tmp_path: Path, text: str) -> None:
    assert load_config(write(tmp_path, text)) == SchedulerConfig()


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        pytest.param(
            {"cycle": {"profile": {"scores": {"GpuPacking": "high"}}}},
            "cycle.profile.scores.GpuPacking: must be a number, got 'high'",
            id="string-for-number",
        ),
        pytest.param(
            {"cycle": {"profile": {"scores": {"GpuPacking": -1}}}},
            "cycle.profile.scores.GpuPacking: -1.0 is out of range; allowed: 0–100",
            id="negative-weight",
        ),
        pytest.param(
            {"cycle": {"porfile": {}}},
            "cycle.porfile: unknown key; did you mean 'profile'?",
            id="typo-did-you-mean",
        ),
        pytest.param(
            {"cycle": {"profile": {"scores": {"Interferance": 1}}}},
            "cycle.profile.scores.Interferance: unknown plugin; did you mean 'Interference'?",
            id="unknown-score-plugin-did-you-mean",
        ),
        pytest.param(
            {"cycle": {"profile": {"scores": {"NodeAffinity": 101}}}},
            "cycle.profile.scores.NodeAffinity: 101.0 is out of range; allowed: 0–100",
            id="weight-above-100",
        ),
        pytest.param(
            {"cycle": {"profile": {"filters": ["NodeReady", "NodeAfinity"]}}},
            "cycle.profile.filters: 'NodeAfinity': unknown plugin; did you mean 'NodeAffinity'?",
            id="unknown-filter-plugin-did-you-mean",
        ),
        pytest.param(
            {
                "cycle": {
                    "profile": {
                        "filters": ["PodTopologySpread", *(p.name for p in REGISTRY.filters)]
                    }
                }
            },
            "cycle.profile.filters: 'PodTopologySpread' reads the result of 'NodeAffinity', "
            "'TaintToleration': list it after them",
            id="a-filter-runs-after-those-it-reads",
        ),
        pytest.param(
            {"cycle": {"weights": {"interference": 2}}},
            "cycle.weights: replaced by cycle.profile.scores, keyed by plugin name",
            id="weights-of-earlier-versions-name-their-replacement",
        ),
        pytest.param(
            {"cylce": {}},
            "cylce: unknown key; did you mean 'cycle'?",
            id="typo-section",
        ),
        pytest.param(
            {"cycle": {"stale_policy": "reject"}},
            "cycle.stale_policy: replaced by the Interference plugin's args: "
            "cycle.profile.plugin_config: [{name: Interference, args: {stale_policy: …}}]",
            id="stale-policy-of-earlier-versions-names-its-replacement",
        ),
        pytest.param(
            {"cycle": {"signal_window": "60s"}},
            "cycle.signal_window: replaced by the Interference plugin's args: "
            "cycle.profile.plugin_config: [{name: Interference, args: {signal_window: …}}]",
            id="signal-window-of-earlier-versions-names-its-replacement",
        ),
        pytest.param(
            {"cycle": {"risk_k": 2}},
            "cycle.risk_k: replaced by the Interference plugin's args: "
            "cycle.profile.plugin_config: [{name: Interference, args: {risk_k: …}}]",
            id="risk-k-of-earlier-versions-names-its-replacement",
        ),
        pytest.param(
            {"cycle": {"recent_load_weight": 50}},
            "cycle.recent_load_weight: replaced by the Interference plugin's args: "
            "cycle.profile.plugin_config: [{name: Interference, args: {recent_load_weight: …}}]",
            id="recent-load-weight-of-earlier-versions-names-its-replacement",
        ),
        pytest.param(
            {"cycle": {"gpu_resource": "example.com/gpu"}},
            "cycle.gpu_resource: replaced by the GpuPacking plugin's args: "
            "cycle.profile.plugin_config: [{name: GpuPacking, args: {resource: …}}]",
            id="gpu-resource-of-earlier-versions-names-its-replacement",
        ),
        pytest.param(
            {"cycle": {"profile": {"plugin_config": [{"name": "Interferance", "args": {}}]}}},
            "cycle.profile.plugin_config[0].name: 'Interferance' is not a plugin with args; "
            "did you mean 'Interference'?",
            id="unknown-plugin-in-plugin-config-did-you-mean",
        ),
        pytest.param(
            {
                "cycle": {
                    "profile": {
                        "plugin_config": [
                            {"name": "Interference", "args": {"stale_policy": "ignore"}}
                        ]
                    }
                }
            },
            "cycle.profile.plugin_config[0].args.stale_policy: must be one of neutral, "
            "avoid, reject, got 'ignore'",
            id="bad-literal-in-plugin-args",
        ),
        pytest.param(
            {"loop": {"dry_run": "yes please"}},
            "loop.dry_run: must be true or false (or yes/no, 1/0), got 'yes please'",
            id="bad-bool",
        ),
        pytest.param(
            {"loop": {"ignore_namespaces": "kube-system"}},
            "loop.ignore_namespaces: must be a list of names, e.g. [kube-system], got 'kube-",
            id="string-for-list",
        ),
        pytest.param(
            {"loop": {"scheduler_name": ""}},
            "loop.scheduler_name: must not be empty, e.g. interference-scheduler",
            id="empty-name",
        ),
        pytest.param(
            {"kubernetes": {"page_size": 2.5}},
            "kubernetes.page_size: must be a whole number, got 2.5",
            id="float-for-int",
        ),
        pytest.param(
            {"redis": {"url": "localhost:6379"}},
            "redis.url: 'localhost:6379' must start with redis://, rediss:// or unix://",
            id="bad-redis-url",
        ),
        pytest.param(
            {"leader_election": {"lease_duration_s": 10, "renew_deadline_s": 10}},
            "leader_election.lease_duration_s: 10 must be greater than renew_deadline_s (10)",
            id="lease-timing",
        ),
        pytest.param(
            {"http": {"port": 70000}},
            "http.port: 70000 must be an integer in 0–65535",
            id="bad-port",
        ),
        pytest.param(
            {"http": 10251},
            "http: must be a mapping, got 10251",
            id="scalar-for-section",
        ),
        pytest.param(
            {"reload_interval_s": 0},
            "reload_interval_s: 0.0 is out of range; allowed: > 0",
            id="top-level-range",
        ),
    ],
)
def test_errors_name_the_field_and_the_fix(document: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(document, "policy.yaml")
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems
    assert str(caught.value).startswith("policy.yaml: invalid configuration:")


def test_a_file_with_the_cycle_section_under_its_former_name_is_refused_naming_cycle(
    tmp_path: Path,
) -> None:
    """Refused whole, nothing under it read (no alias: the name never shipped), the new key
    in the message; the same keys under ``cycle`` read."""
    former = "engine"  # vocabulary: former name
    text = f"{former}:\n  relax_after_s: 30\n"
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert caught.value.problems == [
        f"{former}: replaced by cycle: the same keys, the scheduling cycle's section"
        " (docs/design.md, Glossary)"
    ]
    assert load_config(write(tmp_path, text.replace(former, "cycle"))).cycle.relax_after_s == 30


def test_a_filter_left_out_of_the_list_runs_at_its_default_place() -> None:
    every = REGISTRY.filter_names
    without_last = parse_config({"cycle": {"profile": {"filters": list(every[:-1])}}})
    assert without_last.cycle.profile.filters == every  # Interference still runs, last

    # NodeResourcesFit moved before NodePorts, VolumeBinding left out: it runs right after
    # NodeResourcesFit, its predecessor in the default order
    listed = [n for n in every if n != "VolumeBinding"]
    at = listed.index("NodePorts")
    listed[at], listed[at + 1] = listed[at + 1], listed[at]
    assert listed[at : at + 2] == ["NodeResourcesFit", "NodePorts"]
    config = parse_config({"cycle": {"profile": {"filters": listed}}})
    expected = [*listed[: at + 1], "VolumeBinding", *listed[at + 1 :]]
    assert config.cycle.profile.filters == tuple(expected)

    # a filter with no predecessor in the list runs first
    first = parse_config({"cycle": {"profile": {"filters": ["NodeUnschedulable"]}}})
    assert first.cycle.profile.filters == every


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            {
                "cycle": {
                    "profile": {
                        "scores": {"GpuPacking": "x"},
                        "plugin_config": [{"name": "Interference", "args": {"stale_policy": "no"}}],
                    }
                },
                "bogus": 1,
            }
        )
    assert len(caught.value.problems) == 3


BAD_EVERYWHERE = """
loop:
  bind_workers: 0
  max_writes_in_flight: 0
  dry_run: maybe
cycle:
  relax_after_s: -1
  record_top_k: -2
http:
  port: 99999
  host: 7
reload_interval_s: 0
"""


def test_every_problem_of_every_section_is_reported_at_once(tmp_path: Path) -> None:
    """Not only one per section: a section's own checks stop at their first problem,
    and a section with a wrongly typed key was not checked further at all; a file with
    problems in three sections and the top level is fixed in one edit, not six."""
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, BAD_EVERYWHERE))
    fields = sorted(problem.split(":", 1)[0] for problem in caught.value.problems)
    assert fields == [
        "cycle.record_top_k",
        "cycle.relax_after_s",
        "http.host",
        "http.port",
        "loop.bind_workers",
        "loop.dry_run",
        "loop.max_writes_in_flight",
        "reload_interval_s",
    ], caught.value.problems
    assert "loop.bind_workers: 0 must be an integer ≥ 1" in caught.value.problems
    assert isinstance(caught.value, ValueError)  # what the callers catch, as before
    assert str(caught.value).count("\n  ") == len(fields)


def test_overrides_report_every_problem() -> None:
    with pytest.raises(ConfigError) as caught:
        with_overrides(SchedulerConfig(), loop={"bind_workers": 0, "max_writes_in_flight": 0})
    assert [p.split(":", 1)[0] for p in caught.value.problems] == [
        "loop.bind_workers",
        "loop.max_writes_in_flight",
    ]


def test_yaml_syntax_errors_say_where(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not valid YAML at line 3, column \d+"):
        load_config(write(tmp_path, "cycle:\n  profile: {a: 1\nloop: [\n"))
    with pytest.raises(ConfigError, match="top level must be a mapping of sections, got a list"):
        load_config(write(tmp_path, "- cycle\n"))
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(str(tmp_path / "missing.yaml"))


def test_overrides_are_validated() -> None:
    config = with_overrides(
        SchedulerConfig(), loop={"dry_run": True}, kubernetes={"kubeconfig": "k"}
    )
    assert config.loop.dry_run and config.kubernetes.kubeconfig == "k"
    with pytest.raises(ConfigError, match=r"redis\.url"):
        with_overrides(SchedulerConfig(), redis={"url": "nope"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("No", False),
        ("YES", True),
        ("1", True),
        ("0", False),
        ("'False'", False),
        ("on", None),  # YAML 1.1 would read True: a typo must not turn binding on or off
        ("off", None),
        ("Y", None),
        ("2", None),
    ],
)
def test_config_booleans_take_only_six_words(
    tmp_path: Path, text: str, expected: bool | None
) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text(f"loop:\n  dry_run: {text}\n")
    if expected is None:
        with pytest.raises(ConfigError, match=r"loop.dry_run: must be true or false"):
            load_config(str(path))
    else:
        assert load_config(str(path)).loop.dry_run is expected
