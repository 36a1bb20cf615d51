"""``interference-scheduler extender``: serve kube-scheduler's extender protocol.

The same config file, flags and environment as standalone mode (``loop.dry_run`` and
``leader_election`` do not apply: kube-scheduler elects its leader and binds; every
replica of the extender answers). ``/filter`` and ``/prioritize`` are served on the
``extender`` port, over HTTPS requiring kube-scheduler's client certificate, with a body
limit and a bounded thread pool (``extender`` settings); ``/healthz``, ``/readyz`` and
``/metrics`` stay on the ``http`` port for the kubelet and Prometheus
(:mod:`scheduler.extender.protocol` describes the protocol, :mod:`scheduler.extender.extender`
the answers, :mod:`scheduler.endpoint.http` the endpoints).

The node and pod view comes from the same informers (list + watch) as standalone mode,
the signals from the same Redis signal cache, and decision records go to the same
Redis keys. Its only writes to the API server are Events: about its configuration's
reloads, and a Warning Event on a pod whose annotations need fixing (as standalone mode
writes). ``/readyz`` fails until nodes and pods are listed, so kube-scheduler's
calls go to a replica that knows the cluster; an invalid configuration reload never
makes it fail (the last valid configuration keeps answering, :mod:`scheduler.entry.config_reload`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from interference_infra.cliparse import RUNTIME_EXIT, USAGE_EXIT, OneLineParser
from interference_infra.http import EndpointBindError
from interference_infra.logsetup import configure_logging, mask_credentials
from interference_infra.strict import SettingsError
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.kubernetes import KubernetesCluster
from scheduler.adapters.kubernetes_settings import make_api_client
from scheduler.adapters.leader import default_identity
from scheduler.adapters.queued_decision_sink import QueuedDecisionSink
from scheduler.adapters.redis_settings import connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.cycle.cache import ClusterCache
from scheduler.cycle.ports import ClusterError
from scheduler.cycle.queue import SchedulingQueue
from scheduler.endpoint.http import (
    DEFAULT_PORT,
    EXTENDER_PORT,
    ExtenderEndpoint,
    HealthServer,
    Heartbeat,
    Status,
)
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.entry.cli_common import (
    add_process_arguments,
    environment_keys,
    load_configuration,
    make_tracer,
    one_line,
    overrides,
    report_reachability,
)
from scheduler.entry.config import ConfigError, SchedulerConfig, with_overrides
from scheduler.entry.config_reload import ConfigReload, config_map_ref
from scheduler.extender.extender import Extender
from scheduler.extender.metrics import ExtenderMetrics
from scheduler.signals.table import NodeTable

log = logging.getLogger("scheduler")


def build_parser() -> OneLineParser:
    """The ``extender`` subcommand's parser (one-line errors, exit status 2)."""
    parser = OneLineParser(
        prog="interference-scheduler extender",
        description="Serves kube-scheduler's HTTP extender protocol (POST /filter and"
        f" /prioritize on the extender port ({EXTENDER_PORT}, extender.port, HTTPS with"
        " kube-scheduler's client certificate; /healthz, /readyz and /metrics stay on the"
        f" http port, {DEFAULT_PORT}) with the interference filters and scores; never"
        " binds. Flags win over the environment, which wins over the config file.",
        epilog="example: interference-scheduler extender --config scheduler.yaml",
    )
    add_process_arguments(parser)
    parser.set_defaults(dry_run=None)  # nothing to dry-run: the extender never binds
    return parser


