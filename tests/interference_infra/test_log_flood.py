"""The Kubernetes client's retry warnings do not flood the log while the API server is
down (urllib3 logs ``Retrying (Retry(total=…)) after connection broken …`` per retry of
every request: 164 lines in 28 s before; issue 31). One line per kind per interval goes
through, and the next one says how many were left out."""

from __future__ import annotations

import io
import logging

import kubernetes
import pytest
import urllib3

from interference_infra.logsetup import RETRY_LOG_INTERVAL_S, RateLimited, configure_logging
from tests.conftest import free_port


def test_retries_against_a_refusing_port_are_one_line() -> None:
    """The real client, a real socket that refuses: ten requests, three retries each."""
    stream = io.StringIO()
    configure_logging("INFO", "text", own=["scheduler"], stream=stream)
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))
    for _ in range(10):
        with pytest.raises(urllib3.exceptions.MaxRetryError):
            api.list_node(_request_timeout=1)
    lines = [line for line in stream.getvalue().splitlines() if "Retrying" in line]
    assert len(lines) == 1, stream.getvalue()
    assert "urllib3.connectionpool" in lines[0]


def test_one_line_per_kind_per_interval_then_the_count() -> None:
    now = [1000.0]
    limit = RateLimited(interval_s=30.0, clock=lambda: now[0])
    logger = logging.getLogger("test.flood")
    records = []

    def emit(msg: str, *args: object) -> bool:
        record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, msg, args, None)
        passed = limit.filter(record)
        if passed:
            records.append(record.getMessage())
        return passed

    retry = "Retrying (%r) after connection broken by '%r': %s"
    assert emit(retry, "Retry(total=2)", "refused", "/api/v1/nodes")
    for i in range(163):  # 164 in 28 s, as measured
        now[0] += 28.0 / 164
        assert not emit(retry, f"Retry(total={i % 3})", "refused", "/api/v1/pods")
    assert emit("Connection pool is full, discarding connection: %s", "apiserver")  # other kind
    now[0] += 30.0
    assert emit(retry, "Retry(total=2)", "refused", "/api/v1/nodes")
    assert records[-1].endswith("(163 more like it in the last 58 s not logged)"), records
    now[0] += 31.0
    assert emit(retry, "Retry(total=2)", "refused", "/api/v1/nodes")
    assert "not logged" not in records[-1]
    assert len(records) == 4
    assert RETRY_LOG_INTERVAL_S == 30.0
