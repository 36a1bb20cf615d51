"""Fixtures of the e2e tests: a real control plane per session, the RBAC of deploy/ applied
to it, ServiceAccount kubeconfigs, a real redis-server and ``interference-scheduler``
processes.

Without binaries every e2e test is skipped with one line saying how to enable them
(``KUBEBUILDER_ASSETS``; see tests/e2e/control_plane.py).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from interference_cli.redis_process import free_port
from tests.conftest import RedisServer
from tests.deploy.manifests import DEPLOY, render
from tests.e2e.control_plane import Assets, AssetsMissing, ControlPlane, find_assets, pid_alive
from tests.e2e.kube import Kube, SchedulerProcess

NAMESPACE = "interference-system"
"""Where deploy/ puts the ServiceAccounts and the leader-election Role."""
AGENT_NAMESPACE = "interference-agent"
"""Where deploy/ puts the agent and its ServiceAccount."""
RBAC_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
              "RoleBinding")  # fmt: skip


@functools.cache
def _assets() -> Assets | str:
    """The binaries, or why there are none (found once per session)."""
    try:
        return find_assets()
    except AssetsMissing as exc:
        return str(exc)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip every e2e test with the same reason, raised here so ``-ra`` folds them into
    one line; fail them under ``CI``, which must run them (a skip there hides a broken
    set-up)."""
    if isinstance(_assets(), str) and item.get_closest_marker("e2e"):
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the e2e tests: {_assets()}", pytrace=False)
        pytest.skip(str(_assets()))


@pytest.fixture(scope="session")
def assets() -> Assets:
    found = _assets()
    if isinstance(found, str):
        pytest.skip(found)
    return found


def _processes_mentioning(text: str) -> list[str]:
    """``pid cmdline`` of live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and pid_alive(int(entry.name)):
            found.append(f"{entry.name} {cmdline[:200]}")
    return found


@pytest.fixture(scope="session")
def control_plane(assets: Assets) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver with deploy/'s RBAC objects applied (as the admin)."""
    plane = ControlPlane(assets)
    try:
        plane.start()
        rbac = [o for o in render(DEPLOY) if o["kind"] in RBAC_KINDS]
        kube = Kube(plane)
        kube.kubectl("apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump_all(rbac))
        yield plane
    finally:
        workdir = str(plane.workdir)
        survivors = plane.stop()
        left = _processes_mentioning(workdir)
    assert not survivors and not left, f"processes left behind: {survivors} {left}"
    assert not Path(workdir).exists(), f"{workdir} left behind"


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Kube:
    """Admin access (test set-up and assertions only; the workloads use their own tokens)."""
    return Kube(control_plane)


@pytest.fixture(scope="session")
def scheduler_kubeconfig(control_plane: ControlPlane) -> Path:
    """A kubeconfig holding a TokenRequest token of deploy/'s scheduler ServiceAccount."""
    token = control_plane.service_account_token(NAMESPACE, "interference-scheduler")
    path = control_plane.workdir / "scheduler.kubeconfig"
    return control_plane.kubeconfig(path, token, "interference-scheduler")


@pytest.fixture(scope="session")
def agent_kubeconfig(control_plane: ControlPlane) -> Path:
    """A kubeconfig holding a TokenRequest token of deploy/'s agent ServiceAccount."""
    token = control_plane.service_account_token(AGENT_NAMESPACE, "interference-agent")
    return control_plane.kubeconfig(control_plane.workdir / "agent.kubeconfig", token, "agent")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(port=free_port(), workdir=workdir)
        server.start()
        try:
            yield server.url
        finally:
            server.stop()


def scheduler_command() -> list[str]:
    """The installed ``interference-scheduler`` entry point of this interpreter's venv."""
    script = Path(sys.executable).parent / "interference-scheduler"
    return [str(script)] if script.exists() else [sys.executable, "-m", "scheduler.entry.cli"]


@pytest.fixture
def schedulers(
    control_plane: ControlPlane,
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
) -> Iterator[list[SchedulerProcess]]:
    """Started ``interference-scheduler`` processes (append with :func:`start_scheduler`);
    at teardown each is stopped and its log checked for rejected API writes."""
    started: list[SchedulerProcess] = []
    yield started
    for proc in started:
        proc.stop()
        print(f"--- {proc.replica} log (last 60 lines) ---")  # shown when the test failed
        print("\n".join(proc.log().splitlines()[-60:]))
    for proc in started:
        proc.assert_no_rejected_writes()


def start_scheduler(
    started: list[SchedulerProcess],
    workdir: Path,
    kubeconfig: Path,
    redis_url: str,
    scheduler_name: str,
    replica: str = "scheduler-0",
    lease: tuple[int, int, int] = (4, 3, 1),
    extra: dict[str, object] | None = None,
) -> SchedulerProcess:
    """An ``interference-scheduler`` subprocess as the scheduler ServiceAccount."""
    lease_duration, renew_deadline, retry_period = lease
    config: dict[str, object] = {
        "loop": {"scheduler_name": scheduler_name},
        "redis": {"url": redis_url},
        "leader_election": {
            "enabled": True,
            "lease_name": scheduler_name,
            "lease_duration_s": lease_duration,
            "renew_deadline_s": renew_deadline,
            "retry_period_s": retry_period,
        },
        "http": {"port": free_port(), "host": "127.0.0.1"},
    }
    for section, values in (extra or {}).items():
        merged = dict(config.get(section, {}) or {})  # type: ignore[call-overload]
        merged.update(values)
        config[section] = merged
    config_path = workdir / f"{replica}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "POD_NAME": replica,
        "POD_NAMESPACE": NAMESPACE,
        "LOG_LEVEL": "INFO",
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.pop("REDIS_URL", None)
    log_path = workdir / f"{replica}.log"
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            [*scheduler_command(), "--config", str(config_path), "--kubeconfig", str(kubeconfig)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    proc = SchedulerProcess(replica, popen, log_path, int(config["http"]["port"]))  # type: ignore[index]
    started.append(proc)
    return proc
