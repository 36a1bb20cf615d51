"""Slow clients against the real programs (issue 28): 20 and 70 connections sending a byte
every 2 s, from ten addresses other than the prober's, must not make ``/healthz``,
``/readyz`` or enrolment time out on the credential issuer, the scheduler or the agent.

Each program runs as a process with its shipped HTTP limits (the scheduler against the
real kube-apiserver, the issuer and the agent against a real redis-server); every probe
and enrolment request must be answered within the kubelet's default probe timeout (1 s).
The stalled TLS handshakes against the extender are in tests/e2e/test_extender.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RedisServer, free_port
from tests.e2e.conftest import SchedulerProcess, start_scheduler
from tests.interference_infra.test_http_doors import PROBE_LIMIT_S, Trickle, timed_get

pytestmark = [pytest.mark.e2e]

ADDRESSES = [f"127.0.0.{i}" for i in range(2, 12)]
ROUNDS = 8
"""Probe rounds, 0.6 s apart: past the programs' 10 s request deadline and back."""
BIN = Path(sys.executable).parent


def wait_ready(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if timed_get(port, "/readyz")[0] == 200:
                return
        except OSError:
            pass
        assert proc.poll() is None, f"{what} exited"
        assert time.monotonic() < deadline, f"{what} never ready"
        time.sleep(0.2)


def post_unauthenticated(port: int) -> tuple[int, float]:
    """An enrolment without a token: the issuer's answer (401), timed."""
    import http.client

    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("POST", "/v1/credentials", b"")
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    finally:
        connection.close()


def probe_under_attack(
    port: int, count: int, extra: list[tuple[str, int]] | None = None
) -> list[tuple[str, int, float]]:
    """``ROUNDS`` rounds of /healthz and /readyz (and enrolment on the issuer) while
    ``count`` connections trickle: (what, status, seconds) for each."""
    answers: list[tuple[str, int, float]] = []
    with Trickle(port, count, ADDRESSES) as trickle:
        time.sleep(1.0)
        assert trickle.opened >= count
        for _ in range(ROUNDS):
            for path in ("/healthz", "/readyz"):
                answers.append((path, *timed_get(port, path)))
            if extra is not None:
                answers.append(("POST /v1/credentials", *post_unauthenticated(port)))
            time.sleep(0.6)
    return answers


def assert_answered(answers: list[tuple[str, int, float]], enrolment: bool = False) -> None:
    for what, status, elapsed in answers:
        expected = 401 if what.startswith("POST") else 200
        assert status == expected and elapsed < PROBE_LIMIT_S, answers
    assert not enrolment or any(what.startswith("POST") for what, _, _ in answers)


@pytest.fixture
def issuer(redis_server: RedisServer, tmp_path: Path) -> Iterator[int]:
    kubeconfig = tmp_path / "kubeconfig"  # no API server: no token gets that far here
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "REDIS_URL": redis_server.url,
        "HTTP_ADDRESS": "127.0.0.1",
        "HTTP_PORT": str(port),
        "KUBECONFIG": str(kubeconfig),
    }
    proc = subprocess.Popen(
        [str(BIN / "interference-credentials")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(port, proc, "the issuer")
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


@pytest.fixture
def agent(redis_server: RedisServer) -> Iterator[int]:
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "REDIS_URL": redis_server.url,
        "NODE_NAME": "slow-clients-node",
        "HTTP_ADDRESS": "127.0.0.1",
        "HTTP_PORT": str(port),
    }
    proc = subprocess.Popen(
        [str(BIN / "interference-agent"), "--no-kubernetes", "--probes", "psi,taskstats"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(port, proc, "the agent")
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("count", [20, 70])
def test_the_issuer_answers_probes_and_enrolment(issuer: int, count: int) -> None:
    assert_answered(probe_under_attack(issuer, count, extra=[]), enrolment=True)


@pytest.mark.parametrize("count", [20, 70])
def test_the_agent_answers_its_probes(agent: int, count: int) -> None:
    assert_answered(probe_under_attack(agent, count))


@pytest.mark.parametrize("count", [20, 70])
def test_the_scheduler_answers_its_probes(
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
    count: int,
) -> None:
    scheduler = start_scheduler(
        schedulers, tmp_path, scheduler_kubeconfig, redis_url, "e2e-slow-clients"
    )
    wait_ready(scheduler.http_port, scheduler.popen, "the scheduler")
    assert_answered(probe_under_attack(scheduler.http_port, count))
