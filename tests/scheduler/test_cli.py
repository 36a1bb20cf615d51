"""The ``interference-scheduler`` process end to end: real client against the emulator,
real redis-server, the real scheduling loop; dry run, reload and start-up errors."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from interference import keys
from interference.decision import parse_decision_hash
from interference.signals import NodeMetrics
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.entry.cli import Scheduler, main, overrides, parse_args
from scheduler.entry.config import load_config, with_overrides
from tests.builders import node_obj
from tests.conftest import RedisServer, free_port
from tests.scheduler.k8s_emulator import EmulatorThread, pod, running_emulator
from tests.shaped_reports import shaped_report

pytestmark = pytest.mark.redis


NOISY = NodeMetrics(runq_p99_us=4000.0, runq_wait_ratio=0.8, psi_cpu_some=60.0)
QUIET = NodeMetrics(runq_p99_us=250.0, runq_wait_ratio=0.01, psi_cpu_some=1.0)


class AgentsPublishing:
    """One agent publisher (the real :class:`RedisPublisher`) per node, each writing an
    agent-shaped report with the given signals every 0.5 s from a thread, as running
    agents do; the scheduler computes the index from them."""

    def __init__(self, url: str, signals: dict[str, NodeMetrics]) -> None:
        self._publishers = {
            name: RedisPublisher(PublisherSettings(redis_url=url)) for name in signals
        }
        self._signals = signals
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for publisher in self._publishers.values():
            publisher.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, publisher in self._publishers.items():
                shaped = shaped_report(name, time.time(), pods=5, gpus=0)
                publisher.publish(
                    dataclasses.replace(shaped, metrics=self._signals[name], windows={})
                )
            self._stop.wait(0.5)


def wait_until(predicate: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""
apiVersion: v1
kind: Config
clusters: [{{name: test, cluster: {{server: "{server}"}}}}]
users: [{{name: test, user: {{}}}}]
contexts: [{{name: test, context: {{cluster: test, user: test}}}}]
current-context: test
"""
    )
    return str(path)


def config_text(redis_url: str, kube: str, port: int, dry_run: bool) -> str:
    return f"""
loop:
  dry_run: {"true" if dry_run else "false"}
  idle_wait_s: 0.1
redis:
  url: {redis_url}
  poll_interval_s: 0.2
kubernetes:
  kubeconfig: {kube}
leader_election:
  enabled: false
http:
  host: 127.0.0.1
  port: {port}
reload_interval_s: 0.2
"""


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except urllib.error.URLError:
        return 0, "not listening yet"


@pytest.fixture
def emulator() -> Iterator[EmulatorThread]:
    with running_emulator() as server:
        yield server


def binding_posts(emulator: EmulatorThread) -> list[str]:
    return [p for m, p, _, _ in emulator.requests() if m == "POST" and p.endswith("/binding")]


def test_dry_run_records_decisions_binds_nothing_then_a_reload_turns_binding_on(
    tmp_path: Path, emulator: EmulatorThread, redis_server: RedisServer
) -> None:
    emulator.put("nodes", node_obj("n1"))
    emulator.put("nodes", node_obj("n2"))
    emulator.put("pods", pod("web-0", namespace="shop"))
    store = redis.Redis(port=redis_server.port)
    agents = AgentsPublishing(redis_server.url, {"n1": NOISY, "n2": QUIET})
    port = free_port()
    path = tmp_path / "scheduler.yaml"
    kube = kubeconfig(tmp_path, emulator.url)
    path.write_text(config_text(redis_server.url, kube, port, dry_run=True))

    scheduler = Scheduler(load_config(str(path)), str(path))
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run, args=(stop,), daemon=True)
    thread.start()
    try:
        agents.start()
        record_key = keys.decision_key("shop", "web-0")
        wait_until(lambda: bool(store.exists(record_key)))
        record = parse_decision_hash(store.hgetall(record_key))
        assert record.dry_run and record.result == "dry_run"
        assert record.node in ("n1", "n2") and record.candidates
        assert binding_posts(emulator) == []  # dry run: nothing bound

        wait_until(lambda: http_get(port, "/readyz")[0] == 200)
        assert http_get(port, "/readyz") == (200, "ok (leader)\n")
        assert http_get(port, "/healthz") == (200, "ok\n")
        status, metrics = http_get(port, "/metrics")
        assert (
            status == 200 and 'interference_scheduler_attempts_total{result="dry_run"}' in metrics
        )

        # A broken edit is refused: the replica stays ready, /readyz says why, the dry run
        # goes on.
        path.write_text(config_text(redis_server.url, kube, port, dry_run=True) + "bogus: 1\n")
        wait_until(lambda: "bogus: unknown key" in http_get(port, "/readyz")[1])
        status, text = http_get(port, "/readyz")
        assert status == 200 and "the last valid configuration serves" in text
        assert (
            'interference_scheduler_config_reloads_total{result="invalid"} 1.0'
            in (http_get(port, "/metrics")[1])
        )
        assert binding_posts(emulator) == []

        # Turning dry_run off in the file applies without a restart: the pod gets bound.
        path.write_text(config_text(redis_server.url, kube, port, dry_run=False))
        wait_until(
            lambda: binding_posts(emulator) == ["/api/v1/namespaces/shop/pods/web-0/binding"]
        )
        bound = emulator.get("pods", "shop", "web-0")
        assert bound is not None and bound["spec"]["nodeName"] == "n2"  # the quiet node
        assert http_get(port, "/readyz") == (200, "ok (leader)\n")
    finally:
        agents.stop()
        stop.set()
        thread.join(60)
    assert not thread.is_alive()


