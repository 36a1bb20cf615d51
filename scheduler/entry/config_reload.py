"""Configuration reload: poll the file, apply a valid one, tell about an invalid one,
and in standalone mode watch the Pending rate after each reload and roll back to the
last good configuration when it goes bad (:mod:`scheduler.entry.reload_guard`).

What each outcome does (docs/operations.md, "Configuration reload and roll back"):

* **applied** — the new configuration serves; a ``Normal ConfigReloaded`` Event on the
  ConfigMap, ``interference_scheduler_config_reloads_total{result="applied"}``, a log line.
* **invalid** — nothing that serves changes and the replica stays ready (a config typo
  must never take the scheduler — or, with ``ignorable: false``, every pod of
  kube-scheduler's extender profile — out of service): a ``Warning InvalidConfiguration``
  Event naming every problem, ``result="invalid"``,
  ``interference_scheduler_config_rejected`` 1 until the file changes, an error in the log.
* **rolled back** (leader only) — the guard saw the Pending rate stay above
  ``reload_guard.roll_back_above`` for ``roll_back_after_s``: the last good configuration
  serves again, a ``Warning ConfigRolledBack`` Event with the rate and both files'
  SHA-256, ``result="rolled_back"``, ``config_rejected`` 1, a warning in the log. The
  rejected file is kept for inspection: ``GET /config/rejected`` on the HTTP port (beside
  ``GET /config``, what serves), and it is not applied again until the file changes (a
  restart reads the file anew). With ``reload_guard.dry_run`` it is ``Warning
  WouldRollBack`` and ``result="would_roll_back"``, and nothing changes.
* **undecided** — the watch's time ran out without the evidence to keep or reject the
  file (fewer than ``min_pods`` pods the reload could change, or a few of them Pending):
  an Event (``Normal ReloadUndecided``, ``Warning`` when pods are Pending because of the
  reload), ``result="undecided"``; the watch goes on until the evidence comes.
* A Pending rate above ``warn_above`` is a ``Warning PendingRateHigh`` Event, once per
  reload.

**One verdict for every replica.** Only the leader schedules, so only the leader judges.
It publishes each verdict (the file's SHA-256, ``confirmed`` or ``rolled_back``, and the
last good file's text) as an annotation of its leader election Lease
(``interference.io/reload-verdict``, :mod:`scheduler.entry.reload_verdict`), written with every
renewal; every replica reads the Lease every
``leader_election.retry_period_s`` and follows a verdict about the file it serves: it
confirms it, or returns to the leader's last good file — a standby never serves a file
the leader rolled back, across a failover or a restart. A standby never decides by
itself; one that takes over a file still watched judges it on its own attempts.

The Events are about the ConfigMap the file comes from — the object a person edited and
will ``kubectl describe`` — named by ``INTERFERENCE_SCHEDULER_CONFIGMAP`` (``NAME`` or
``NAMESPACE/NAME``; default ``interference-scheduler-config`` in ``POD_NAMESPACE``, as
``deploy/`` installs it). An Event that cannot be written is logged; the reload stands.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from interference_infra.http import GetRoute
from interference_infra.logsetup import mask_credentials
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.entry.config import (
    LIVE_SECTIONS,
    ConfigError,
    SchedulerConfig,
    parse_config_text,
    read_config_text,
)
from scheduler.entry.reload_guard import Reading, ReloadGuard, ReloadGuardSettings, Verdict
from scheduler.entry.reload_verdict import PublishedVerdict, live_digest

log = logging.getLogger(__name__)

DEFAULT_CONFIG_MAP = "interference-scheduler-config"
CONFIG_PATH = "/config"
"""``GET /config``: the running configuration's file; ``/config/rejected``: the latest
file rolled back from."""
GUARD_TICK_S = 1.0
"""How often the Pending-rate guard checks while it watches a reload."""

EventWriter = Callable[[str, str, str], None]
"""``(type, reason, note)`` → an Event about the configuration's ConfigMap."""


