"""While the API server is away the lease calls fail every ``retry_period_s``: one
warning says so, not one per attempt (issue 31: the log flooded while the apiserver was
down), and one says when they succeed again."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import urllib3
from kubernetes import client
from kubernetes.leaderelection.leaderelection import LeaderElection

from scheduler.adapters.leader import LeaderElector
from tests.conftest import free_port
from tests.scheduler.k8s_emulator import running_emulator
from tests.scheduler.test_leader import FAST, wait_until


def run_elector(host: str, seconds: float) -> threading.Event:
    configuration = client.Configuration()
    configuration.host = host
    configuration.retries = 0
    leading = threading.Event()
    elector = LeaderElector(client.ApiClient(configuration), FAST, leading, identity="a")
    stop = threading.Event()
    thread = threading.Thread(target=elector.run, args=(stop,), daemon=True)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join(30)
    return leading


def failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "lease call" in r.getMessage()]


@pytest.mark.slow
def test_a_refusing_api_server_is_one_line_not_one_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="scheduler"):
        run_elector(f"http://127.0.0.1:{free_port()}", 4.5)  # ~4 attempts at 1 s
    lines = failures(caplog)
    assert len(lines) == 1, lines
    assert "lease call failed" in lines[0]


@pytest.mark.slow
def test_it_says_when_the_lease_calls_succeed_again(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three calls fail as the client fails them while the API server is away (its
    connection errors escape the library), then the emulator answers."""
    real = LeaderElection.try_acquire_or_renew
    failed = []

    def flaky(self: LeaderElection) -> bool:
        if len(failed) < 3:
            failed.append(1)
            raise urllib3.exceptions.MaxRetryError(None, "/leases/sched", "refused")  # type: ignore[arg-type]
        return bool(real(self))  # type: ignore[no-untyped-call]

    monkeypatch.setattr(LeaderElection, "try_acquire_or_renew", flaky)
    with running_emulator() as emulator, caplog.at_level(logging.WARNING, logger="scheduler"):
        configuration = client.Configuration()
        configuration.host = emulator.url
        leading = threading.Event()
        elector = LeaderElector(client.ApiClient(configuration), FAST, leading, identity="a")
        stop = threading.Event()
        thread = threading.Thread(target=elector.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_until(leading.is_set)
        finally:
            stop.set()
            thread.join(30)
    lines = failures(caplog)
    assert len(lines) == 2, lines
    assert "lease call failed" in lines[0]
    assert "lease calls succeed again after" in lines[1]
