"""The cut-off's Node Event never holds the warden: an API server that does not answer costs
a counted, logged-once failure, not time (the Event itself, on a real kube-apiserver:
tests/e2e/test_credentials.py)."""

from __future__ import annotations

import logging
import socket
import time

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from credential_issuer.node_events import (
    QUEUE_SIZE,
    KubernetesNodeEvents,
    NodeEventMetrics,
    cut_off_message,
)


def unanswering_api() -> tuple[client.ApiClient, socket.socket]:
    """An API client whose server accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(200)
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{listener.getsockname()[1]}"
    return client.ApiClient(configuration), listener


def test_cut_offs_return_at_once_while_the_api_server_does_not_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="credential_issuer.node_events")
    api, listener = unanswering_api()
    metrics = NodeEventMetrics(CollectorRegistry())
    events = KubernetesNodeEvents(api, metrics, timeout_s=0.5)
    try:
        started = time.monotonic()
        for i in range(QUEUE_SIZE + 10):
            events.cut_off(f"node-{i}", "writing_too_fast: 51 xadd events in 0.2 s", 300.0)
        assert time.monotonic() - started < 0.5
        # The first Event is being written, the queue holds QUEUE_SIZE: the rest are dropped.
        assert metrics.failed._value.get() >= 9
        deadline = time.monotonic() + 5
        while metrics.failed._value.get() < 11 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metrics.failed._value.get() >= 11  # the timed-out write counted too
        assert metrics.written._value.get() == 0
    finally:
        listener.close()
    events.close()
    warnings = [r for r in caplog.records if "cannot write the Event" in r.getMessage()]
    assert len(warnings) == 1  # once per streak, not once per Event


def test_the_message_says_why_and_when_the_node_gets_a_password_again() -> None:
    message = cut_off_message("gpu-7", "no_expiry intf:node:gpu-7:sched (string)", 300.0)
    assert "gpu-7" in message and "no_expiry" in message and "300 s" in message
    assert len(cut_off_message("n" * 2000, "x" * 2000, 1.0)) == 1024
