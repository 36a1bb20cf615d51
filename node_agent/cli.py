"""``interference-agent``: measure this node's interference and publish it to Redis.

Every flag falls back to an environment variable (named in ``--help``), so a DaemonSet
configures the agent with env vars and a Secret. ``--once`` prints one report as JSON
and needs no Redis.

Size: over 520 lines because every setting's flag, its environment variable and its check
are one table the ``--help`` text, the DaemonSet and the tests read together.
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
from dataclasses import asdict, replace
from types import FrameType

from prometheus_client import CollectorRegistry

from interference.index import REFERENCE_NAMES, IndexReferences
from interference.signals import NodeReport
from interference_infra.cliparse import RUNTIME_EXIT, OneLineParser
from interference_infra.logsetup import configure_logging
from interference_infra.redis_arguments import add_redis_arguments, redis_arguments
from interference_infra.strict import SettingsError, check_range, parse_number
from interference_infra.version import add_version_argument
from node_agent import probes
from node_agent.agent import Agent, build_agent, publisher_settings
from node_agent.credentials import DEFAULT_TOKEN_FILE
from node_agent.degrade import DegradeSettings
from node_agent.health import AgentHttpServer, AgentMetrics
from node_agent.settings import AgentSettings, detect_cgroup_v2_mount

log = logging.getLogger("node_agent")

INDEX_REF_FLAG = "--index-ref"


def parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The argument parser; string defaults come from ``environ``, numbers and booleans
    are read from flag or environment by :func:`settings_from_args` so that an error
    names whichever the value came from."""
    known = ", ".join(sorted(probes.base.registered())) or "none registered"
    p = OneLineParser(
        prog="interference-agent",
        description="Measure per-pod CPU run-queue and memory-reclaim interference on this "
        "node every interval and publish it to Redis. Every flag falls back to the "
        "environment variable named in its help (a DaemonSet configures the agent that "
        "way); booleans accept true/false, 1/0, yes/no.",
        epilog="example: interference-agent --once --no-kubernetes --probes psi,cpu_throttle"
        "  (measure one interval, print it as JSON, no Redis needed)",
    )
    add_version_argument(p)
    p.add_argument(
        "--node-name",
        default=environ.get("NODE_NAME") or socket.gethostname(),
        help="node name the report is published under (env NODE_NAME; default: hostname)",
    )
    add_redis_arguments(p, environ, user="writes only this node's keys")
    p.add_argument(
        "--credentials-url",
        default=environ.get("CREDENTIALS_URL") or None,
        metavar="URL",
        help="get this node's own Redis user from the credential issuer at URL (env "
        "CREDENTIALS_URL, e.g. https://interference-credentials.interference-system:10272), "
        "proving the node with --token-file; REDIS_USERNAME/REDIS_PASSWORD are then ignored",
    )
    p.add_argument(
        "--token-file",
        default=environ.get("TOKEN_FILE") or DEFAULT_TOKEN_FILE,
        metavar="PATH",
        help="projected ServiceAccount token (audience interference-credentials) shown to the "
        "issuer (env TOKEN_FILE; default %(default)s)",
    )
    p.add_argument(
        "--credentials-ca-file",
        default=environ.get("CREDENTIALS_CA_FILE") or None,
        metavar="PEM",
        help="CA that signed the issuer's certificate (env CREDENTIALS_CA_FILE; https:// only; "
        "default: the system's CAs)",
    )
    p.add_argument(
        "--credentials-server-name",
        default=environ.get("CREDENTIALS_SERVER_NAME") or None,
        metavar="NAME",
        help="name the issuer's certificate must carry when --credentials-url is an address "
        "(env CREDENTIALS_SERVER_NAME; https:// only; default: the URL's host)",
    )
    p.add_argument(
        "--interval",
        metavar="SECONDS",
        help="seconds between reports, > 0 (env INTERVAL_S; default 1)",
    )
    p.add_argument(
        "--cgroup-root",
        default=environ.get("CGROUP_ROOT", "/"),
        help="only measure cgroups at or below this path, which must exist (env CGROUP_ROOT; "
        "default /)",
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
        metavar="N",
        help="CPUs the run-queue wait ratio divides by, ≥ 1 (env NCPU; default: the CPUs of "
        "the --cgroup-root cpuset, read from cgroupfs)",
    )
    p.add_argument(
        "--http-address",
        default=environ.get("HTTP_ADDRESS", AgentSettings.http_address),
        help="address serving /healthz, /readyz and /metrics (env HTTP_ADDRESS; "
        "default %(default)s)",
    )
    p.add_argument(
        "--http-port",
        metavar="PORT",
        help=f"port of that endpoint, 0–65535, 0 to serve nothing; a port in use is fatal "
        f"(env HTTP_PORT; default {AgentSettings.http_port})",
    )
    p.add_argument(
        "--metrics-max-pods",
        metavar="N",
        help="most pods with per-pod series on /metrics (victims, antagonists and pods with "
        "an interference tolerance), ≥ 0, 0 for none; more are counted in "
        f"interference_agent_pod_metrics_left_out (env METRICS_MAX_PODS; default "
        f"{AgentSettings.metrics_max_pods})",
    )
    p.add_argument(
        "--probes",
        default=environ.get("PROBES", ""),
        help=f"comma-separated probes to run, each one of {known} (env PROBES; default: "
        "all, with taskstats only as the fallback for BPF probes that cannot load)",
    )
    p.add_argument(
        "--pods-file",
        default=environ.get("PODS_FILE") or None,
        help='YAML/JSON map {uid: "namespace/name"} naming pods without the API; an entry may '
        'be {pod: "namespace/name", annotations: {...}} for its tolerance (env PODS_FILE)',
    )
    p.add_argument(
        "--kubeconfig",
        default=environ.get("KUBECONFIG") or None,
        help="kubeconfig for watching this node's pods (env KUBECONFIG; default: in-cluster "
        "service account, then ~/.kube/config)",
    )
    p.add_argument(
        "--kubelet-url",
        default=environ.get("KUBELET_URL") or None,
        help="name pods from this node's kubelet, e.g. https://NODE_IP:10250 (env KUBELET_URL; "
        "needs get nodes/pods), instead of watching pods in the API server",
    )
    p.add_argument(
        "--kubelet-ca-file",
        default=environ.get("KUBELET_CA_FILE") or None,
        help="CA of the kubelet's serving certificate (env KUBELET_CA_FILE; default: not "
        "verified, kubelets serve self-signed certificates unless configured otherwise)",
    )
    p.add_argument(
        "--proc-root",
        default=environ.get("PROC_ROOT", AgentSettings.proc_root),
        help="the host's procfs, e.g. /host/proc without the host PID namespace (env "
        "PROC_ROOT; default %(default)s)",
    )
    p.add_argument(
        "--degrade",
        default=environ.get("DEGRADE", "off"),
        help="degrade antagonists on this node (BestEffort or interference.io/degradable "
        "pods): off, dry-run (Events and metrics only) or enforce (writes cgroupfs; "
        "deploy/components/degrade) (env DEGRADE; default off)",
    )
    p.add_argument(
        "--degrade-reclaim-stall",
        metavar="MS_PER_S",
        help="node reclaim stall from which the memory antagonist is degraded (env "
        f"DEGRADE_RECLAIM_STALL_MS_PER_S; default {DegradeSettings.reclaim_stall_ms_per_s:g})",
    )
    p.add_argument(
        "--degrade-victim-wait",
        metavar="MS_PER_S",
        help="run-queue wait behind neighbours that makes a pod a victim (env "
        f"DEGRADE_VICTIM_WAIT_MS_PER_S; default {DegradeSettings.victim_wait_ms_per_s:g})",
    )
    p.add_argument(
        "--degrade-state-file",
        default=environ.get("DEGRADE_STATE_FILE", DegradeSettings.state_file),
        help="where what was degraded is kept for restoring after a restart (env "
        "DEGRADE_STATE_FILE; default %(default)s)",
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
        metavar="SECONDS",
        help="TTL of the Redis hashes in seconds, ≥ 1 (env TTL_S; default 3 × interval, "
        "at least 5)",
    )
    p.add_argument(
        "--stream-maxlen",
        metavar="N",
        help=f"cap of the node's report stream, ≥ 1 (env STREAM_MAXLEN; default "
        f"{AgentSettings.stream_maxlen})",
    )
    p.add_argument(
        "--unready-after-publish-failures",
        metavar="N",
        help="/readyz fails after N reports in a row could not be published, ≥ 1 (env "
        f"UNREADY_AFTER_PUBLISH_FAILURES; default {AgentSettings.unready_after_publish_failures})",
    )
    p.add_argument(
        INDEX_REF_FLAG,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a reference point or weight of the interference index (a number ≥ 0; "
        "weights at most 1), repeatable; NAME is one of " + ", ".join(REFERENCE_NAMES),
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="measure one interval, print the report as JSON and exit (no Redis needed)",
    )
    p.add_argument(
        "--log-level",
        default=environ.get("LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR, any case (env LOG_LEVEL; default INFO)",
    )
    p.add_argument(
        "--log-format",
        default=environ.get("LOG_FORMAT", "text"),
        help="json (one object per line, for log collectors) or text (env LOG_FORMAT; "
        "default text)",
    )
    return p


def _flag_or_env(
    value: str | None, environ: Mapping[str, str], flag: str, variable: str
) -> tuple[str, str | None]:
    """(name to blame, raw value): the flag when given, else the environment variable."""
    if value is not None:
        return flag, value
    raw = environ.get(variable)
    return variable, raw if raw not in (None, "") else None


def _number(
    value: str | None,
    environ: Mapping[str, str],
    flag: str,
    variable: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    integer: bool = False,
) -> float | None:
    """The flag's value, else the variable's, checked against the range; None when
    neither is set."""
    name, raw = _flag_or_env(value, environ, flag, variable)
    if raw is None:
        return None
    return parse_number(name, raw, minimum=minimum, maximum=maximum, above=above, integer=integer)


def _integer(
    value: str | None,
    environ: Mapping[str, str],
    flag: str,
    variable: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> int | None:
    number = _number(value, environ, flag, variable, minimum=minimum, maximum=maximum, integer=True)
    return None if number is None else int(number)


def index_references(overrides: Sequence[str]) -> IndexReferences:
    """``IndexReferences`` with ``--index-ref`` ``NAME=VALUE`` overrides, later ones winning;
    ``ValueError`` saying what is wrong (naming the flag)."""
    refs = IndexReferences()
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep or name not in REFERENCE_NAMES:
            raise ValueError(
                f"{INDEX_REF_FLAG} {item!r}: expected NAME=VALUE with NAME one of "
                + ", ".join(REFERENCE_NAMES)
            )
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{INDEX_REF_FLAG} {item!r}: {value!r} is not a number") from None
        check_range(f"{INDEX_REF_FLAG} {name}", number, minimum=0)
        try:
            refs = replace(refs, **{name: number})
        except ValueError as exc:  # a quiet point above its saturation point, weight > 1
            raise ValueError(f"{INDEX_REF_FLAG} {item!r}: {exc}") from None
    return refs


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> AgentSettings:
    """Settings from parsed flags and the environment; ``ValueError`` (a
    :class:`~interference_infra.strict.SettingsError` for a bad number or boolean) naming the
    flag or variable and what it accepts."""
    redis = redis_arguments(args, environ)
    interval = _number(args.interval, environ, "--interval", "INTERVAL_S", above=0)
    maxlen = _integer(args.stream_maxlen, environ, "--stream-maxlen", "STREAM_MAXLEN", minimum=1)
    unready = _integer(
        args.unready_after_publish_failures,
        environ,
        "--unready-after-publish-failures",
        "UNREADY_AFTER_PUBLISH_FAILURES",
        minimum=1,
    )
    port = _integer(args.http_port, environ, "--http-port", "HTTP_PORT", minimum=0, maximum=65535)
    max_pods = _integer(
        args.metrics_max_pods, environ, "--metrics-max-pods", "METRICS_MAX_PODS", minimum=0
    )
    probe_names = tuple(n.strip() for n in args.probes.split(",") if n.strip())
    check_probe_names(probe_names)
    return AgentSettings(
        node_name=args.node_name,
        redis_url=redis.url,
        redis_username=environ.get("REDIS_USERNAME") or None,
        redis_password=environ.get("REDIS_PASSWORD") or None,
        redis_tls=redis.tls,
        redis_sentinels=redis.sentinels,
        redis_sentinel_master=redis.sentinel_master,
        redis_cluster=redis.cluster,
        credentials_url=args.credentials_url,
        token_file=args.token_file,
        credentials_ca_file=args.credentials_ca_file,
        credentials_server_name=args.credentials_server_name,
        interval_s=AgentSettings.interval_s if interval is None else interval,
        ttl_s=_integer(args.ttl, environ, "--ttl", "TTL_S", minimum=1),
        stream_maxlen=AgentSettings.stream_maxlen if maxlen is None else maxlen,
        unready_after_publish_failures=(
            AgentSettings.unready_after_publish_failures if unready is None else unready
        ),
        probes=probe_names,
        cgroup_root=args.cgroup_root,
        cgroup_v2_mount=args.cgroup_v2_mount,
        cgroup_v1_mount=args.cgroup_v1_mount,
        ncpu=_integer(args.ncpu, environ, "--ncpu", "NCPU", minimum=1),
        http_address=args.http_address,
        http_port=AgentSettings.http_port if port is None else port,
        metrics_max_pods=AgentSettings.metrics_max_pods if max_pods is None else max_pods,
        bpf_source_dir=args.bpf_dir,
        index_refs=index_references(args.index_ref),
        pods_file=args.pods_file,
        kubernetes=not args.no_kubernetes,
        kubeconfig=args.kubeconfig,
        kubelet_url=args.kubelet_url,
        kubelet_ca_file=args.kubelet_ca_file,
        proc_root=args.proc_root,
        degrade=degrade_settings(args, environ),
    )


DEGRADE_MODES = ("off", "dry-run", "enforce")


def degrade_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> DegradeSettings:
    """``--degrade`` and its thresholds (``SettingsError`` naming the flag or variable)."""
    mode = str(args.degrade).strip().lower()
    if mode not in DEGRADE_MODES:
        raise SettingsError(
            f"--degrade/DEGRADE must be one of {', '.join(DEGRADE_MODES)}, got {args.degrade!r}"
        )
    stall = _number(
        args.degrade_reclaim_stall,
        environ,
        "--degrade-reclaim-stall",
        "DEGRADE_RECLAIM_STALL_MS_PER_S",
        above=0,
    )
    wait = _number(
        args.degrade_victim_wait,
        environ,
        "--degrade-victim-wait",
        "DEGRADE_VICTIM_WAIT_MS_PER_S",
        above=0,
    )
    return DegradeSettings(
        enabled=mode != "off",
        dry_run=mode != "enforce",
        reclaim_stall_ms_per_s=DegradeSettings.reclaim_stall_ms_per_s if stall is None else stall,
        victim_wait_ms_per_s=DegradeSettings.victim_wait_ms_per_s if wait is None else wait,
        state_file=args.degrade_state_file,
    )


def check_probe_names(names: Sequence[str]) -> None:
    """``ValueError`` naming every probe that does not exist and the ones that do."""
    known = probes.base.registered()
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SettingsError(
            f"unknown probe(s) {', '.join(unknown)} in --probes/PROBES; "
            f"choose from {', '.join(sorted(known))}"
        )


def check_cgroup_root(settings: AgentSettings) -> None:
    """``ValueError`` when ``--cgroup-root`` names a cgroup that exists in neither the v2
    hierarchy nor a v1 controller: the agent would measure nothing, silently."""
    if settings.cgroup_root == "/":
        return
    relative = settings.cgroup_root.strip("/")
    candidates = [os.path.join(settings.cgroup_v2_mount, relative)] + [
        os.path.join(settings.cgroup_v1_mount, controller, relative)
        for controller in ("cpu,cpuacct", "cpu", "cpuacct", "memory", "cpuset")
    ]
    if not any(os.path.isdir(path) for path in candidates):
        raise SettingsError(
            f"--cgroup-root/CGROUP_ROOT {settings.cgroup_root!r} is not a cgroup: "
            f"{candidates[0]} does not exist (nor under the v1 controllers of "
            f"{settings.cgroup_v1_mount}); name an existing cgroup or use /"
        )


def report_json(report: NodeReport) -> str:
    """The report as indented JSON, with each histogram on one line."""
    text = json.dumps(asdict(report), indent=2)
    return re.sub(r"\[([\d\s,.]*)\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)


def redis_description(settings: AgentSettings) -> str:
    """Where reports go and as whom, for the start-up log line (no password)."""
    where = publisher_settings(settings).target.describe()
    enrolment = settings.enrolment()
    if enrolment is not None:
        return f"{where} as this node's own user from {enrolment.endpoint}"
    return where


def prepare(
    argv: Sequence[str] | None, environ: Mapping[str, str]
) -> tuple[argparse.Namespace, AgentSettings]:
    """Parse the flags, set up logging and validate the settings; a bad value exits 2
    with one line naming the flag or variable. Touches nothing but the logging set-up."""
    arg_parser = parser(environ)
    args = arg_parser.parse_args(argv)
    try:
        # DEBUG is for the agent's own loggers; libraries (pyroute2, urllib3) stay at INFO.
        configure_logging(args.log_level, args.log_format, own=["node_agent"])
        settings = settings_from_args(args, environ)
        check_cgroup_root(settings)
    except ValueError as exc:
        arg_parser.error(str(exc))
    return args, settings


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Entry point of ``interference-agent``; returns the exit status: 2 for a bad flag or
    environment value (one line saying which and what it accepts), 1 when it cannot run
    (the health port is taken), 0 after SIGTERM or ``--once``."""
    env = os.environ if environ is None else environ
    args, settings = prepare(argv, env)
    metrics = AgentMetrics(CollectorRegistry())
    try:
        agent = build_agent(settings, publish=not args.once, metrics=metrics)
    except ValueError as exc:
        parser(env).error(str(exc))
    server = None
    if not args.once and settings.http_port:
        try:
            server = http_server(settings, agent)
        except OSError as exc:
            # Fatal: with hostNetwork, kubelet's probes would reach whoever holds the port.
            log.error("%s", exc)
            agent.close()
            return RUNTIME_EXIT
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
            "publishing node %s to Redis at %s every %g s",
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
