"""Acceptance 4: every command in docs/operations.md that can run without a cluster is run.

Commands are the lines of the doc's ``sh`` code blocks. Each is one of: a ``redis-cli``
recipe (also when wrapped in ``kubectl exec deploy/redis --``), run against the deployed
Redis (tests/deploy/conftest.py) filled by the real agent publisher and decision records;
an ``ACL SETUSER`` for an external Redis, run against a plain redis-server and compared
with the bundled ACL; a ``kubectl kustomize`` render; the credential generator, run in a
copy of deploy/. Everything else must be a command that needs a cluster, a registry or a
Docker engine — a new command of any other sort fails the test until it is exercised.
"""

from __future__ import annotations

import base64
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis
import yaml
from prometheus_client import CollectorRegistry

from interference import keys
from interference.decision import CandidateVerdict, Decision, decision_hash
from interference.signals import GpuDevice, NodeMetrics, NodeReport, PodMetrics
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.redis_signals import SignalMetrics
from scheduler.metrics import SchedulerMetrics
from tests.conftest import RedisServer
from tests.deploy.conftest import DeployedRedis, redis_manifests
from tests.deploy.manifests import DEPLOY, REPO, find

DOC = REPO / "docs" / "operations.md"

NODE = "gpu-node-1"
POD_NAMESPACE, POD = "shop", "checkout-api-5b7d9c8f6-q4k2m"
SCORES = {NODE: 72.5, "cpu-node-2": 15.0, "cpu-node-3": 40.25}
"""The example names the doc uses, and each node's interference score."""

NEEDS_CLUSTER = re.compile(
    r"^(kubectl (-n \S+ )?(apply|delete|rollout|logs|get|describe|edit|exec)\b"
    r"|docker |make (local-)?images\b)"
)
"""Commands that need a cluster, a registry or a Docker engine (the Install section's are
run by ``make e2e-cluster``)."""
REDIS_EXEC = re.compile(
    r"^kubectl -n interference-system exec (-i )?deploy/redis -- (redis-cli .*)$"
)


