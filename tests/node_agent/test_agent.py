"""The whole agent, run as the real ``interference-agent`` process (acceptance 5 and the
end-to-end kernel check), plus the Agent class's degraded mode in-process."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from interference import codec, freshness, keys, sched_record
from interference.signals import SCHEMA_VERSION, NodeMetrics, NodeReport
from node_agent.agent import Agent, pod_directory
from node_agent.pods import KubernetesPodDirectory, StaticPodDirectory
from node_agent.publisher import PublisherSettings, RedisPublisher
from node_agent.settings import AgentSettings, detect_cgroup_v2_mount
from tests.conftest import RedisServer, free_port
from tests.node_agent.bpf_workloads import BUSY_LOOP, many_started_in, started_in
from tests.node_agent.own_cgroups import cgroup_tree, unique_name
from tests.node_agent.test_pods import Emulator, core_api, pod

AGENT = str(Path(sys.executable).with_name("interference-agent"))
V2_MOUNT = detect_cgroup_v2_mount()
SLEEPER = [sys.executable, "-c", "import time; time.sleep(3600)"]
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 60.0) -> T:
    """Poll ``probe`` until it returns something truthy; fail saying ``what`` never happened."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


@dataclass
class AgentProcess:
    """A running ``interference-agent`` and where its log goes."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    node: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None
        return int(match.group(1))

    def stop(self) -> int:
        """SIGTERM, then the exit status (a clean stop is 0)."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture
