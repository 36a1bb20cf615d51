"""`interference record` against a real redis-server (and a real Redis Cluster): it finds
every node's report stream, reads them in batches, and never overwrites a file."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import msgpack
import pytest
import redis

from interference import codec, keys
from interference.signals import NodeMetrics, NodeReport, PodMetrics
from interference_cli import store as store_module
from interference_cli import trace
from interference_cli.errors import CliError
from interference_cli.main import main
from interference_cli.store import Store
from interference_cli.trace import load_trace, record_to_file, write_trace
from node_agent.publisher import PublisherSettings, RedisPublisher
from tests.conftest import RedisServer
from tests.redis_topologies import redis_cluster

pytestmark = pytest.mark.redis


def report(node: str, ts: float, index: float = 10.0) -> NodeReport:
    return NodeReport(
        node=node,
        ts=ts,
        interval_s=1.0,
        metrics=NodeMetrics(runq_p99_us=40 * index, interference_index=index),
        histograms={"runq_us": [0, 3, 10]},
        pods=[PodMetrics("web", f"{node}-api", uid=f"u-{node}", cpu_ms_per_s=index)],
        measured=("runq",),
    )


def publisher(url: str, *, cluster: bool = False) -> RedisPublisher:
    """The agent's own publisher (a long TTL: slow test hosts)."""
    return RedisPublisher(PublisherSettings(url, ttl_s=60, cluster=cluster))


def publish_all(url: str, reports: list[NodeReport], *, cluster: bool = False) -> None:
    pub = publisher(url, cluster=cluster)
    try:
        for r in reports:
            assert pub.publish(r), r.node
    finally:
        pub.close()


