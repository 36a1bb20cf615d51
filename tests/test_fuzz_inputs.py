"""Fuzzing the edges (hypothesis): whatever the command line, the environment or the config
file holds, the three programs' argument handling (the scheduler's extender mode's too)
and the scheduler's config loader end in a value or in their own error — exit status 0
(``--help``) or 2 with one line on stderr — never a traceback.

Each program is driven up to the point where it would start working (parse the flags,
read the environment, validate the settings), since beyond that it contacts Redis or the
API server."""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interference_cli import main as cli_main
from node_agent import cli as agent_cli
from scheduler.entry import cli as scheduler_cli
from scheduler.entry import extender_cli
from scheduler.entry.config import ConfigError, SchedulerConfig, load_config, parse_config

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WORDS = st.sampled_from(
    [
        "-1", "0", "1", "0.5", "1e309", "nan", "-inf", "x", "", " ", "é", "\x00", "yes", "Y",
        "redis://u:p@127.0.0.1:1/0", "rediss://127.0.0.1:1", "unix:///nonexistent",
        "localhost:6379", "/", "/no/such",
        "a=b", "runq_p99_us=5", "psi", "bogus,psi", "DEBUG", "debug", "loud", "json", "xml",
        "ns/pod", "ns/", "--", "-", "--help-me",
    ]
)  # fmt: skip
TEXT = st.text(max_size=12)


def argv_of(flags: list[str], commands: list[str] = ()) -> st.SearchStrategy[list[str]]:  # type: ignore[assignment]
    """Argument lists mixing the program's own flags and commands with odd values."""
    token = st.one_of(st.sampled_from(flags + list(commands)), WORDS, TEXT)
    return st.lists(token, max_size=8)


def outcome(call: Callable[[], Any]) -> tuple[int, str]:
    """(exit status, stderr) of ``call``: its int result, SystemExit's code, else 0.
    Any other exception propagates and fails the test."""
    err = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                result = call()
            except SystemExit as exc:
                return int(exc.code or 0), err.getvalue()
        return (result if isinstance(result, int) else 0), err.getvalue()
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def assert_clean(status: int, err: str) -> None:
    assert status in (0, 2), (status, err)
    assert "Traceback" not in err
    if status == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, err


def option_strings(parser: Any) -> list[str]:
    return [o for action in parser._actions for o in action.option_strings]


# --- interference -------------------------------------------------------------------------

CLI_FLAGS = [
    o for o in option_strings(cli_main.build_parser({})) if o not in ("-h", "--help")
] + [
    "--interval", "--out", "--duration", "--count", "--from-start", "--trace", "--pods",
    "--policy", "--json", "--explain", "--redis-url", "--help",
]  # fmt: skip
CLI_COMMANDS = ["top", "node", "explain", "record", "simulate", "recommend-tolerance"]
NOBODY = "redis://127.0.0.1:1/0"
"""A Redis URL where nothing listens: commands that get that far fail at once (exit 1)."""


@FUZZ
@given(argv=argv_of(CLI_FLAGS, CLI_COMMANDS), redis_url=st.one_of(st.none(), WORDS))
def test_interference_never_traces_back(argv: list[str], redis_url: str | None) -> None:
    """The real entry point; ``--watch`` (runs until Ctrl-C) and ``--plot`` (writes files)
    are left out."""
    argv = [a for a in argv if a not in ("--watch", "--plot")]
    env = {"REDIS_URL": NOBODY if redis_url is None or "://" not in redis_url else redis_url}
    status, err = outcome(lambda: cli_main.main(argv, env))
    assert status in (0, 1, 2), (status, err)
    assert "Traceback" not in err
    if status:
        assert len([line for line in err.splitlines() if line.strip()]) == 1, err


# --- interference-agent -------------------------------------------------------------------

AGENT_FLAGS = option_strings(agent_cli.parser({}))
AGENT_ENV = st.dictionaries(
    st.sampled_from(
        [
            "INTERVAL_S", "HTTP_PORT", "NCPU", "TTL_S", "STREAM_MAXLEN", "REDIS_CLUSTER",
            "PROBES", "CGROUP_ROOT", "REDIS_URL", "REDIS_SENTINELS", "LOG_LEVEL", "LOG_FORMAT",
            "REDIS_CA_FILE", "NODE_NAME",
        ]
    ),
    st.one_of(WORDS, TEXT),
    max_size=4,
)  # fmt: skip


