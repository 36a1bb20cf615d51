"""What the two entry points of ``interference-scheduler`` share: the standalone
scheduler (:mod:`scheduler.entry.cli`) and kube-scheduler extender mode
(:mod:`scheduler.entry.extender_cli`) both import this module, neither imports the other's
internals — the process flags, the settings taken from flags and the environment, the
start-up reachability lines and the one-line configuration error.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from interference import keys
from interference_infra.redis_client import (
    REDIS_ERRORS,
    RedisConnection,
    credentials_refused,
    parse_sentinels,
    refused_credentials_reason,
    unreachable_reason,
)
from interference_infra.strict import parse_bool
from interference_infra.version import add_version_argument
from scheduler.adapters.kubernetes import KubernetesCluster
from scheduler.adapters.tracing import OtlpTracer, TracingMetrics, TracingSettings
from scheduler.cycle.ports import ClusterError
from scheduler.entry.config import ConfigError, SchedulerConfig, load_config, with_overrides

log = logging.getLogger("scheduler")

TLS_ENV = {"REDIS_CA_FILE": "ca_file", "REDIS_CERT_FILE": "cert_file", "REDIS_KEY_FILE": "key_file"}
"""Environment variables that set the Redis TLS options of the config's ``redis`` section."""
REDIS_ENV = {
    "REDIS_URL": "url",
    **TLS_ENV,
    "REDIS_SENTINELS": "sentinels",
    "REDIS_SENTINEL_MASTER": "sentinel_master",
    "REDIS_CLUSTER": "cluster",
}
"""Every environment variable that sets a key of the config's ``redis`` section."""
OVERRIDES_SOURCE = "command line/environment"
"""What :func:`scheduler.entry.config.with_overrides` names as the source of its errors."""


def add_process_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config``, ``--kubeconfig``, ``--log-level`` and ``--log-format``: the flags the
    standalone scheduler and the extender share (and ``--version``)."""
    add_version_argument(parser)
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get("INTERFERENCE_SCHEDULER_CONFIG", ""),
        help="YAML config file, reloaded on change (env INTERFERENCE_SCHEDULER_CONFIG)",
    )
    parser.add_argument(
        "--kubeconfig", metavar="FILE", default="", help="kubeconfig (default: in-cluster)"
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR, any case (env LOG_LEVEL; default INFO)",
    )
    parser.add_argument(
        "--log-format",
        default=os.environ.get("LOG_FORMAT", "text"),
        help="json (one object per line) or text (env LOG_FORMAT; default text)",
    )


def report_reachability(
    cluster: KubernetesCluster, connection: RedisConnection, while_down: str
) -> None:
    """One clear line each when the API server or Redis cannot be reached at start;
    ``while_down`` says what the process does until Redis answers."""
    try:
        cluster.list_page("Node", "")
    except ClusterError as exc:
        log.error("Kubernetes API: %s (retrying in the background)", exc)
    try:
        connection.client().zrange(keys.NODES_BY_INDEX, 0, 0)
    except REDIS_ERRORS as exc:
        connection.reset()
        if credentials_refused(exc):  # it answers: "cannot reach" would send one to the network
            log.error(
                "Redis: %s (%s); %s until it accepts them",
                refused_credentials_reason(connection.target),
                exc,
                while_down,
            )
            return
        log.error(
            "Redis: cannot reach %s (%s); check redis.url / REDIS_URL and REDIS_USERNAME /"
            " REDIS_PASSWORD; %s until it answers",
            connection.target.describe(),
            unreachable_reason(connection.target, exc),
            while_down,
        )


def overrides(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Config fields set by flags or the environment; :class:`SettingsError` for a
    malformed ``DRY_RUN`` (a mistyped value must never mean "bind")."""
    sections: dict[str, dict[str, Any]] = {}
    redis_section: dict[str, Any] = {}
    if env.get("REDIS_URL"):
        redis_section["url"] = env["REDIS_URL"]
    for variable, name in TLS_ENV.items():
        if env.get(variable):
            redis_section[name] = env[variable]
    if env.get("REDIS_SENTINELS", "").strip():
        sentinels = parse_sentinels(env["REDIS_SENTINELS"], "REDIS_SENTINELS")
        redis_section["sentinels"] = tuple(f"{host}:{port}" for host, port in sentinels)
    if env.get("REDIS_SENTINEL_MASTER"):
        redis_section["sentinel_master"] = env["REDIS_SENTINEL_MASTER"]
    if env.get("REDIS_CLUSTER", "").strip():
        redis_section["cluster"] = parse_bool("REDIS_CLUSTER", env["REDIS_CLUSTER"])
    if redis_section:
        sections["redis"] = redis_section
    dry_run = args.dry_run
    if dry_run is None and env.get("DRY_RUN", "").strip():
        dry_run = parse_bool("DRY_RUN", env["DRY_RUN"])
    if dry_run is not None:
        sections["loop"] = {"dry_run": dry_run}
    if args.kubeconfig:
        sections["kubernetes"] = {"kubeconfig": args.kubeconfig}
    return sections


def load_configuration(
    path: str | None, fixed: Mapping[str, dict[str, Any]], env: Mapping[str, str]
) -> tuple[SchedulerConfig | None, list[str]]:
    """The file's configuration (the defaults without ``path``) with the flags' and the
    environment's values over it; else ``None`` and one line per source with problems
    (:func:`one_line`): the file's and the overrides' together, the overrides checked over
    the defaults when the file does not read, so one start tells every problem."""
    problems: list[str] = []
    try:
        loaded = load_config(path) if path else SchedulerConfig()
    except ConfigError as exc:
        problems.append(one_line(exc))
        loaded = SchedulerConfig()
    try:
        config = with_overrides(loaded, **fixed)
    except ConfigError as exc:
        problems.append(one_line(exc, environment_keys(env)))
        return None, problems
    return (None, problems) if problems else (config, [])


def environment_keys(env: Mapping[str, str]) -> dict[str, str]:
    """``{"redis.url": "REDIS_URL", …}``: the config keys the environment sets, each with
    the variable that set it, so an error names what the user actually gave."""
    return {f"redis.{key}": variable for variable, key in REDIS_ENV.items() if env.get(variable)}


def one_line(error: ConfigError, given_as: Mapping[str, str] | None = None) -> str:
    """A configuration error as one line: the file, then every problem. ``given_as``
    (:func:`environment_keys`) names the variable beside a key the environment set:
    ``REDIS_URL (redis.url): …``."""
    source = str(error).split(":", 1)[0]
    # Only the overrides' error is about the environment's values; a file's is the file's.
    names = (given_as or {}) if source == OVERRIDES_SOURCE else {}

    def named(problem: str) -> str:
        key, colon, rest = problem.partition(":")
        return f"{names[key]} ({key}){colon}{rest}" if colon and key in names else problem

    problems = "; ".join(named(" ".join(problem.split())) for problem in error.problems)
    return source + ": invalid configuration: " + problems


def make_tracer(settings: TracingSettings, registry: CollectorRegistry) -> OtlpTracer | None:
    """The OTLP tracer when tracing is on (``tracing.endpoint`` or the standard
    ``OTEL_EXPORTER_OTLP_*ENDPOINT`` variables), else ``None``."""
    endpoint = settings.resolved_endpoint()
    if not endpoint:
        return None
    log.info(
        "tracing scheduling attempts to %s (%s, sample ratio %g)",
        endpoint,
        settings.resolved_protocol(),
        settings.sample_ratio,
    )
    return OtlpTracer(settings, TracingMetrics(registry))
