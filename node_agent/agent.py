"""The node agent: probes → attribution → aggregation → one report per interval → Redis.

Probes that cannot run on this host are logged once with their reason and left out
(degraded mode); when the BPF probes cannot load, taskstats delay accounting stands in
for them. Nothing a probe, the API server or Redis does ends the loop.

Every report also carries windowed signals (10 s and 60 s: merged run-queue histogram
p99, mean/max/σ of wait ratio, reclaim stall and index; :mod:`node_agent.history`).

Failing closed: every report lists the signal families its probes actually delivered
(``measured``; a probe whose collect failed delivers nothing), and ``/readyz`` answers 503
while no probe of a core family (:data:`interference.signals.CORE_FAMILIES`: run-queue,
i.e. ``runqlat`` or ``taskstats``) runs or delivered in the latest interval, and after
``AgentSettings.unready_after_publish_failures`` consecutive reports could not be
published (default 3). On a clean shutdown the agent removes its node from the store
(:meth:`ReportSink.withdraw`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import yaml
from prometheus_client import CollectorRegistry

from interference.freshness import missing_core
from interference.signals import GpuDevice, NodeReport
from node_agent.aggregate import aggregate, measured_families, resolve_owners
from node_agent.attribution import Attributor
from node_agent.cgroup_knobs import PodCgroups
from node_agent.credentials import Enrolment
from node_agent.degrade import DegradeMetrics, Degrader, EventSink, restore_previous_run
from node_agent.degrade_state import left_degraded
from node_agent.events import KubernetesEvents, LoggedEvents
from node_agent.gpu import GpuInventory
from node_agent.health import AgentMetrics, liveness_problem
from node_agent.history import SignalHistory
from node_agent.kubelet_pods import KubeletPodDirectory, KubeletSettings
from node_agent.pods import (
    KubernetesPodDirectory,
    PodDirectory,
    StaticPodDirectory,
    kubernetes_directory_from_environment,
)
from node_agent.probes import base
from node_agent.publisher import PublisherSettings, RedisPublisher
from node_agent.settings import BPF_PROBES, FALLBACK_PROBE, AgentSettings
from node_agent.signal_metrics import SignalCollector
from node_agent.tolerances import PodTolerance

log = logging.getLogger(__name__)

POD_SYNC_WAIT_S = 5.0
"""How long start-up waits for the first list of this node's pods."""


class ReportSink(Protocol):
    """Where reports go (Redis in production)."""

    def publish(self, report: NodeReport) -> bool:
        """Deliver one report; False when it was dropped. Must not raise."""

    def withdraw(self, node: str) -> bool:
        """Remove ``node``'s data from the store (clean shutdown); False when that failed.
        Must not raise."""

    def close(self) -> None:
        """Release connections."""


