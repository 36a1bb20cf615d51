"""/healthz, /readyz and /metrics over real HTTP."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, Counter

from scheduler.endpoint.http import DEFAULT_PORT, HealthServer, Heartbeat, HttpSettings, Status


@dataclass
class State:
    synced: bool = False
    config_error: str = ""
    leading: bool = False


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def get(server: HealthServer, path: str) -> tuple[int, str, str]:
    url = f"http://127.0.0.1:{server.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


Setup = tuple[HealthServer, State, Heartbeat, Clock, CollectorRegistry]


@pytest.fixture
def setup() -> Iterator[Setup]:
    state = State()
    clock = Clock()
    heartbeat = Heartbeat("signal follower", max_silence_s=30, clock=clock)
    registry = CollectorRegistry()
    status = Status(
        synced=lambda: state.synced,
        config_error=lambda: state.config_error,
        leading=lambda: state.leading,
        heartbeats=(heartbeat,),
    )
    server = HealthServer(HttpSettings(host="127.0.0.1", port=0), registry, status)
    server.start()
    yield server, state, heartbeat, clock, registry
    server.stop()


def test_readyz_needs_a_synced_cache_and_stays_ready_on_an_invalid_config(setup: Setup) -> None:
    server, state, _, _, _ = setup
    code, _, body = get(server, "/readyz")
    assert (
        code == 503
        and body == "not ready (follower): cluster cache not synced yet (listing nodes and pods)\n"
    )
    state.synced = True
    assert get(server, "/readyz")[::2] == (200, "ok (follower)\n")
    state.leading = True
    assert get(server, "/readyz")[::2] == (200, "ok (leader)\n")
    state.config_error = "cycle.stale_policy: must be one of neutral, avoid, reject, got 'x'"
    code, _, body = get(server, "/readyz")  # a config typo never makes a replica unready
    assert code == 200 and body.startswith("ok (leader); the configuration file is invalid")
    assert "the last valid configuration serves: cycle.stale_policy" in body


def test_healthz_fails_when_a_loop_is_wedged_or_a_thread_died(setup: Setup) -> None:
    server, _, heartbeat, clock, _ = setup
    assert get(server, "/healthz")[::2] == (200, "ok\n")
    clock.now += 31
    code, _, body = get(server, "/healthz")
    assert code == 500 and "signal follower silent for 31 s (limit 30 s)" in body
    heartbeat.beat()
    assert get(server, "/healthz")[0] == 200


def test_healthz_fails_when_a_published_last_beat_stops_advancing() -> None:
    """The scheduling loop publishes ``last_cycle_at`` instead of calling beat()."""
    clock = Clock()
    last_cycle_at = [clock.now]
    loop_beat = Heartbeat(
        "scheduling loop", max_silence_s=60, clock=clock, last_beat=lambda: last_cycle_at[0]
    )
    status = Status(
        synced=lambda: True, config_error=lambda: "", leading=lambda: True, heartbeats=(loop_beat,)
    )
    server = HealthServer(HttpSettings(host="127.0.0.1", port=0), CollectorRegistry(), status)
    server.start()
    try:
        clock.now += 59
        assert get(server, "/healthz")[::2] == (200, "ok\n")
        clock.now += 2
        code, _, body = get(server, "/healthz")
        assert code == 500 and "scheduling loop silent for 61 s (limit 60 s)" in body
        last_cycle_at[0] = clock.now  # the loop came round again
        assert get(server, "/healthz")[::2] == (200, "ok\n")
    finally:
        server.stop()


def test_healthz_reports_dead_threads() -> None:
    finished = threading.Thread(target=lambda: None, name="scheduling-loop")
    finished.start()
    finished.join()
    status = Status(
        synced=lambda: True, config_error=lambda: "", leading=lambda: True, threads=(finished,)
    )
    server = HealthServer(HttpSettings(host="127.0.0.1", port=0), CollectorRegistry(), status)
    server.start()
    try:
        code, _, body = get(server, "/healthz")
        assert code == 500 and "thread scheduling-loop has died" in body
    finally:
        server.stop()


def test_metrics_serves_the_registry_passed_in(setup: Setup) -> None:
    server, _, _, _, registry = setup
    Counter("interference_scheduler_test_things", "Things.", registry=registry).inc(3)
    code, content_type, body = get(server, "/metrics")
    assert code == 200 and content_type.startswith("text/plain; version=")
    assert "interference_scheduler_test_things_total 3.0" in body


def test_unknown_paths_and_failing_checks(setup: Setup) -> None:
    server = setup[0]
    assert get(server, "/nope")[0] == 404

    def broken() -> bool:
        raise RuntimeError("cache exploded")

    server._status.synced = broken
    code, _, body = get(server, "/readyz")
    assert code == 500 and "cache exploded" in body


def test_settings_validate_the_port() -> None:
    assert HttpSettings().port == DEFAULT_PORT == 10251
    with pytest.raises(ValueError, match="port: -1 must be an integer in 0–65535"):
        HttpSettings(port=-1)
