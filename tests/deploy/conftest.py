"""A redis-server started exactly as the deployed Redis container starts: the rendered
ConfigMap's entrypoint.sh, redis.conf and ACL template, with the env the Deployment gives
it (passwords per Secret key), on a random loopback port."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from tests.conftest import free_port
from tests.deploy.manifests import DEPLOY, REPO, container, find, pod_templates, render


def redis_manifests() -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The rendered redis-config ConfigMap data and the Redis container's env."""
    objects = render(DEPLOY)
    config = find(objects, "ConfigMap", "redis-config")["data"]
    env = container(find(objects, "Deployment", "redis"), "redis")["env"]
    return config, env


SECRET_SCRIPT = REPO / "scripts" / "create-redis-secret.sh"


def generated_secret(**environ: str) -> dict[str, str]:
    """The redis-credentials Secret as scripts/create-redis-secret.sh makes it (``--print``,
    no cluster), decoded; ``environ`` is added to the script's environment."""
    done = subprocess.run(
        ["sh", str(SECRET_SCRIPT), "--print"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], **environ},
        check=True,
    )
    secret = yaml.safe_load(done.stdout)
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == "redis-credentials"
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def referenced_secret_keys() -> set[str]:
    """Keys of redis-credentials that the base's workloads read."""
    return {
        var["valueFrom"]["secretKeyRef"]["key"]
        for _, template in pod_templates(render(DEPLOY))
        for c in template["spec"]["containers"]
        for var in c.get("env", [])
        if "secretKeyRef" in var.get("valueFrom", {})
    }


POD_FIELDS = {
    "spec.nodeName": "gpu-node-1",
    "metadata.name": "interference-scheduler-6d4b9c7f5-k2x8p",
    "metadata.namespace": "interference-system",
    "status.podIP": "10.0.3.17",
    "status.hostIP": "10.0.3.17",
}
"""Downward-API values a pod would get, for resolving ``fieldRef`` env vars."""


def container_env(env: list[dict[str, Any]], secret: dict[str, str]) -> dict[str, str]:
    """A container's environment with ``secretKeyRef`` resolved from ``secret`` and
    ``fieldRef`` from :data:`POD_FIELDS`."""
    resolved = {}
    for var in env:
        name = str(var["name"])
        if "value" in var:
            resolved[name] = str(var["value"])
        elif "secretKeyRef" in var["valueFrom"]:
            resolved[name] = secret[var["valueFrom"]["secretKeyRef"]["key"]]
        else:
            resolved[name] = POD_FIELDS[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return resolved


@dataclass
class DeployedRedis:
    """The Redis of deploy/base, run locally by its own entrypoint script."""

    workdir: Path
    secret: dict[str, str] = field(default_factory=dict)
    """Secret key → password, as the redis-credentials Secret would hold them."""
    extra_args: tuple[str, ...] = ()
    """redis-server arguments after the shipped ones (they override redis.conf)."""
    port: int = 0
    proc: subprocess.Popen[str] | None = None
    stderr: str = ""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def env(self) -> dict[str, str]:
        """The Redis container's environment (REDISCLI_AUTH included)."""
        _, env = redis_manifests()
        return container_env(env, self.secret)

    def start(self) -> None:
        if shutil.which("redis-server") is None or shutil.which("sha256sum") is None:
            pytest.fail("redis-server and sha256sum are needed; run `make setup`")
        config, _ = redis_manifests()
        for name, text in config.items():
            (self.workdir / name).write_text(text)
        self.port = free_port()
        env = {
            "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
            "ACL_TEMPLATE": str(self.workdir / "users.acl.template"),
            "ACL_FILE": str(self.workdir / "users.acl"),
            "REDIS_CONF": str(self.workdir / "redis.conf"),
            **self.env(),
        }
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir)]
        args += self.extra_args
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
        password ``REDISCLI_AUTH``)."""
        return redis.Redis(
            port=self.port,
            username="admin",
            password=self.env()["REDISCLI_AUTH"],
            decode_responses=True,
        )

    def credentials(self, kind: str, name: str, container_name: str) -> tuple[str, str]:
        """(REDIS_USERNAME, REDIS_PASSWORD) a deployed workload container logs in with."""
        workload = find(render(DEPLOY), kind, name)
        env = container_env(container(workload, container_name)["env"], self.secret)
        return env["REDIS_USERNAME"], env["REDIS_PASSWORD"]


@pytest.fixture
def deployed_redis(tmp_path: Path) -> Iterator[DeployedRedis]:
    """The deployed Redis with the passwords the documented generator makes."""
    server = DeployedRedis(workdir=tmp_path, secret=generated_secret())
    server.start()
    try:
        yield server
    finally:
        server.stop()