class Agent:
    """Measures one node every ``settings.interval_s`` and hands each report to ``sink``."""

    def __init__(
        self,
        settings: AgentSettings,
        directory: PodDirectory,
        sink: ReportSink | None = None,
        gpu_inventory: GpuInventory | None = None,
        metrics: AgentMetrics | None = None,
        enrolment: Enrolment | None = None,
        events: EventSink | None = None,
    ) -> None:
        """``sink`` None only measures (``--once``); ``gpu_inventory`` None reports no GPUs;
        ``metrics`` None records into a registry of its own; ``enrolment`` (the sink's
        source of Redis credentials) is started with the probes and explains ``/readyz``
        while it holds none; ``events`` receives the degrader's Events (log lines when
        None)."""
        self.settings = settings
        cpus = settings.cpus()
        self.ncpu = cpus.count
        """CPUs the run-queue wait ratio divides by."""
        log.info("run-queue wait ratio divides by %d CPU(s), from %s", cpus.count, cpus.source)
        self.metrics = metrics if metrics is not None else AgentMetrics(CollectorRegistry())
        self._ctx = settings.probe_context()
        self._directory = directory
        self._attributor = Attributor(self._ctx, directory)
        self._sink = sink
        self._gpu_inventory = gpu_inventory
        self._enrolment = enrolment
        self._probes: list[base.Probe] = []
        self._failing_probes: set[str] = set()
        self._last_collect = 0.0
        self._loop_started: float | None = None
        self._last_measured: float | None = None
        self._last_measured_families: tuple[str, ...] = ()
        self._history = SignalHistory()
        """Recent intervals, for the windowed signals of each report."""
        self._started = False
        self.consecutive_publish_failures = 0
        """Reports dropped in a row by the sink (0 after any successful publish)."""
        self.disabled_probes: dict[str, str] = {}
        """Probes that could not start, with the reason (published in every report)."""
        self.degrader: Degrader | None = None
        """Degrades antagonists after each report when ``settings.degrade.enabled``."""
        self._events = events if events is not None else LoggedEvents()
        tolerance_of = getattr(directory, "tolerance", None)
        self.signal_metrics = SignalCollector(
            settings.node_name,
            settings.metrics_max_pods,
            tolerance_of if callable(tolerance_of) else _no_tolerance,
        )
        """The node's and its pods' signals on ``/metrics`` (:mod:`node_agent.signal_metrics`)."""
        self.metrics.registry.register(self.signal_metrics)
        if settings.degrade.enabled:
            opted_in = getattr(directory, "degradable", None)
            self.degrader = Degrader(
                settings.degrade,
                PodCgroups(self._ctx),
                self._events,
                DegradeMetrics(self.metrics.registry),
                opted_in=opted_in if callable(opted_in) else (lambda _uid: False),
            )

    @property
    def running_probes(self) -> list[str]:
        """Names of the probes collecting now."""
        return [p.name for p in self._probes]

    def start(self) -> None:
        """Start the probes: the configured list, or every registered one with taskstats
        only as the stand-in for BPF probes that cannot load. Enrolment for Redis
        credentials starts first, so they are there by the first report."""
        if self._enrolment is not None:
            self._enrolment.start()
        registered = base.registered()
        explicit = bool(self.settings.probes)
        names = (
            list(self.settings.probes)
            if explicit
            else [n for n in sorted(registered) if n != FALLBACK_PROBE]
        )
        self._probes, self.disabled_probes = base.start_probes(names, self._ctx)
        missing_bpf = [n for n in BPF_PROBES if n in self.disabled_probes]
        if not explicit and missing_bpf and FALLBACK_PROBE in registered:
            log.warning(
                "BPF probe(s) %s unavailable: falling back to %s delay accounting (per-task "
                "run-queue and reclaim delay, coarser percentiles)",
                ", ".join(missing_bpf),
                FALLBACK_PROBE,
            )
            fallback, fallback_disabled = base.start_probes([FALLBACK_PROBE], self._ctx)
            self._probes += fallback
            self.disabled_probes.update(fallback_disabled)
        if self.disabled_probes:
            log.warning(
                "degraded mode: running %s; disabled %s (reasons above)",
                ", ".join(self.running_probes) or "no probe at all",
                ", ".join(sorted(self.disabled_probes)),
            )
        else:
            log.info("running probes: %s", ", ".join(self.running_probes) or "none")
        self.metrics.set_probes(self.running_probes, self.disabled_probes)
        if self.degrader is not None:
            mode = "dry run" if self.settings.degrade.dry_run else "enforcing"
            log.info("degrading antagonists on this node (%s)", mode)
            restored = self.degrader.restore_saved()
        else:
            # A previous run may have degraded and crashed: it is put back even with
            # degrading off now.
            restored = restore_previous_run(self.settings.degrade.state_file, self._events)
        if restored:
            log.info("restored what a previous run degraded: %s", ", ".join(restored))
        self._started = True
        if self._gpu_inventory is not None:
            self._gpu_inventory.start()
        self._last_collect = time.monotonic()

    def liveness_problem(self) -> str:
        """Why ``/healthz`` fails ("" while an interval completed in the last 3)."""
        return liveness_problem(
            time.monotonic(), self._loop_started, self._last_measured, self.settings.interval_s
        )

    def readiness_problem(self) -> str:
        """Why ``/readyz`` fails, "" when ready: a report was measured, it holds every core
        family, no core probe is missing, and fewer than
        ``settings.unready_after_publish_failures`` publishes failed in a row."""
        if not self._started:
            return "no report measured yet"
        running_core = missing_core(measured_families(self.running_probes))
        if running_core:
            disabled = ", ".join(f"{n}: {why}" for n, why in sorted(self.disabled_probes.items()))
            return (
                f"no probe measures the core signal famil{'ies' if len(running_core) > 1 else 'y'}"
                f" {', '.join(running_core)} (run runqlat, or taskstats without BPF)"
                + (f"; disabled: {disabled}" if disabled else "")
            )
        if self._last_measured is None:
            return "no report measured yet"
        missed = missing_core(self._last_measured_families)
        if missed:
            return (
                f"the latest report lacks the core signal family {', '.join(missed)}: its "
                "probe could not measure the interval or its BPF maps lost entries (see the log)"
            )
        if self._enrolment is not None and (problem := self._enrolment.problem()):
            return problem
        limit = self.settings.unready_after_publish_failures
        if self.consecutive_publish_failures >= limit:
            return (
                f"the last {self.consecutive_publish_failures} reports could not be published "
                f"(limit {limit}); see the log for why Redis refused or could not be reached"
            )
        return ""

    def measure(self) -> NodeReport:
        """Collect every probe and build the report for the time since the last call."""
        samples: dict[str, base.Sample] = {}
        for probe in self._probes:
            sample = self._collect(probe)
            if sample is not None:  # a failed collect measured nothing: leave it out
                samples[probe.name] = sample
        now = time.monotonic()
        interval_s = max(now - self._last_collect, 1e-3)
        self._last_collect = now
        owners = resolve_owners(samples.values(), self._attributor, self.settings.cgroup_root)
        result = aggregate(
            samples,
            owners,
            interval_s,
            self.ncpu,
            self.settings.index_refs,
            self.settings.cgroup_root,
        )
        ended_at = time.time()
        self._history.add(
            ended_at,
            interval_s,
            result.metrics,
            result.histograms.get(base.HIST_RUNQ_US, []),
            result.measured,
        )
        report = NodeReport(
            node=self.settings.node_name,
            ts=ended_at,
            interval_s=round(interval_s, 6),
            metrics=result.metrics,
            histograms=result.histograms,
            pods=result.pods,
            gpus=self._gpus(),
            disabled_probes=dict(self.disabled_probes),
            measured=result.measured,
            windows=self._history.windows(ended_at),
        )
        self._last_measured_families = result.measured
        self._last_measured = time.monotonic()
        self.metrics.intervals_measured.inc()
        self.signal_metrics.observe(report, self.ncpu)
        return report

    def run(self, stop: threading.Event) -> None:
        """Report every interval until ``stop`` is set; ticks that fall behind are skipped."""
        interval = self.settings.interval_s
        self._loop_started = time.monotonic()
        next_tick = self._loop_started + interval
        failing = False
        while not stop.wait(max(0.0, next_tick - time.monotonic())):
            try:
                report = self.measure()
            except Exception:
                # A bug must cost one interval, not the agent; logged once per streak.
                if not failing:
                    log.exception("measuring the interval failed; skipping it")
                failing = True
            else:
                failing = False
                if self._sink is not None:
                    self.publish(report)
                self.degrade(report)
            next_tick += interval
            now = time.monotonic()
            if next_tick <= now:  # fell behind (a stalled host): realign, don't burst
                next_tick = now + interval

    def degrade(self, report: NodeReport) -> None:
        """Hand ``report`` to the degrader (when on); a failure costs one interval."""
        if self.degrader is None:
            return
        try:
            self.degrader.observe(report, time.monotonic())
        except Exception:
            log.exception("degrading antagonists failed this interval")

    def publish(self, report: NodeReport) -> bool:
        """Hand ``report`` to the sink, counting failures in a row (for ``/readyz``)."""
        if self._sink is None:
            return False
        if self._sink.publish(report):
            self.consecutive_publish_failures = 0
            return True
        self.consecutive_publish_failures += 1
        self.metrics.publish_failures.inc()
        return False

    def close(self, withdraw: bool = True) -> None:
        """Close probes and the sink, first removing this node from the store when
        ``withdraw`` (a clean shutdown: readers then see the node gone at once instead of
        after its TTL); safe to call twice."""
        sink, self._sink = self._sink, None
        if self.degrader is not None:
            # Leaving a pod degraded with no agent to restore it would be worse than
            # letting the next agent degrade it again.
            self.degrader.restore_all()
        if (
            withdraw
            and sink is not None
            and self._last_measured is not None
            and sink.withdraw(self.settings.node_name)
        ):
            log.info("removed node %s from the store", self.settings.node_name)
        for probe in self._probes:
            try:
                probe.close()
            except Exception:
                log.exception("closing probe %s failed", probe.name)
        self._probes = []
        if sink is not None:
            sink.close()
        if self._enrolment is not None:
            self._enrolment.stop()
        if isinstance(self._directory, KubernetesPodDirectory | KubeletPodDirectory):
            self._directory.stop()
        if self._gpu_inventory is not None:
            self._gpu_inventory.close()

    def _collect(self, probe: base.Probe) -> base.Sample | None:
        # A failed collect measured nothing: the interval leaves the probe's families out
        # of ``measured`` (degraded when a core family), never reads as quiet.
        try:
            with self.metrics.collect_duration.labels(probe=probe.name).time():
                sample = probe.collect()
        except base.CollectFailed as exc:
            if probe.name not in self._failing_probes:
                log.warning(
                    "probe %s could not measure this interval (%s); its data is left out "
                    "until it can",
                    probe.name,
                    exc,
                )
                self._failing_probes.add(probe.name)
            return None
        except Exception:  # a bug in one probe must not end the loop
            if probe.name not in self._failing_probes:
                log.exception("probe %s failed to collect; its data is left out", probe.name)
                self._failing_probes.add(probe.name)
            return None
        if probe.name in self._failing_probes:
            log.info("probe %s measures again", probe.name)
            self._failing_probes.discard(probe.name)
        return sample

    def _gpus(self) -> list[GpuDevice]:
        if self._gpu_inventory is None:
            return []
        try:
            return self._gpu_inventory.devices()
        except Exception:
            log.exception("GPU inventory failed; reporting no GPUs this interval")
            return []


