"""Acceptance 4: every command in docs/operations.md that can run without a cluster is run.

Commands are the lines of the doc's ``sh`` code blocks. Each is one of: a ``redis-cli``
recipe (also when wrapped in ``kubectl exec deploy/redis --``), run against the deployed
Redis (tests/deploy/conftest.py) filled by the real agent publisher and decision records;
an ``ACL SETUSER`` for an external Redis, run against a plain redis-server and compared
with the bundled ACL; a ``kubectl kustomize`` render; the Secret generator, run with a
recording kubectl; the offline ``interference simulate --explain``. Everything else must be
a command that needs a cluster, a registry or a Docker daemon — a new command of any other
sort fails the test until it is exercised.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml
from prometheus_client import CollectorRegistry

from credential_issuer.issuer import IssuerMetrics
from credential_issuer.redis_users import AgentUsers
from credential_issuer.settings import redis_target
from interference import acl, keys, sched_record
from interference.decision import CandidateVerdict, Decision, decision_hash
from interference.signals import GpuDevice, NodeMetrics, NodeReport, PodMetrics
from node_agent.publisher import PublisherSettings, RedisPublisher
from scheduler.adapters.preemption import PreemptionMetrics
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.adapters.tracing import TracingMetrics
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.extender.metrics import ExtenderMetrics
from scheduler.rebalancing.metrics import RebalanceMetrics
from tests.conftest import RedisServer
from tests.deploy.conftest import USERS, DeployedRedis, redis_manifests
from tests.deploy.manifests import REPO, Obj, kustomizations, pod_templates, render

DOC = REPO / "docs" / "operations.md"

NODE = "gpu-node-1"
POD_NAMESPACE, POD = "shop", "checkout-api-5b7d9c8f6-q4k2m"
INDEX_OF = {NODE: 72.5, "cpu-node-2": 15.0, "cpu-node-3": 40.25}
"""The example names the doc uses, and each node's interference index."""

NEEDS_CLUSTER = re.compile(
    r"^(kubectl (-n \S+ )?(apply|delete|rollout|logs|get|describe|edit|exec|port-forward|set)\b"
    # the agents' Service addresses without cluster DNS (Install, run by make e2e-cluster)
    r"|(REDIS_IP|ISSUER_IP|SCHEME|QUERY)=\$\("
    r"|curl -s localhost:10251/|docker |make (local-)?images\b"
    r"|(KUBEBUILDER_ASSETS=\S+ )?make test\b|\S*python -m pytest -m e2e\b"
    r"|REDIS_USERNAME=\S+ REDIS_PASSWORD_FILE=\S+ REDIS_CA_FILE=\S+ interference top "
    r"--redis-url rediss://localhost:6379/0$)"
)
"""Commands that need a cluster, a registry, a Docker daemon or Kubernetes binaries (the
Install section's are run by ``make e2e-cluster``, the test commands are the suite; the
scheduler's ``/config`` pages through a port-forward by tests/e2e/test_config_rollback.py)."""
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


VIEWER_RECIPE = "redis-cli --tls --cacert ca.crt --user interference-viewer "
"""A recipe run from an operator's machine as the viewer user, over TLS with the CA of the
viewer's Secret saved as ca.crt (password in REDISCLI_AUTH)."""