def test_cgroup_root() -> Iterator[str]:
    """A fresh cgroup subtree the agent is limited to (``--cgroup-root``)."""
    name = unique_name("intf-test-c")
    if os.geteuid() != 0:
        yield f"/{name}"  # cannot create cgroups: an empty subtree limits the agent just as well
        return
    with cgroup_tree(V2_MOUNT, name):
        yield f"/{name}"


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    started: list[AgentProcess] = []

    def start(*args: str, node: str | None = None) -> AgentProcess:
        node = node or f"test-node-{uuid.uuid4().hex[:8]}"
        log_path = tmp_path / f"{node}.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                # No health endpoint: a taken port would stop the agent (exit 1), and
                # agents of parallel test runs share this host.
                [AGENT, "--node-name", node, "--no-kubernetes", "--http-port", "0", *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        agent = AgentProcess(proc, log_path, node)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()


def stream_reports(server: RedisServer, node: str) -> list[NodeReport]:
    raw = redis.Redis(port=server.port, socket_timeout=2)
    entries = raw.xrange(keys.reports_key(node))
    reports = [codec.decode_report(e[keys.REPORTS_FIELD.encode()]) for _, e in entries]
    assert {r.node for r in reports} <= {node}
    return reports


def wait_for_reports(
    server: RedisServer, node: str, count: int, timeout_s: float = 60.0
) -> list[NodeReport]:
    """The node's reports in its report stream once there are at least ``count``."""

    def enough() -> list[NodeReport] | None:
        reports = stream_reports(server, node)
        return reports if len(reports) >= count else None

    return wait_for(f"{count} report(s) of {node} in the stream", enough, timeout_s)


@pytest.mark.redis
@pytest.mark.slow
def test_agent_publishes_readable_keys_that_expire_after_it_stops(
    redis_server: RedisServer,
    start_agent: Callable[..., AgentProcess],
    test_cgroup_root: str,
) -> None:
    agent = start_agent(
        "--redis-url", redis_server.url, "--interval", "1", "--cgroup-root", test_cgroup_root
    )
    reports = wait_for_reports(redis_server, agent.node, 2)
    r = redis_server.client()

    fields = r.hgetall(keys.node_key(agent.node))
    for name in (*NodeMetrics.__dataclass_fields__, "updated_at", "interval_s"):
        assert re.fullmatch(r"-?\d+(\.\d+)?", fields[name]), (name, fields[name])
    metrics, updated_at = codec.parse_node_hash(fields)
    assert abs(updated_at - time.time()) < 60
    assert 0 <= metrics.interference_index <= 100
    assert 0 < r.ttl(keys.node_key(agent.node)) <= freshness.ttl_seconds(1.0)

    # The scheduling record; the ranking is the scheduler's to write, never the agent's.
    payload = redis.Redis(port=redis_server.port).get(keys.sched_key(agent.node))
    assert payload is not None
    record = sched_record.decode(payload)
    assert record["node_id"] == sched_record.node_id(agent.node)
    assert abs(record["ts"] - time.time()) < 60
    assert 0 < r.ttl(keys.sched_key(agent.node)) <= freshness.ttl_seconds(1.0)
    assert not r.exists(keys.NODES_BY_INDEX, keys.NODES_UPDATED)
    patterns = keys.node_key_patterns(agent.node)
    assert all(k.startswith(patterns[0]) for k in r.scan_iter()), "a key of no node"

    latest = reports[-1]
    assert latest.v == SCHEMA_VERSION
    assert latest.interval_s == pytest.approx(1.0, rel=0.5)
    assert latest.ts > reports[0].ts
    assert latest.histograms.keys() == {"runq_us", "reclaim_us"}
    assert r.hget(keys.gpu_key(agent.node), "count") == "0"  # no NVML on this host

    assert agent.stop() == 0
    assert "stopping" in agent.log()
    node_keys = [
        keys.node_key(agent.node),
        keys.sched_key(agent.node),
        keys.reports_key(agent.node),
        keys.gpu_key(agent.node),
    ]
    wait_for(
        "the node's keys to expire",
        lambda: r.exists(*node_keys) == 0,
        timeout_s=freshness.ttl_seconds(1.0) + 15,
    )


@pytest.mark.redis
@pytest.mark.slow
def test_agent_survives_a_redis_restart_with_bounded_memory(
    redis_server: RedisServer,
    start_agent: Callable[..., AgentProcess],
    test_cgroup_root: str,
) -> None:
    interval = 0.25
    agent = start_agent(
        "--redis-url",
        redis_server.url,
        "--interval",
        str(interval),
        "--cgroup-root",
        test_cgroup_root,
        "--log-level",
        "DEBUG",
    )
    wait_for_reports(redis_server, agent.node, 2)

    redis_server.stop()
    wait_for("the agent to notice the outage", lambda: "unreachable" in agent.log(), 30)
    time.sleep(2)  # let allocations settle after the first failures
    rss_early = agent.rss_kib()
    wait_for(
        "40 dropped reports",
        lambda: agent.log().count("dropped the report") >= 40,
        timeout_s=120,
    )
    rss_late = agent.rss_kib()
    assert agent.proc.poll() is None, "the agent died while Redis was down"
    # Logged once per outage, not once per interval.
    assert agent.log().count("is unreachable") == 1

    redis_server.start()
    back_at = time.time()
    first = wait_for_reports(redis_server, agent.node, 1, timeout_s=30)[0]
    dropped_after_restart = [
        float(ts)
        for ts in re.findall(r"dropped the report of \S+ at ts=([\d.]+)", agent.log())
        if float(ts) > back_at
    ]
    print(
        f"\nRSS during outage: {rss_early} KiB -> {rss_late} KiB; first report "
        f"{first.ts - back_at:+.2f} s after restart; reports dropped after it: "
        f"{len(dropped_after_restart)}"
    )
    # Resumed within 2 intervals: at most one report measured after Redis came back was lost.
    assert len(dropped_after_restart) <= 1
    assert "is back after" in agent.log()
    assert rss_late - rss_early < 8 * 1024, "memory grew while reports were being dropped"
    assert redis_server.client().hget(keys.node_key(agent.node), "interference_index") is not None
    assert agent.stop() == 0


@pytest.mark.bpf
@pytest.mark.redis
@pytest.mark.slow
def test_busy_pod_shows_run_queue_wait_and_idle_sibling_none(
    redis_server: RedisServer,
    start_agent: Callable[..., AgentProcess],
    test_cgroup_root: str,
    tmp_path: Path,
) -> None:
    """Three busy loops pinned to one CPU in one pod, a sleeping process in its sibling pod; the
    agent (real BPF, real attribution via --pods-file) sees wait in one pod only."""
    busy_uid, idle_uid = str(uuid.uuid4()), str(uuid.uuid4())
    pods_file = tmp_path / "pods.yaml"
    pods_file.write_text(f"{busy_uid}: test/busy\n{idle_uid}: test/idle\n")
    qos = Path(V2_MOUNT, test_cgroup_root.strip("/"), "kubepods", "besteffort")
    busy_dir, idle_dir = qos / f"pod{busy_uid}" / ("b" * 64), qos / f"pod{idle_uid}" / ("c" * 64)
    busy_dir.mkdir(parents=True)
    idle_dir.mkdir(parents=True)

    with (
        many_started_in(3, [busy_dir / "cgroup.procs"], BUSY_LOOP, cpu=0),
        started_in([idle_dir / "cgroup.procs"], SLEEPER, cpu=0),
    ):
        agent = start_agent(
            "--redis-url",
            redis_server.url,
            "--interval",
            "1",
            "--cgroup-root",
            test_cgroup_root,
            "--pods-file",
            str(pods_file),
        )
        reports = wait_for_reports(redis_server, agent.node, 3)
        pod_hash = redis_server.client().hgetall(keys.pod_key(agent.node, "test", "busy"))
        assert agent.stop() == 0

    assert "runqlat" not in reports[-1].disabled_probes, agent.log()
    rows = {p.key: p for p in reports[-1].pods}
    busy = rows["test/busy"]
    idle_wait = rows["test/idle"].runq_wait_ms_per_s if "test/idle" in rows else 0.0
    print(f"\nbusy pod waits {busy.runq_wait_ms_per_s:.1f} ms/s, idle pod {idle_wait:.2f} ms/s")
    # Three loops sharing one CPU: each waits about 2/3 of the time, ≈ 2000 ms/s in all.
    assert busy.runq_wait_ms_per_s > 500
    assert busy.cpu_ms_per_s > 0  # its share of CPU 0 depends on what else runs there
    assert busy.runq_p99_us > 0
    assert busy.uid == busy_uid and busy.qos == "besteffort"
    assert idle_wait < 0.01 * busy.runq_wait_ms_per_s
    assert reports[-1].metrics.runq_wait_ratio > 0
    assert float(pod_hash["runq_wait_ms_per_s"]) > 500


@pytest.mark.bpf
@pytest.mark.redis
@pytest.mark.slow
def test_metrics_show_the_real_histogram_the_victim_its_tolerance_and_the_antagonist(
    redis_server: RedisServer,
    start_agent: Callable[..., AgentProcess],
    test_cgroup_root: str,
    tmp_path: Path,
) -> None:
    """Real BPF probes behind /metrics (node_agent/signal_metrics.py): a pod of one busy
    loop declaring a tolerance shares CPU 0 with a pod of three; the scrape holds the node's
    run-queue histogram (cumulative, +Inf = count) and signals, the victim with its p99 and
    its tolerance, and the antagonist with the wait it caused; no UID in any label."""
    from prometheus_client.parser import text_string_to_metric_families

    hog_uid, victim_uid = str(uuid.uuid4()), str(uuid.uuid4())
    pods_file = tmp_path / "pods.yaml"
    pods_file.write_text(
        f"{hog_uid}: test/hog\n"
        f"{victim_uid}:\n  pod: test/victim\n"
        "  annotations: {interference.io/max-runq-p99-us: '500'}\n"
    )
    qos = Path(V2_MOUNT, test_cgroup_root.strip("/"), "kubepods", "besteffort")
    hog_dir, victim_dir = qos / f"pod{hog_uid}" / ("b" * 64), qos / f"pod{victim_uid}" / ("c" * 64)
    hog_dir.mkdir(parents=True)
    victim_dir.mkdir(parents=True)
    port = free_port()

    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                text = reply.read().decode()
        except OSError:
            return {}
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def victim_seen() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        found = scrape()
        names = {
            (name, dict(labels).get("pod")) for (name, labels), value in found.items() if value
        }
        wanted = {
            ("interference_pod_runq_p99_seconds", "victim"),
            ("interference_pod_caused_wait_ratio", "hog"),
        }
        return found if wanted <= names else None

    with (
        many_started_in(3, [hog_dir / "cgroup.procs"], BUSY_LOOP, cpu=0),
        started_in([victim_dir / "cgroup.procs"], BUSY_LOOP, cpu=0),
    ):
        agent = start_agent(
            "--redis-url",
            redis_server.url,
            "--cgroup-root",
            test_cgroup_root,
            "--pods-file",
            str(pods_file),
            "--http-port",
            str(port),
        )
        found = wait_for("the victim and the antagonist on /metrics", victim_seen, 60)
        assert agent.stop() == 0, agent.log()

    node = agent.node
    victim = (("namespace", "test"), ("node", node), ("pod", "victim"))
    assert found[("interference_pod_tolerance_runq_p99_seconds", victim)] == 0.0005
    assert found[("interference_pod_runq_p99_seconds", (*victim, ("window", "latest")))] > 0
    assert found[("interference_pod_runq_p99_seconds", (*victim, ("window", "10s")))] > 0
    assert found[("interference_pod_neighbour_wait_ratio", victim)] > 0
    assert found[("interference_node_signal_measured", (("family", "runq"), ("node", node)))] == 1
    assert found[("interference_node_runq_p99_seconds", (("node", node), ("window", "latest")))]
    assert found[("interference_node_runq_wait_ratio", (("node", node), ("window", "10s")))] > 0
    buckets = [
        (float(dict(labels)["le"]), value)
        for (name, labels), value in found.items()
        if name == "interference_node_runq_delay_seconds_bucket"
    ]
    counts = [value for _, value in sorted(buckets)]
    assert counts == sorted(counts) and counts[-1] > 0
    count = found[("interference_node_runq_delay_seconds_count", (("node", node),))]
    assert counts[-1] == count
    assert found[("interference_node_runq_delay_seconds_sum", (("node", node),))] > 0
    assert not any(uid in repr(found) for uid in (hog_uid, victim_uid))


@pytest.mark.bpf
def test_without_bpf_the_agent_degrades_to_taskstats_and_still_sees_contention(
    tmp_path: Path, test_cgroup_root: str
) -> None:
    """BPF sources missing: runqlat and reclaim are disabled with their reason, taskstats
    stands in, the other probes keep running, and two busy loops sharing a CPU in a pod
    still show run-queue wait for that pod."""
    pod_uid = str(uuid.uuid4())
    pod_dir = Path(V2_MOUNT, test_cgroup_root.strip("/"), "kubepods", f"pod{pod_uid}", "d" * 64)
    pod_dir.mkdir(parents=True)
    settings = AgentSettings(
        node_name="degraded-node",
        interval_s=1.0,
        cgroup_root=test_cgroup_root,
        bpf_source_dir=str(tmp_path / "no-bpf-here"),
    )
    agent = Agent(settings, StaticPodDirectory({pod_uid: ("ml", "trainer-0")}))
    with many_started_in(2, [pod_dir / "cgroup.procs"], BUSY_LOOP, cpu=0):
        agent.start()
        try:
            assert {"runqlat", "reclaim"} <= set(agent.disabled_probes)
            assert all("no-bpf-here" in agent.disabled_probes[n] for n in ("runqlat", "reclaim"))
            assert {"taskstats", "psi", "cpu_throttle"} <= set(agent.running_probes)
            time.sleep(1.0)
            report = agent.measure()
        finally:
            agent.close()
    assert report.disabled_probes == {n: agent.disabled_probes[n] for n in ("runqlat", "reclaim")}
    trainer = next(p for p in report.pods if p.key == "ml/trainer-0")
    print(f"\ntaskstats fallback: pod waits {trainer.runq_wait_ms_per_s:.0f} ms/s")
    assert trainer.runq_wait_ms_per_s > 100  # two loops on one CPU: ≈ 1000 ms/s
    assert trainer.qos == "guaranteed"
    assert report.metrics.runq_wait_ratio > 0


@pytest.mark.redis
def test_agent_class_runs_in_a_thread_and_stops_on_request(
    redis_server: RedisServer, test_cgroup_root: str
) -> None:
    settings = AgentSettings(
        node_name="thread-node",
        interval_s=0.2,
        cgroup_root=test_cgroup_root,
        probes=("psi", "cpu_throttle"),
        redis_url=redis_server.url,
    )
    publisher = RedisPublisher(PublisherSettings(redis_url=redis_server.url, ttl_s=5))
    agent = Agent(settings, StaticPodDirectory(), publisher)
    agent.start()
    assert agent.running_probes == ["psi", "cpu_throttle"]
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    try:
        wait_for("three published reports", lambda: publisher.published >= 3, 30)
    finally:
        stop.set()
        thread.join(timeout=10)
    try:
        assert not thread.is_alive()
        reports = stream_reports(redis_server, "thread-node")
        assert len(reports) == publisher.published
        assert all(b.ts > a.ts for a, b in itertools.pairwise(reports))
    finally:
        agent.close()
    # Closing withdraws the node: its report stream goes with its other keys.
    assert redis_server.client().exists(keys.reports_key("thread-node")) == 0


@pytest.mark.bpf
def test_once_prints_a_report_as_json_without_redis(test_cgroup_root: str) -> None:
    done = subprocess.run(
        [
            AGENT,
            "--once",
            "--no-kubernetes",
            "--node-name",
            "once-node",
            "--interval",
            "0.5",
            "--cgroup-root",
            test_cgroup_root,
            "--redis-url",
            "redis://127.0.0.1:1/0",  # nothing listens there: --once must not care
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    body = json.loads(done.stdout)
    assert body["node"] == "once-node"
    assert body["v"] == SCHEMA_VERSION
    assert set(body["metrics"]) == set(NodeMetrics.__dataclass_fields__)
    assert "running probes" in done.stderr.decode()


def test_kubeconfig_names_pods_through_the_api_server(tmp_path: Path) -> None:
    """--kubeconfig wiring: the real kubernetes client against the kmock emulator."""
    with Emulator() as emulator:
        api = core_api(emulator.url)
        api.create_namespaced_pod("ml", pod("ml", "trainer-0", "uid-t0", "gpu-node-3"))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emu", "cluster": {"server": emulator.url}}],
                    "users": [{"name": "agent", "user": {"token": "t"}}],
                    "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "agent"}}],
                    "current-context": "emu",
                }
            )
        )
        directory = pod_directory(AgentSettings(node_name="gpu-node-3", kubeconfig=str(kubeconfig)))
        try:
            assert isinstance(directory, KubernetesPodDirectory)
            assert directory.lookup("uid-t0") == ("ml", "trainer-0")  # synced before return
        finally:
            directory.stop()


def test_unusable_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("clusters: [}")
    with pytest.raises(ValueError, match=f"cannot use kubeconfig {broken}"):
        pod_directory(AgentSettings(node_name="n", kubeconfig=str(broken)))
    with pytest.raises(ValueError, match="cannot use kubeconfig"):
        pod_directory(AgentSettings(node_name="n", kubeconfig=str(tmp_path / "absent")))


@pytest.mark.bpf
def test_without_capabilities_the_agent_says_what_it_needs_and_runs_degraded(
    test_cgroup_root: str,
) -> None:
    """Root with every capability dropped (as in an unprivileged pod): BPF probes are
    disabled with a message naming the capabilities, and the report still comes out."""
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) is needed to drop capabilities"
    done = subprocess.run(
        [
            setpriv,
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--",
            AGENT,
            "--once",
            "--no-kubernetes",
            "--interval",
            "0.5",
            "--cgroup-root",
            test_cgroup_root,
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    disabled = json.loads(done.stdout)["disabled_probes"]
    for name in ("runqlat", "reclaim"):
        assert "CAP_BPF" in disabled[name], disabled
    assert "degraded mode" in done.stderr.decode()
