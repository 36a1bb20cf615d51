"""The credential issuer as deploy/ runs it, against the code: its image and command, every
env var read by its own parser, its port, probes and scrape annotation served by its real
HTTP server, its pod hardening, and the agent's side of the handshake (the projected token's
audience, path and the issuer's address) matching what the issuer expects.

Nothing here restates a value the code owns: the audience, the agents' ServiceAccount and
the port come from ``credential_issuer.settings``, the env from the issuer's parser."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import yaml
from prometheus_client import CollectorRegistry

from credential_issuer import cli as issuer_cli
from credential_issuer.issuer import Issuer, IssuerMetrics
from credential_issuer.redis_users import AgentUsers
from credential_issuer.review import Identity
from credential_issuer.server import IssuerServer
from credential_issuer.settings import (
    DEFAULT_AGENT_SERVICE_ACCOUNT,
    DEFAULT_AUDIENCE,
    DEFAULT_PORT,
    IssuerSettings,
)
from tests.deploy.conftest import container_env, mounted_here
from tests.deploy.manifests import DEPLOY, REPO, Obj, container, find, kustomizations, render

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCHEDULER_DOCKERFILE = DEPLOY / "docker" / "scheduler.Dockerfile"
SECRET = {"password": "a", "credentials-password": "b" * 20, "scheduler-password": "c"}
LOGGING_ENV = {"LOG_FORMAT"}
"""Read by the logging set-up (``--log-format``), not by the settings."""
PROGRAM = "interference-credentials"


def base() -> tuple[Obj, ...]:
    return render(kustomizations()["base"])


def deployment() -> Obj:
    return find(base(), "Deployment", PROGRAM)


def issuer_container() -> Obj:
    return container(deployment(), "issuer")


def agent_container() -> Obj:
    return container(find(base(), "DaemonSet", "interference-agent"), "agent")


def env_of(c: Obj) -> dict[str, str]:
    """A container's env, Secret references resolved from :data:`SECRET`, downward-API
    ones from :data:`tests.deploy.conftest.POD_FIELDS`."""
    return container_env(c.get("env", []), SECRET)


def issuer_settings(env: dict[str, str]) -> IssuerSettings:
    """What ``interference-credentials`` with the container's args builds from ``env``."""
    args = issuer_cli.parser(env).parse_args(issuer_container().get("args", []))
    return issuer_cli.settings_from_args(args, env)


# --- image and command ---------------------------------------------------------------


def test_the_issuer_runs_the_scheduler_image_with_its_own_program() -> None:
    for name, variant in kustomizations().items():
        objects = render(variant)
        issuer = container(find(objects, "Deployment", PROGRAM), "issuer")
        scheduler = container(find(objects, "Deployment", "interference-scheduler"), "scheduler")
        assert issuer["image"] == scheduler["image"], name
        assert issuer["imagePullPolicy"] == scheduler["imagePullPolicy"], name
    (program,) = issuer_container()["command"]
    module = PYPROJECT["project"]["scripts"][program].partition(":")[0]
    assert module.split(".")[0] == "credential_issuer"
    assert program == PROGRAM
    text = SCHEDULER_DOCKERFILE.read_text()
    assert re.search(r"^COPY credential_issuer/ credential_issuer/$", text, re.MULTILINE)
    # The build runs the program once: an image without it does not build.
    assert f"{PROGRAM} " in text or f"{PROGRAM};" in text
    assert "credential_issuer*" in str(PYPROJECT["tool"]["setuptools"]["packages"]["find"])
    assert "!credential_issuer" in (REPO / ".dockerignore").read_text().splitlines()