def test_two_replicas_only_the_lease_holder_binds_then_the_other_takes_over(
    tmp_path: Path, emulator: EmulatorThread, redis_server: RedisServer
) -> None:
    emulator.put("nodes", node_obj("n1"))
    kube = kubeconfig(tmp_path, emulator.url)
    election = (
        "  enabled: true\n  lease_duration_s: 3\n  renew_deadline_s: 2\n  retry_period_s: 1\n"
    )
    replicas: list[tuple[Scheduler, threading.Event, threading.Thread]] = []

    def start(name: str) -> Scheduler:
        path = tmp_path / f"{name}.yaml"
        text = config_text(redis_server.url, kube, free_port(), dry_run=False)
        path.write_text(text.replace("  enabled: false\n", election))
        scheduler = Scheduler(load_config(str(path)), str(path))
        stop = threading.Event()
        thread = threading.Thread(target=scheduler.run, args=(stop,), daemon=True)
        thread.start()
        replicas.append((scheduler, stop, thread))
        return scheduler

    def binders() -> list[str]:
        return emulator.user_agents(r"/binding$")

    try:
        first = start("a")
        wait_until(first.leading.is_set)
        second = start("b")
        wait_until(lambda: second.elector.holder == first.identity)
        for i in range(3):
            emulator.put("pods", pod(f"p{i}"))
        wait_until(lambda: len(binders()) == 3)
        assert set(binders()) == {f"interference-scheduler/{first.identity}"}
        assert not second.leading.is_set()

        replicas[0][1].set()  # the leader shuts down and hands the Lease back
        replicas[0][2].join(60)
        wait_until(second.leading.is_set)
        emulator.put("pods", pod("p3"))
        wait_until(lambda: len(binders()) == 4)
        assert binders()[-1] == f"interference-scheduler/{second.identity}"
        assert all(p["spec"]["nodeName"] == "n1" for p in emulator.all("pods"))
    finally:
        for _, stop, thread in replicas:
            stop.set()
            thread.join(60)


def test_redis_outage_schedules_interference_blind_and_recovers(
    tmp_path: Path, emulator: EmulatorThread, redis_server: RedisServer
) -> None:
    emulator.put("nodes", node_obj("n1"))
    path = tmp_path / "scheduler.yaml"
    text = config_text(redis_server.url, kubeconfig(tmp_path, emulator.url), 0, dry_run=False)
    path.write_text(
        text.replace("  poll_interval_s: 0.2\n", "  poll_interval_s: 0.2\n  socket_timeout_s: 1\n")
    )
    scheduler = Scheduler(load_config(str(path)), str(path))
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run, args=(stop,), daemon=True)
    thread.start()

    def metric(name: str) -> float:
        return scheduler.registry.get_sample_value(name) or 0.0

    try:
        wait_until(scheduler.signals.healthy)
        redis_server.stop()
        wait_until(lambda: not scheduler.signals.healthy())
        emulator.put("pods", pod("during-outage"))
        wait_until(lambda: bool(binding_posts(emulator)))  # still scheduled, blind
        assert metric("interference_scheduler_interference_blind_attempts_total") >= 1
        assert metric("interference_scheduler_redis_errors_total") >= 1
        wait_until(lambda: metric("interference_scheduler_decision_write_errors_total") >= 1)

        redis_server.start()
        wait_until(scheduler.signals.healthy)
        emulator.put("pods", pod("after-outage"))
        store = redis.Redis(port=redis_server.port)
        wait_until(lambda: bool(store.exists(keys.decision_key("default", "after-outage"))))
        record = parse_decision_hash(store.hgetall(keys.decision_key("default", "after-outage")))
        assert record.result == "scheduled" and record.node == "n1"
    finally:
        stop.set()
        thread.join(60)


