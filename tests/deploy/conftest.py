"""A redis-server started exactly as the deployed Redis container starts: the rendered
ConfigMap's entrypoint.sh, redis.conf and ACL template, with the files the Deployment
mounts (a password file per user's Secret, the Secret redis-tls) as
scripts/create-redis-secret.sh makes them, on random loopback ports."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from tests.conftest import free_port
from tests.deploy.manifests import DEPLOY, REPO, container, find, render


def redis_manifests() -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The rendered redis-config ConfigMap data and the Redis container's env."""
    objects = render(DEPLOY)
    config = find(objects, "ConfigMap", "redis-config")["data"]
    env = container(find(objects, "Deployment", "redis"), "redis").get("env", [])
    return config, env


SECRET_SCRIPT = REPO / "scripts" / "create-redis-secret.sh"
USERS = ("admin", "issuer", "scheduler", "viewer")
"""The Redis users with a Secret each (``redis-<user>``)."""


def generated_objects(**environ: str) -> list[dict[str, Any]]:
    """What scripts/create-redis-secret.sh makes (``--print``, no cluster)."""
    done = subprocess.run(
        ["sh", str(SECRET_SCRIPT), "--print"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], **environ},
        check=True,
    )
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


def decoded(obj: dict[str, Any]) -> dict[str, str]:
    """A Secret's data, decoded."""
    return {k: base64.b64decode(v).decode() for k, v in obj["data"].items()}


def generated_secrets(**environ: str) -> dict[str, dict[str, str]]:
    """Every Secret scripts/create-redis-secret.sh makes, by name, decoded."""
    return {
        obj["metadata"]["name"]: decoded(obj)
        for obj in generated_objects(**environ)
        if obj["kind"] == "Secret"
    }


POD_FIELDS = {
    "spec.nodeName": "gpu-node-1",
    "metadata.name": "interference-scheduler-6d4b9c7f5-k2x8p",
    "metadata.namespace": "interference-system",
    "status.podIP": "10.0.3.17",
    "status.hostIP": "10.0.3.17",
}
"""Downward-API values a pod would get, for resolving ``fieldRef`` env vars."""


MOUNTED_REDIS_FILES = "/var/run/secrets/redis/"
"""Where the pods mount their Redis Secret or CA (the programs check the files exist)."""
_MOUNT_ROOT = Path(tempfile.mkdtemp(prefix="deploy-mounts-"))


def pytest_sessionfinish() -> None:
    shutil.rmtree(_MOUNT_ROOT, ignore_errors=True)


def mounted_here(path: str) -> str:
    """A readable local file standing for the pod's mounted file ``path`` (a placeholder
    text: tests that log in replace these paths with real ones)."""
    local = _MOUNT_ROOT / path.removeprefix("/")
    local.parent.mkdir(parents=True, exist_ok=True)
    if not local.exists():
        local.write_text("mounted in the pod\n")
    return str(local)