def doc_commands() -> list[str]:
    """Every command line of the doc's ``sh`` blocks."""
    blocks = re.findall(r"^ *```sh\n(.*?)^ *```", DOC.read_text(), re.MULTILINE | re.DOTALL)
    return [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def redis_recipe(command: str) -> str | None:
    """The ``redis-cli …`` part of a recipe the doc runs in the Redis pod, else None."""
    if command.startswith("redis-cli ") and "ACL SETUSER" not in command:
        return command
    wrapped = REDIS_EXEC.match(command)
    return wrapped.group(2) if wrapped else None


def redis_command_name(recipe: str) -> str:
    """The Redis command of a recipe (``HGETALL``…), or ``--scan`` for a key scan."""
    words = [w for w in shlex.split(recipe)[1:] if w != "--raw"]
    return words[0] if words[0] == "--scan" else words[0].upper()


def test_every_command_is_exercised_or_needs_a_cluster() -> None:
    commands = doc_commands()
    assert len(commands) > 20
    unexercised = [
        c
        for c in commands
        if not (
            redis_recipe(c)
            or "ACL SETUSER" in c
            or c.startswith("kubectl kustomize ")
            or "openssl rand" in c
            or NEEDS_CLUSTER.match(c)
        )
    ]
    assert unexercised == [], "commands in docs/operations.md that no test runs"


# --- redis-cli recipes -------------------------------------------------------------


def node_report(node: str, ts: float) -> NodeReport:
    pods = [PodMetrics("kube-system", f"proxy-{node}", uid=f"uid-proxy-{node}", qos="burstable")]
    gpus: list[GpuDevice] = []
    disabled: dict[str, str] = {}
    if node == NODE:
        pods.append(
            PodMetrics(
                POD_NAMESPACE,
                POD,
                uid="uid-api",
                qos="guaranteed",
                cpu_ms_per_s=420.0,
                runq_wait_ms_per_s=31.5,
                runq_p99_us=2900,
            )
        )
        gpus = [
            GpuDevice(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559, 20480, 87.0, 1)
            for i in range(2)
        ]
        disabled = {"reclaim": "tracepoint vmscan:mm_vmscan_memcg_reclaim_begin is missing"}
    return NodeReport(
        node=node,
        ts=ts,
        interval_s=1.0,
        metrics=NodeMetrics(runq_p50_us=40, runq_p99_us=SCORES[node] * 40, score=SCORES[node]),
        histograms={"runq_us": [0, 12, 40, 22, 7, 1]},
        pods=pods,
        gpus=gpus,
        disabled_probes=disabled,
    )


class Store:
    """The deployed Redis, written to as the agents and the scheduler write to it."""

    def __init__(self, server: DeployedRedis) -> None:
        self.server = server
        username, password = server.credentials("DaemonSet", "interference-agent", "agent")
        self.publisher = RedisPublisher(
            PublisherSettings(server.url, username=username, password=password, ttl_s=600)
        )
        self.now = 1_700_000_000.0

    def publish_all(self) -> None:
        self.now += 1
        for node in SCORES:
            assert self.publisher.publish(node_report(node, self.now))

    def record_decision(self) -> None:
        username, password = self.server.credentials(
            "Deployment", "interference-scheduler", "scheduler"
        )
        scheduler = redis.Redis(port=self.server.port, username=username, password=password)
        candidates = [
            CandidateVerdict("cpu-node-2", True, [], {"interference": 85.0, "balance": 60.0}, 78.0),
            CandidateVerdict(NODE, False, ["node(s) exceeded the pod's run-queue p99 tolerance"]),
        ]
        decision = Decision(
            POD_NAMESPACE,
            POD,
            "scheduled",
            "cpu-node-2",
            "Successfully assigned shop/checkout-api-5b7d9c8f6-q4k2m to cpu-node-2",
            self.now,
            candidates=candidates,
        )
        key = keys.decision_key(POD_NAMESPACE, POD)
        scheduler.hset(key, mapping=decision_hash(decision))  # type: ignore[arg-type]
        scheduler.expire(key, keys.DECISION_TTL_S)


@pytest.fixture
def store(deployed_redis: DeployedRedis) -> Store:
    filled = Store(deployed_redis)
    filled.publish_all()
    filled.record_decision()
    return filled


def run_recipe(recipe: str, store: Store, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run a recipe in a shell as the Redis container would, against the local Redis."""
    real = shutil.which("redis-cli")
    assert real, "redis-cli is not installed; run `make setup`"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "redis-cli"
    wrapper.write_text(f'#!/bin/sh\nexec {real} -p {store.server.port} "$@"\n')
    wrapper.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **store.server.env()}
    proc = subprocess.Popen(
        ["bash", "-c", recipe],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="backslashreplace",  # stream entries are msgpack
    )
    if "BLOCK" in recipe:
        # The recipe waits for the next report: keep publishing until it has seen one.
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            store.publish_all()
            time.sleep(0.3)
    stdout, stderr = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(recipe, proc.returncode, stdout, stderr)


RECIPES = sorted({r for c in doc_commands() if (r := redis_recipe(c))})


def check_output(name: str, recipe: str, out: str) -> None:
    """What each kind of recipe must show, given the data the store fixture wrote."""
    lines = out.splitlines()
    if name == "ZREVRANGE":
        ranked = sorted(SCORES, key=SCORES.__getitem__, reverse=True)
        assert lines[0::2] == ranked
        assert [float(s) for s in lines[1::2]] == sorted(SCORES.values(), reverse=True)
    elif name == "ZRANGE":
        assert set(lines[0::2]) == set(SCORES)
    elif name == "ZCARD":
        assert lines == [str(len(SCORES))]
    elif name == "HGETALL" and "intf:node:" in recipe:
        fields = dict(zip(lines[0::2], lines[1::2], strict=True))
        assert fields["score"] == "72.5" and "updated_at" in fields and "hist_runq_us" in fields
    elif name == "HGETALL" and "intf:pod:" in recipe:
        fields = dict(zip(lines[0::2], lines[1::2], strict=True))
        assert fields["node"] == NODE and fields["runq_wait_ms_per_s"] == "31.5"
    elif name == "HGETALL" and "intf:gpu:" in recipe:
        fields = dict(zip(lines[0::2], lines[1::2], strict=True))
        assert fields["count"] == "2" and fields["1.model"] == "NVIDIA H100 80GB HBM3"
    elif name == "HGETALL" and "intf:decision:" in recipe:
        fields = dict(zip(lines[0::2], lines[1::2], strict=True))
        assert fields["result"] == "scheduled" and fields["node"] == "cpu-node-2"
    elif name == "HGET" and recipe.endswith("candidates"):
        assert [c["node"] for c in yaml.safe_load(out)] == ["cpu-node-2", NODE]
    elif name == "HGET" and recipe.endswith("disabled_probes"):
        assert lines == ["reclaim"]
    elif name == "HMGET":
        assert lines[:3] == ["2900", "0", "72.5"]
    elif name == "TTL":
        assert 0 < int(lines[0]) <= 600
    elif name == "SMEMBERS":
        assert set(lines) == {f"{POD_NAMESPACE}/{POD}", f"kube-system/proxy-{NODE}"}
    elif name == "--scan":
        pattern = shlex.split(recipe)[-1]
        assert lines and all(re.fullmatch(pattern.replace("*", ".*"), k) for k in lines)
    elif name == "XLEN":
        assert int(lines[0]) >= len(SCORES)
    elif name in ("XINFO", "XREAD"):
        assert NODE in out or "cpu-node" in out
    elif name == "TIME":
        assert len(lines) == 2 and all(part.isdigit() for part in lines)
    else:
        pytest.fail(f"no expectation for recipe {recipe!r}: add one to check_output")


@pytest.mark.redis
@pytest.mark.parametrize("recipe", RECIPES)
def test_redis_recipe(recipe: str, store: Store, tmp_path: Path) -> None:
    done = run_recipe(recipe, store, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), f"{recipe!r} printed nothing"
    assert not re.search(r"\b(ERR|NOPERM|WRONGTYPE)\b", done.stdout), done.stdout
    check_output(redis_command_name(recipe), recipe, done.stdout)


def test_the_recipes_cover_what_the_issue_asks_for() -> None:
    names = {redis_command_name(r) for r in RECIPES}
    assert {"ZREVRANGE", "HGETALL", "XREAD"} <= names
    assert any(keys.decision_key(POD_NAMESPACE, POD) in r for r in RECIPES)
    assert any(keys.node_key(NODE) in r for r in RECIPES)


# --- ACL users for an external Redis ------------------------------------------------


@pytest.mark.redis
def test_external_redis_acl_commands_match_the_bundled_users(
    redis_server: RedisServer, deployed_redis: DeployedRedis
) -> None:
    """Running the doc's ACL SETUSER lines gives the same users as users.acl.template."""
    setusers = [c for c in doc_commands() if "ACL SETUSER" in c]
    assert len(setusers) == 2
    for command in setusers:
        argv = shlex.split(command)
        assert argv[0] == "redis-cli"
        done = subprocess.run(
            ["redis-cli", "-p", str(redis_server.port), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.stdout.strip() == "OK", done.stdout + done.stderr
    documented, bundled = redis_server.client(), deployed_redis.admin()
    for user in ("interference-agent", "interference-scheduler"):
        ours, theirs = documented.acl_getuser(user), bundled.acl_getuser(user)
        assert ours is not None and theirs is not None
        for aspect in ("flags", "commands", "keys", "channels", "categories"):
            assert sorted(ours[aspect]) == sorted(theirs[aspect]), (user, aspect)


# --- renders and the credential generator -------------------------------------------


@pytest.mark.parametrize(
    "command", sorted(c for c in doc_commands() if c.startswith("kubectl kustomize "))
)
def test_kustomize_command(command: str) -> None:
    done = subprocess.run(
        shlex.split(command), cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    kinds = {obj["kind"] for obj in yaml.safe_load_all(done.stdout) if obj}
    assert {"DaemonSet", "Deployment"} <= kinds


def test_credential_generator_replaces_the_example_passwords(tmp_path: Path) -> None:
    (generator,) = [c for c in doc_commands() if "openssl rand" in c]
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed by the documented credential generator")
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    done = subprocess.run(
        ["bash", "-c", generator], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path / "deploy")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    secret = find(list(yaml.safe_load_all(rendered)), "Secret", "redis-credentials")
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    _, env = redis_manifests()
    needed = {v["valueFrom"]["secretKeyRef"]["key"] for v in env if "valueFrom" in v}
    assert set(values) == needed
    assert all(len(v) == 48 and not v.startswith("REPLACE-ME") for v in values.values())
    assert len(set(values.values())) == len(values)


def test_documented_metrics_are_exported() -> None:
    """Every ``interference_scheduler_*`` series the doc names is in the scheduler's /metrics."""
    registry = CollectorRegistry()
    SchedulerMetrics(registry)
    SignalMetrics(registry)
    exported = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in registry.collect()
    }
    documented = set(re.findall(r"\binterference_scheduler_\w+", DOC.read_text()))
    assert len(documented) >= 5
    assert documented <= exported, sorted(documented - exported)
