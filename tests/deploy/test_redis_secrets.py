"""One Secret per Redis user, mounted as files only by its own component, and TLS between
every component and the bundled Redis: checked on the rendered manifests of the base and of
every overlay, and on the deployed Redis config run locally (TLS only, the shipped files)."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from interference_cli.store import Store
from interference_infra.redis_tls import RedisTls
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.redis_signals import RedisSignalCache
from scheduler.adapters.signal_metrics import SignalMetrics
from tests.deploy.conftest import (
    USERS,
    DeployedRedis,
    generated_objects,
    mounted_secret,
)
from tests.deploy.manifests import (
    DEPLOY,
    Obj,
    container,
    find,
    kustomizations,
    pod_templates,
    render,
)

USER_SECRETS = {f"redis-{user}" for user in USERS}
MOUNTED_BY = {
    "redis-admin": {"redis"},
    "redis-issuer": {"redis", "interference-credentials"},
    "redis-scheduler": {"redis", "interference-scheduler"},
    "redis-viewer": {"redis"},
    "redis-tls": {"redis"},
}
"""Which workloads mount each Secret: Redis checks every password, so it mounts them all;
each other component only its own user's; the viewer's is for CLI users, in no pod."""


def secret_mounts(template: Obj) -> Iterator[tuple[str, list[str] | None]]:
    """(Secret name, keys mounted or None for all) of every Secret volume of a pod."""
    for volume in template["spec"].get("volumes", []):
        if "secret" in volume:
            items = volume["secret"].get("items")
            yield volume["secret"]["secretName"], [i["key"] for i in items] if items else None
        for source in volume.get("projected", {}).get("sources", []):
            if "secret" in source:
                items = source["secret"].get("items")
                yield source["secret"]["name"], [i["key"] for i in items] if items else None


def secret_users(objects: tuple[Obj, ...]) -> dict[str, set[str]]:
    users: dict[str, set[str]] = defaultdict(set)
    for owner, template in pod_templates(objects):
        for name, _ in secret_mounts(template):
            users[name].add(owner["metadata"]["name"])
    return users


@pytest.mark.parametrize("name", ["base", "local-images", "dry-run", "legacy-kernel"])
def test_each_secret_is_mounted_only_by_its_component(name: str) -> None:
    objects = render(kustomizations()[name])
    assert {k: v for k, v in secret_users(objects).items() if k in MOUNTED_BY} == MOUNTED_BY


def test_redis_mounts_only_the_password_of_each_user() -> None:
    redis_template = find(render(DEPLOY), "Deployment", "redis")["spec"]["template"]
    mounts = dict(secret_mounts(redis_template))
    assert {k: mounts[k] for k in USER_SECRETS} == {k: ["password"] for k in USER_SECRETS}
    assert mounts["redis-tls"] is None  # the certificate, its key and the CA


@pytest.mark.parametrize("name", sorted(kustomizations()))
def test_no_secret_reaches_a_pod_through_its_environment(name: str) -> None:
    """Files only: an environment is shown by `kubectl describe`, inherited by every child
    process and read by anyone who can exec `env`; and a changed Secret never reaches it."""
    for owner, template in pod_templates(render(kustomizations()[name])):
        spec = template["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert not [e for e in c.get("envFrom", []) if "secretRef" in e], owner
            assert not [
                v["name"] for v in c.get("env", []) if "secretKeyRef" in v.get("valueFrom", {})
            ], (name, owner["metadata"]["name"])


def test_the_stubs_carry_no_data_and_no_volume_is_optional() -> None:
    objects = render(DEPLOY)
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    assert set(secrets) == USER_SECRETS | {"redis-tls", "interference-credentials-tls"}
    assert all("data" not in s and "stringData" not in s for s in secrets.values())
    for _, template in pod_templates(objects):
        for volume in template["spec"].get("volumes", []):
            sources = [volume, *volume.get("projected", {}).get("sources", [])]
            for source in sources:
                for kind in ("secret", "configMap"):
                    assert not source.get(kind, {}).get("optional"), volume


def test_the_script_makes_every_secret_the_manifests_mount() -> None:
    """What scripts/create-redis-secret.sh makes holds every key the pods mount, with the
    stubs' types (a Secret's type is immutable), and each user's Secret names its user."""
    made = {(o["kind"], o["metadata"]["name"]): o for o in generated_objects()}
    stubs = {o["metadata"]["name"]: o for o in render(DEPLOY) if o["kind"] == "Secret"}
    for name, stub in stubs.items():
        assert made["Secret", name]["type"] == stub["type"]
    for _, template in pod_templates(render(DEPLOY)):
        for name, keys in secret_mounts(template):
            assert set(keys or []) <= set(made["Secret", name]["data"]), name
    assert ("ConfigMap", "redis-ca") in made