def container_env(env: list[dict[str, Any]], secret: dict[str, str]) -> dict[str, str]:
    """A container's environment with ``secretKeyRef`` resolved from ``secret``,
    ``fieldRef`` from :data:`POD_FIELDS`, and paths of mounted Redis files
    (:data:`MOUNTED_REDIS_FILES`) pointing at local files (:func:`mounted_here`)."""
    resolved = {}
    for var in env:
        name = str(var["name"])
        if "value" in var and str(var["value"]).startswith(MOUNTED_REDIS_FILES):
            resolved[name] = mounted_here(str(var["value"]))
        elif "value" in var:
            resolved[name] = str(var["value"])
        elif "secretKeyRef" in var["valueFrom"]:
            resolved[name] = secret[var["valueFrom"]["secretKeyRef"]["key"]]
        else:
            resolved[name] = POD_FIELDS[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return resolved


def mounted_secret(workload: dict[str, Any], container_name: str, path: str) -> tuple[str, str]:
    """(Secret name, key) of the file ``path`` as ``container_name`` of ``workload`` mounts
    it (a ``secret`` volume, or a ``projected`` one of Secrets)."""
    spec = workload["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in container(workload, container_name).get("volumeMounts", []):
        directory = mount["mountPath"].rstrip("/") + "/"
        if not path.startswith(directory):
            continue
        relative = path[len(directory) :]
        volume = volumes[mount["name"]]
        sources = (
            [{"secret": {**volume["secret"], "name": volume["secret"]["secretName"]}}]
            if "secret" in volume
            else volume.get("projected", {}).get("sources", [])
        )
        for source in sources:
            secret = source.get("secret")
            if secret is None:
                continue
            for item in secret.get("items", []):
                if item["path"] == relative:
                    return str(secret["name"]), str(item["key"])
    raise AssertionError(f"{workload['metadata']['name']}/{container_name} mounts no {path}")


@dataclass
class DeployedRedis:
    """The Redis of deploy/base, run locally by its own entrypoint script and redis.conf,
    which serve TLS only, with the mounted files the Deployment gives it (a password file
    per user, redis-tls). Tests of ACL users also open a plaintext port (``url``) so their
    clients need no CA; ``tls_url`` is the shipped TLS port."""

    workdir: Path
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    """Secret name → decoded data, as scripts/create-redis-secret.sh makes them."""
    extra_args: tuple[str, ...] = ()
    """redis-server arguments after the shipped ones (they override redis.conf)."""
    plaintext: bool = True
    """Open a plaintext port besides the TLS one (the shipped config has none)."""
    port: int = 0
    tls_port: int = 0
    proc: subprocess.Popen[str] | None = None
    stderr: str = ""

    @property
    def secret(self) -> dict[str, str]:
        """User → password (each from its Secret redis-<user>)."""
        return {user: self.secrets[f"redis-{user}"]["password"] for user in USERS}

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def tls_url(self) -> str:
        return f"rediss://127.0.0.1:{self.tls_port}/0"

    @property
    def password_dir(self) -> Path:
        """The Deployment's projected volume of passwords, one file per user."""
        return self.workdir / "passwords"

    @property
    def tls_dir(self) -> Path:
        """The Secret redis-tls as mounted (tls.crt, tls.key, ca.crt)."""
        return self.workdir / "tls"

    @property
    def ca_file(self) -> Path:
        return self.tls_dir / "ca.crt"

    def write_password(self, user: str, password: str) -> None:
        """Replace a mounted password file the way the kubelet updates a Secret volume:
        the new file appears whole (a rename), never half-written."""
        path = self.password_dir / user
        staged = path.with_name(f".{user}.new")
        staged.write_text(password)
        staged.replace(path)

    def env(self) -> dict[str, str]:
        """What the Redis container's entrypoint and redis-cli wrapper read: its env and
        the paths of its mounted files here."""
        _, env = redis_manifests()
        return {
            **container_env(env, {}),
            "PASSWORD_DIR": str(self.password_dir),
            "REDIS_ADMIN_PASSWORD_FILE": str(self.password_dir / "admin"),
            "REDIS_TLS_CA_FILE": str(self.ca_file),
            "REDIS_CLI_PORT": str(self.tls_port),
        }

    def start(self) -> None:
        if shutil.which("redis-server") is None or shutil.which("sha256sum") is None:
            pytest.fail("redis-server and sha256sum are needed; run `make setup`")
        if not self.secrets:
            self.secrets = generated_secrets()
        config, _ = redis_manifests()
        for name, text in config.items():
            (self.workdir / name).write_text(text)
        self.password_dir.mkdir(exist_ok=True)
        for user, password in self.secret.items():
            self.write_password(user, password)
        self.tls_dir.mkdir(exist_ok=True)
        for name, text in self.secrets["redis-tls"].items():
            (self.tls_dir / name).write_text(text)
        self.tls_port = free_port()
        args = ["--tls-port", str(self.tls_port), "--bind", "127.0.0.1"]
        # The shipped paths (/var/run/secrets/redis/tls/...) as mounted here.
        for option in ("tls-cert-file", "tls-key-file", "tls-ca-cert-file"):
            name = {"tls-cert-file": "tls.crt", "tls-key-file": "tls.key"}.get(option, "ca.crt")
            args += [f"--{option}", str(self.tls_dir / name)]
        if self.plaintext:
            self.port = free_port()
            args += ["--port", str(self.port)]
        args += ["--dir", str(self.workdir), *self.extra_args]
        env = {
            "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
            "ACL_TEMPLATE": str(self.workdir / "users.acl.template"),
            "ACL_FILE": str(self.workdir / "users.acl"),
            "REDIS_CONF": str(self.workdir / "redis.conf"),
            **self.env(),
        }
        self.proc = subprocess.Popen(
            ["sh", str(self.workdir / "entrypoint.sh"), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stderr = self.proc.stderr.read() if self.proc.stderr else ""
                pytest.fail(f"the Redis entrypoint exited {self.proc.returncode}: {self.stderr}")
            try:
                self.admin().ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        pytest.fail("the deployed Redis did not start within 15 s")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                _, self.stderr = self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                _, self.stderr = self.proc.communicate()
            self.proc = None

    def admin(self) -> redis.Redis[str]:
        """A client logged in as the container's redis-cli wrapper does (user ``admin``,
        password from its mounted file), over TLS."""
        return redis.Redis(
            port=self.tls_port,
            username="admin",
            password=self.secret["admin"],
            decode_responses=True,
            ssl=True,
            ssl_ca_certs=str(self.ca_file),
        )

    def credentials(self, kind: str, name: str, container_name: str) -> tuple[str, str]:
        """(REDIS_USERNAME, password) a deployed workload container logs in with: the
        password is the file REDIS_PASSWORD_FILE names, from the Secret mounted there."""
        workload = find(render(DEPLOY), kind, name)
        env = {v["name"]: v.get("value") for v in container(workload, container_name)["env"]}
        secret, key = mounted_secret(workload, container_name, env["REDIS_PASSWORD_FILE"])
        return env["REDIS_USERNAME"], self.secrets[secret][key]


@pytest.fixture
def deployed_redis(tmp_path: Path) -> Iterator[DeployedRedis]:
    """The deployed Redis with the passwords the documented generator makes."""
    server = DeployedRedis(workdir=tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