def _no_tolerance(_uid: str) -> PodTolerance | None:
    return None


def pod_directory(settings: AgentSettings) -> PodDirectory:
    """The pods-file directory, else the API (when enabled and credentials exist), else
    an empty directory that leaves pods named by UID."""
    if settings.pods_file:
        return StaticPodDirectory.from_file(settings.pods_file)
    if settings.kubernetes:
        found = _kubernetes_directory(settings)
        if found is not None:
            # Names for the first reports too; pods stay keyed by UID until the list lands.
            if not found.wait_synced(POD_SYNC_WAIT_S):
                log.warning(
                    "pods on %s not listed within %g s; reporting them by UID until they are",
                    settings.node_name,
                    POD_SYNC_WAIT_S,
                )
            return found
    return StaticPodDirectory()


def _kubernetes_directory(
    settings: AgentSettings,
) -> KubernetesPodDirectory | KubeletPodDirectory | None:
    if settings.kubelet_url:
        kubelet = KubeletPodDirectory(
            KubeletSettings(url=settings.kubelet_url, ca_file=settings.kubelet_ca_file),
            settings.node_name,
        )
        kubelet.start()
        return kubelet
    if not settings.kubeconfig:
        return kubernetes_directory_from_environment(settings.node_name)
    # Imported here: the client costs ~20 MB of RSS, paid only where it is used.
    from kubernetes import client, config

    try:
        api_client = config.new_client_from_config(config_file=settings.kubeconfig)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot use kubeconfig {settings.kubeconfig}: {exc}") from exc
    directory = KubernetesPodDirectory(client.CoreV1Api(api_client), settings.node_name)
    directory.start()
    return directory


