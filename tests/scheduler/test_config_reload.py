"""Configuration reload (scheduler.entry.config_reload): an invalid file leaves the last valid
configuration serving and says so; after a reload the Pending-rate guard keeps it or
rolls back to the last good one, and the rejected file stays readable."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from scheduler.cycle.settings import CycleSettings
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.entry.config import SchedulerConfig, load_config
from scheduler.entry.config_reload import ConfigReload, ConfigWatcher, config_map_ref
from scheduler.entry.reload_guard import ReloadGuard, Verdict
from scheduler.plugins.interference import InterferenceArgs


def interference_args(cycle: CycleSettings) -> InterferenceArgs:
    found = dict(cycle.profile.plugin_config).get("Interference", InterferenceArgs())
    assert isinstance(found, InterferenceArgs)
    return found


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def rewrite(path: str, text: str) -> None:
    """Replace the file the way a ConfigMap update does: a new inode renamed into place."""
    tmp = path + ".new"
    Path(tmp).write_text(text)
    os.replace(tmp, path)


def stale_policy_yaml(policy: str, guard: str = "") -> str:
    return (
        "cycle:\n  profile:\n    plugin_config:\n      - name: Interference\n"
        f"        args: {{stale_policy: {policy}}}\n" + guard
    )


# ---- the watcher -----------------------------------------------------------------------------


def test_reload_applies_a_valid_change_and_keeps_the_old_config_on_a_bad_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, stale_policy_yaml("neutral"))
    applied: list[SchedulerConfig] = []
    invalid: list[str] = []
    watcher = ConfigWatcher(path, load_config(path), applied.append, on_invalid=invalid.append)
    assert not watcher.check()  # unchanged

    rewrite(path, stale_policy_yaml("reject"))
    assert watcher.check()
    assert [interference_args(c.cycle).stale_policy for c in applied] == ["reject"]

    caplog.set_level(logging.ERROR, logger="scheduler.entry.config_reload")
    rewrite(path, stale_policy_yaml("sometimes"))
    assert not watcher.check()
    assert interference_args(watcher.current.cycle).stale_policy == "reject"  # kept
    assert "cycle.profile.plugin_config[0].args.stale_policy: must be one of" in watcher.error
    assert invalid == [watcher.error] and watcher.file_rejected
    assert any(
        "still serving the last valid configuration" in r.getMessage() for r in caplog.records
    )
    assert len(applied) == 1
    assert not watcher.check()  # the same bad file is told about once
    assert len(invalid) == 1

    rewrite(path, stale_policy_yaml("avoid"))
    assert watcher.check()
    assert watcher.error == "" and not watcher.file_rejected
    assert [interference_args(c.cycle).stale_policy for c in applied] == ["reject", "avoid"]


def test_restart_only_sections_are_flagged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, "http:\n  port: 9000\n")
    watcher = ConfigWatcher(path, load_config(path), lambda c: None)
    caplog.set_level(logging.WARNING, logger="scheduler.entry.config_reload")
    rewrite(path, "http:\n  port: 9001\n")
    assert watcher.check()
    assert any("'http' take effect after a restart" in r.getMessage() for r in caplog.records)


# ---- the reload: Events, metrics, the guard, the roll back -----------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(
        self,
        tmp_path: Path,
        text: str,
        *,
        leading: bool = True,
        lease: dict[str, str] | None = None,
        name: str = "config.yaml",
    ) -> None:
        """``lease``: the leader election Lease's annotations, shared by the harnesses of
        replicas (where the leader publishes its verdicts)."""
        path = tmp_path / name
        path.write_text(text)
        self.path = str(path)
        self.lease = {} if lease is None else lease
        self.stranded: list[str] = []
        self.clock = Clock()
        self.registry = CollectorRegistry()
        self.metrics = SchedulerMetrics(self.registry)
        self.applied: list[SchedulerConfig] = []
        self.events: list[tuple[str, str, str]] = []
        self.guard = ReloadGuard()
        self.leading = leading
        self.reload = ConfigReload(
            self.path,
            load_config(self.path),
            self.applied.append,
            self.metrics,
            lambda kind, reason, note: self.events.append((kind, reason, note)),
            guard=self.guard,
            leading=lambda: self.leading,
            clock=self.clock,
            stranded=lambda: self.stranded,
            publish=lambda verdict: self.lease.__setitem__("verdict", verdict),
            published=lambda: self.lease.get("verdict"),
        )

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        assert value is not None, name
        return value

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]

    def pods(self, total: int, pending: int) -> None:
        """``total`` attempts now, the first ``pending`` of them finding no node."""
        for i in range(total):
            self.guard.observe(f"ns/p{i}", i >= pending, self.clock.now)

    def run_for(self, seconds: int, total: int, pending: int) -> list[Verdict]:
        verdicts = []
        for _ in range(seconds):
            self.pods(total, pending)
            verdicts.append(self.reload.tick().verdict)
            self.clock.now += 1
        return verdicts

    def route(self, path: str) -> tuple[int, str]:
        (route,) = self.reload.routes().values()
        code, body, _ = route(path)
        return code, body.decode()


FAST_GUARD = "reload_guard: {roll_back_after_s: 30, watch_for_s: 120, window_s: 20, min_pods: 5}\n"


def test_an_invalid_file_is_an_event_and_a_metric_and_serving_goes_on(tmp_path: Path) -> None:
    h = Harness(tmp_path, stale_policy_yaml("neutral"))
    rewrite(h.path, stale_policy_yaml("sometimes"))
    h.reload.watcher.check()
    assert h.applied == []
    ((kind, reason, note),) = h.events
    assert (kind, reason) == ("Warning", "InvalidConfiguration")
    assert "stale_policy: must be one of" in note and "Still serving" in note
    assert h.metric("interference_scheduler_config_reloads_total", result="invalid") == 1
    assert h.metric("interference_scheduler_config_rejected") == 1
    code, body = h.route("/config")
    assert code == 200 and "the file on disk is invalid" in body and "neutral" in body
    rewrite(h.path, stale_policy_yaml("avoid"))
    h.reload.watcher.check()
    assert h.metric("interference_scheduler_config_rejected") == 0
    assert h.reasons() == ["InvalidConfiguration", "ConfigReloaded"]


def test_a_reload_leaving_pods_pending_is_rolled_back(tmp_path: Path) -> None:
    h = Harness(tmp_path, stale_policy_yaml("neutral", FAST_GUARD))
    good = Path(h.path).read_text()
    bad = stale_policy_yaml("reject", FAST_GUARD)
    rewrite(h.path, bad)
    assert h.reload.watcher.check()
    assert h.guard.watching
    verdicts = h.run_for(40, total=10, pending=5)
    assert verdicts[0] is Verdict.WARN and verdicts[30] is Verdict.ROLL_BACK
    assert not h.guard.watching
    assert [interference_args(c.cycle).stale_policy for c in h.applied] == ["reject", "neutral"]
    assert h.reasons() == ["ConfigReloaded", "PendingRateHigh", "ConfigRolledBack"]
    note = h.events[-1][2]
    assert "Pending rate 50 % (5 of 10 pods" in note.replace("%", " %")
    assert "stayed above reload_guard.roll_back_above 8%" in note
    assert "GET /config/rejected" in note
    assert h.metric("interference_scheduler_config_reloads_total", result="rolled_back") == 1
    assert h.metric("interference_scheduler_config_rejected") == 1
    code, body = h.route("/config/rejected")
    assert code == 200 and body.endswith(bad) and "rolled back at" in body
    code, body = h.route("/config")
    assert code == 200 and body.endswith(good) and "was rolled back" in body

    assert not h.reload.watcher.check()  # the rejected file is not applied again
    assert len(h.applied) == 2
    rewrite(h.path, stale_policy_yaml("avoid", FAST_GUARD))  # a fixed file is
    assert h.reload.watcher.check()
    assert h.metric("interference_scheduler_config_rejected") == 0
    assert h.route("/config/rejected")[0] == 200  # kept until the next roll back


def test_dry_run_says_it_would_roll_back_and_changes_nothing(tmp_path: Path) -> None:
    guard = FAST_GUARD.replace("min_pods: 5", "min_pods: 5, dry_run: true")
    h = Harness(tmp_path, stale_policy_yaml("neutral", guard))
    rewrite(h.path, stale_policy_yaml("reject", guard))
    h.reload.watcher.check()
    h.run_for(40, total=10, pending=1)  # 10 %: no warning, a roll back
    assert h.reasons() == ["ConfigReloaded", "WouldRollBack"]
    assert "nothing changed" in h.events[-1][2]
    assert [interference_args(c.cycle).stale_policy for c in h.applied] == ["reject"]
    assert h.metric("interference_scheduler_config_reloads_total", result="would_roll_back") == 1
    assert h.metric("interference_scheduler_config_rejected") == 0
    assert h.route("/config/rejected")[0] == 404


def test_a_follower_never_acts(tmp_path: Path) -> None:
    h = Harness(tmp_path, stale_policy_yaml("neutral", FAST_GUARD), leading=False)
    rewrite(h.path, stale_policy_yaml("reject", FAST_GUARD))
    h.reload.watcher.check()
    h.run_for(40, total=10, pending=10)
    assert h.reasons() == ["ConfigReloaded"]
    assert len(h.applied) == 1


def test_a_kept_reload_is_the_next_roll_backs_target(tmp_path: Path) -> None:
    h = Harness(tmp_path, stale_policy_yaml("neutral", FAST_GUARD))
    rewrite(h.path, stale_policy_yaml("avoid", FAST_GUARD))
    h.reload.watcher.check()
    assert h.run_for(130, total=10, pending=0)[-10:].count(Verdict.CONFIRMED) == 1
    assert h.metric("interference_scheduler_config_reloads_total", result="confirmed") == 1
    assert math.isnan(h.metric("interference_scheduler_reload_pending_rate"))
    rewrite(h.path, stale_policy_yaml("reject", FAST_GUARD))
    h.reload.watcher.check()
    h.run_for(40, total=10, pending=10)
    assert [interference_args(c.cycle).stale_policy for c in h.applied] == [
        "avoid",
        "reject",
        "avoid",
    ]


def test_a_guard_turned_off_keeps_every_valid_reload(tmp_path: Path) -> None:
    off = "reload_guard: {enabled: false}\n"
    h = Harness(tmp_path, stale_policy_yaml("neutral", off))
    rewrite(h.path, stale_policy_yaml("reject", FAST_GUARD))  # its own guard does not apply
    h.reload.watcher.check()
    assert not h.guard.watching
    assert "reload_guard is off" in h.events[-1][2]
    assert h.reload.watcher.last_good == h.reload.watcher.running


def test_an_event_that_cannot_be_written_leaves_the_reload_standing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, stale_policy_yaml("neutral"))
    applied: list[SchedulerConfig] = []

    def refuse(kind: str, reason: str, note: str) -> None:
        raise RuntimeError("forbidden")

    reload = ConfigReload(
        path, load_config(path), applied.append, SchedulerMetrics(CollectorRegistry()), refuse
    )
    rewrite(path, stale_policy_yaml("reject"))
    assert reload.watcher.check()
    assert len(applied) == 1
    assert "cannot write the ConfigReloaded Event" in caplog.text


def test_the_thread_reloads_without_restart(tmp_path: Path) -> None:
    risk_k = (
        "reload_interval_s: 0.05\ncycle:\n  profile:\n    plugin_config:\n"
        "      - {{name: Interference, args: {{risk_k: {}}}}}\n"
    )
    path = write(tmp_path, risk_k.format(1))
    applied: list[CycleSettings] = []
    reload = ConfigReload(
        path,
        load_config(path),
        lambda c: applied.append(c.cycle),
        SchedulerMetrics(CollectorRegistry()),
        lambda *_: None,
    )
    stop = threading.Event()
    thread = threading.Thread(target=reload.run, args=(stop,), daemon=True)
    thread.start()
    try:
        rewrite(path, risk_k.format(2.5))
        deadline = time.monotonic() + 30
        while not applied and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [interference_args(e).risk_k for e in applied] == [2.5]
    finally:
        stop.set()
        thread.join(30)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"POD_NAMESPACE": "intf"}, ("intf", "interference-scheduler-config")),
        ({"POD_NAMESPACE": "intf", "INTERFERENCE_SCHEDULER_CONFIGMAP": "mine"}, ("intf", "mine")),
        ({"INTERFERENCE_SCHEDULER_CONFIGMAP": "ops/mine"}, ("ops", "mine")),
        ({}, ("default", "interference-scheduler-config")),
    ],
)
def test_the_events_name_the_config_map(env: dict[str, str], expected: tuple[str, str]) -> None:
    assert config_map_ref(env) == expected


# ---- what the guard judges, and one verdict for every replica ---------------------------


def test_pods_pending_anyway_do_not_count_and_stranded_pods_do(tmp_path: Path) -> None:
    h = Harness(tmp_path, stale_policy_yaml("neutral", FAST_GUARD))
    rewrite(h.path, stale_policy_yaml("avoid", FAST_GUARD))
    h.reload.watcher.check()

    def second() -> Verdict:
        for i in range(6):  # waiting on unbound claims under either configuration
            h.guard.observe(f"ns/claim{i}", False, h.clock.now, pending_anyway=True)
        h.pods(5, pending=0)
        verdict = h.reload.tick().verdict
        h.clock.now += 1
        return verdict

    assert {second() for _ in range(40)} == {Verdict.WATCHING}
    h.stranded = [f"ns/other{i}" for i in range(5)]  # no longer ours: 5 of 10 Pending
    verdicts = [second() for _ in range(40)]
    assert verdicts[0] is Verdict.WARN and verdicts[30] is Verdict.ROLL_BACK
    assert h.reasons() == ["ConfigReloaded", "PendingRateHigh", "ConfigRolledBack"]
    note = h.events[-1][2]
    assert "50% (5 of 10 pods the reload could change in the window; 6 Pending under" in note


def test_too_few_pods_is_said_once_and_neither_keeps_nor_rejects(tmp_path: Path) -> None:
    h = Harness(tmp_path, stale_policy_yaml("neutral", FAST_GUARD))
    rewrite(h.path, stale_policy_yaml("reject", FAST_GUARD))
    h.reload.watcher.check()
    verdicts = h.run_for(200, total=2, pending=2)
    assert verdicts.count(Verdict.UNDECIDED) == 1 and Verdict.CONFIRMED not in verdicts
    assert Verdict.ROLL_BACK not in verdicts and h.guard.watching
    assert h.reasons() == ["ConfigReloaded", "ReloadUndecided"]
    kind, _, note = h.events[-1]
    assert kind == "Warning"
    assert "only 2 pods it could change were attempted (reload_guard.min_pods 5)" in note
    assert h.metric("interference_scheduler_config_reloads_total", result="undecided") == 1
    assert h.reload.watcher.last_good != h.reload.watcher.running
    verdicts = h.run_for(30, total=10, pending=0)  # the evidence comes: kept
    assert verdicts.count(Verdict.CONFIRMED) == 1


def replicas(tmp_path: Path, text: str) -> tuple[Harness, Harness]:
    """A leader and a standby whose files differ only in a restart-only section."""
    lease: dict[str, str] = {}
    leader = Harness(tmp_path, "http: {port: 9001}\n" + text, lease=lease, name="leader.yaml")
    standby = Harness(
        tmp_path, "http: {port: 9002}\n" + text, leading=False, lease=lease, name="standby.yaml"
    )
    return leader, standby


@pytest.mark.parametrize(
    ("pending", "leader_verdict", "standby_serves"),
    [
        pytest.param(10, Verdict.ROLL_BACK, "neutral", id="rolled back: the standby returns"),
        pytest.param(0, Verdict.CONFIRMED, "reject", id="kept: the standby keeps it"),
    ],
)
def test_the_standby_follows_the_leaders_verdict(
    tmp_path: Path, pending: int, leader_verdict: Verdict, standby_serves: str
) -> None:
    leader, standby = replicas(tmp_path, stale_policy_yaml("neutral", FAST_GUARD))
    for replica in (leader, standby):
        port = 9001 if replica is leader else 9002
        rewrite(replica.path, f"http: {{port: {port}}}\n" + stale_policy_yaml("reject", FAST_GUARD))
        assert replica.reload.watcher.check()
    standby_verdicts = []
    leader_verdicts = []
    for _ in range(200):
        leader.pods(10, pending)
        leader_verdicts.append(leader.reload.tick().verdict)
        standby_verdicts.append(standby.reload.tick().verdict)
        leader.clock.now += 1
        standby.clock.now += 1
    assert leader_verdict in leader_verdicts
    assert standby_verdicts.count(leader_verdict) == 1  # it followed, once
    assert leader_verdicts.index(leader_verdict) == standby_verdicts.index(leader_verdict)
    assert standby.reasons() == ["ConfigReloaded"]  # the leader's Events say it
    served = interference_args(standby.reload.watcher.current.cycle).stale_policy
    assert served == standby_serves
    assert standby.reload.watcher.last_good.config == standby.reload.watcher.current
    assert not standby.guard.watching


def test_a_standby_alone_never_keeps_a_file(tmp_path: Path) -> None:
    _, standby = replicas(tmp_path, stale_policy_yaml("neutral", FAST_GUARD))
    rewrite(standby.path, "http: {port: 9002}\n" + stale_policy_yaml("reject", FAST_GUARD))
    standby.reload.watcher.check()
    verdicts = standby.run_for(300, total=10, pending=10)
    assert set(verdicts) == {Verdict.WATCHING}
    assert standby.reload.watcher.last_good != standby.reload.watcher.running


def test_a_replica_started_with_a_rolled_back_file_serves_the_leaders_good_one(
    tmp_path: Path,
) -> None:
    leader, _ = replicas(tmp_path, stale_policy_yaml("neutral", FAST_GUARD))
    rewrite(leader.path, "http: {port: 9001}\n" + stale_policy_yaml("reject", FAST_GUARD))
    leader.reload.watcher.check()
    assert Verdict.ROLL_BACK in leader.run_for(40, total=10, pending=10)
    published = json.loads(leader.lease["verdict"])
    assert published["verdict"] == "rolled_back" and "neutral" in published["good_text"]

    restarted = Harness(  # its file on disk is the one the leader rolled back
        tmp_path,
        "http: {port: 9003}\n" + stale_policy_yaml("reject", FAST_GUARD),
        leading=False,
        lease=leader.lease,
        name="restarted.yaml",
    )
    assert restarted.reload.tick().verdict is Verdict.ROLL_BACK
    watcher = restarted.reload.watcher
    assert interference_args(watcher.current.cycle).stale_policy == "neutral"
    assert [interference_args(c.cycle).stale_policy for c in restarted.applied] == ["neutral"]
    assert watcher.rejected is not None and watcher.file_rejected
    assert restarted.reload.tick().verdict is Verdict.IDLE  # once


def test_the_published_good_file_keeps_no_password(tmp_path: Path) -> None:
    secret = "redis: {url: 'redis://scheduler:s3cret@redis:6379/0'}\n"
    leader, _ = replicas(tmp_path, secret + stale_policy_yaml("neutral", FAST_GUARD))
    rewrite(leader.path, "http: {port: 9001}\n" + secret + stale_policy_yaml("reject", FAST_GUARD))
    leader.reload.watcher.check()
    assert Verdict.ROLL_BACK in leader.run_for(40, total=10, pending=10)
    published = json.loads(leader.lease["verdict"])
    assert "s3cret" not in leader.lease["verdict"]
    assert "redis://scheduler:***@redis:6379/0" in published["good_text"]
    restarted = Harness(
        tmp_path,
        "http: {port: 9003}\n" + secret + stale_policy_yaml("reject", FAST_GUARD),
        leading=False,
        lease=leader.lease,
        name="restarted.yaml",
    )
    assert restarted.reload.tick().verdict is Verdict.ROLL_BACK  # the live sections agree
