"""Acceptance 3: the DaemonSet and the Deployment use the images, ports, probes, env vars,
host paths and config keys the code actually builds, serves and reads.

Nothing here restates a value the code owns: env vars go through the agent's and the
scheduler's own parsers, the config through ``scheduler.entry.config``, the probe paths are
fetched from the real ``HealthServer``, the entrypoints come from pyproject.toml.
"""

from __future__ import annotations

import dataclasses
import importlib
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

import pytest
import yaml
from prometheus_client import CollectorRegistry

from interference_infra.strict import parse_log_format
from node_agent import cli as agent_cli
from node_agent.health import AgentHttpServer
from node_agent.probes.bpf.prerequisites import HostPaths
from node_agent.probes.bpf.sources import BPF_DIR_ENV
from node_agent.settings import AgentSettings, detect_cgroup_v2_mount
from scheduler.adapters.leader import default_identity, lease_namespace
from scheduler.adapters.redis_settings import connect
from scheduler.api.pods import parse_pod
from scheduler.endpoint.http import HealthServer, Status
from scheduler.entry import cli as scheduler_cli
from scheduler.entry.config import SchedulerConfig, parse_config, with_overrides
from tests.deploy.conftest import POD_FIELDS, container_env, mounted_here
from tests.deploy.manifests import (
    DEPLOY,
    REPO,
    Obj,
    container,
    find,
    kustomizations,
    load_examples,
    pod_templates,
    render,
)

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DOCKERFILES = {
    "agent": DEPLOY / "docker" / "agent.Dockerfile",
    "scheduler": DEPLOY / "docker" / "scheduler.Dockerfile",
}
RUNTIME_ONLY_ENV = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "HOST_IP"}
"""Env vars read by the NVIDIA container runtime (to expose NVML), or by the kubelet when it
expands ``$(HOST_IP)`` in ``KUBELET_URL``, not by the agent."""
LOGGING_ENV = {"LOG_FORMAT"}
"""Env vars of the logging set-up rather than of the settings."""
SECRET = {"password": "a", "credentials-password": "b", "scheduler-password": "c"}


def base() -> tuple[Obj, ...]:
    return render(kustomizations()["base"])


def agent_container() -> Obj:
    return container(find(base(), "DaemonSet", "interference-agent"), "agent")


def scheduler_deployment() -> Obj:
    return find(base(), "Deployment", "interference-scheduler")


def scheduler_container() -> Obj:
    return container(scheduler_deployment(), "scheduler")


def agent_settings(env: dict[str, str]) -> AgentSettings:
    """What ``interference-agent`` with the container's args builds from ``env``."""
    args = agent_cli.parser(env).parse_args(agent_container().get("args", []))
    return agent_cli.settings_from_args(args, env)


def scheduler_config(env: dict[str, str]) -> SchedulerConfig:
    """What ``interference-scheduler`` with the container's args runs with: the mounted
    ConfigMap's file, then the flag/env overrides."""
    args = scheduler_cli.parse_args(scheduler_container()["args"])
    document = yaml.safe_load(mounted_file(scheduler_deployment(), args.config))
    return with_overrides(parse_config(document), **scheduler_cli.overrides(args, env))


def mounted_file(workload: Obj, path: str) -> str:
    """The content a container sees at ``path``, from the ConfigMap volume mounted there."""
    spec = workload["spec"]["template"]["spec"]
    target = PurePosixPath(path)
    for mount in spec["containers"][0]["volumeMounts"]:
        if target.parent == PurePosixPath(mount["mountPath"]):
            assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates"
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            config_map = find(base(), "ConfigMap", volume["configMap"]["name"])
            return str(config_map["data"][target.name])
    raise AssertionError(f"nothing is mounted at {target.parent}")


# --- images and entrypoints ----------------------------------------------------------