def redis_recipe(command: str) -> str | None:
    """The ``redis-cli …`` part of a recipe the doc runs in the Redis pod, else None."""
    if command.startswith(VIEWER_RECIPE):
        return None
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
            or c.startswith(VIEWER_RECIPE)
            or "ACL SETUSER" in c
            or c.startswith("kubectl kustomize ")
            or c.startswith(("scripts/create-redis-secret.sh", "interference simulate "))
            # run on a real apiserver by tests/e2e/test_extender_certs.py
            or c.startswith("scripts/create-extender-certs.sh")
            # run on the deployed Redis by tests/deploy/test_redis_rotation.py
            or c.startswith("scripts/rotate-redis-password.sh ")
            # a preemptor's record: its explain line is rendered from the record a real
            # loop wrote by tests/scheduler/test_preemption_loop.py
            or c.startswith("interference explain ml/train-0 ")
            # the kubectl plugin: run with a kubectl that answers as the real one, in front
            # of a real Redis, by tests/cli/test_kubectl_plugin.py
            or c.startswith("kubectl interference ")
            # run on the recorded traces, against a real Prometheus and on live agents'
            # streams by tests/cli/test_recommend_tolerance*.py
            or c.startswith("interference recommend-tolerance ")
            # Central pods on system nodes: run by make e2e-cluster on its system node
            or c.startswith("SYSTEM_NODES=")
            or c.startswith("kubectl -n interference-system patch deployment ")
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
        metrics=NodeMetrics(
            runq_p50_us=40, runq_p99_us=INDEX_OF[node] * 40, interference_index=INDEX_OF[node]
        ),
        histograms={"runq_us": [0, 12, 40, 22, 7, 1]},
        pods=pods,
        gpus=gpus,
        disabled_probes=disabled,
        measured=("psi", "runq"),
    )