def record(url: str, out: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(["--redis-url", url, "record", "--out", str(out), *args])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    return stdout


def test_record_reads_every_nodes_stream_and_skips_malformed_entries(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    publish_all(redis_server.url, [report("n1", now), report("n2", now + 0.1)])
    redis.Redis(port=redis_server.port).xadd(
        keys.reports_key("n1"), {keys.REPORTS_FIELD: b"\xc1garbage"}
    )
    publish_all(redis_server.url, [report("n1", now + 1)])
    out = tmp_path / "trace.msgpack"
    stdout = record(redis_server.url, out, capsys, "--from-start", "--duration", "1")
    assert "recorded 3 reports" in stdout and "skipped 1 malformed" in stdout
    assert "intf:node:n1:reports" in stdout  # the skipped entry is named by its stream
    reports = load_trace(out)
    assert sorted((r.node, r.ts) for r in reports) == [
        ("n1", now),
        ("n1", now + 1),
        ("n2", now + 0.1),
    ]
    assert reports[0].pods == report("n1", now).pods  # whole reports, pod rows included


def test_record_without_from_start_takes_only_new_reports_and_finds_new_nodes(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reports already there are left out; a node whose stream appears after the start
    (found by a later SCAN) is recorded from its first report."""
    monkeypatch.setattr(trace, "RESCAN_S", 0.3)
    now = time.time()
    publish_all(redis_server.url, [report("old", now - 5), report("old", now - 4)])
    store = Store(redis_server.url)
    out = tmp_path / "trace.msgpack"
    done: list[trace.RecordResult] = []
    recorder = threading.Thread(
        target=lambda: done.append(record_to_file(store, out, duration_s=3.0, max_reports=3))
    )
    recorder.start()
    time.sleep(0.5)
    publish_all(redis_server.url, [report("old", now), report("new", now + 0.5)])
    time.sleep(0.5)
    publish_all(redis_server.url, [report("new", now + 1)])
    recorder.join(timeout=30)
    assert not recorder.is_alive()
    assert done[0].written == 3 and not done[0].appended
    assert sorted((r.node, r.ts) for r in load_trace(out)) == [
        ("new", now + 0.5),
        ("new", now + 1),
        ("old", now),
    ]


def test_entries_that_share_an_id_go_by_stream_key_whatever_the_reply_order(
    redis_server: RedisServer,
) -> None:
    """Two agents can add a report in the same millisecond: their entries get one id."""
    client = redis.Redis(port=redis_server.port)
    client.xadd(keys.reports_key("alpha"), {keys.REPORTS_FIELD: b"x"}, id="999-5")
    for node in ("zeta", "alpha", "mid"):  # created out of key order
        payload = codec.encode_report(report(node, 1.0))
        client.xadd(keys.reports_key(node), {keys.REPORTS_FIELD: payload}, id="1000-0")
    store = Store(redis_server.url)
    for order in (["zeta", "alpha", "mid"], ["mid", "zeta", "alpha"]):
        last_ids = {keys.reports_key(node): "0-0" for node in order}
        got = [(key, entry_id) for key, entry_id, _ in store.streams_after(last_ids)]
        assert got == [
            (keys.reports_key("alpha"), "999-5"),
            (keys.reports_key("alpha"), "1000-0"),
            (keys.reports_key("mid"), "1000-0"),
            (keys.reports_key("zeta"), "1000-0"),
        ]


def test_record_reads_streams_in_batches(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More streams than one XREAD takes: every stream is still read, each entry once."""
    monkeypatch.setattr(store_module, "STREAM_BATCH", 3)
    now = time.time()
    nodes = [f"node-{i}" for i in range(10)]
    publish_all(redis_server.url, [report(n, now + i) for i, n in enumerate(nodes)])
    publish_all(redis_server.url, [report(n, now + 20 + i) for i, n in enumerate(nodes)])
    out = tmp_path / "trace.msgpack"
    result = record_to_file(Store(redis_server.url), out, from_start=True, duration_s=1.0)
    assert result.written == 20
    reports = load_trace(out)
    assert sorted((r.node, r.ts) for r in reports) == sorted(
        [(n, now + i) for i, n in enumerate(nodes)]
        + [(n, now + 20 + i) for i, n in enumerate(nodes)]
    )


def test_record_appends_to_an_existing_trace(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    out = tmp_path / "trace.msgpack"
    write_trace(out, [codec.encode_report(report("earlier", now - 60))], "an earlier recording")
    publish_all(redis_server.url, [report("n1", now)])
    stdout = record(redis_server.url, out, capsys, "--from-start", "--count", "1")
    assert "recorded 1 reports" in stdout and "appended" in stdout
    assert [r.node for r in load_trace(out)] == ["earlier", "n1"]
    # One header: the file is still one trace.
    objects = list(msgpack.Unpacker(open(out, "rb"), raw=False))  # noqa: SIM115
    assert [isinstance(o, dict) for o in objects] == [True, False, False]


def test_record_into_an_empty_file_writes_a_new_trace(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "trace.msgpack"
    out.touch()
    publish_all(redis_server.url, [report("n1", time.time())])
    stdout = record(redis_server.url, out, capsys, "--from-start", "--count", "1")
    assert "appended" not in stdout
    assert [r.node for r in load_trace(out)] == ["n1"]


def _truncated_trace(path: Path) -> bytes:
    write_trace(path, [codec.encode_report(report("n", 1.0))], "x")
    return path.read_bytes()[:-3]


@pytest.mark.parametrize(
    ("case", "content", "message"),
    [
        ("not msgpack", b"\xc1\xc1 my notes", "is not msgpack"),
        ("msgpack, no trace header", msgpack.packb({"hello": 1}), "is not an interference trace"),
        ("a trace cut short", None, "is truncated"),
        ("text", b"node,score\nn1,3\n", "will not write to"),
    ],
)
def test_record_refuses_a_file_that_is_not_a_whole_trace_and_leaves_it_alone(
    redis_server: RedisServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    content: bytes | None,
    message: str,
) -> None:
    out = tmp_path / "precious.bin"
    if content is None:
        content = _truncated_trace(tmp_path / "whole.msgpack")
    out.write_bytes(content)
    publish_all(redis_server.url, [report("n1", time.time())])
    code = main(["--redis-url", redis_server.url, "record", "--out", str(out), "--count", "1"])
    _, err = capsys.readouterr()
    assert code == 1, case
    assert message in err and "will not write to" in err and err.count("\n") == 1, (case, err)
    assert out.read_bytes() == content, case


def test_record_refuses_a_directory(redis_server: RedisServer, tmp_path: Path) -> None:
    with pytest.raises(CliError, match="is not a file"):
        record_to_file(Store(redis_server.url), tmp_path, duration_s=0.1)


@pytest.mark.slow
def test_record_on_a_redis_cluster_reads_streams_on_every_shard(tmp_path: Path) -> None:
    """Nodes' streams hash to slots on every shard; XREAD may not cross slots, so the
    recorder reads one slot's streams per command, all in one pipelined round."""
    with redis_cluster(tmp_path) as ports:
        url = f"redis://127.0.0.1:{ports[0]}/0"
        now = time.time()
        nodes = [f"node-{i}" for i in range(30)]
        publish_all(url, [report(n, now + i) for i, n in enumerate(nodes)], cluster=True)
        shards_holding = sum(
            1 for port in ports if redis.Redis(port=port).dbsize() > 0
        )  # the writes spread over the shards
        assert shards_holding == len(ports)
        store = Store(url, cluster=True)
        out = tmp_path / "trace.msgpack"
        result = record_to_file(store, out, from_start=True, duration_s=1.5)
        assert result.written == len(nodes)
        assert sorted(r.node for r in load_trace(out)) == sorted(nodes)
        assert set(store.report_streams()) == set(nodes)  # SCAN walked every shard


def test_report_streams_ignores_keys_that_only_look_like_one(redis_server: RedisServer) -> None:
    publish_all(redis_server.url, [report("n1", time.time())])
    client = redis_server.client()
    client.xadd("intf:node:a:b:reports", {"r": "x"})  # no node name holds a colon
    client.set("intf:node:n1:pod:reports", "x")  # a pod named "reports"
    assert Store(redis_server.url).report_streams() == {"n1": keys.reports_key("n1")}


def test_record_stops_at_the_count_across_streams(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    now = time.time()
    publish_all(redis_server.url, [report(f"n{i}", now + i) for i in range(5)])
    out = tmp_path / "trace.msgpack"
    result = record_to_file(Store(redis_server.url), out, from_start=True, max_reports=2)
    assert result.written == 2
    assert len(load_trace(out)) == 2


def test_a_stream_found_later_is_read_from_the_start_time_on(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user without SCAN finds streams through the ranking: a node ranked only after
    the recording started has older reports in its stream, which are left out."""
    monkeypatch.setattr(trace, "RESCAN_S", 0.3)
    client = redis_server.client()
    client.execute_command(
        "ACL", "SETUSER", "viewer", "on", ">s3cret", "%R~intf:*", "-@all",
        *(f"+{c}" for c in store_module.VIEWER_COMMANDS),
    )  # fmt: skip
    now = time.time()
    publish_all(redis_server.url, [report("late", now - 2), report("late", now - 1)])
    time.sleep(0.05)
    store = Store(f"redis://viewer:s3cret@127.0.0.1:{redis_server.port}/0")
    out = tmp_path / "trace.msgpack"
    done: list[trace.RecordResult] = []
    recorder = threading.Thread(
        target=lambda: done.append(record_to_file(store, out, duration_s=3.0, max_reports=1))
    )
    recorder.start()
    time.sleep(0.3)
    publish_all(redis_server.url, [report("late", now)])
    client.zadd(keys.NODES_BY_INDEX, {"late": 5.0})  # the scheduler ranks it now
    recorder.join(timeout=30)
    assert not recorder.is_alive()
    assert [(r.node, r.ts) for r in load_trace(out)] == [("late", now)]


def _a_trace(path: Path) -> bytes:
    write_trace(path, [codec.encode_report(report("earlier", 1.0 + i)) for i in range(50)], "x")
    return path.read_bytes()


def test_an_appended_trace_keeps_every_byte_it_had_and_reads_as_one_trace(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "trace.msgpack"
    before = _a_trace(out)
    publish_all(redis_server.url, [report("n1", time.time()), report("n2", time.time())])
    stdout = record(redis_server.url, out, capsys, "--from-start", "--count", "2")
    assert "recorded 2 reports" in stdout and "appended" in stdout
    assert out.read_bytes().startswith(before)  # the earlier recording, byte for byte
    assert [r.node for r in load_trace(out)] == ["earlier"] * 50 + ["n1", "n2"]


def test_no_agents_warns_exits_1_and_leaves_the_trace_as_it_was(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "trace.msgpack"
    before = _a_trace(out)
    argv = ["--redis-url", redis_server.url, "record", "--out", str(out), "--duration", "0.3"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "recorded no reports: no node report stream (intf:node:NODE:reports)" in err
    assert redis_server.url in err and "REDIS_URL" in err and "interference-agent" in err
    assert f"the trace in {out} is unchanged" in err and err.count("\n") == 1
    assert out.read_bytes() == before
    # A new file is not left behind as an empty trace.
    new = tmp_path / "new.msgpack"
    assert main([*argv[:4], str(new), "--duration", "0.3"]) == 1
    assert f"{new} was not written" in capsys.readouterr().err and not new.exists()


def test_streams_without_new_reports_warn_and_suggest_from_start(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    publish_all(redis_server.url, [report("n1", time.time())])  # before the start: not new
    out = tmp_path / "trace.msgpack"
    argv = ["--redis-url", redis_server.url, "record", "--out", str(out), "--duration", "0.3"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "1 nodes' report streams" in err and "no report new in 0 s" in err
    assert "are the agents still publishing?" in err and "--from-start" in err
    assert not out.exists()


def test_a_write_that_fails_halfway_leaves_only_whole_entries(
    redis_server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full disk (or Ctrl-C) in the middle of a write: the file is cut back to its last
    whole entry, so the trace it was stays readable."""
    out = tmp_path / "trace.msgpack"
    before = _a_trace(out)
    publish_all(redis_server.url, [report("n1", time.time())])
    real_write = trace._write_all

    def half_then_full(handle: object, data: bytes) -> None:
        real_write(handle, data[: len(data) // 2])  # type: ignore[arg-type]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trace, "_write_all", half_then_full)
    with pytest.raises(CliError, match="No space left on device"):
        record_to_file(Store(redis_server.url), out, from_start=True, max_reports=1)
    assert out.read_bytes() == before
    assert len(load_trace(out)) == 50