class ExtenderProcess:
    """The whole extender process: build with a config, :meth:`run` until ``stop`` is set."""

    def __init__(
        self,
        config: SchedulerConfig,
        config_path: str = "",
        fixed: Mapping[str, dict[str, Any]] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        fixed = dict(fixed or {})
        self.config = config
        self.registry = CollectorRegistry()
        self.metrics = SchedulerMetrics(self.registry)
        self.extender_metrics = ExtenderMetrics(self.registry)
        signal_metrics = SignalMetrics(self.registry)
        self.identity = default_identity()
        self.api = make_api_client(config.kubernetes.kubeconfig, config.kubernetes.context)
        self.api.user_agent = f"interference-scheduler-extender/{self.identity}"
        # kube-scheduler preempts in extender mode: no PodDisruptionBudgets to follow here
        self.cluster = KubernetesCluster(
            self.api, config.kubernetes, identity=self.identity, preemption=False
        )
        self.redis = connect(config.redis, env)
        self.signals = RedisSignalCache(
            self.redis, config.redis, signal_metrics, known_nodes=lambda: self.cache.node_names()
        )
        self.decisions = QueuedDecisionSink(
            RedisDecisionSink(self.redis, config.redis, signal_metrics), config.redis
        )
        # Pods of our scheduler name wait in this queue unread (kube-scheduler schedules
        # them); it holds one key per pending pod and drops each once it is bound.
        self.cache = ClusterCache(
            NodeTable(),
            SchedulingQueue(),
            self.metrics,
            config.loop.scheduler_name,
            config.loop.ignore_namespaces,
        )
        self.tracer = make_tracer(config.tracing, self.registry)
        self.extender = Extender(
            self.cache,
            self.signals,
            self.decisions,
            config.cycle,
            self.metrics,
            self.extender_metrics,
            tracer=self.tracer,
            events=self.cluster,
        )
        config_map = config_map_ref(env)
        self.reload = (
            ConfigReload(
                config_path,
                config,
                lambda new: self.extender.update_settings(new.cycle),
                self.metrics,
                lambda kind, reason, note: self.cluster.record_object_event(
                    "ConfigMap", *config_map, kind, reason, "Reload", note
                ),
                transform=lambda loaded: with_overrides(loaded, **fixed),
            )
            if config_path
            else None
        )
        self.signal_heartbeat = Heartbeat(
            "redis signal follower", max_silence_s=60 + 2 * config.redis.socket_timeout_s
        )
        self.extender_tls = config.extender.tls()  # unusable files: ValueError at start
        self._threads: list[threading.Thread] = []
        self.http: HealthServer | None = None
        self.extender_http: ExtenderEndpoint | None = None

    def report_reachability(self) -> None:
        """One clear line each when the API server or Redis cannot be reached at start."""
        report_reachability(self.cluster, self.redis, "answering interference-blind")

    def run(self, stop: threading.Event) -> None:
        self.report_reachability()
        informers = self._start("informers", self.cluster.run_informers, self.cache, stop)
        signals = self._start("signal-cache", self.signals.run, stop, self.signal_heartbeat.beat)
        if self.reload is not None:
            self._start("config-reload", self.reload.run, stop)
        watcher = self.reload.watcher if self.reload is not None else None
        self._start("record-confirmer", self.extender.run_record_confirmer, stop)
        self._start("pod-warnings", self.extender.run_pod_warnings, stop)
        refused = self.extender_metrics.refused
        # the verbs' port first, so /readyz never passes before kube-scheduler can connect
        self.extender_http = ExtenderEndpoint(
            self.config.extender,
            self.extender.routes(),
            self.extender_tls,
            on_refused=lambda reason: refused.labels(reason).inc(),
        )
        self.extender_http.start()
        self.http = HealthServer(
            self.config.http,
            self.registry,
            Status(
                synced=self.cache.synced,
                config_error=(lambda: watcher.error) if watcher else (lambda: ""),
                leading=lambda: True,  # every extender replica answers
                heartbeats=(self.signal_heartbeat,),
                threads=(informers, signals),
                role=lambda: "extender",
            ),
            decisions=self.decisions,
            get_routes=self.reload.routes() if self.reload is not None else None,
        )
        self.http.start()
        if self.extender_tls is None:
            log.warning(
                "extender.plaintext is true: /filter and /prioritize are served over plain"
                " HTTP without client authentication (for a loopback test only)"
            )
        log.info(
            "interference-scheduler extender %s answering /filter and /prioritize on %s port"
            " %d (health and metrics on port %d)",
            self.identity,
            self.extender_http.scheme.upper(),
            self.extender_http.port,
            self.http.port,
        )
        stop.wait()
        log.info("stopping")
        for thread in self._threads:
            thread.join(timeout=30)
        self.decisions.close()
        if self.tracer is not None:
            self.tracer.close()
        self.extender_http.stop()
        self.http.stop()

    def _start(self, name: str, target: Any, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``interference-scheduler extender``; exit status as standalone's."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        configure_logging(args.log_level, args.log_format, own=["scheduler"])
    except SettingsError as exc:
        parser.error(str(exc))
    unparsed: list[str] = []  # told with the file's problems: every stage at once
    try:
        fixed = overrides(args, os.environ)
    except SettingsError as exc:
        fixed, unparsed = {}, exc.problems
    fixed.pop("loop", None)  # DRY_RUN does not apply: the extender never binds
    config, problems = load_configuration(args.config, fixed, os.environ)
    if unparsed:
        parser.error("; ".join([*unparsed, *problems]))
    if config is None:
        print(f"interference-scheduler extender: {'; '.join(problems)}", file=sys.stderr)
        return USAGE_EXIT
    try:
        process = ExtenderProcess(config, args.config, fixed)
    except ConfigError as exc:
        print(
            f"interference-scheduler extender: {one_line(exc, environment_keys(os.environ))}",
            file=sys.stderr,
        )
        return USAGE_EXIT
    except (ClusterError, ValueError) as exc:
        print(f"interference-scheduler extender: {mask_credentials(str(exc))}", file=sys.stderr)
        return USAGE_EXIT
    if not args.config:
        log.warning("no --config given: running with the built-in defaults")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        process.run(stop)
    except EndpointBindError as exc:  # names the paths, the address and the setting to change
        log.error("%s", exc)
        return RUNTIME_EXIT
    except OSError as exc:
        log.error("cannot serve the extender: %s", exc)
        return RUNTIME_EXIT
    return 0