def test_the_image_sources_are_enough_for_the_issuer(tmp_path: Path) -> None:
    """Only what the scheduler Dockerfile copies (plus the installed third-party packages)
    is needed to import the issuer's entry point."""
    text = SCHEDULER_DOCKERFILE.read_text()
    for sources, _ in re.findall(r"^COPY (?!--from)(.+) (\S+)$", text, re.MULTILINE):
        for source in sources.split():
            if (REPO / source).is_dir():
                shutil.copytree(REPO / source, tmp_path / source)
    module, _, function = PYPROJECT["project"]["scripts"][PROGRAM].partition(":")
    env = {"PYTHONPATH": f"{tmp_path}:{sysconfig.get_paths()['purelib']}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-S", "-c", f"import {module}; assert callable({module}.{function})"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


# --- env, port, probes ------------------------------------------------------------------


def perturbed(name: str, value: str) -> str:
    """A different valid value of the same sort."""
    if name == "REDIS_URL":
        parts = urlsplit(value)
        return parts._replace(netloc=f"other-{parts.hostname}:{parts.port or 6379}").geturl()
    if value.isdigit():
        return str(int(value) + 1)
    if name.endswith("_FILE"):  # a mounted file: another file that exists
        return mounted_here(f"/var/run/secrets/redis/{name.lower()}-changed")
    return f"{value}-changed"


def test_every_issuer_env_var_is_read_by_the_issuer() -> None:
    env = env_of(issuer_container())
    full = issuer_settings(env)
    for name in sorted(set(env) - LOGGING_ENV):
        changed = {**env, name: perturbed(name, env[name])}
        assert issuer_settings(changed) != full, f"the issuer ignores env {name}"
    args = issuer_cli.parser(env).parse_args(issuer_container().get("args", []))
    assert args.log_format == env["LOG_FORMAT"] == "json"
    # Its own user, the password from the mounted file of its Secret (read at each login).
    assert (full.redis.username, full.redis.password) == (PROGRAM, None)
    assert full.redis.password_file == env["REDIS_PASSWORD_FILE"]
    assert full.redis.url.startswith("rediss://") and full.redis.tls.ca_file
    # The defaults it relies on are the agents' side of deploy/: their ServiceAccount and
    # the audience of their projected token (checked below).
    assert full.audience == DEFAULT_AUDIENCE
    spec = find(base(), "DaemonSet", "interference-agent")["spec"]["template"]["spec"]
    namespace = find(base(), "DaemonSet", "interference-agent")["metadata"]["namespace"]
    assert full.agent_service_account == (namespace, spec["serviceAccountName"])
    assert f"{namespace}/{spec['serviceAccountName']}" == DEFAULT_AGENT_SERVICE_ACCOUNT


class _NoReviews:
    def review(self, token: str) -> Identity:
        raise AssertionError("no credentials are requested here")


def serve(settings: IssuerSettings, problem: str, paths: list[str]) -> list[int]:
    """Status codes the real issuer server answers for ``paths`` when its readiness check
    says ``problem``."""
    users = AgentUsers(settings.redis, 1.0)
    metrics = IssuerMetrics(CollectorRegistry())
    issuer = Issuer(settings, _NoReviews(), users, metrics)
    server = IssuerServer(issuer, "127.0.0.1", 0, ready=lambda: problem)
    server.start()
    codes = []
    try:
        for path in paths:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{server.port}{path}", timeout=10
                ) as r:
                    codes.append(r.status)
            except urllib.error.HTTPError as exc:
                codes.append(exc.code)
    finally:
        server.stop()
        users.close()
    return codes