class Store:
    """The deployed Redis, written to as the agents and the scheduler write to it."""

    def __init__(self, server: DeployedRedis) -> None:
        self.server = server
        # Each node's agent logs in as its own user, created by the credential issuer's
        # Redis code with the issuer's deployed credentials.
        username, password = server.credentials("Deployment", "interference-credentials", "issuer")
        users = AgentUsers(redis_target(server.url, username=username, password=password), 5.0)
        self.publishers = {}
        try:
            for node in INDEX_OF:
                agent_password = secrets.token_hex(24)
                users.set_user(node, agent_password)
                self.publishers[node] = RedisPublisher(
                    PublisherSettings(
                        server.url,
                        username=acl.agent_username(node),
                        password=agent_password,
                        ttl_s=600,
                    )
                )
        finally:
            users.close()
        self.now = 1_700_000_000.0

    def publish_all(self) -> None:
        self.now += 1
        for node, publisher in self.publishers.items():
            assert publisher.publish(node_report(node, self.now))

    def rank(self) -> None:
        """The scheduler's signal follower, logged in as its deployed user: read every
        node's record, write the ranking ``intf:nodes`` / ``intf:nodes:updated``."""
        username, password = self.server.credentials(
            "Deployment", "interference-scheduler", "scheduler"
        )
        settings = RedisSettings(url=self.server.url)
        connection = connect(settings, {"REDIS_USERNAME": username, "REDIS_PASSWORD": password})
        cache = RedisSignalCache(
            connection,
            settings,
            SignalMetrics(CollectorRegistry()),
            known_nodes=lambda: list(INDEX_OF),
            clock=lambda: self.now + 0.5,
        )
        try:
            assert cache.poll_once() == len(INDEX_OF)
            assert cache.write_ranking()
        finally:
            connection.close()

    def record_decision(self) -> None:
        username, password = self.server.credentials(
            "Deployment", "interference-scheduler", "scheduler"
        )
        scheduler = redis.Redis(port=self.server.port, username=username, password=password)
        candidates = [
            CandidateVerdict(
                "cpu-node-2", True, [], {"Interference": 85.0, "NodeResourcesFit": 60.0}, 78.0
            ),
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
        looked = Decision(
            POD_NAMESPACE,
            POD,
            "would_evict",
            NODE,
            "would evict (dry run): its run-queue p99 8150 µs > tolerance 500 µs",
            self.now,
            dry_run=True,
            candidates=candidates,
        )
        key = keys.rebalance_decision_key(POD_NAMESPACE, POD)
        scheduler.hset(key, mapping=decision_hash(looked))  # type: ignore[arg-type]
        scheduler.expire(key, keys.DECISION_TTL_S)


@pytest.fixture
def store(deployed_redis: DeployedRedis) -> Store:
    filled = Store(deployed_redis)
    filled.publish_all()
    filled.rank()
    filled.record_decision()
    return filled


def run_recipe(recipe: str, store: Store, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run a recipe in a shell as the Redis container would, against the local Redis."""
    real = shutil.which("redis-cli")
    assert real, "redis-cli is not installed; run `make setup`"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    # The container's redis-cli is the ConfigMap's wrapper (TLS, logged in as admin from
    # the mounted password file); server.env() points it at this Redis's files and port.
    config, _ = redis_manifests()
    (bin_dir / "redis-cli").write_text(config["redis-cli"])
    (bin_dir / "redis-cli").chmod(0o755)
    env = {
        **store.server.env(),
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "REDIS_CLI_BINARY": real,
    }
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
        # The scheduler ranks by the index it computes from the signals (not the reported one).
        ranked = [float(s) for s in lines[1::2]]
        assert set(lines[0::2]) == set(INDEX_OF)
        assert ranked == sorted(ranked, reverse=True) and all(0 <= i <= 100 for i in ranked)
    elif name == "ZRANGE":
        assert set(lines[0::2]) == set(INDEX_OF)
    elif name == "ZCARD":
        assert lines == [str(len(INDEX_OF))]
    elif name == "HGETALL" and ":pod:" in recipe:
        assert keys.pod_key(NODE, POD_NAMESPACE, POD) in recipe
        fields = dict(zip(lines[0::2], lines[1::2], strict=True))
        assert fields["node"] == NODE and fields["runq_wait_ms_per_s"] == "31.5"
    elif name == "HGETALL" and recipe.endswith(keys.gpu_key(NODE)):
        fields = dict(zip(lines[0::2], lines[1::2], strict=True))
        assert fields["count"] == "2" and fields["1.model"] == "NVIDIA H100 80GB HBM3"
    elif name == "HGETALL" and recipe.endswith(keys.node_key(NODE)):
        fields = dict(zip(lines[0::2], lines[1::2], strict=True))
        assert fields["interference_index"] == "72.5"
        assert "updated_at" in fields and "hist_runq_us" in fields
    elif name == "HGETALL" and recipe.endswith(keys.rebalance_decision_key(POD_NAMESPACE, POD)):
        fields = dict(zip(lines[0::2], lines[1::2], strict=True))
        assert fields["result"] == "would_evict" and fields["node"] == NODE
        assert fields["dry_run"] == "1"
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
        if pattern == keys.sched_key("*"):
            assert sorted(lines) == sorted(keys.sched_key(n) for n in INDEX_OF)
    elif name == "XLEN":
        assert keys.reports_key(NODE) in recipe
        assert int(lines[0]) >= 1
    elif name == "STRLEN":
        assert keys.sched_key(NODE) in recipe
        assert lines == [str(sched_record.SIZE)]
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


VIEWER_RECIPES = sorted(c for c in doc_commands() if c.startswith(VIEWER_RECIPE))


@pytest.mark.redis
@pytest.mark.parametrize("recipe", VIEWER_RECIPES)
def test_viewer_recipe(recipe: str, store: Store) -> None:
    """Each recipe as the doc says to run it (the viewer's password in REDISCLI_AUTH) reads
    without error what the agents and the scheduler wrote."""
    real = shutil.which("redis-cli")
    assert real, "redis-cli is not installed; run `make setup`"
    argv = [str(store.server.ca_file) if a == "ca.crt" else a for a in shlex.split(recipe)]
    done = subprocess.run(
        [real, "-p", str(store.server.tls_port), *argv[1:]],
        env={"PATH": "/usr/bin:/bin", "REDISCLI_AUTH": store.server.secret["viewer"]},
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), f"{recipe!r} printed nothing"
    assert not re.search(r"\b(ERR|NOPERM|WRONGPASS|WRONGTYPE)\b", done.stdout), done.stdout
    if "ZREVRANGE" in recipe:
        assert set(done.stdout.splitlines()[0::2]) == set(INDEX_OF)


def run_as_viewer(recipe: str, store: Store) -> subprocess.CompletedProcess[str]:
    """A recipe of the Redis pod run from an operator's machine as the viewer user (the
    doc's ``redis-cli --user interference-viewer``, password in REDISCLI_AUTH)."""
    real = shutil.which("redis-cli")
    assert real, "redis-cli is not installed; run `make setup`"
    argv = shlex.split(recipe)
    assert argv[0] == "redis-cli"
    tls = ["--tls", "--cacert", str(store.server.ca_file), "-p", str(store.server.tls_port)]
    proc = subprocess.Popen(
        [real, *tls, "--user", "interference-viewer", *argv[1:]],
        env={"PATH": "/usr/bin:/bin", "REDISCLI_AUTH": store.server.secret["viewer"]},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="backslashreplace",  # stream entries are msgpack
    )
    if "BLOCK" in recipe:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            store.publish_all()
            time.sleep(0.3)
    stdout, stderr = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


@pytest.mark.redis
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_redis_recipe_runs_as_the_viewer(recipe: str, store: Store) -> None:
    """The doc hands CLI users the viewer: each recipe of the Redis pod (as admin) runs as
    the viewer too, with the same output, and Redis logs no refused command."""
    done = run_as_viewer(recipe, store)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip(), f"{recipe!r} printed nothing as the viewer"
    errors = r"\b(ERR|NOPERM|WRONGPASS|WRONGTYPE)\b"
    assert not re.search(errors, done.stdout + done.stderr), done.stdout + done.stderr
    check_output(redis_command_name(recipe), recipe, done.stdout)
    assert store.server.admin().acl_log() == []


@pytest.mark.redis
def test_the_viewer_may_only_read_intf_keys(deployed_redis: DeployedRedis) -> None:
    """What the viewer is granted so that the recipes run stays read-only: no command
    that writes or administers, and read access to ``intf:*`` keys only."""
    admin = deployed_redis.admin()
    viewer = admin.acl_getuser("interference-viewer")
    assert viewer is not None
    assert viewer["keys"] == ["%R~intf:*"] and viewer["categories"] == ["-@all"]
    assert all(c.startswith("+") for c in viewer["commands"]), viewer["commands"]
    granted = [c.removeprefix("+") for c in viewer["commands"]]
    for command in granted:
        name, _, sub = command.partition("|")
        info = admin.execute_command("COMMAND", "INFO", name)[name]
        if sub:
            (entry,) = [s for s in info["subcommands"] if s[0] == command]
            flags, categories = set(entry[2]), set(entry[6])
        else:
            flags, categories = set(info["flags"]), set(info["acl_categories"])
        assert not flags & {"write", "admin", "denyoom"}, (command, flags)
        assert not categories & {"@write", "@admin", "@dangerous"}, (command, categories)


def test_there_are_viewer_recipes() -> None:
    assert len(VIEWER_RECIPES) >= 3


def test_the_recipes_cover_what_the_issue_asks_for() -> None:
    names = {redis_command_name(r) for r in RECIPES}
    assert {"ZREVRANGE", "HGETALL", "XREAD"} <= names
    assert any(keys.decision_key(POD_NAMESPACE, POD) in r for r in RECIPES)
    assert any(keys.rebalance_decision_key(POD_NAMESPACE, POD) in r for r in RECIPES)
    assert any(keys.node_key(NODE) in r for r in RECIPES)


# --- ACL users for an external Redis ------------------------------------------------


@pytest.mark.redis
def test_external_redis_acl_commands_match_the_bundled_users(
    redis_server: RedisServer, deployed_redis: DeployedRedis
) -> None:
    """Running the doc's ACL SETUSER lines gives the same users as users.acl.template."""
    setusers = [c for c in doc_commands() if "ACL SETUSER" in c]
    assert len(setusers) == 3
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
    for user in ("interference-credentials", "interference-scheduler", "interference-viewer"):
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


FAKE_KUBECTL = """#!{python}
# Records each call; keeps namespaces, Secrets and ConfigMaps as files in $STATE and refuses
# what the API server refuses: creating an object that exists, replacing a missing one.
import base64, json, os, subprocess, sys
import yaml
state = os.environ["STATE"]
args = sys.argv[1:]
open(os.path.join(state, "calls"), "a").write(" ".join(args) + "\\n")
namespace = "default"
if args[:1] == ["--namespace"]:
    namespace, args = args[1], args[2:]
def path(kind, name, ns):
    return os.path.join(state, f"{{kind}}.{{ns}}.{{name}}.yaml")
if args[:2] in (["get", "namespace"], ["create", "namespace"]):
    marker = os.path.join(state, f"namespace.{{args[2]}}")
    if args[0] == "create":
        open(marker, "w").close()
    sys.exit(0 if os.path.exists(marker) else 1)
if args[0] == "create" and "--dry-run=client" in args:
    sys.exit(subprocess.run([{real!r}, *sys.argv[1:]]).returncode)
if args[:2] in (["create", "-f"], ["replace", "-f"]):
    obj = yaml.safe_load(sys.stdin.read())
    target = path(obj["kind"].lower(), obj["metadata"]["name"], obj["metadata"]["namespace"])
    if os.path.exists(target) == (args[0] == "create"):
        print(f"{{args[0]}}: {{obj['metadata']['name']}} exists or is missing", file=sys.stderr)
        sys.exit(1)
    yaml.safe_dump(obj, open(target, "w"))
    sys.exit(0)
if args[0] == "get" and args[1] in ("secret", "configmap"):
    target = path(args[1], args[2], namespace)
    if not os.path.exists(target):
        print(f'(NotFound): {{args[1]}}s "{{args[2]}}" not found', file=sys.stderr)
        sys.exit(1)
    if "-o" in args:
        key = args[args.index("-o") + 1].removeprefix("jsonpath={{.data.").removesuffix("}}")
        data = yaml.safe_load(open(target)).get("data", {{}})
        print(data.get(key.replace("\\\\.", "."), ""), end="")
    sys.exit(0)
print(f"unexpected kubectl {{sys.argv[1:]}}", file=sys.stderr)
sys.exit(99)
"""


def run_generator(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The doc's install step (plus ``extra`` arguments) with a recording kubectl whose
    state is ``tmp_path/state``."""
    (generator,) = [c for c in doc_commands() if c.startswith("scripts/create-redis-secret.sh")]
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(FAKE_KUBECTL.format(python=sys.executable, real=shutil.which("kubectl")))
    kubectl.chmod(0o755)
    return subprocess.run(
        [*shlex.split(generator), *extra],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "KUBECTL": str(kubectl), "STATE": str(state)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def stored(tmp_path: Path, kind: str, name: str, namespace: str = "interference-system") -> Obj:
    """An object the generator created, as the fake API server keeps it."""
    loaded: Obj = yaml.safe_load(
        (tmp_path / "state" / f"{kind}.{namespace}.{name}.yaml").read_text()
    )
    return loaded


def decode(obj: Obj) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in obj["data"].items()}


ACL_USERS = {
    "admin": "admin",
    "issuer": "interference-credentials",
    "scheduler": "interference-scheduler",
    "viewer": "interference-viewer",
}


def test_secret_generator_creates_what_the_workloads_mount(tmp_path: Path) -> None:
    """The doc's install step creates both namespaces, one basic-auth Secret per Redis user
    (the stubs' type) with its user name, a random password and the CA, the TLS Secret
    whose certificate that CA signed, and the CA ConfigMap for the agents; a second run
    keeps everything. No password reaches its output or any command line."""

    def run(*extra: str) -> str:
        done = run_generator(tmp_path, *extra)
        assert done.returncode == 0, done.stderr
        return done.stdout

    out = run()
    assert "created namespace interference-system" in out
    assert "created namespace interference-agent" in out
    stubs = {
        o["metadata"]["name"]: o for o in render(kustomizations()["base"]) if o["kind"] == "Secret"
    }
    tls = stored(tmp_path, "secret", "redis-tls")
    assert tls["type"] == stubs["redis-tls"]["type"] == "kubernetes.io/tls"
    ca = decode(tls)["ca.crt"]
    passwords = {}
    for user in USERS:
        secret = stored(tmp_path, "secret", f"redis-{user}")
        assert secret["type"] == stubs[f"redis-{user}"]["type"] == "kubernetes.io/basic-auth"
        data = decode(secret)
        assert data["username"] == ACL_USERS[user] and data["ca.crt"] == ca
        passwords[user] = data["password"]
    assert all(re.fullmatch(r"[0-9a-f]{48}", v) for v in passwords.values())
    assert len(set(passwords.values())) == len(USERS)
    for namespace in ("interference-system", "interference-agent"):
        assert stored(tmp_path, "configmap", "redis-ca", namespace)["data"]["ca.crt"] == ca
    calls = (tmp_path / "state" / "calls").read_text()
    assert not any(v in out or v in calls for v in passwords.values())
    again = run()
    assert again.count("exists; kept") == 6  # redis-tls, four users, the issuer's certificate
    assert all(decode(stored(tmp_path, "secret", f"redis-{u}"))["password"] == passwords[u]
               for u in USERS)  # fmt: skip


def test_secret_generator_reuses_the_passwords_of_an_older_release(tmp_path: Path) -> None:
    """The one Secret redis-credentials of older releases: its passwords go to the new
    Secrets, so Redis and the components keep them across the upgrade."""
    state = tmp_path / "state"
    state.mkdir()
    before = {
        "username": "admin",
        "password": "a" * 48,
        "credentials-password": "b" * 48,
        "scheduler-password": "c" * 48,
        "viewer-password": "d" * 48,
    }
    yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "redis-credentials", "namespace": "interference-system"},
            "type": "kubernetes.io/basic-auth",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in before.items()},
        },
        (state / "secret.interference-system.redis-credentials.yaml").open("w"),
    )
    done = run_generator(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "reused the passwords of admin issuer scheduler viewer" in done.stdout
    assert "delete secret redis-credentials" in done.stdout
    got = {u: decode(stored(tmp_path, "secret", f"redis-{u}"))["password"] for u in USERS}
    assert got == {"admin": "a" * 48, "issuer": "b" * 48, "scheduler": "c" * 48,
                   "viewer": "d" * 48}  # fmt: skip


def test_secret_generator_points_rotate_to_the_rotation_script(tmp_path: Path) -> None:
    done = run_generator(tmp_path, "--rotate")
    assert done.returncode == 2
    assert "scripts/rotate-redis-password.sh USER" in done.stderr
    assert not (tmp_path / "state" / "calls").exists()


def test_no_render_holds_a_password() -> None:
    """`kubectl kustomize` of the base and every overlay contains no password: the Secrets
    are the data-less stubs (which the API server refuses to create, so an apply without
    the real ones fails), the ACL template has only hash placeholders, no env var holds a
    password."""
    for name, directory in kustomizations().items():
        objects = render(directory)
        for secret in (o for o in objects if o["kind"] == "Secret"):
            assert secret["metadata"]["name"].startswith(
                ("redis-", "interference-credentials-tls")
            ), name
            assert not {"data", "stringData"} & set(secret), name
        for _, template in pod_templates(objects):
            for c in template["spec"]["containers"]:
                for var in c.get("env", []):
                    if "PASSWORD" in var["name"] and not var["name"].endswith("_FILE"):
                        assert "value" not in var, (name, var)
                    assert var["name"] != "REDISCLI_AUTH", (name, var)
        for config in (o for o in objects if o["kind"] == "ConfigMap"):
            for key, text in config.get("data", {}).items():
                assert not re.search(r"requirepass|masterauth", text), (name, key)
                if key.endswith(".acl.template"):  # `>password` would be a plaintext one
                    assert not re.search(r"(^|\s)>", text), (name, key)
                    assert text.count("_SHA256@") == 4, (name, key)


def test_the_offline_explain_command_prints_a_decision_record() -> None:
    """The documented way to read a decision without a cluster, run as written."""
    (command,) = [c for c in doc_commands() if c.startswith("interference simulate ")]
    cli = Path(sys.executable).parent / "interference"
    done = subprocess.run(
        [str(cli), *shlex.split(command)[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    # Table cells wrap: read the text without the box drawing.
    out = " ".join(re.sub(r"[│┃━─┏┓┗┛┡┩└┘┳┻╇┼┬┴—]", " ", done.stdout).split())
    assert "policy interference-aware" in out and "policy least-allocated" in out
    assert "shop/web-3: scheduled on" in out
    assert "total = Σ weight × score" in out
    assert re.search(r"measured [\d.]+ µs > tolerance 10000 µs", out)


def test_documented_metrics_are_exported() -> None:
    """Every ``interference_scheduler_*`` series the doc names is in the scheduler's /metrics."""
    registry = CollectorRegistry()
    SchedulerMetrics(registry)
    SignalMetrics(registry)
    ExtenderMetrics(registry)  # extender mode
    TracingMetrics(registry)  # with tracing on
    RebalanceMetrics(registry)
    PreemptionMetrics(registry)
    exported = {
        family.name + suffix
        for family in registry.collect()
        for suffix in {"counter": ("_total",), "histogram": ("", "_bucket", "_count", "_sum")}.get(
            family.type, ("",)
        )
    }
    documented = set(re.findall(r"\binterference_scheduler_\w+", DOC.read_text()))
    assert len(documented) >= 5
    assert documented <= exported, sorted(documented - exported)


def test_documented_issuer_metrics_are_exported() -> None:
    """Every ``interference_credentials_*`` series the doc names is in the issuer's /metrics."""
    registry = CollectorRegistry()
    IssuerMetrics(registry)
    exported = {
        family.name + suffix
        for family in registry.collect()
        for suffix in {"counter": ("_total",), "histogram": ("", "_bucket", "_count", "_sum")}.get(
            family.type, ("",)
        )
    }
    documented = set(re.findall(r"\binterference_credentials_\w+", DOC.read_text()))
    assert len(documented) >= 2
    assert documented <= exported, sorted(documented - exported)


def test_documented_agent_metrics_are_exported() -> None:
    """Every ``interference_agent_*``, ``interference_node_*`` and ``interference_pod_*``
    series the doc names is on an agent's /metrics once it measured (its signal collector
    holds a report with a victim, an antagonist and a pod with every tolerance)."""
    from node_agent.degrade import DegradeMetrics
    from node_agent.health import AgentMetrics
    from node_agent.signal_metrics import SignalCollector
    from node_agent.tolerances import PodTolerance

    registry = CollectorRegistry()
    AgentMetrics(registry)
    DegradeMetrics(registry)  # with DEGRADE on
    victim = PodMetrics(
        "shop", "api", uid="u1", cpu_ms_per_s=200.0, neighbour_wait_ms_per_s=300.0,
        culprits=(("batch/hog", 300.0),),
    )  # fmt: skip
    hog = PodMetrics("batch", "hog", uid="u2", cpu_ms_per_s=1900.0)
    tolerance = PodTolerance(max_runq_p99_us=500, max_reclaim_stall_ms_per_s=2, max_index=40)
    collector = SignalCollector("n1", tolerance_of={"u1": tolerance}.get)
    registry.register(collector)
    collector.observe(
        NodeReport(
            node="n1",
            ts=1.0,
            interval_s=1.0,
            metrics=NodeMetrics(),
            histograms={"runq_us": [1]},
            pods=[victim, hog],
            measured=("net", "psi", "reclaim", "runq", "throttle"),
        ),
        ncpu=1,
    )
    exported = {
        family.name + suffix
        for family in registry.collect()
        for suffix in {"counter": ("_total",), "histogram": ("", "_bucket", "_count", "_sum")}.get(
            family.type, ("",)
        )
    }
    documented = set(re.findall(r"\binterference_(?:agent|node|pod)_\w+", DOC.read_text()))
    assert len(documented) >= 20
    assert documented <= exported, sorted(documented - exported)