def pod_redis_env(workload: Obj, container_name: str) -> dict[str, str]:
    """The container's env values as written (mounted paths as the pod sees them)."""
    return {v["name"]: str(v["value"]) for v in container(workload, container_name)["env"]
            if "value" in v}  # fmt: skip


def mounted_from(workload: Obj, container_name: str, path: str) -> str:
    """What the file ``path`` is in the pod: ``Secret/NAME:KEY`` or ``ConfigMap/NAME:KEY``."""
    template = workload["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in template.get("volumes", [])}
    for mount in container(workload, container_name).get("volumeMounts", []):
        directory = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(directory) and "configMap" in volumes[mount["name"]]:
            config_map = volumes[mount["name"]]["configMap"]
            key = path[len(directory) :]
            items = {i["path"]: i["key"] for i in config_map.get("items", [])}
            return f"ConfigMap/{config_map['name']}:{items.get(key, key)}"
    secret, key = mounted_secret(workload, container_name, path)
    return f"Secret/{secret}:{key}"


@pytest.mark.parametrize(
    ("kind", "name", "container_name", "ca_from"),
    [
        ("DaemonSet", "interference-agent", "agent", "ConfigMap/redis-ca:ca.crt"),
        ("Deployment", "interference-credentials", "issuer", "Secret/redis-issuer:ca.crt"),
        ("Deployment", "interference-scheduler", "scheduler", "Secret/redis-scheduler:ca.crt"),
    ],
)
def test_every_component_speaks_tls_to_redis_verified_by_the_install_ca(
    kind: str, name: str, container_name: str, ca_from: str
) -> None:
    workload = find(render(DEPLOY), kind, name)
    env = pod_redis_env(workload, container_name)
    if name == "interference-scheduler":  # its URL is in its config file
        config = find(render(DEPLOY), "ConfigMap", "interference-scheduler-config")
        assert "url: rediss://redis:6379/0" in config["data"]["scheduler.yaml"]
        assert "REDIS_URL" not in env
    else:
        assert env["REDIS_URL"].startswith("rediss://redis")
    assert mounted_from(workload, container_name, env["REDIS_CA_FILE"]) == ca_from
    if "REDIS_PASSWORD_FILE" in env:
        secret = ca_from.split(":")[0]
        assert mounted_from(workload, container_name, env["REDIS_PASSWORD_FILE"]) == (
            f"{secret}:password"
        )


def test_local_images_reach_redis_by_address_over_tls() -> None:
    """Without cluster DNS the programs in Redis' namespace get its ClusterIP from their
    environment (the agents' address is set at install: docs/operations.md, step 3)."""
    objects = render(kustomizations()["local-images"])
    for kind, name, container_name in (
        ("Deployment", "interference-credentials", "issuer"),
        ("Deployment", "interference-scheduler", "scheduler"),
    ):
        env = pod_redis_env(find(objects, kind, name), container_name)
        assert env["REDIS_URL"].startswith("rediss://$(REDIS_SERVICE_HOST)"), name
        assert env["REDIS_URL"].endswith("?ssl_check_hostname=false"), name


@pytest.fixture
def tls_only_redis(tmp_path: Path) -> Iterator[DeployedRedis]:
    """The deployed Redis with exactly its shipped ports: TLS only."""
    server = DeployedRedis(workdir=tmp_path, plaintext=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.redis
def test_the_shipped_redis_serves_tls_only(tls_only_redis: DeployedRedis) -> None:
    admin = tls_only_redis.admin()
    assert admin.config_get("port") == {"port": "0"}
    assert admin.config_get("tls-auth-clients") == {"tls-auth-clients": "no"}
    # Plain Redis on the TLS port gets no answer a plaintext client could use.
    with socket.create_connection(("127.0.0.1", tls_only_redis.tls_port), timeout=5) as sock:
        sock.settimeout(2)
        sock.sendall(b"PING\r\n")
        try:
            answer = sock.recv(64)
        except OSError:  # a timeout, or the server closing the connection
            answer = b""
    assert not answer.startswith((b"+", b"-")), answer
    # A client that does not know the install's CA refuses the certificate.
    refused = redis.Redis(port=tls_only_redis.tls_port, ssl=True, socket_timeout=5)
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        refused.ping()


@pytest.mark.redis
def test_the_certificate_names_the_service_and_port_forward(tls_only_redis: DeployedRedis) -> None:
    """With hostname checks on (redis-py's default), the certificate is good for 127.0.0.1
    and localhost (kubectl port-forward); its SANs name the Service (openssl)."""
    for host in ("127.0.0.1", "localhost"):
        client = redis.Redis(
            host=host,
            port=tls_only_redis.tls_port,
            username="interference-viewer",
            password=tls_only_redis.secret["viewer"],
            ssl=True,
            ssl_ca_certs=str(tls_only_redis.ca_file),
        )
        assert client.time()  # the viewer may read the clock, not PING
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed")
    text = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName"],
        input=tls_only_redis.secrets["redis-tls"]["tls.crt"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in ("redis", "redis.interference-system.svc", "localhost"):
        assert f"DNS:{name}," in text or text.rstrip().endswith(f"DNS:{name}")
    context = ssl.create_default_context(cafile=str(tls_only_redis.ca_file))
    address = ("127.0.0.1", tls_only_redis.tls_port)
    with (
        socket.create_connection(address, timeout=5) as sock,
        context.wrap_socket(sock, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


@pytest.mark.redis
def test_the_scheduler_and_the_cli_log_in_over_tls_with_their_mounted_files(
    tls_only_redis: DeployedRedis, tmp_path: Path
) -> None:
    """The scheduler's signal cache with its Deployment's env (the files as mounted here),
    and the CLI as the viewer with the viewer Secret's password file and CA."""
    server = tls_only_redis
    mounted = tmp_path / "scheduler"
    mounted.mkdir()
    (mounted / "password").write_text(server.secret["scheduler"])
    (mounted / "ca.crt").write_text(server.secrets["redis-scheduler"]["ca.crt"])
    workload = find(render(DEPLOY), "Deployment", "interference-scheduler")
    env = pod_redis_env(workload, "scheduler")
    env = {
        k: v.replace("/var/run/secrets/redis", str(mounted)) for k, v in env.items()
    }  # where this test mounted them
    settings = RedisSettings(url=server.tls_url, ca_file=env["REDIS_CA_FILE"])
    connection = connect(settings, env)
    try:
        cache = RedisSignalCache(
            connection, settings, SignalMetrics(CollectorRegistry()), known_nodes=lambda: []
        )
        assert cache.write_ranking()
    finally:
        connection.close()
    viewer_dir = tmp_path / "viewer"
    viewer_dir.mkdir()
    (viewer_dir / "password").write_text(server.secrets["redis-viewer"]["password"])
    (viewer_dir / "ca.crt").write_text(server.secrets["redis-viewer"]["ca.crt"])
    store = Store(
        server.tls_url,
        username=server.secrets["redis-viewer"]["username"],
        password_file=str(viewer_dir / "password"),
        tls=RedisTls(ca_file=str(viewer_dir / "ca.crt")),
    )
    admin = server.admin()
    admin.zadd("intf:nodes", {"tls-node": 12.0})
    admin.zadd("intf:nodes:updated", {"tls-node": time.time()})
    assert [row.node for row in store.node_rows()] == ["tls-node"]
    assert server.admin().acl_log() == []


@pytest.mark.redis
def test_the_probes_work_beside_the_kubelets_service_variables(
    tls_only_redis: DeployedRedis, tmp_path: Path
) -> None:
    """The kubelet gives every container docker-link variables for each Service of its
    namespace, REDIS_PORT=tcp://… among them for the Service redis: the probes' redis-cli
    wrapper must not take any of them for its own settings."""
    redis_pod = find(render(DEPLOY), "Deployment", "redis")
    probes = container(redis_pod, "redis")
    commands = [probes[p]["exec"]["command"] for p in ("readinessProbe", "livenessProbe")]
    assert commands == [["redis-cli", "ping"]] * 2
    config = find(render(DEPLOY), "ConfigMap", "redis-config")["data"]
    wrapper = tmp_path / "redis-cli"
    wrapper.write_text(config["redis-cli"])
    wrapper.chmod(0o755)
    service_links = {
        "REDIS_PORT": "tcp://10.96.0.10:6379",
        "REDIS_PORT_6379_TCP": "tcp://10.96.0.10:6379",
        "REDIS_PORT_6379_TCP_ADDR": "10.96.0.10",
        "REDIS_PORT_6379_TCP_PORT": "6379",
        "REDIS_SERVICE_HOST": "10.96.0.10",
        "REDIS_SERVICE_PORT": "6379",
    }
    env = {**tls_only_redis.env(), **service_links, "PATH": f"{tmp_path}:/usr/bin:/bin"}
    env["REDIS_CLI_BINARY"] = shutil.which("redis-cli") or "redis-cli"
    done = subprocess.run(
        ["redis-cli", "ping"], env=env, capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout.strip()) == (0, "PONG"), done.stderr