def images_built_by_make(tmp_path: Path) -> dict[str, str]:
    """Dockerfile (repo-relative) → image tag, from the ``docker build`` calls ``make images``
    makes, recorded by a docker CLI that only writes its arguments down (no Docker daemon here;
    ``make e2e-cluster`` runs the real builds)."""
    calls = tmp_path / "docker-calls"
    fake = tmp_path / "docker"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\n')
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "DOCKER": str(fake)}
    done = subprocess.run(
        ["make", "--no-print-directory", "images"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    built = {}
    for call in calls.read_text().splitlines():
        dockerfile = re.search(r" -f (\S+)", call)
        tag = re.search(r" -t (\S+)", call)
        assert call.startswith("build ") and dockerfile and tag, call
        built[dockerfile.group(1)] = tag.group(1)
    return built


@pytest.mark.parametrize(
    ("kind", "name", "container_name", "component"),
    [
        ("DaemonSet", "interference-agent", "agent", "agent"),
        ("Deployment", "interference-scheduler", "scheduler", "scheduler"),
    ],
)
def test_workload_runs_the_image_make_builds_at_the_project_version(
    kind: str, name: str, container_name: str, component: str, tmp_path: Path
) -> None:
    built = images_built_by_make(tmp_path)[str(DOCKERFILES[component].relative_to(REPO))]
    assert built == f"interference-{component}:{PYPROJECT['project']['version']}"
    for variant in kustomizations().values():
        image = container(find(render(variant), kind, name), container_name)["image"]
        assert image == built, variant


@pytest.mark.parametrize("component", sorted(DOCKERFILES))
def test_dockerfile_entrypoint_is_a_project_script(component: str) -> None:
    text = DOCKERFILES[component].read_text()
    (entrypoint,) = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE)
    program = yaml.safe_load(entrypoint)[0]
    target = PYPROJECT["project"]["scripts"][program]
    module, _, function = target.partition(":")
    assert callable(getattr(importlib.import_module(module), function))
    assert program == f"interference-{component}"


@pytest.mark.parametrize("component", sorted(DOCKERFILES))
def test_dockerfile_base_images_are_pinned(component: str) -> None:
    text = DOCKERFILES[component].read_text()
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE))
    images = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert images
    for reference in images:
        # FROM ${BASE_IMAGE}: the build argument's default is what an unparameterised build uses.
        image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], reference)
        pinned = "@sha256:" in image or re.search(r":\d+(\.\d+)+[-\w.]*$", image)
        assert pinned, f"{image} is not pinned to a digest or an exact version tag"


@pytest.mark.parametrize("component", sorted(DOCKERFILES))
def test_dockerfile_copies_only_what_exists(component: str) -> None:
    text = DOCKERFILES[component].read_text()
    for sources in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.MULTILINE):
        for source in sources.split():
            assert (REPO / source).exists(), f"{component} image copies missing {source}"


def test_scheduler_image_runs_as_a_non_root_user() -> None:
    text = DOCKERFILES["scheduler"].read_text()
    final_stage = text.rsplit("\nFROM ", 1)[1]
    users = re.findall(r"^USER (\S+)$", final_stage, re.MULTILINE)
    assert users, "the scheduler image sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    context = scheduler_deployment()["spec"]["template"]["spec"]["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] == int(uid)
    assert scheduler_container()["securityContext"]["readOnlyRootFilesystem"] is True


def test_agent_image_has_bcc_and_points_the_agent_at_its_bpf_sources() -> None:
    text = DOCKERFILES["agent"].read_text()
    assert re.search(r"apt-get install .*python3-bpfcc", text)
    bpf_destination = re.search(r"^COPY bpf/ (\S+)$", text, re.MULTILINE)
    env_dir = re.search(rf"{BPF_DIR_ENV}=(\S+)", text)
    assert bpf_destination and env_dir
    assert bpf_destination.group(1).rstrip("/") == env_dir.group(1).rstrip("/")
    assert any(Path(p).suffix == ".c" for p in (REPO / "bpf").iterdir())
    # The agent reads that variable (through its --bpf-dir flag's default).
    assert agent_cli.parser({BPF_DIR_ENV: env_dir.group(1)}).parse_args([]).bpf_dir == (
        env_dir.group(1)
    )


# --- the agent's env, mounts and resources ------------------------------------------