def test_invalid_config_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("cycle:\n  profile:\n    scores:\n      GpuPacking: high\n")
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cycle.profile.scores.GpuPacking: must be a number, got 'high'" in err


def test_missing_kubeconfig_exits_2_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--kubeconfig", str(tmp_path / "nope")]) == 2
    assert "pass --kubeconfig FILE" in capsys.readouterr().err


def test_flags_and_environment_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("loop:\n  dry_run: false\nredis:\n  url: redis://file:6379/0\n")
    args = parse_args(["--config", str(path), "--kubeconfig", "/k"])
    fixed = overrides(args, {"REDIS_URL": "redis://env:6379/0", "DRY_RUN": "true"})
    config = with_overrides(load_config(str(path)), **fixed)
    assert config.redis.url == "redis://env:6379/0"
    assert config.loop.dry_run is True
    assert config.kubernetes.kubeconfig == "/k"
    args = parse_args(["--dry-run"])
    assert overrides(args, {"DRY_RUN": "false"})["loop"] == {"dry_run": True}  # flag wins


@pytest.mark.slow
def test_unreachable_api_server_and_redis_are_one_line_each_and_it_keeps_running(
    tmp_path: Path,
) -> None:
    dead_api = f"http://127.0.0.1:{free_port()}"
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    port = free_port()
    path = tmp_path / "scheduler.yaml"
    path.write_text(config_text(dead_redis, kubeconfig(tmp_path, dead_api), port, dry_run=False))
    script = Path(sys.executable).parent / "interference-scheduler"
    proc = subprocess.Popen(
        [str(script), "--config", str(path)],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "POD_NAME": "sched-test"},
    )
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("Redis: cannot reach" in x for x in lines):
            lines.append(proc.stderr.readline())
        api_lines = [x for x in lines if "Kubernetes API: cannot reach the API server" in x]
        redis_lines = [x for x in lines if "Redis: cannot reach" in x]
        assert len(api_lines) == 1 and dead_api in api_lines[0]
        assert len(redis_lines) == 1 and "REDIS_URL" in redis_lines[0]
        wait_until(lambda: http_get(port, "/healthz")[0] == 200)
        status, body = http_get(port, "/readyz")
        assert status == 503 and "not synced" in body
        assert proc.poll() is None  # still running, retrying
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_healthz_fails_while_the_scheduling_loop_is_wedged(
    tmp_path: Path, emulator: EmulatorThread, redis_server: RedisServer
) -> None:
    emulator.put("nodes", node_obj("n1"))
    port = free_port()
    path = tmp_path / "scheduler.yaml"
    text = config_text(redis_server.url, kubeconfig(tmp_path, emulator.url), port, dry_run=False)
    path.write_text(
        text.replace("  idle_wait_s: 0.1\n", "  idle_wait_s: 0.1\n  wedged_after_s: 1\n")
    )
    scheduler = Scheduler(load_config(str(path)), str(path))
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: http_get(port, "/readyz")[0] == 200)
        assert http_get(port, "/healthz") == (200, "ok\n")
        # Holding the cache lock blocks the scheduling thread, as a stuck call would.
        with scheduler.loop.cache.lock:
            wait_until(lambda: http_get(port, "/healthz")[0] == 500)
            assert "scheduling loop silent for" in http_get(port, "/healthz")[1]
        wait_until(lambda: http_get(port, "/healthz") == (200, "ok\n"))
    finally:
        stop.set()
        thread.join(60)
