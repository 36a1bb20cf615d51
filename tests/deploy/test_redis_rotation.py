"""scripts/rotate-redis-password.sh on the deployed Redis (TLS only, its shipped
entrypoint, redis.conf and redis-cli wrapper) while a live client of the rotated user keeps
logging in again and again with its password file: not one call fails, and afterwards only
the new password works.

Redis, TLS, the ACL, the wrapper and the clients are real. kubectl is a small program here
(``KUBECTL``) that keeps each Secret in a file and runs ``kubectl exec`` locally, and a thread
plays the kubelet: a second after a Secret changes it swaps the mounted files, as the kubelet
updates a Secret volume (whole files, by rename)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from interference_infra.redis_client import RedisConnection, RedisTarget
from interference_infra.redis_tls import RedisTls
from tests.deploy.conftest import USERS, DeployedRedis, redis_manifests
from tests.deploy.manifests import REPO

pytestmark = pytest.mark.redis

SCRIPT = REPO / "scripts" / "rotate-redis-password.sh"
ACL_USER = {
    "admin": "admin",
    "issuer": "interference-credentials",
    "scheduler": "interference-scheduler",
    "viewer": "interference-viewer",
}
POD_FILE = {
    "redis": "/var/run/secrets/redis/passwords/admin",
    "interference-credentials": "/var/run/secrets/redis/password",
    "interference-scheduler": "/var/run/secrets/redis/password",
}
"""The file each component's pod reads its password from (the manifests' mounts)."""

KUBECTL = """#!{python}
import base64, json, os, subprocess, sys
state = {state!r}
args = sys.argv[1:]
if args[:1] == ["--namespace"]:
    args = args[2:]
def secret_file(name):
    return os.path.join(state, "secrets", name)
if args[:2] == ["exec", "deploy/redis"]:  # kubectl exec deploy/redis -c redis -- redis-cli ...
    cli = args[args.index("--") + 2:]
    sys.exit(subprocess.run(["sh", os.path.join(state, "redis-cli"), *cli],
                            env=json.load(open(os.path.join(state, "redis-env.json")))).returncode)
if args[:1] == ["exec"]:  # kubectl exec POD -c C -- sha256sum FILE
    pod, command = args[1], args[args.index("--") + 1:]
    mounts = json.load(open(os.path.join(state, "mounts.json")))
    sys.exit(subprocess.run([command[0], mounts[pod][command[1]]]).returncode)
if args[:2] == ["get", "secret"]:
    path = secret_file(args[2])
    if not os.path.exists(path):
        print(f'Error from server (NotFound): secrets "{{args[2]}}" not found', file=sys.stderr)
        sys.exit(1)
    if "-o" in args:
        assert args[args.index("-o") + 1] == "jsonpath={{.data.password}}", args
        print(base64.b64encode(open(path, "rb").read()).decode(), end="")
    sys.exit(0)
if args[:2] == ["patch", "secret"]:
    patch = json.load(open(args[args.index("--patch-file") + 1]))
    staged = secret_file(args[2]) + ".new"
    open(staged, "wb").write(base64.b64decode(patch["data"]["password"]))
    os.replace(staged, secret_file(args[2]))
    sys.exit(0)
if args[:2] == ["get", "pods"]:
    label = args[args.index("-l") + 1].split("=", 1)[1]
    print(f"{{label}}-0")
    sys.exit(0)
