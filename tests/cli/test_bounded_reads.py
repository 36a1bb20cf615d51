"""The `interference` CLI against one node that wrote far more than an agent does (issue
28, item 2): the deployed Redis (shipped redis.conf, ACL users), the CLI's store logged in
as the viewer. A report it cannot trust is left out in bounded time and memory; a reply
Redis cuts at its per-client limit is refused in one line that says so, and every other
node still reads."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from interference import keys
from interference.signals import PodMetrics
from interference_cli.errors import CliError
from tests.deploy.conftest import DeployedRedis
from tests.deploy.test_redis_acl import agent_publisher, enrol, report, viewer_store

pytestmark = pytest.mark.redis

MIB = 1 << 20
FORGED = b"\xdd" + (MIB - 5).to_bytes(4, "big") + b"\x90" * (MIB - 5)
"""1 MiB (what Redis takes in one argument) of msgpack: an array of a million empty arrays."""


@pytest.fixture
def deployed(tmp_path: Path) -> Iterator[DeployedRedis]:
    server = DeployedRedis(workdir=tmp_path)
    server.start()
    try:
        with agent_publisher(server, "good") as publisher:
            rows = [PodMetrics("shop", "api-0", uid="u0")]
            for second in range(3):
                assert publisher.publish(report("good", time.time() - 3 + second, rows))
        yield server
    finally:
        server.stop()


def as_agent(server: DeployedRedis, node: str) -> redis.Redis[bytes]:
    username, password = enrol(server, node)
    return redis.Redis(port=server.port, username=username, password=password)


def test_forged_reports_are_left_out_unbuilt_and_other_nodes_read(
    deployed: DeployedRedis,
) -> None:
    bad = as_agent(deployed, "forged")
    for _ in range(keys.NODE_REPORTS_MAXLEN):
        bad.xadd(keys.reports_key("forged"), {keys.REPORTS_FIELD: FORGED})
    store = viewer_store(deployed)
    started = time.perf_counter()
    assert store.index_history("forged") == []
    assert time.perf_counter() - started < 3  # refused by length, never built
    assert len(store.index_history("good")) == 3


@pytest.mark.parametrize("kind", ["report stream", "node hash"])
def test_a_reply_over_redis_limit_is_refused_saying_why(deployed: DeployedRedis, kind: str) -> None:
    bad = as_agent(deployed, "bad")
    chunk = {f"f{i}": os.urandom(MIB) for i in range(16)}
    for _ in range(3):  # 48 MiB: over the 32 MB a reply may hold
        if kind == "report stream":
            bad.xadd(keys.reports_key("bad"), chunk)  # type: ignore[arg-type]
        else:
            bad.hset(keys.node_key("bad"), mapping=chunk)  # type: ignore[arg-type]
            chunk = {f"g{len(chunk)}{k}": v for k, v in chunk.items()}
    store = viewer_store(deployed)
    with pytest.raises(CliError, match=r"cut its reply .*client-output-buffer-limit"):
        if kind == "report stream":
            store.index_history("bad")
        else:
            store.node_detail("bad")
    assert len(store.index_history("good")) == 3  # the next command reads as before
    assert store.node_detail("good").row.node == "good"
    assert deployed.proc is not None and deployed.proc.poll() is None