@FUZZ
@given(argv=argv_of(AGENT_FLAGS), env=AGENT_ENV)
def test_agent_flags_and_environment_never_trace_back(argv: list[str], env: dict[str, str]) -> None:
    """Everything the agent does before it loads probes: ``node_agent.cli.prepare``."""
    assert_clean(*outcome(lambda: agent_cli.prepare(["--no-kubernetes", *argv], env)))


# --- interference-scheduler ---------------------------------------------------------------

SCHEDULER_FLAGS = [o for o in option_strings(scheduler_cli.build_parser()) if o != "--config"]
SCHEDULER_ENV = st.dictionaries(
    st.sampled_from(["DRY_RUN", "REDIS_URL", "REDIS_CA_FILE", "REDIS_CERT_FILE"]),
    st.one_of(WORDS, TEXT),
    max_size=3,
)


@FUZZ
@given(argv=argv_of(SCHEDULER_FLAGS), env=SCHEDULER_ENV)
def test_scheduler_flags_and_environment_never_trace_back(
    argv: list[str], env: dict[str, str]
) -> None:
    """Everything the scheduler does before it contacts the API server:
    ``scheduler.entry.cli.prepare`` (the config file is fuzzed below)."""
    argv = [a for a in argv if a != "--config"]
    assert_clean(*outcome(lambda: scheduler_cli.prepare(argv, env)))


EXTENDER_FLAGS = [o for o in option_strings(extender_cli.build_parser()) if o != "--config"]


@FUZZ
@given(argv=argv_of(EXTENDER_FLAGS))
def test_extender_parser_never_traces_back(argv: list[str]) -> None:
    """``interference-scheduler extender``'s argument parser (the rest of its start-up is
    the scheduler's: the config loader and the overrides, fuzzed here too)."""
    argv = [a for a in argv if a != "--config"]
    assert_clean(*outcome(lambda: extender_cli.build_parser().parse_args(argv)))


# --- the config loader --------------------------------------------------------------------

SECTIONS = ["cycle", "loop", "redis", "kubernetes", "leader_election", "http"]
KEYS = [
    *SECTIONS, "profile", "scores", "filters", "Interference", "NodeResourcesFit", "stale_after_s",
    "relax_after_s", "stale_policy", "dry_run", "scheduler_name", "ignore_namespaces", "url",
    "port",
    "reload_interval_s", "lease_duration_s", "poll_interval_s", "ca_file", "record_top_k", "bogus",
    "plugin_config", "name", "args", "signal_window", "GpuPacking", "resource",
]  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
    WORDS,
)
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ
@given(document=st.dictionaries(st.sampled_from(KEYS), DOCUMENTS, max_size=4))
def test_config_loader_ends_in_a_config_or_config_error(document: dict[str, Any]) -> None:
    try:
        config = parse_config(document, "fuzz.yaml")
    except ConfigError as exc:
        assert exc.problems and all(p.strip() for p in exc.problems)
        assert "\n" not in scheduler_cli.one_line(exc)
    else:
        assert isinstance(config, SchedulerConfig)


PLUGIN_ARGS = [
    "stale_policy", "signal_window", "risk_k", "recent_load_weight", "resource", "bogus",
]  # fmt: skip
PLUGIN_CONFIG = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {
                "name": st.one_of(
                    st.sampled_from(["Interference", "GpuPacking", "NodeReady"]), SCALARS
                ),
                "args": st.one_of(
                    SCALARS, st.dictionaries(st.sampled_from(PLUGIN_ARGS), SCALARS, max_size=3)
                ),
            }
        ),
        DOCUMENTS,
    ),
    max_size=3,
)


@FUZZ
@given(plugin_config=st.one_of(PLUGIN_CONFIG, DOCUMENTS))
def test_plugin_config_ends_in_a_config_or_config_error(plugin_config: Any) -> None:
    document = {"cycle": {"profile": {"plugin_config": plugin_config}}}
    try:
        config = parse_config(document, "fuzz.yaml")
    except ConfigError as exc:
        assert exc.problems and all(p.strip() for p in exc.problems)
        assert "\n" not in scheduler_cli.one_line(exc)
    else:
        assert isinstance(config, SchedulerConfig)


@FUZZ
@given(content=st.one_of(st.binary(max_size=200), st.builds(yaml.safe_dump, DOCUMENTS)))
def test_any_config_file_loads_or_says_why(content: bytes | str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "scheduler.yaml"
        if isinstance(content, str):
            path.write_text(content)
        else:
            path.write_bytes(content)
        try:
            load_config(str(path))
        except ConfigError as exc:
            assert "\n" not in scheduler_cli.one_line(exc)