def perturbed(value: str) -> str:
    """A different value of the same sort (an integer stays an integer, a number a number)."""
    for number in (int, float):
        try:
            return str(number(value) * 2 + 1)
        except ValueError:
            continue
    if value.startswith(_MOUNT_PREFIX):  # a mounted file: another file that exists
        return mounted_here(value.replace(".", "-changed.", 1) if "." in value else value + "2")
    return f"{value}-changed"


_MOUNT_PREFIX = mounted_here("/var/run/secrets/redis/x").removesuffix("/var/run/secrets/redis/x")


def test_every_agent_env_var_is_read_by_the_agent() -> None:
    env = container_env(agent_container()["env"], SECRET)
    full = agent_settings(env)
    for name in sorted(set(env) - RUNTIME_ONLY_ENV - LOGGING_ENV):
        changed = {**env, name: perturbed(env[name])}
        assert agent_settings(changed) != full, f"the agent ignores env {name}"
    # Logging is set up before the settings are built; the parser reads it.
    args = agent_cli.parser(env).parse_args(agent_container().get("args", []))
    assert parse_log_format(args.log_format) == env["LOG_FORMAT"] == "json"
    assert full.node_name == POD_FIELDS["spec.nodeName"]
    # Pod names from this node's own kubelet: $(HOST_IP) is the kubelet's expansion.
    assert env["KUBELET_URL"] == "https://$(HOST_IP):10250"
    assert env["HOST_IP"] == POD_FIELDS["status.hostIP"]
    # No password in the manifest: the agent's Redis user comes from the credential issuer.
    assert full.redis_password is None and full.redis_username is None