print(f"kubectl stand-in: unexpected {{args}}", file=sys.stderr)
sys.exit(2)
"""


@dataclass
class Cluster:
    """The Secrets (one file each), the pods' mounted files, and the kubelet that copies
    one to the other a second after a change."""

    server: DeployedRedis
    state: Path
    mounts: dict[str, Path] = field(default_factory=dict)
    """Component → its mounted password file (Redis' are in the server's password dir)."""
    kubectl: Path = Path()
    stop: threading.Event = field(default_factory=threading.Event)
    kubelet: threading.Thread | None = None

    def secret(self, user: str) -> str:
        return (self.state / "secrets" / f"redis-{user}").read_text()

    def mounted_files(self, user: str) -> list[Path]:
        files = [self.server.password_dir / user]
        component = {"issuer": "interference-credentials", "scheduler": "interference-scheduler"}
        if user in component:
            files.append(self.mounts[component[user]])
        return files

    def sync(self) -> None:
        """The kubelet: each changed Secret reaches its mounted files one second later."""
        changed: dict[str, float] = {}
        while not self.stop.wait(0.2):
            for user in USERS:
                value = self.secret(user)
                stale = [f for f in self.mounted_files(user) if f.read_text() != value]
                if not stale:
                    changed.pop(user, None)
                    continue
                first_seen = changed.setdefault(user, time.monotonic())
                if time.monotonic() - first_seen < 1.0:
                    continue
                for path in stale:
                    staged = path.with_name(f".{path.name}.new")
                    staged.write_text(value)
                    staged.replace(path)

    def rotate(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", str(SCRIPT), *args],
            env={"PATH": os.environ["PATH"], "KUBECTL": str(self.kubectl), "WAIT_S": "60"},
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    if shutil.which("redis-cli") is None:
        pytest.fail("redis-cli is not installed; run `make setup`")
    server = DeployedRedis(workdir=tmp_path / "redis", plaintext=False)
    server.workdir.mkdir()
    server.start()
    state = tmp_path / "cluster"
    (state / "secrets").mkdir(parents=True)
    for user in USERS:
        (state / "secrets" / f"redis-{user}").write_text(server.secret[user])
    cluster = Cluster(server, state)
    for component, user in (("interference-credentials", "issuer"),
                            ("interference-scheduler", "scheduler")):  # fmt: skip
        path = state / "mounts" / component / "password"
        path.parent.mkdir(parents=True)
        path.write_text(server.secret[user])
        cluster.mounts[component] = path
    pods = {
        f"{component}-0": {POD_FILE[component]: str(path)}
        for component, path in cluster.mounts.items()
    }
    pods["redis-0"] = {POD_FILE["redis"]: str(server.password_dir / "admin")}
    (state / "mounts.json").write_text(json.dumps(pods))
    config, _ = redis_manifests()
    (state / "redis-cli").write_text(config["redis-cli"])
    real = shutil.which("redis-cli")
    (state / "redis-env.json").write_text(
        json.dumps({**server.env(), "PATH": "/usr/bin:/bin", "REDIS_CLI_BINARY": str(real)})
    )
    cluster.kubectl = state / "kubectl"
    cluster.kubectl.write_text(KUBECTL.format(python=sys.executable, state=str(state)))
    cluster.kubectl.chmod(0o755)
    cluster.kubelet = threading.Thread(target=cluster.sync, daemon=True)
    cluster.kubelet.start()
    try:
        yield cluster
    finally:
        cluster.stop.set()
        cluster.kubelet.join(timeout=5)
        server.stop()


@dataclass
class LiveClient:
    """A client of one user that logs in again before every call (its pool is dropped),
    reading its password file each time, as the scheduler does after any reconnect; and a
    connection logged in once, kept open throughout."""

    connection: RedisConnection
    kept: redis.Redis[bytes]
    admin: bool = False
    """The admin may run anything; the scheduler's user only its own commands (MGET)."""
    calls: int = 0
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def call(self, client: object) -> None:
        assert isinstance(client, redis.Redis)
        if self.admin:
            client.execute_command("ACL", "WHOAMI")
        else:
            client.mget(["intf:node:x:sched:{x}"])

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.connection.reset()
                self.call(self.connection.client())
                self.calls += 1
            except redis.RedisError as exc:
                self.failures.append(repr(exc))
            time.sleep(0.02)