def test_issuer_port_probes_service_and_scrape_annotation_match_what_it_serves() -> None:
    settings = issuer_settings(env_of(issuer_container()))
    assert settings.port == DEFAULT_PORT
    ports = {p["name"]: p["containerPort"] for p in issuer_container()["ports"]}
    assert ports["http"] == settings.port
    service = find(base(), "Service", PROGRAM)
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == "http" and service_port["port"] == settings.port
    template = deployment()["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(settings.port)
    probes = [issuer_container()[k]["httpGet"] for k in ("livenessProbe", "readinessProbe")]
    assert all(p["port"] in ("http", settings.port) for p in probes)
    paths = [probes[0]["path"], probes[1]["path"], annotations["prometheus.io/path"]]
    assert serve(settings, "", paths) == [200, 200, 200]
    # Readiness checks something: Redis not answering makes it 503, liveness stays 200.
    assert serve(settings, "Redis does not answer", paths) == [200, 503, 200]


def test_issuer_pod_is_hardened_and_sized() -> None:
    text = SCHEDULER_DOCKERFILE.read_text()
    (uid,) = {
        u.split(":")[0] for u in re.findall(r"^USER (\S+)$", text.rsplit("\nFROM ", 1)[1], re.M)
    }
    spec = deployment()["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == int(uid) != 0
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    context = issuer_container()["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"] and "add" not in context["capabilities"]
    assert not spec.get("hostNetwork") and not spec.get("hostPID")
    # Its volumes: its own Redis user's Secret (password and CA) and its serving
    # certificate's, read-only.
    names = {v["secret"]["secretName"] for v in spec["volumes"]}
    assert names == {"redis-issuer", "interference-credentials-tls"}
    assert [m["readOnly"] for m in issuer_container()["volumeMounts"]] == [True, True]
    # It calls the API server (TokenReview) with its own ServiceAccount's token.
    assert spec["serviceAccountName"] == PROGRAM
    assert spec.get("automountServiceAccountToken", True) is True
    resources = issuer_container()["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]
    assert 1 <= deployment()["spec"]["replicas"] <= 2
    budget = find(base(), "PodDisruptionBudget", PROGRAM)
    assert budget["spec"]["selector"]["matchLabels"].items() <= spec_labels().items()
    assert budget["spec"]["minAvailable"] == 1


def spec_labels() -> dict[str, Any]:
    labels: dict[str, Any] = deployment()["spec"]["template"]["metadata"]["labels"]
    return labels


# --- the agent's side -------------------------------------------------------------------


def test_the_agent_sends_the_token_the_issuer_accepts_to_the_issuer() -> None:
    """The projected token: the issuer's audience, an hour at most, at the path the agent
    reads; the agent's issuer address is the issuer Service's port."""
    spec = find(base(), "DaemonSet", "interference-agent")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    env = env_of(agent_container())
    token_file = PurePosixPath(env["TOKEN_FILE"])
    mounts = [m for m in agent_container()["volumeMounts"] if "projected" in volumes[m["name"]]]
    (mount,) = mounts
    assert mount["readOnly"] is True
    (source,) = volumes[mount["name"]]["projected"]["sources"]
    token = source["serviceAccountToken"]
    assert token["audience"] == DEFAULT_AUDIENCE
    assert 600 <= token["expirationSeconds"] <= 3600
    assert PurePosixPath(mount["mountPath"]) / token["path"] == token_file
    url = urlsplit(env["CREDENTIALS_URL"])
    service = find(base(), "Service", PROGRAM)
    # the agent runs in a namespace of its own: the Service's name with its namespace
    service_host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.scheme == "https" and url.hostname == service_host
    assert env["CREDENTIALS_CA_FILE"].endswith("/ca.crt")
    assert url.port == service["spec"]["ports"][0]["port"]
    # Without a cluster DNS (local-images) the kubelet's Service variables cannot help (they
    # name only Services of the pod's own namespace): the install sets the address instead.
    local = render(kustomizations()["local-images"])
    local_env = env_of(container(find(local, "DaemonSet", "interference-agent"), "agent"))
    assert local_env["CREDENTIALS_URL"] == env["CREDENTIALS_URL"]
    install = (REPO / "docs" / "operations.md").read_text()
    assert "set env daemonset/interference-agent" in install
    assert '"CREDENTIALS_URL=https://$ISSUER_IP:10272"' in install


def test_no_rendered_agent_holds_a_redis_password() -> None:
    for name, variant in kustomizations().items():
        env = env_of(container(find(render(variant), "DaemonSet", "interference-agent"), "agent"))
        assert not {"REDIS_USERNAME", "REDIS_PASSWORD"} & set(env), name
        assert "CREDENTIALS_URL" in env, name


def test_the_issuer_and_the_agents_reach_each_other_through_the_policies() -> None:
    """Spelled out here, evaluated in test_network_policy.py: the issuer's policy admits the
    agents, Redis' admits the issuer."""
    issuer_policy = find(base(), "NetworkPolicy", PROGRAM)
    assert issuer_policy["spec"]["podSelector"]["matchLabels"].items() <= spec_labels().items()
    peers = yaml.safe_dump(find(base(), "NetworkPolicy", "redis")["spec"]["ingress"])
    assert f"app.kubernetes.io/name: {PROGRAM}" in peers
