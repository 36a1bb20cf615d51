"""``interference-scheduler``: wires the config, adapters, elector, loop and endpoints.

Precedence: command-line flags > environment > config file > defaults. Environment:

* ``INTERFERENCE_SCHEDULER_CONFIG`` — config file when ``--config`` is not given;
* ``KUBECONFIG`` — used by the client when neither flag nor file names a kubeconfig;
* ``REDIS_URL``, ``REDIS_USERNAME``, ``REDIS_PASSWORD`` — Redis address and ACL user;
* ``DRY_RUN`` (``1``/``true``) — like ``--dry-run``;
* ``POD_NAME``, ``POD_NAMESPACE`` — leader identity and Lease namespace;
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
from collections.abc import Mapping, Sequence
from typing import Any

import redis
from prometheus_client import CollectorRegistry

from interference import keys
from scheduler.adapters.kubernetes import KubernetesCluster, make_api_client
from scheduler.adapters.redis_signals import (
    QueuedDecisionSink,
    RedisDecisionSink,
    RedisSignalCache,
    SignalMetrics,
    connect,
    safe_url,
)
from scheduler.config import (
    ConfigError,
    ConfigWatcher,
    SchedulerConfig,
    load_config,
    with_overrides,
)
from scheduler.http import HealthServer, Heartbeat, Status
from scheduler.leader import LeaderElector, default_identity
from scheduler.loop import SchedulingLoop
from scheduler.metrics import SchedulerMetrics
from scheduler.ports import ClusterError

log = logging.getLogger("scheduler")

_TRUE = {"1", "true", "yes", "on"}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="interference-scheduler",
        description="Schedules pods with spec.schedulerName: interference-scheduler using"
        " per-node interference signals from Redis.",
    )
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
        "--dry-run",
        action="store_true",
        default=None,
        help="record decisions in Redis, bind nothing (env DRY_RUN)",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    return parser.parse_args(argv)


def overrides(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Config fields set by flags or the environment."""
    sections: dict[str, dict[str, Any]] = {}
    if env.get("REDIS_URL"):
        sections["redis"] = {"url": env["REDIS_URL"]}
    dry_run = args.dry_run
    if dry_run is None and env.get("DRY_RUN"):
        dry_run = env["DRY_RUN"].strip().lower() in _TRUE
    if dry_run is not None:
        sections["loop"] = {"dry_run": dry_run}
    if args.kubeconfig:
        sections["kubernetes"] = {"kubeconfig": args.kubeconfig}
    return sections


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
        self.signals = RedisSignalCache(self.redis, config.redis, signal_metrics)
        self.decisions = QueuedDecisionSink(
            RedisDecisionSink(self.redis, config.redis, signal_metrics), config.redis
        )
        self.leading = threading.Event()
        self.elector = LeaderElector(
            self.api,
            config.leader_election,
            self.leading,
            self.identity,
            on_change=lambda leading: self.metrics.leader.set(1 if leading else 0),
        )
        self.loop = SchedulingLoop(
            self.cluster,
            self.signals,
            self.decisions,
            config.engine,
            config.loop,
            self.leading,
            self.metrics,
        )
        self.watcher = (
            ConfigWatcher(
                config_path,
                config,
                self._apply_reload,
                transform=lambda loaded: with_overrides(loaded, **fixed),
            )
            if config_path
            else None
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

    def _apply_reload(self, new: SchedulerConfig) -> None:
        self.loop.update_settings(new.engine, new.loop)
        self.loop_heartbeat.max_silence_s = new.loop.wedged_after_s

    def report_reachability(self) -> None:
        """One clear line each when the API server or Redis cannot be reached at start."""
        try:
            self.cluster.list_page("Node", "")
        except ClusterError as exc:
            log.error("Kubernetes API: %s (retrying in the background)", exc)
        try:
            self.redis.xrevrange(keys.STREAM, count=1)
        except redis.RedisError as exc:
            log.error(
                "Redis: cannot reach %s (%s); check redis.url / REDIS_URL and REDIS_USERNAME /"
                " REDIS_PASSWORD; scheduling interference-blind until it answers",
                safe_url(self.config.redis.url),
                exc,
            )

    def run(self, stop: threading.Event) -> None:
        self.report_reachability()
        loop_thread = self._start("scheduling-loop", self.loop.run, stop)
        elector_thread = self._start("leader-election", self.elector.run, stop)
        signals_thread = self._start(
            "signal-cache", self.signals.run, stop, self.signal_heartbeat.beat
        )
        if self.watcher is not None:
            self._start("config-watcher", self.watcher.run, stop)
        watcher = self.watcher
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
        self.http.stop()

    def _start(self, name: str, target: Any, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    fixed = overrides(args, os.environ)
    try:
        loaded = load_config(args.config) if args.config else SchedulerConfig()
        scheduler = Scheduler(with_overrides(loaded, **fixed), args.config, fixed)
    except (ConfigError, ClusterError) as exc:
        print(f"interference-scheduler: {exc}", file=sys.stderr)
        return 2
    if not args.config:
        log.warning("no --config given: running with the built-in defaults")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    scheduler.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