def test_agent_port_probes_and_scrape_annotation_match_what_it_serves() -> None:
    env = container_env(agent_container()["env"], SECRET)
    settings = agent_settings(env)
    # Its own network namespace: it listens on the pod's address, where the kubelet's
    # probes and Prometheus reach it.
    assert settings.http_address == POD_FIELDS["status.podIP"]
    ports = {p["name"]: p["containerPort"] for p in agent_container()["ports"]}
    assert ports["http"] == settings.http_port != 0
    template = find(base(), "DaemonSet", "interference-agent")["spec"]["template"]
    assert "hostNetwork" not in template["spec"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(settings.http_port)
    probes = {
        kind: agent_container()[kind]["httpGet"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert all(p["port"] in ("http", settings.http_port) for p in probes.values())
    paths = {
        **{kind: p["path"] for kind, p in probes.items()},
        "scrape": annotations["prometheus.io/path"],
    }
    assert agent_serves(paths, healthy=True) == dict.fromkeys(paths, 200)
    # The probes really check something: a stuck, unready agent fails all three of them.
    failing = agent_serves(paths, healthy=False)
    assert failing == {**dict.fromkeys(probes, 503), "scrape": 200}


def agent_serves(paths: dict[str, str], *, healthy: bool) -> dict[str, int]:
    """Status codes the real agent endpoint answers for ``paths`` when its loop is (not)
    alive and ready."""
    problem = "" if healthy else "stuck"
    server = AgentHttpServer("127.0.0.1", 0, CollectorRegistry(), lambda: problem, lambda: problem)
    server.start()
    codes = {}
    try:
        for name, path in paths.items():
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{server.port}{path}", timeout=10
                ) as r:
                    codes[name] = r.status
            except urllib.error.HTTPError as exc:
                codes[name] = exc.code
    finally:
        server.stop()
    return codes


def test_agent_mounts_the_host_paths_it_reads_read_only() -> None:
    mounts = {m["mountPath"]: m for m in agent_container()["volumeMounts"]}
    spec = find(base(), "DaemonSet", "interference-agent")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    defaults = AgentSettings(node_name="n")
    sys_fs_cgroup = str(Path(detect_cgroup_v2_mount()).parent)
    needed = {
        defaults.tracefs,
        sys_fs_cgroup if defaults.cgroup_v2_mount.endswith("unified") else defaults.cgroup_v2_mount,
        defaults.cgroup_v1_mount,
        HostPaths().modules_root,
    }
    for path in needed:
        assert path in mounts, f"the agent reads {path} but the DaemonSet does not mount it"
        mount = mounts[path]
        assert mount.get("readOnly") is True
        assert volumes[mount["name"]]["hostPath"]["path"] == path
    # No host PID namespace: the host's /proc, read-only, where PROC_ROOT says.
    assert "hostPID" not in spec
    proc_root = agent_settings(container_env(agent_container()["env"], SECRET)).proc_root
    assert mounts[proc_root].get("readOnly") is True
    assert volumes[mounts[proc_root]["name"]]["hostPath"]["path"] == "/proc"


def test_agent_is_not_privileged_and_adds_only_named_capabilities() -> None:
    context = agent_container()["securityContext"]
    assert context.get("privileged") is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert set(context["capabilities"]["add"]) == {"BPF", "PERFMON"}
    assert context["readOnlyRootFilesystem"] is True


CONTROL_PLANE_TAINTS = (
    {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
    {"key": "node-role.kubernetes.io/master", "effect": "NoSchedule"},
)


def tolerates(toleration: Obj, taint: Obj) -> bool:
    """Kubernetes toleration semantics (Exists/Equal, empty key and effect match all)."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint["key"]
    return toleration.get("key") == taint["key"] and toleration.get("value") == taint.get("value")


def test_agent_runs_on_worker_and_gpu_nodes_but_not_control_plane_ones() -> None:
    spec = find(base(), "DaemonSet", "interference-agent")["spec"]["template"]["spec"]
    tolerations = spec["tolerations"]
    for taint in CONTROL_PLANE_TAINTS:
        assert not any(tolerates(t, taint) for t in tolerations), f"tolerates {taint}"
    gpu = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert any(tolerates(t, gpu) for t in tolerations)
    assert "nodeSelector" not in spec and "affinity" not in spec


def test_the_toleration_check_can_fail() -> None:
    assert tolerates({"operator": "Exists"}, CONTROL_PLANE_TAINTS[0])
    assert not tolerates({"key": "nvidia.com/gpu", "operator": "Exists"}, CONTROL_PLANE_TAINTS[0])


# --- the scheduler's config, env, port and probes -----------------------------------


def test_scheduler_config_map_is_valid_for_the_code() -> None:
    env = container_env(scheduler_container()["env"], SECRET)
    config = scheduler_config(env)
    assert config.loop.dry_run is False
    assert config.leader_election.enabled is True
    assert parse_log_format(scheduler_cli.parse_args(scheduler_container()["args"]).log_format) == (
        "json"
    )
    overlay = render(kustomizations()["dry-run"])
    args = container(find(overlay, "Deployment", "interference-scheduler"), "scheduler")["args"]
    dry = with_overrides(config, **scheduler_cli.overrides(scheduler_cli.parse_args(args), env))
    assert dry.loop.dry_run is True


def test_scheduler_ports_probes_and_scrape_annotation_match_what_it_serves() -> None:
    env = container_env(scheduler_container()["env"], SECRET)
    port = scheduler_config(env).http.port
    ports = {p["name"]: p["containerPort"] for p in scheduler_container()["ports"]}
    assert ports["http"] == port
    dockerfile = DOCKERFILES["scheduler"].read_text()
    assert re.search(rf"^EXPOSE {port}$", dockerfile, re.MULTILINE)
    annotations = scheduler_deployment()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    paths = [
        scheduler_container()["livenessProbe"]["httpGet"],
        scheduler_container()["readinessProbe"]["httpGet"],
        {"path": annotations["prometheus.io/path"], "port": "http"},
    ]
    assert all(p["port"] in ("http", port) for p in paths)
    served = serve_and_get([p["path"] for p in paths])
    assert served == [200, 200, 200], dict(zip([p["path"] for p in paths], served, strict=True))


def serve_and_get(paths: list[str]) -> list[int]:
    """Status codes the real HealthServer answers for ``paths`` (a synced, valid leader)."""
    registry = CollectorRegistry()
    status = Status(synced=lambda: True, config_error=lambda: "", leading=lambda: True)
    config = dataclasses.replace(SchedulerConfig().http, port=0, host="127.0.0.1")
    server = HealthServer(config, registry, status)
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
    return codes


def test_scheduler_env_feeds_redis_login_and_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    env = container_env(scheduler_container()["env"], SECRET)
    config = scheduler_config(env)
    password_file = Path(env["REDIS_PASSWORD_FILE"])
    password_file.write_text("scheduler-password-from-the-mounted-secret")
    client = connect(config.redis, env).client()
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    provider = kwargs["credential_provider"]
    assert provider.get_credentials() == (
        env["REDIS_USERNAME"],
        "scheduler-password-from-the-mounted-secret",
    )
    assert config.redis.url.startswith("rediss://") and kwargs["ssl_ca_certs"]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert lease_namespace(config.leader_election) == POD_FIELDS["metadata.namespace"]
    assert default_identity().startswith(POD_FIELDS["metadata.name"] + "_")


def test_scheduler_replicas_and_disruption_budget() -> None:
    deployment = scheduler_deployment()
    assert deployment["spec"]["replicas"] == 2
    budget = find(base(), "PodDisruptionBudget", "interference-scheduler")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["minAvailable"] == 1


# --- examples -----------------------------------------------------------------------


@pytest.mark.parametrize("file", sorted(load_examples()))
def test_example_opts_in_and_parses_without_unsupported_fields(file: str) -> None:
    env = container_env(scheduler_container()["env"], SECRET)
    scheduler_name = scheduler_config(env).loop.scheduler_name
    templates = list(pod_templates(load_examples()[file]))
    assert templates, f"{file} has no workload"
    for owner, template in templates:
        pod = parse_pod(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                **template,
                "metadata": {
                    "name": owner["metadata"]["name"],
                    "namespace": "shop",
                    **template.get("metadata", {}),
                },
            }
        )
        assert pod.scheduler_name == scheduler_name
        assert pod.unsupported == (), f"{file}: the scheduler would warn about {pod.unsupported}"


def test_the_examples_cover_tolerance_gpu_and_antagonist() -> None:
    pods = {
        file: [
            parse_pod(
                {
                    "metadata": {"name": "p", "namespace": "shop", **t.get("metadata", {})},
                    "spec": t["spec"],
                }
            )
            for _, t in pod_templates(objects)
        ]
        for file, objects in load_examples().items()
    }
    assert pods["latency-sensitive-service.yaml"][0].tolerance is not None
    assert pods["gpu-training-job.yaml"][0].requests.get("nvidia.com/gpu", 0) >= 1
    assert pods["batch-antagonist.yaml"][0].tolerance is None


@pytest.mark.parametrize("component", sorted(DOCKERFILES))
def test_image_sources_are_enough_for_the_entrypoint(component: str, tmp_path: Path) -> None:
    """Only what the Dockerfile copies (plus the installed third-party packages) is needed
    to import the entrypoint — and, for the agent, to read its BPF programs from the
    directory the image's INTERFERENCE_BPF_DIR names."""
    text = DOCKERFILES[component].read_text()
    copies = re.findall(r"^COPY (?!--from)(.+) (\S+)$", text, re.MULTILINE)
    for sources, _ in copies:
        for source in sources.split():
            if (REPO / source).is_dir():
                shutil.copytree(REPO / source, tmp_path / source)
    (entrypoint,) = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE)
    module, _, function = PYPROJECT["project"]["scripts"][yaml.safe_load(entrypoint)[0]].partition(
        ":"
    )
    check = f"import {module}; assert callable({module}.{function})"
    env = {"PYTHONPATH": f"{tmp_path}:{sysconfig.get_paths()['purelib']}", "PATH": "/usr/bin:/bin"}
    if component == "agent":
        bpf_dir = re.search(rf"{BPF_DIR_ENV}=(\S+)", text)
        assert bpf_dir
        env[BPF_DIR_ENV] = str(tmp_path / "bpf")  # where `COPY bpf/ <dir>` put it, here
        check += (
            "; from node_agent.probes import base"
            "; from node_agent.probes.bpf import sources"
            "; from node_agent.settings import BPF_PROBES"
            "; d = sources.resolve_source_dir(base.ProbeContext())"
            f"; assert str(d) == {str(tmp_path / 'bpf')!r}, d"
            "; [sources.read_program(d, name) for name in BPF_PROBES]"
        )
    # -S: no site processing, so the editable install of this checkout is not on the path.
    done = subprocess.run(
        [sys.executable, "-S", "-c", check],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
