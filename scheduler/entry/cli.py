"""``interference-scheduler``: wires the config, adapters, elector, loop and endpoints.

Precedence: command-line flags > environment > config file > defaults. Environment:

* ``INTERFERENCE_SCHEDULER_CONFIG`` — config file when ``--config`` is not given;
* ``KUBECONFIG`` — used by the client when neither flag nor file names a kubeconfig;
* ``REDIS_URL``, ``REDIS_USERNAME``, ``REDIS_PASSWORD`` — Redis address and ACL user;
  ``REDIS_PASSWORD_FILE`` instead of ``REDIS_PASSWORD``: a file (the mounted Secret) read
  at every login, so a rotated password needs no restart;
* ``REDIS_SENTINELS`` (``HOST:PORT,…``) and ``REDIS_SENTINEL_MASTER``, or
  ``REDIS_CLUSTER`` (``true``) — a master found through Redis Sentinel, or a Redis Cluster
  (as the agent's variables);
* ``REDIS_CA_FILE``, ``REDIS_CERT_FILE``, ``REDIS_KEY_FILE`` — TLS (``rediss://``);
* ``DRY_RUN`` (``1``/``true``) — like ``--dry-run``;
* ``POD_NAME``, ``POD_NAMESPACE`` — leader identity and Lease namespace;
* ``INTERFERENCE_SCHEDULER_CONFIGMAP`` — ``NAME`` or ``NAMESPACE/NAME`` of the ConfigMap
  the reload Events are about (default ``interference-scheduler-config`` in
  ``POD_NAMESPACE``; :mod:`scheduler.entry.config_reload`);
* ``LOG_LEVEL`` — like ``--log-level``.

Exit status 2 for an invalid configuration or missing Kubernetes credentials (nothing
can work until a person fixes them). An unreachable API server or Redis is reported in
one line at start and retried for as long as the process runs: the scheduler serves
/healthz meanwhile and schedules interference-blind while Redis is down.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from interference import keys
from interference_infra.cliparse import RUNTIME_EXIT, USAGE_EXIT, OneLineParser
from interference_infra.logsetup import configure_logging, mask_credentials
from interference_infra.redis_client import REDIS_ERRORS
from interference_infra.strict import SettingsError
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.eviction import KubernetesEvictor
from scheduler.adapters.kubernetes import KubernetesCluster
from scheduler.adapters.kubernetes_settings import make_api_client
from scheduler.adapters.leader import LeaderElector, default_identity, lease_namespace
from scheduler.adapters.move_journal import ConfigMapMoveJournal, journal_name
from scheduler.adapters.node_reports import RedisNodeReportSource
from scheduler.adapters.preemption import KubernetesPreemptor, PreemptionMetrics
from scheduler.adapters.queued_decision_sink import QueuedDecisionSink
from scheduler.adapters.redis_settings import connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.cycle.ports import ClusterError
from scheduler.cycle.preemption import antagonists_in
from scheduler.endpoint.http import HealthServer, Heartbeat, Status
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.entry.cli_common import (
    add_process_arguments,
    load_configuration,
    make_tracer,
    overrides,
    report_reachability,
)
from scheduler.entry.cli_common import (
    one_line as one_line,  # re-exported: tests/test_fuzz_inputs.py formats errors with it
)
from scheduler.entry.config import SchedulerConfig, with_overrides
from scheduler.entry.config_reload import ConfigReload, config_map_ref
from scheduler.entry.extender_cli import main as extender_main
from scheduler.entry.reload_guard import ReloadGuard
from scheduler.entry.reload_verdict import LEASE_VERDICT_ANNOTATION
from scheduler.rebalancing.metrics import RebalanceMetrics
from scheduler.rebalancing.rebalance import REBALANCE_MODES
from scheduler.rebalancing.rebalancer import Rebalancer
from scheduler.standalone.loop import SchedulingLoop

log = logging.getLogger("scheduler")


def build_parser() -> OneLineParser:
    """The argument parser (one-line errors, exit status 2)."""
    parser = OneLineParser(
        prog="interference-scheduler",
        description="Schedules pods with spec.schedulerName: interference-scheduler using"
        " per-node interference signals from Redis. Flags win over the environment, which"
        " wins over the config file; booleans accept true/false, 1/0, yes/no.",
        epilog="example: interference-scheduler --config scheduler.yaml --dry-run "
        "--log-format json  (decide and record, bind nothing); `interference-scheduler"
        " extender --help`: kube-scheduler extender mode",
    )
    add_process_arguments(parser)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=None,
        help="record decisions in Redis, bind nothing (env DRY_RUN=true)",
    )
    parser.add_argument(
        "--rebalance",
        choices=REBALANCE_MODES,
        default=None,
        help="the rebalancer's mode, over the config file's rebalancer.mode: off, dry_run (the"
        " default: Events and records, evicts nothing) or enforce (evicts)",
    )
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


class Scheduler:
    """The whole process: build with a config, :meth:`run` until ``stop`` is set."""

    def __init__(
        self,
        config: SchedulerConfig,
        config_path: str = "",
        fixed: Mapping[str, dict[str, Any]] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``fixed``: the flag/environment overrides (see :func:`overrides`), re-applied to
        every reloaded file so they keep winning."""
        env = os.environ if env is None else env
        fixed = dict(fixed or {})
        self.config = config
        self.registry = CollectorRegistry()
        self.metrics = SchedulerMetrics(self.registry)
        signal_metrics = SignalMetrics(self.registry)
        self.identity = default_identity()
        self.api = make_api_client(config.kubernetes.kubeconfig, config.kubernetes.context)
        self.api.user_agent = (
            f"interference-scheduler/{self.identity}"  # names the replica in audit logs
        )
        self.cluster = KubernetesCluster(self.api, config.kubernetes, identity=self.identity)
        self.redis = connect(config.redis, env)
        self.signals = RedisSignalCache(
            self.redis,
            config.redis,
            signal_metrics,
            known_nodes=lambda: self.loop.cache.node_names(),
        )
        self.decisions = QueuedDecisionSink(
            RedisDecisionSink(self.redis, config.redis, signal_metrics), config.redis
        )
        """The placement records, and what the decision page (``/decisions/NS/POD``) shows."""
        self.rebalancing_records = RedisDecisionSink(
            self.redis, config.redis, signal_metrics, record_key=keys.rebalance_decision_key
        )
        """The rebalancer's records: written in its own thread, a few per look, so unqueued;
        a key of their own keeps each pod's placement record (docs/design.md §11)."""
        self.leading = threading.Event()
        self.elector = LeaderElector(
            self.api,
            config.leader_election,
            self.leading,
            self.identity,
            on_change=lambda leading: self.metrics.leader.set(1 if leading else 0),
        )
        self.tracer = make_tracer(config.tracing, self.registry)
        self.node_reports = RedisNodeReportSource(self.redis, signal_metrics)
        """The agents' reports: the rebalancer's evidence, and the antagonists the opt-in
        preemption rule reads (cycle.preemption.preempt_antagonists)."""
        self.loop = SchedulingLoop(
            self.cluster,
            self.signals,
            self.decisions,
            config.cycle,
            config.loop,
            self.leading,
            self.metrics,
            tracer=self.tracer,
            preemptor=KubernetesPreemptor(self.cluster, PreemptionMetrics(self.registry)),
            antagonists=self._antagonists,
            on_attempt=lambda key, placed, anyway: self.guard.observe(
                key, placed, time.time(), anyway
            ),
        )
        self.guard = ReloadGuard()
        config_map = config_map_ref(env)
        self.reload = (
            ConfigReload(
                config_path,
                config,
                self._apply_reload,
                self.metrics,
                lambda kind, reason, note: self.cluster.record_object_event(
                    "ConfigMap", *config_map, kind, reason, "Reload", note
                ),
                transform=lambda loaded: with_overrides(loaded, **fixed),
                guard=self.guard,
                leading=self.leading.is_set,
                judge=self._judge_reload,
                stranded=lambda: self.loop.baseline.stranded(self.loop.cache),
                publish=lambda verdict: self.elector.publish(LEASE_VERDICT_ANNOTATION, verdict),
                published=lambda: self.elector.annotation(LEASE_VERDICT_ANNOTATION),
            )
            if config_path
            else None
        )
        self.rebalancer = Rebalancer(
            self.loop.cache,
            self.signals,
            self.node_reports,
            KubernetesEvictor(self.api),
            self.cluster,
            self.rebalancing_records,
            config.cycle,
            config.rebalancer,
            config.loop.scheduler_name,
            RebalanceMetrics(self.registry),
            journal=ConfigMapMoveJournal(
                self.api,
                lease_namespace(config.leader_election),
                journal_name(config.leader_election.lease_name),
            ),
            records_only=config.loop.dry_run,
            tracer=self.tracer,
            max_clock_skew_s=config.redis.max_clock_skew_s,
        )
        self.signal_heartbeat = Heartbeat(
            "redis signal follower", max_silence_s=60 + 2 * config.redis.socket_timeout_s
        )
        loop = self.loop
        self.loop_heartbeat = Heartbeat(
            "scheduling loop",
            max_silence_s=config.loop.wedged_after_s,
            last_beat=lambda: loop.last_cycle_at,
        )
        self._threads: list[threading.Thread] = []
        self.http: HealthServer | None = None

    def _antagonists(self, nodes: Sequence[str]) -> dict[str, frozenset[str]]:
        """The antagonists the agents' latest report names on each of ``nodes`` (none
        while Redis cannot be read: the opt-in rule then finds no candidate)."""
        try:
            found = self.node_reports.recent(nodes)
        except REDIS_ERRORS as exc:
            log.warning("cannot read the agents' reports for preemption: %s", exc)
            return {}
        return {
            node: antagonists_in([max(reports, key=lambda r: r.ts)])
            for node, reports in found.items()
            if reports
        }

    def _judge_reload(self, good: SchedulerConfig | None, new: SchedulerConfig | None) -> None:
        """Let the loop compare Pending pods with the last good configuration
        (scheduler.standalone.reload_baseline) while a reload is judged."""
        if good is None or new is None:
            self.loop.baseline.judge(None)
            return
        self.loop.baseline.judge(
            (good.cycle, (good.loop.scheduler_name, good.loop.ignore_namespaces)),
            (new.cycle, (new.loop.scheduler_name, new.loop.ignore_namespaces)),
        )

    def _apply_reload(self, new: SchedulerConfig) -> None:
        self.loop.update_settings(new.cycle, new.loop)
        self.loop_heartbeat.max_silence_s = new.loop.wedged_after_s
        self.rebalancer.update_settings(
            new.cycle, new.rebalancer, new.loop.scheduler_name, records_only=new.loop.dry_run
        )

    def report_reachability(self) -> None:
        """One clear line each when the API server or Redis cannot be reached at start."""
        report_reachability(self.cluster, self.redis, "scheduling interference-blind")

    def run(self, stop: threading.Event) -> None:
        self.report_reachability()
        loop_thread = self._start("scheduling-loop", self.loop.run, stop)
        elector_thread = self._start("leader-election", self.elector.run, stop)
        signals_thread = self._start(
            "signal-cache", self.signals.run, stop, self.signal_heartbeat.beat
        )
        self._start("rebalancer", self.rebalancer.run, stop, self.leading)
        if self.reload is not None:
            self._start("config-reload", self.reload.run, stop)
        watcher = self.reload.watcher if self.reload is not None else None
        self.http = HealthServer(
            self.config.http,
            self.registry,
            Status(
                synced=self.loop.cache.synced,
                config_error=(lambda: watcher.error) if watcher else (lambda: ""),
                leading=self.leading.is_set,
                heartbeats=(self.signal_heartbeat, self.loop_heartbeat),
                threads=(loop_thread, elector_thread, signals_thread),
            ),
            decisions=self.decisions,
            get_routes=self.reload.routes() if self.reload is not None else None,
        )
        self.http.start()
        log.info(
            "interference-scheduler %s running (scheduler name %s%s)",
            self.identity,
            self.config.loop.scheduler_name,
            ", dry run" if self.config.loop.dry_run else "",
        )
        stop.wait()
        log.info("stopping")
        for thread in self._threads:
            thread.join(timeout=30)
        self.decisions.close()  # the loop has stopped: write the records still queued
        if self.tracer is not None:
            self.tracer.close()
        self.http.stop()

    def _start(self, name: str, target: Any, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread


def prepare(
    argv: Sequence[str] | None, env: Mapping[str, str]
) -> tuple[argparse.Namespace, dict[str, dict[str, Any]], SchedulerConfig]:
    """Parse the flags, set up logging, read the environment and the config file; a bad
    value exits 2 (SystemExit) with one line saying what is wrong. Touches nothing but the
    logging set-up. Returns the arguments, the flag/env overrides and the configuration."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        configure_logging(args.log_level, args.log_format, own=["scheduler"])
    except SettingsError as exc:
        parser.error(str(exc))
    unparsed: list[str] = []  # told with the file's problems: every stage at once
    try:
        fixed = overrides(args, env)
    except SettingsError as exc:
        fixed, unparsed = {}, exc.problems
    if args.rebalance is not None:
        fixed["rebalancer"] = {"mode": args.rebalance}
    config, problems = load_configuration(args.config, fixed, env)
    if unparsed:
        parser.error("; ".join([*unparsed, *problems]))
    if config is None:
        print(f"interference-scheduler: {'; '.join(problems)}", file=sys.stderr)
        raise SystemExit(USAGE_EXIT)
    return args, fixed, config


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; exit status 2 for a bad flag, variable or configuration, 1 when it
    cannot run (its HTTP port is taken), 0 after SIGTERM. ``extender`` as the first
    argument runs kube-scheduler extender mode (:mod:`scheduler.entry.extender_cli`)."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] == ["extender"]:
        return extender_main(arguments[1:])
    try:
        args, fixed, config = prepare(arguments, os.environ)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        scheduler = Scheduler(config, args.config, fixed)
    except (ClusterError, ValueError) as exc:
        print(f"interference-scheduler: {mask_credentials(str(exc))}", file=sys.stderr)
        return USAGE_EXIT
    if not args.config:
        log.warning("no --config given: running with the built-in defaults")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        scheduler.run(stop)
    except OSError as exc:
        log.error(
            "cannot serve /healthz, /readyz and /metrics on %s:%d (%s); free the port or set "
            "http.port",
            scheduler.config.http.host,
            scheduler.config.http.port,
            exc.strerror or exc,
        )
        return RUNTIME_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
