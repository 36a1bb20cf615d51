"""The shared health/metrics endpoint over real HTTP: checks, metrics, POST routes,
keep-alive, and a taken port."""

from __future__ import annotations

import http.client
import socket

import pytest
from prometheus_client import CollectorRegistry, Counter

from interference_infra.http import EndpointBindError, HealthEndpoint, problem_check


def get(port: int, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("problem", "answer"),
    [("", (200, "ok\n")), ("no report measured yet", (503, "no report measured yet\n"))],
)
def test_problem_check_answers_ok_or_the_reason(problem: str, answer: tuple[int, str]) -> None:
    assert problem_check(lambda: problem)() == answer


def test_serves_each_check_the_metrics_and_names_the_paths_it_has() -> None:
    registry = CollectorRegistry()
    Counter("probe_total", "A counter.", registry=registry).inc(3)

    def broken() -> tuple[int, str]:
        raise RuntimeError("state lost")

    checks = {"/healthz": lambda: (200, "ok\n"), "/readyz": broken}
    endpoint = HealthEndpoint("127.0.0.1", 0, registry, checks)
    endpoint.start()
    try:
        assert get(endpoint.port, "/healthz?verbose") == (200, "ok\n")
        status, body = get(endpoint.port, "/readyz")
        assert (status, "state lost" in body) == (500, True)
        status, body = get(endpoint.port, "/metrics")
        assert status == 200 and "probe_total 3.0" in body
        assert get(endpoint.port, "/nothing") == (
            404,
            "not found: try /healthz, /readyz, /metrics\n",
        )
    finally:
        endpoint.stop()
        endpoint.stop()  # safe twice


@pytest.mark.parametrize(("keep_alive", "version"), [(True, 11), (False, 10)])
def test_keep_alive_serves_http11_on_one_connection(keep_alive: bool, version: int) -> None:
    """With keep-alive two POSTs share one connection; without it the server answers
    HTTP/1.0 and closes it."""
    routes = {"/echo": lambda body: (200, body, "application/octet-stream")}
    endpoint = HealthEndpoint(
        "127.0.0.1", 0, CollectorRegistry(), {}, post_routes=routes, keep_alive=keep_alive
    )
    endpoint.start()
    connection = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=10)
    try:
        connection.request("POST", "/echo", body=b"first")
        response = connection.getresponse()
        assert (response.version, response.read()) == (version, b"first")
        assert response.will_close is not keep_alive
        kept = connection.sock
        connection.request("POST", "/echo", body=b"second")  # reconnects when closed
        assert connection.getresponse().read() == b"second"
        assert (kept is not None and connection.sock is kept) == keep_alive
    finally:
        connection.close()
        endpoint.stop()


def test_a_taken_port_is_one_sentence_with_the_fix() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(EndpointBindError) as raised:
            HealthEndpoint(
                "127.0.0.1",
                port,
                CollectorRegistry(),
                {"/healthz": lambda: (200, "ok\n")},
                bind_fix="pick another --http-port",
            )
    finally:
        holder.close()
    assert raised.value.strerror == "Address already in use"
    assert str(raised.value) == (
        f"cannot serve /healthz, /metrics on 127.0.0.1:{port} "
        "([Errno 98] Address already in use); pick another --http-port"
    )
