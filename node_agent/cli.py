"""``interference-agent``: measure this node's interference and publish it to Redis.

Every flag falls back to an environment variable (named in ``--help``), so a DaemonSet
configures the agent with env vars and a Secret. ``--once`` prints one report as JSON
and needs no Redis.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields, replace
from types import FrameType
from urllib.parse import urlsplit, urlunsplit

from prometheus_client import CollectorRegistry

from interference.score import ScoreReferences
from interference.signals import NodeReport
from node_agent import probes
from node_agent.agent import Agent, build_agent
from node_agent.health import AgentHttpServer, AgentMetrics
from node_agent.settings import AgentSettings, detect_cgroup_v2_mount

log = logging.getLogger("node_agent")

_SCORE_REF_NAMES = tuple(f.name for f in fields(ScoreReferences))


def parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The argument parser; defaults come from ``environ``."""
    known = ", ".join(sorted(probes.base.registered())) or "none registered"
    p = argparse.ArgumentParser(
        prog="interference-agent",
        description="Measure per-pod CPU run-queue and memory-reclaim interference on this "
        "node every interval and publish it to Redis (DESIGN §3–§4).",
    )
    p.add_argument(
        "--node-name",
        default=environ.get("NODE_NAME") or socket.gethostname(),
        help="node name the report is published under (env NODE_NAME; default: hostname)",
    )
    p.add_argument(
        "--redis-url",
        default=environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        help="redis:// or rediss:// URL (env REDIS_URL; default %(default)s); the ACL user "
        "and password come from env REDIS_USERNAME / REDIS_PASSWORD",
    )
    p.add_argument(
        "--redis-sentinels",
        default=environ.get("REDIS_SENTINELS", ""),
        metavar="HOST:PORT,…",
        help="find the master through these Redis Sentinels (env REDIS_SENTINELS); "
        "--redis-url then only gives the database number and rediss:// for TLS",
    )
    p.add_argument(
        "--redis-sentinel-master",
        default=environ.get("REDIS_SENTINEL_MASTER", "mymaster"),
        help="master name the sentinels monitor (env REDIS_SENTINEL_MASTER; default %(default)s)",
    )
    p.add_argument(
        "--redis-cluster",
        action="store_true",
        default=environ.get("REDIS_CLUSTER", "").lower() in ("1", "true", "yes"),
        help="--redis-url names a Redis Cluster node (env REDIS_CLUSTER=1)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=environ.get("INTERVAL_S", "1"),
        help="seconds between reports (env INTERVAL_S; default 1)",
    )
    p.add_argument(
        "--cgroup-root",
        default=environ.get("CGROUP_ROOT", "/"),
        help="only measure cgroups at or below this path (env CGROUP_ROOT; default /)",
    )
    p.add_argument(
        "--cgroup-v2-mount",
        default=environ.get("CGROUP_V2_MOUNT") or detect_cgroup_v2_mount(),
        help="where the cgroup v2 hierarchy is mounted (env CGROUP_V2_MOUNT; default "
        "/sys/fs/cgroup on pure-v2 hosts, else /sys/fs/cgroup/unified)",
    )
    p.add_argument(
        "--cgroup-v1-mount",
        default=environ.get("CGROUP_V1_MOUNT", AgentSettings.cgroup_v1_mount),
        help="parent of the v1 controller mounts cpu/, memory/, … (env CGROUP_V1_MOUNT; "
        "default %(default)s)",
    )
    p.add_argument(
        "--ncpu",
        type=int,
        default=environ.get("NCPU") or None,
        help="CPUs the run-queue wait ratio divides by (env NCPU; default: the CPUs of the "
        "--cgroup-root cpuset, read from cgroupfs)",
    )
    p.add_argument(
        "--http-address",
        default=environ.get("HTTP_ADDRESS", AgentSettings.http_address),
        help="address serving /healthz, /readyz and /metrics (env HTTP_ADDRESS; "
        "default %(default)s)",
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=environ.get("HTTP_PORT", str(AgentSettings.http_port)),
        help="port of that endpoint, 0 to serve nothing (env HTTP_PORT; default %(default)s)",
    )
    p.add_argument(
        "--probes",
        default=environ.get("PROBES", ""),
        help=f"comma-separated probes to run (env PROBES; default: all of {known}, with "
        "taskstats only as the fallback for BPF probes that cannot load)",
    )
    p.add_argument(
        "--pods-file",
        default=environ.get("PODS_FILE") or None,
        help='YAML/JSON map {uid: "namespace/name"} naming pods without the API (env PODS_FILE)',
    )
    p.add_argument(
        "--kubeconfig",
        default=environ.get("KUBECONFIG") or None,
        help="kubeconfig for watching this node's pods (env KUBECONFIG; default: in-cluster "
        "service account, then ~/.kube/config)",
    )
    p.add_argument(
        "--no-kubernetes",
        action="store_true",
        help="do not contact the API server; pods are named by UID (or --pods-file)",
    )
    p.add_argument(
        "--bpf-dir",
        default=environ.get("INTERFERENCE_BPF_DIR", ""),
        help="directory holding the *.bpf.c programs (env INTERFERENCE_BPF_DIR)",
    )
    p.add_argument(
        "--ttl",
        type=int,
        default=environ.get("TTL_S") or None,
        help="TTL of the Redis hashes in seconds (env TTL_S; default 3 × interval, at least 5)",
    )
    p.add_argument(
        "--stream-maxlen",
        type=int,
        default=environ.get("STREAM_MAXLEN") or AgentSettings.stream_maxlen,
        help="approximate cap of the report stream (env STREAM_MAXLEN; default %(default)s)",
    )
    p.add_argument(
        "--score-ref",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a score reference or weight, repeatable; NAME is one of "
        + ", ".join(_SCORE_REF_NAMES),
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="measure one interval, print the report as JSON and exit (no Redis needed)",
    )
    p.add_argument(
        "--log-level",
        default=environ.get("LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log verbosity (env LOG_LEVEL; default INFO)",
    )
    return p


def score_references(overrides: Sequence[str]) -> ScoreReferences:
    """``ScoreReferences`` with ``NAME=VALUE`` overrides; ``ValueError`` saying what is wrong."""
    refs = ScoreReferences()
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep or name not in _SCORE_REF_NAMES:
            raise ValueError(
                f"--score-ref {item!r}: expected NAME=VALUE with NAME one of "
                + ", ".join(_SCORE_REF_NAMES)
            )
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--score-ref {item!r}: {value!r} is not a number") from None
        refs = replace(refs, **{name: number})
    return refs


def sentinel_addresses(value: str) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` as pairs; ``ValueError`` naming the entry that is wrong."""
    out: list[tuple[str, int]] = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"--redis-sentinels entry {item!r} is not HOST:PORT")
        out.append((host, int(port)))
    return tuple(out)


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> AgentSettings:
    """Settings from parsed flags; ``ValueError`` for values that make no sense."""
    return AgentSettings(
        node_name=args.node_name,
        redis_url=args.redis_url,
        redis_username=environ.get("REDIS_USERNAME") or None,
        redis_password=environ.get("REDIS_PASSWORD") or None,
        redis_sentinels=sentinel_addresses(args.redis_sentinels),
        redis_sentinel_master=args.redis_sentinel_master,
        redis_cluster=args.redis_cluster,
        interval_s=args.interval,
        ttl_s=args.ttl,
        stream_maxlen=args.stream_maxlen,
        probes=tuple(n.strip() for n in args.probes.split(",") if n.strip()),
        cgroup_root=args.cgroup_root,
        cgroup_v2_mount=args.cgroup_v2_mount,
        cgroup_v1_mount=args.cgroup_v1_mount,
        ncpu=args.ncpu,
        http_address=args.http_address,
        http_port=args.http_port,
        bpf_source_dir=args.bpf_dir,
        score_refs=score_references(args.score_ref),
        pods_file=args.pods_file,
        kubernetes=not args.no_kubernetes,
        kubeconfig=args.kubeconfig,
    )


def report_json(report: NodeReport) -> str:
    """The report as indented JSON, with each histogram on one line."""
    text = json.dumps(asdict(report), indent=2)
    return re.sub(r"\[([\d\s,.]*)\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)


def redis_description(settings: AgentSettings) -> str:
    """Where reports go, for the start-up log line (no password)."""
    if settings.redis_sentinels:
        sentinels = ",".join(f"{host}:{port}" for host, port in settings.redis_sentinels)
        return f"Redis master {settings.redis_sentinel_master!r} via sentinels {sentinels}"
    kind = "Redis Cluster at " if settings.redis_cluster else ""
    return kind + redact_url(settings.redis_url)


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for logs."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Entry point of ``interference-agent``; returns the exit status."""
    env = os.environ if environ is None else environ
    arg_parser = parser(env)
    args = arg_parser.parse_args(argv)
    # DEBUG is for the agent's own loggers; libraries (pyroute2, urllib3) stay at INFO.
    logging.basicConfig(
        level=max(logging.INFO, logging.getLevelName(args.log_level)),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    log.setLevel(args.log_level)
    metrics = AgentMetrics(CollectorRegistry())
    try:
        settings = settings_from_args(args, env)
        agent = build_agent(settings, publish=not args.once, metrics=metrics)
    except ValueError as exc:
        arg_parser.error(str(exc))
    server = None
    if not args.once and settings.http_port:
        try:
            server = http_server(settings, agent)
        except OSError as exc:
            # Measuring matters more than the endpoint; a liveness probe will say the rest.
            log.error("%s; measuring and publishing go on without it", exc)
        else:
            server.start()
            log.info(
                "serving /healthz, /readyz and /metrics on %s:%d",
                settings.http_address,
                server.port,
            )

    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        agent.start()
        if args.once:
            if stop.wait(settings.interval_s):
                return 0
            sys.stdout.write(report_json(agent.measure()) + "\n")
            return 0
        log.info(
            "publishing node %s to %s every %g s",
            settings.node_name,
            redis_description(settings),
            settings.interval_s,
        )
        agent.run(stop)
        return 0
    finally:
        if server is not None:
            server.stop()
        agent.close()


def http_server(settings: AgentSettings, agent: Agent) -> AgentHttpServer:
    """The agent's health and metrics endpoint (not started); ``OSError`` saying why
    it cannot bind."""
    return AgentHttpServer(
        settings.http_address,
        settings.http_port,
        agent.metrics.registry,
        health=agent.liveness_problem,
        ready=agent.readiness_problem,
    )


if __name__ == "__main__":
    sys.exit(main())