def live_client(cluster: Cluster, user: str, password_file: Path) -> LiveClient:
    server = cluster.server
    target = RedisTarget(
        server.tls_url,
        tls=RedisTls(ca_file=str(server.ca_file)),
        username=ACL_USER[user],
        password_file=str(password_file),
    )
    kept = redis.Redis(
        port=server.tls_port,
        username=ACL_USER[user],
        password=password_file.read_text(),
        ssl=True,
        ssl_ca_certs=str(server.ca_file),
        single_connection_client=True,
    )
    client = LiveClient(RedisConnection(target, 5.0), kept, admin=user == "admin")
    client.call(kept)
    return client


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def login(server: DeployedRedis, user: str, password: str) -> bool:
    client = redis.Redis(
        port=server.tls_port,
        username=ACL_USER[user],
        password=password,
        ssl=True,
        ssl_ca_certs=str(server.ca_file),
    )
    try:
        client.execute_command("AUTH", ACL_USER[user], password)
        return True
    except redis.AuthenticationError:
        return False
    finally:
        client.close()


@pytest.mark.parametrize(
    ("user", "file_of"),
    [("scheduler", "interference-scheduler"), ("admin", "redis")],
)
def test_rotation_with_a_live_client_that_never_fails(
    cluster: Cluster, user: str, file_of: str
) -> None:
    server = cluster.server
    old = server.secret[user]
    password_file = cluster.mounts.get(file_of, server.password_dir / "admin")
    client = live_client(cluster, user, password_file)
    worker = threading.Thread(target=client.run)
    worker.start()
    try:
        time.sleep(0.5)
        before = client.calls
        done = cluster.rotate(user)
        during = client.calls - before
        time.sleep(1.0)  # and it keeps working with the new password alone
    finally:
        client.stop.set()
        worker.join(timeout=10)
    assert done.returncode == 0, done.stdout + done.stderr
    assert client.failures == [], client.failures[:3]
    assert before > 0 and during >= 20, (before, during)
    new = cluster.secret(user)
    assert new != old and len(new) == 48
    assert password_file.read_text() == new  # the component's file was swapped meanwhile
    assert login(server, user, new) and not login(server, user, old)
    admin = server.admin() if user != "admin" else None
    if admin is not None:
        assert admin.acl_getuser(ACL_USER[user])["passwords"] == [sha256(new)]
    client.call(client.kept)  # logged in with the old password, still served
    assert "new password added" in done.stdout
    assert f"every pod of deploy/{file_of} reads the new password" in done.stdout
    assert "only the password in secret" in done.stdout
    assert old not in done.stdout + done.stderr and new not in done.stdout + done.stderr
    # A restart of Redis now starts from the Secret's (mounted) passwords: the new one.
    acl = server.password_dir / user
    assert acl.read_text() == new


def test_keep_old_then_finish_for_the_cli_users(cluster: Cluster) -> None:
    """The viewer has no pods: the Secret changes, both passwords work until --finish."""
    server = cluster.server
    old = server.secret["viewer"]
    kept = cluster.rotate("viewer", "--keep-old")
    assert kept.returncode == 0, kept.stderr
    new = cluster.secret("viewer")
    assert new != old
    assert login(server, "viewer", old) and login(server, "viewer", new)
    assert "rotate-redis-password.sh viewer --finish" in kept.stdout
    finished = cluster.rotate("viewer", "--finish")
    assert finished.returncode == 0, finished.stderr
    assert login(server, "viewer", new) and not login(server, "viewer", old)


def test_finish_refuses_when_redis_does_not_know_the_secrets_password(cluster: Cluster) -> None:
    """A Secret changed by hand (or a Redis that restarted before the Secret changed): the
    script removes nothing, so the running components keep their working password."""
    secret = cluster.state / "secrets" / "redis-viewer"
    secret.write_text("f" * 48)
    done = cluster.rotate("viewer", "--finish")
    assert done.returncode == 1
    assert "Redis does not accept the password in redis-viewer" in done.stderr
    assert login(cluster.server, "viewer", cluster.server.secret["viewer"])


def test_unknown_user_is_a_usage_error(cluster: Cluster) -> None:
    done = cluster.rotate("agent")
    assert done.returncode == 2 and "unknown argument agent" in done.stderr