def config_map_ref(env: Mapping[str, str]) -> tuple[str, str]:
    """``(namespace, name)`` of the ConfigMap the Events are about."""
    value = env.get("INTERFERENCE_SCHEDULER_CONFIGMAP", "").strip() or DEFAULT_CONFIG_MAP
    namespace, _, name = value.rpartition("/")
    return namespace or env.get("POD_NAMESPACE", "") or "default", name


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """A configuration with the file text it was read from (empty: the built-in
    defaults, or a file that could not be read back)."""

    config: SchedulerConfig
    text: str

    @property
    def sha256(self) -> str:
        """The text's SHA-256, hex (how Events, logs and ``/config`` name a version)."""
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def live(self) -> str:
        """The digest of its live sections (what a published verdict is about)."""
        return live_digest(self.config, LIVE_SECTIONS)


@dataclass(frozen=True, slots=True)
class RejectedConfig:
    """A file the scheduler rolled back from, kept for inspection."""

    file: ConfigFile
    reason: str
    at: float
    """Unix time of the roll back."""


class ConfigWatcher:
    """Polls a config file and calls ``on_change`` with each new valid config.

    An invalid file changes nothing that serves: the running configuration stays,
    :attr:`error` says why and ``on_invalid`` is told once per change of the file.
    The watcher also keeps the **last good** configuration — the start one, then each
    reloaded one once :meth:`confirm` is called — and :meth:`roll_back` returns to it,
    keeping the file it left as :attr:`rejected` (not applied again until it changes).
    """

    def __init__(
        self,
        path: str,
        current: SchedulerConfig,
        on_change: Callable[[SchedulerConfig], None],
        transform: Callable[[SchedulerConfig], SchedulerConfig] = lambda c: c,
        on_invalid: Callable[[str], None] = lambda error: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.current = current
        self.error = ""
        """Why the file on disk is invalid right now (empty while it is valid)."""
        self.reloads = 0
        self.rejected: RejectedConfig | None = None
        """The latest file rolled back from (``None`` until a roll back)."""
        self.rolled_back = False
        """True from a roll back until the file changes: the file on disk is not served."""
        self._on_change = on_change
        self._on_invalid = on_invalid
        self._transform = transform
        self._clock = clock
        self._signature = self._stat()
        try:
            text = read_config_text(path)
        except ConfigError:
            text = ""
        self.running = ConfigFile(current, text)
        """What serves now, with its text."""
        self.last_good = self.running
        """Where :meth:`roll_back` returns to."""

    def _stat(self) -> tuple[float, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime, st.st_size, st.st_ino)

    @property
    def file_rejected(self) -> bool:
        """True while the file on disk is not what serves: invalid, or rolled back."""
        return bool(self.error) or self.rolled_back

    def check(self) -> bool:
        """Reload if the file changed; True when a new config was applied."""
        signature = self._stat()
        if signature == self._signature:
            return False
        self._signature = signature
        self.rolled_back = False
        try:
            text = read_config_text(self.path)
            new = self._transform(parse_config_text(text, self.path))
        except ConfigError as exc:
            self.error = "; ".join(exc.problems)
            log.error(
                "%s; still serving the last valid configuration (sha256 %s)",
                exc,
                self.running.sha256[:12],
            )
            self._on_invalid(self.error)
            return False
        self.error = ""
        if new == self.current:
            return False
        for name in dataclasses.fields(SchedulerConfig):
            section = name.name
            if section not in LIVE_SECTIONS and getattr(new, section) != getattr(
                self.current, section
            ):
                log.warning("config: changes to %r take effect after a restart", section)
        self.current = new
        self.running = ConfigFile(new, text)
        self.reloads += 1
        self._on_change(new)
        log.info("configuration reloaded from %s (sha256 %s)", self.path, self.running.sha256[:12])
        return True

    def confirm(self) -> None:
        """The running configuration is good: a later roll back returns to it."""
        self.last_good = self.running

    def roll_back(self, reason: str, to: ConfigFile | None = None) -> SchedulerConfig:
        """Return to the last good configuration (or ``to``, which becomes the last good
        one) and keep the running one as :attr:`rejected`; returns the configuration to
        apply (the caller applies it)."""
        if to is not None:
            self.last_good = to
        self.rejected = RejectedConfig(self.running, reason, self._clock())
        self.running = self.last_good
        self.current = self.last_good.config
        self.rolled_back = True
        return self.current

    def parse(self, text: str) -> ConfigFile:
        """A configuration file's text as this watcher would apply it (ConfigError)."""
        return ConfigFile(self._transform(parse_config_text(text, self.path)), text)


class ConfigReload:
    """The reload of one process (see the module docstring): :meth:`run` polls the file
    every ``reload_interval_s`` and, with a guard, checks it every :data:`GUARD_TICK_S`.

    ``apply`` puts a configuration into service; ``guard`` is standalone mode's
    (extender mode has none: kube-scheduler, not this process, leaves pods Pending);
    ``leading`` says whether this replica may act on a verdict. ``judge(last good, new)``
    starts the loop's comparison of each Pending pod with the last good configuration
    (``judge(None, None)`` ends it); ``stranded()`` lists the pods the reload stopped
    attempting; ``publish`` and ``published`` write and read the leader's verdict
    (:class:`PublishedVerdict`).
    """

    def __init__(
        self,
        path: str,
        config: SchedulerConfig,
        apply: Callable[[SchedulerConfig], None],
        metrics: SchedulerMetrics,
        tell: EventWriter,
        *,
        transform: Callable[[SchedulerConfig], SchedulerConfig] = lambda c: c,
        guard: ReloadGuard | None = None,
        leading: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
        judge: Callable[[SchedulerConfig | None, SchedulerConfig | None], None] = (
            lambda before, after: None
        ),
        stranded: Callable[[], list[str]] = list,
        publish: Callable[[str], None] = lambda verdict: None,
        published: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._apply = apply
        self._judge = judge
        self._stranded = stranded
        self._publish = publish
        self._published = published
        self._told_unknown = ""
        """The configuration last logged as rolled back by the leader with no way back."""
        self._metrics = metrics
        self._tell = tell
        self.guard = guard
        self._leading = leading
        self._clock = clock
        self.watcher = ConfigWatcher(
            path, config, self._reloaded, transform, self._invalid, clock=clock
        )
        metrics.config_rejected.set_function(lambda: 1.0 if self.watcher.file_rejected else 0.0)

    # ---- what each outcome does ----------------------------------------------------------

    def _reloaded(self, new: SchedulerConfig) -> None:
        self._apply(new)
        self._metrics.config_reloads.labels("applied").inc()
        watcher = self.watcher
        watched = self.guard is not None and watcher.last_good.config.reload_guard.enabled
        how = (
            "; watching the Pending rate before keeping it"
            if watched
            else ("" if self.guard is None else "; reload_guard is off: kept as it is")
        )
        self._event(
            "Normal",
            "ConfigReloaded",
            f"applied {watcher.path} (sha256 {watcher.running.sha256[:12]}){how}",
        )
        if watched and self.guard is not None:
            self.guard.watch(watcher.last_good.config.reload_guard, self._clock())
            self._judge(watcher.last_good.config, new)
        else:
            self._judge(None, None)
            watcher.confirm()

    def _invalid(self, error: str) -> None:
        self._metrics.config_reloads.labels("invalid").inc()
        self._event(
            "Warning",
            "InvalidConfiguration",
            f"{self.watcher.path} is invalid: {error}. Still serving the last valid"
            f" configuration (sha256 {self.watcher.running.sha256[:12]}) and ready; fix the"
            " file to apply it.",
        )

    def tick(self) -> Reading:
        """One guard check; acts on its verdict. The leader judges (warns, rolls back,
        confirms) and publishes; every replica follows a published verdict first."""
        if self.guard is None:
            return Reading(Verdict.IDLE)
        followed = self._follow()
        if followed is not None:
            return Reading(followed)
        if not self._leading():
            self._metrics.reload_pending_rate.set(float("nan"))
            return Reading(Verdict.WATCHING if self.guard.watching else Verdict.IDLE)
        now = self._clock()
        if self.guard.watching:
            self.guard.observe_stranded(self._stranded(), now)
        reading = self.guard.check(now)
        rate = reading.rate
        watching = reading.verdict in (Verdict.WATCHING, Verdict.WARN, Verdict.UNDECIDED)
        self._metrics.reload_pending_rate.set((rate or 0.0) if watching else float("nan"))
        if reading.verdict is Verdict.CONFIRMED:
            self.watcher.confirm()
            self._judge(None, None)
            self._metrics.config_reloads.labels("confirmed").inc()
            self._publish_verdict("confirmed", self.watcher.running)
            log.info(
                "configuration sha256 %s kept: the Pending rate stayed acceptable while watched"
                " (at least reload_guard.min_pods, %d, pods the reload could change attempted)",
                self.watcher.running.sha256[:12],
                reading.seen,
            )
        elif reading.verdict is Verdict.UNDECIDED:
            self._undecided(reading)
        elif reading.verdict is Verdict.WARN and self._leading():
            message = (
                f"Pending rate {_share(reading)} since the reload of sha256"
                f" {self.watcher.running.sha256[:12]}, above"
                f" reload_guard.warn_above {self._settings().warn_above:.0%}"
            )
            log.warning("%s", message)
            self._event("Warning", "PendingRateHigh", message)
        elif reading.verdict is Verdict.ROLL_BACK and self._leading():
            self._roll_back(reading)
        return reading

    def _settings(self) -> ReloadGuardSettings:
        return self.watcher.last_good.config.reload_guard

    def _publish_verdict(self, verdict: str, bad: ConfigFile) -> None:
        good = self.watcher.last_good
        # Lease readers are not the file's readers: a URL's password stays out (the
        # restart-only redis section is all it can sit in, so the live digest holds).
        text = mask_credentials(good.text)
        published = PublishedVerdict(bad.live, verdict, good.live, text, bad.sha256)
        self._publish(published.encode())

    def _follow(self) -> Verdict | None:
        """Follow the leader's verdict about the file this replica serves, if there is
        one and this replica has not reached it already."""
        verdict = PublishedVerdict.decode(self._published())
        watcher = self.watcher
        running = watcher.running
        if verdict is None or verdict.config != running.live:
            return None
        if verdict.verdict == "confirmed":
            if watcher.last_good is running:
                return None
            watcher.confirm()
            self._stop_watching()
            self._metrics.config_reloads.labels("confirmed").inc()
            log.info("configuration sha256 %s kept: the leader confirmed it", running.sha256[:12])
            return Verdict.CONFIRMED
        to: ConfigFile | None = None
        if watcher.last_good.live != verdict.good_config or watcher.last_good is running:
            try:
                to = watcher.parse(verdict.good_text) if verdict.good_text else None
            except ConfigError as exc:
                log.error("the leader's last good configuration does not parse here: %s", exc)
            if to is None or to.live != verdict.good_config:
                if self._told_unknown == running.live:
                    return None
                self._told_unknown = running.live
                log.error(
                    "serving sha256 %s, which the leader rolled back, and its last good"
                    " configuration is not known here",
                    running.sha256[:12],
                )
                return None
        why = (
            f"the leader rolled back {watcher.path} (sha256 {running.sha256[:12]}; the"
            f" leader's file sha256 {verdict.file_sha256[:12]})"
        )
        self._apply(watcher.roll_back(why, to))
        self._stop_watching()
        self._metrics.config_reloads.labels("rolled_back").inc()
        log.warning("%s; this replica returned there too", why)
        return Verdict.ROLL_BACK

    def _stop_watching(self) -> None:
        if self.guard is not None:
            self.guard.stop()
        self._judge(None, None)
        self._metrics.reload_pending_rate.set(float("nan"))

    def _undecided(self, reading: Reading) -> None:
        settings = self._settings()
        message = (
            f"not kept yet: {settings.watch_for_s:.0f} s after the reload of sha256"
            f" {self.watcher.running.sha256[:12]} only {reading.seen} pods it could change"
            f" were attempted (reload_guard.min_pods {settings.min_pods}), {_share(reading)};"
            " still watching, and it is not the last good configuration until it is kept"
        )
        self._metrics.config_reloads.labels("undecided").inc()
        log.warning("%s", message)
        self._event("Warning" if reading.pending else "Normal", "ReloadUndecided", message)

    def _roll_back(self, reading: Reading) -> None:
        settings = self._settings()
        watcher = self.watcher
        bad, good = watcher.running.sha256[:12], watcher.last_good.sha256[:12]
        why = (
            f"Pending rate {_share(reading)} stayed above reload_guard.roll_back_above"
            f" {settings.roll_back_above:.0%} for {reading.above_for_s:.0f} s after the"
            f" reload of {watcher.path} (sha256 {bad})"
        )
        if settings.dry_run:
            self._metrics.config_reloads.labels("would_roll_back").inc()
            message = (
                f"{why}; would return to sha256 {good} (reload_guard.dry_run: nothing changed)"
            )
            log.warning("%s", message)
            self._event("Warning", "WouldRollBack", message)
            return
        bad_file = watcher.running
        self._apply(watcher.roll_back(why))
        self._judge(None, None)
        self._publish_verdict("rolled_back", bad_file)
        self._metrics.config_reloads.labels("rolled_back").inc()
        message = (
            f"{why}; returned to the last good configuration (sha256 {good}). The rejected"
            f" file is kept at GET {CONFIG_PATH}/rejected on the scheduler's HTTP port and is"
            " not applied again until the file changes: fix the ConfigMap."
        )
        log.warning("%s", message)
        self._event("Warning", "ConfigRolledBack", message)

    def _event(self, event_type: str, reason: str, message: str) -> None:
        try:
            self._tell(event_type, reason, message)
        except Exception as exc:  # the reload stands; the log says what happened
            log.warning("cannot write the %s Event about the configuration: %s", reason, exc)

    # ---- running ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Poll the file and tick the guard until ``stop`` is set."""
        next_check = time.monotonic() + self.watcher.current.reload_interval_s
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_check:
                next_check = now + self.watcher.current.reload_interval_s
                try:
                    self.watcher.check()
                except Exception:  # a callback bug must not end reloading
                    log.exception("applying the reloaded configuration failed")
            try:
                self.tick()
            except Exception:
                log.exception("checking the Pending rate after a reload failed")
            wait = next_check - time.monotonic()
            if self.guard is not None:
                wait = min(wait, GUARD_TICK_S)
            stop.wait(max(0.0, wait))

    def routes(self) -> dict[str, GetRoute]:
        """``GET /config`` (what serves) and ``GET /config/rejected`` (the latest file
        rolled back from): the file's text as read, a URL's password masked."""
        return {CONFIG_PATH: self._config_route}

    def _config_route(self, path: str) -> tuple[int, bytes, str]:
        watcher = self.watcher
        text_type = "text/plain; charset=utf-8"
        if path.rstrip("/") == CONFIG_PATH:
            running = watcher.running
            head = f"# serving: {watcher.path} sha256 {running.sha256}"
            if watcher.error:
                head += f"\n# the file on disk is invalid (not applied): {watcher.error}"
            elif watcher.rolled_back:
                head += f"\n# the file on disk was rolled back: GET {CONFIG_PATH}/rejected"
            return 200, mask_credentials(f"{head}\n{running.text}").encode(), text_type
        if path.rstrip("/") == f"{CONFIG_PATH}/rejected":
            rejected = watcher.rejected
            if rejected is None:
                return 404, b"no configuration has been rolled back\n", text_type
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rejected.at))
            head = f"# rolled back at {stamp}: {rejected.reason}\n# sha256 {rejected.file.sha256}\n"
            return 200, mask_credentials(head + rejected.file.text).encode(), text_type
        return 404, f"not found: try {CONFIG_PATH} or {CONFIG_PATH}/rejected\n".encode(), text_type


def _share(reading: Reading) -> str:
    rate = reading.rate or 0.0
    anyway = (
        f"; {reading.pending_anyway} Pending under the last good configuration too, not counted"
        if reading.pending_anyway
        else ""
    )
    return (
        f"{rate:.0%} ({reading.pending} of {reading.attempted} pods the reload could change"
        f" in the window{anyway})"
    )