def publisher_settings(settings: AgentSettings) -> PublisherSettings:
    """Where and how the agent's reports are written."""
    return PublisherSettings(
        redis_url=settings.redis_url,
        username=settings.redis_username,
        password=settings.redis_password,
        ttl_s=settings.effective_ttl_s,
        stream_maxlen=settings.stream_maxlen,
        socket_timeout_s=settings.redis_socket_timeout_s,
        sentinels=settings.redis_sentinels,
        sentinel_master=settings.redis_sentinel_master,
        cluster=settings.redis_cluster,
        tls=settings.redis_tls,
    )


def build_agent(
    settings: AgentSettings, *, publish: bool = True, metrics: AgentMetrics | None = None
) -> Agent:
    """An agent wired to Redis (when ``publish``, as the node's own user from the credential
    issuer when ``settings.credentials_url`` is set), the pod directory, NVML and
    ``metrics``."""
    metrics = metrics if metrics is not None else AgentMetrics(CollectorRegistry())
    enrolment_settings = settings.enrolment() if publish else None
    enrolment = None
    if enrolment_settings is not None:
        counter = metrics.credentials
        enrolment = Enrolment(
            enrolment_settings,
            settings.node_name,
            count=lambda event: counter.labels(event=event).inc(),
        )
    sink = RedisPublisher(publisher_settings(settings), enrolment) if publish else None
    wanted = settings.degrade.enabled or left_degraded(settings.degrade.state_file)
    events = kubernetes_events(settings) if wanted else None
    return Agent(
        settings, pod_directory(settings), sink, GpuInventory(), metrics, enrolment, events
    )


def kubernetes_events(settings: AgentSettings) -> EventSink | None:
    """Events through the API server (in-cluster config, else ``settings.kubeconfig``),
    or None (log lines) without API access."""
    if not settings.kubernetes:
        return None
    from kubernetes import client, config

    try:
        if settings.kubeconfig:
            api_client = config.new_client_from_config(config_file=settings.kubeconfig)  # type: ignore[no-untyped-call]
        else:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            api_client = client.ApiClient()
    except (config.ConfigException, OSError, yaml.YAMLError) as exc:
        log.warning("no API access for Events (%s): the degrader's Events go to the log", exc)
        return None
    return KubernetesEvents(client.EventsV1Api(api_client), settings.node_name)
