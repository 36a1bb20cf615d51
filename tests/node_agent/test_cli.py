"""``interference-agent`` flags, env fallbacks and errors."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from interference.index import IndexReferences
from node_agent import cli
from node_agent.probes.base import ProbeContext, ProbeUnavailable
from node_agent.probes.cgroup_files import CgroupCounterProbe
from node_agent.probes.cpu_throttle import CpuThrottleProbe
from node_agent.probes.memory_events import MemoryEventsProbe
from node_agent.settings import DEFAULT_HTTP_PORT, AgentSettings, detect_cgroup_v2_mount


def settings_for(argv: list[str], environ: dict[str, str]) -> AgentSettings:
    args = cli.parser(environ).parse_args(argv)
    return cli.settings_from_args(args, environ)


def test_defaults_without_flags_or_env() -> None:
    settings = settings_for([], {})
    assert settings.node_name == socket.gethostname()
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.redis_username is None and settings.redis_password is None
    assert settings.interval_s == 1.0
    assert settings.cgroup_root == "/"
    assert settings.cgroup_v2_mount == detect_cgroup_v2_mount()
    assert settings.cgroup_v1_mount == "/sys/fs/cgroup"
    assert settings.probes == ()
    assert settings.effective_ttl_s == 5
    assert settings.kubernetes is True
    assert settings.index_refs == IndexReferences()


ENV = {
    "NODE_NAME": "gpu-7",
    "REDIS_URL": "redis://redis.intf:6379/2",
    "REDIS_USERNAME": "agent",
    "REDIS_PASSWORD": "s3cret",
    "INTERVAL_S": "2.5",
    "CGROUP_ROOT": "/kubepods.slice",
    "CGROUP_V2_MOUNT": "/host/sys/fs/cgroup",
    "CGROUP_V1_MOUNT": "/host/sys/fs/cgroup-v1",
    "PROBES": "psi, runqlat,,",
    "PODS_FILE": "/etc/pods.yaml",
    "INTERFERENCE_BPF_DIR": "/opt/bpf",
    "TTL_S": "12",
    "STREAM_MAXLEN": "500",
    "UNREADY_AFTER_PUBLISH_FAILURES": "5",
    "SWEEP_INTERVAL_S": "12.5",  # gone with the sweep: an old manifest's value is ignored
    "REDIS_SENTINELS": "sentinel-0.redis:26379, 10.0.0.7:26380",
    "REDIS_SENTINEL_MASTER": "intf",
    "REDIS_CLUSTER": "",
}


def test_env_fallbacks() -> None:
    settings = settings_for([], ENV)
    assert settings.node_name == "gpu-7"
    assert settings.redis_url == "redis://redis.intf:6379/2"
    assert (settings.redis_username, settings.redis_password) == ("agent", "s3cret")
    assert settings.interval_s == 2.5
    assert settings.cgroup_root == "/kubepods.slice"
    assert settings.cgroup_v2_mount == "/host/sys/fs/cgroup"
    assert settings.cgroup_v1_mount == "/host/sys/fs/cgroup-v1"
    assert settings.probes == ("psi", "runqlat")
    assert settings.pods_file == "/etc/pods.yaml"
    assert settings.bpf_source_dir == "/opt/bpf"
    assert settings.effective_ttl_s == 12
    assert settings.stream_maxlen == 500
    assert settings.unready_after_publish_failures == 5
    assert not hasattr(settings, "sweep_interval_s")
    assert settings.redis_sentinels == (("sentinel-0.redis", 26379), ("10.0.0.7", 26380))
    assert settings.redis_sentinel_master == "intf"
    assert settings.redis_cluster is False
    assert settings_for([], {"REDIS_CLUSTER": "true"}).redis_cluster is True


def test_flags_win_over_env() -> None:
    settings = settings_for(
        [
            "--node-name",
            "n2",
            "--redis-url",
            "redis://127.0.0.1:7000/0",
            "--interval",
            "0.5",
            "--cgroup-root",
            "/test",
            "--cgroup-v2-mount",
            "/mnt/v2",
            "--cgroup-v1-mount",
            "/mnt/v1",
            "--probes",
            "cpu_throttle",
            "--no-kubernetes",
            "--index-ref",
            "runq_p99_us=20000",
            "--index-ref",
            "weight_net_drops=0",
        ],
        ENV,
    )
    assert (settings.node_name, settings.interval_s, settings.cgroup_root) == ("n2", 0.5, "/test")
    assert settings.redis_url == "redis://127.0.0.1:7000/0"
    assert (settings.cgroup_v2_mount, settings.cgroup_v1_mount) == ("/mnt/v2", "/mnt/v1")
    assert settings.probes == ("cpu_throttle",)
    assert settings.kubernetes is False
    assert settings.index_refs == IndexReferences(runq_p99_us=20000.0, weight_net_drops=0.0)


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        ([], {"INTERVAL_S": "fast"}, "INTERVAL_S='fast' is not a number; allowed: > 0"),
        (["--interval", "0"], {}, "--interval=0 is out of range; allowed: > 0"),
        (["--cgroup-root", "kubepods"], {}, "cgroup root must be an absolute path"),
        (["--node-name", ""], {}, "node name is empty"),
        (["--ttl", "0"], {}, "--ttl=0 is out of range; allowed: ≥ 1"),
        (
            ["--unready-after-publish-failures", "0"],
            {},
            "--unready-after-publish-failures=0 is out of range; allowed: ≥ 1",
        ),
        (["--sweep-interval", "30"], {}, "unrecognized arguments: --sweep-interval"),
        (["--index-ref", "runq=5"], {}, "NAME one of runq_p99_us"),
        (["--index-ref", "runq_p99_us=soon"], {}, "'soon' is not a number"),
        (["--index-ref", "runq_p99_us=100"], {}, "runq_p99_us_quiet < runq_p99_us"),
        (["--index-ref", "weight_reclaim=2"], {}, "weight_reclaim: 2.0 must be between 0 and 1"),
        (["--redis-url", "localhost:6379"], {}, "redis://"),
        (["--log-level", "LOUD"], {}, "log level 'LOUD' is not one of DEBUG, INFO"),
        ([], {"REDIS_CLUSTER": "Y"}, "REDIS_CLUSTER='Y' is not a boolean"),
        (["--probes", "bogus,psi"], {}, "unknown probe(s) bogus"),
        (["--cgroup-root", "/intf-test-c-does-not-exist"], {}, "is not a cgroup"),
        (["--http-port", "-1"], {}, "--http-port=-1 is out of range; allowed: 0–65535"),
        (["--index-ref", "runq_p99_us=-5"], {}, "allowed: ≥ 0"),
        (["--redis-sentinels", "sentinel-0"], {}, "entry 'sentinel-0' is not HOST:PORT"),
        (["--redis-sentinels", "a:1", "--redis-cluster"], {}, "not both"),
    ],
)
def test_bad_configuration_exits_2_saying_what_is_wrong(
    argv: list[str], environ: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--no-kubernetes", *argv], environ)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_pods_file_exits_2_naming_the_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = tmp_path / "pods.yaml"
    pods.write_text("abc-123: just-a-name\n")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--pods-file", str(pods), "--once"], {})
    assert exit_info.value.code == 2
    assert "'abc-123'" in capsys.readouterr().err


def test_once_prints_one_report(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(
        [
            "--once",
            "--no-kubernetes",
            "--node-name",
            "cli-node",
            "--interval",
            "0.2",
            "--probes",
            "psi",
        ],
        {},
    )
    assert status == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["node"] == "cli-node"
    assert report["interval_s"] == pytest.approx(0.2, abs=0.5)
    assert report["disabled_probes"] == {}


@pytest.mark.parametrize(
    ("settings", "shown"),
    [
        (AgentSettings(redis_url="redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0"),
        (
            AgentSettings(redis_url="redis://agent:s3cret@redis:6379/0"),
            "redis://agent:***@redis:6379/0",
        ),
        (AgentSettings(redis_url="rediss://:s3cret@redis:6380"), "rediss://:***@redis:6380"),
        (
            AgentSettings(redis_url="redis://:s3cret@redis-0:6379/0", redis_cluster=True),
            "cluster node redis://:***@redis-0:6379/0",
        ),
        (
            AgentSettings(redis_sentinels=(("s-0", 26379),), redis_sentinel_master="intf"),
            "master 'intf' via sentinels s-0:26379",
        ),
    ],
)
def test_the_logged_redis_target_hides_the_password(settings: AgentSettings, shown: str) -> None:
    assert cli.redis_description(settings) == shown


@pytest.mark.parametrize(
    ("argv", "environ", "ncpu", "address", "port"),
    [
        ([], {}, None, "127.0.0.1", DEFAULT_HTTP_PORT),
        ([], {"NCPU": "3", "HTTP_ADDRESS": "10.0.0.5", "HTTP_PORT": "9100"}, 3, "10.0.0.5", 9100),
        (["--ncpu", "2", "--http-port", "0"], {"NCPU": "8"}, 2, "127.0.0.1", 0),
    ],
)
def test_cpu_count_and_http_endpoint_flags(
    argv: list[str], environ: dict[str, str], ncpu: int | None, address: str, port: int
) -> None:
    settings = settings_for(argv, environ)
    assert (settings.ncpu, settings.http_address, settings.http_port) == (ncpu, address, port)


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--ncpu", "0"], "--ncpu=0 is out of range"), (["--http-port", "70000"], "--http-port")],
)
def test_bad_cpu_count_or_port_is_a_clear_error(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings_for(argv, {})


@pytest.mark.parametrize("probe_class", [CpuThrottleProbe, MemoryEventsProbe])
def test_cgroup_probes_hint_at_flags_that_exist(
    tmp_path: Path, probe_class: type[CgroupCounterProbe]
) -> None:
    ctx = ProbeContext(cgroup_v2_mount=str(tmp_path / "v2"), cgroup_v1_mount=str(tmp_path))
    with pytest.raises(ProbeUnavailable) as raised:
        probe_class(ctx).start()
    hinted = set(re.findall(r"--[a-z0-9-]+", str(raised.value)))
    assert hinted == {"--cgroup-v2-mount", "--cgroup-v1-mount"}
    assert hinted <= set(cli.parser({})._option_string_actions)


def test_a_taken_health_port_is_fatal(capsys: pytest.CaptureFixture[str]) -> None:
    """With hostNetwork, kubelet's probes would reach whoever holds the port: exit 1."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        status = cli.main(
            ["--no-kubernetes", "--probes", "psi", "--http-port", str(port)],
            {"REDIS_URL": "redis://127.0.0.1:1/0"},
        )
    finally:
        holder.close()
    assert status == 1
    err = capsys.readouterr().err
    assert "pick another --http-port/--http-address, or --http-port 0 to serve nothing" in err
    assert "Traceback" not in err


def test_log_format_json_gives_one_object_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        cli.main(
            [
                "--no-kubernetes",
                "--probes",
                "psi",
                "--http-port",
                str(holder.getsockname()[1]),
                "--log-format",
                "JSON",
                "--log-level",
                "debug",
            ],
            {"REDIS_URL": "redis://agent:s3cret@127.0.0.1:1/0"},
        )
    finally:
        holder.close()
    lines = capsys.readouterr().err.splitlines()
    entries = [json.loads(line) for line in lines]
    assert entries and all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    assert any(
        "pick another --http-port" in e["message"] and e["level"] == "ERROR" for e in entries
    )
