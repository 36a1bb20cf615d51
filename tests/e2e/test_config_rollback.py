"""Configuration reload on the real apiserver (scheduler.entry.config_reload): a config typo
keeps the last valid configuration serving and the replica ready, in standalone and in
extender mode; a valid reload that leaves every pod Pending (a filter set that rejects
every node) is rolled back by the Pending-rate guard and the pods bind. Each outcome is
an Event on the ConfigMap, a metric and a log line; the rejected file stays readable at
GET /config/rejected."""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from interference_cli.redis_process import free_port
from tests.e2e.conftest import NAMESPACE as SYSTEM_NAMESPACE
from tests.e2e.conftest import scheduler_command, start_scheduler
from tests.e2e.kube import Kube, Obj, SchedulerProcess, wait_for

pytestmark = [pytest.mark.e2e]

SCHEDULER = "e2e-rollback"
NAMESPACE = "e2e-rollback"
CONFIG_MAP = "e2e-rollback-config"
NODES = ("rollback-node-a", "rollback-node-b")
FAST_GUARD = {"window_s": 30, "roll_back_after_s": 5, "watch_for_s": 60, "min_pods": 3}
REJECT_EVERY_NODE = {  # no agent publishes here: every node is stale, so every node fails
    "profile": {"plugin_config": [{"name": "Interference", "args": {"stale_policy": "reject"}}]}
}


@pytest.fixture
def nodes(kube: Kube) -> Iterator[tuple[str, ...]]:
    kube.ensure_namespace(NAMESPACE)
    for name in NODES:
        kube.create_node(name, cpu="8")
    yield NODES
    for pod in kube.pods(NAMESPACE):
        kube.delete_pod(NAMESPACE, pod["metadata"]["name"])
    for name in NODES:
        kube.delete_node(name)


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def rewrite(path: Path, config: dict[str, object] | str) -> None:
    """Replace the file as a ConfigMap update does: a new inode renamed into place."""
    text = config if isinstance(config, str) else yaml.safe_dump(config)
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def config_events(kube: Kube, config_map: str) -> list[Obj]:
    return [
        e
        for e in kube.events(SYSTEM_NAMESPACE)
        if e["regarding"].get("kind") == "ConfigMap" and e["regarding"]["name"] == config_map
    ]


def named(kube: Kube, config_map: str, reason: str) -> list[Obj]:
    return [e for e in config_events(kube, config_map) if e["reason"] == reason]


def reasons(kube: Kube, config_map: str) -> list[str]:
    return [e["reason"] for e in sorted(config_events(kube, config_map), key=_when)]


def _when(event: Obj) -> str:
    return str(event.get("eventTime") or "")


def bound(kube: Kube, names: list[str]) -> bool:
    return all(kube.pod(NAMESPACE, name)["spec"].get("nodeName") for name in names)


def test_a_typo_keeps_serving_and_a_reload_that_leaves_pods_pending_is_rolled_back(
    kube: Kube,
    nodes: tuple[str, ...],
    schedulers: list[SchedulerProcess],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INTERFERENCE_SCHEDULER_CONFIGMAP", CONFIG_MAP)
    scheduler = start_scheduler(
        schedulers, tmp_path, scheduler_kubeconfig, redis_url, SCHEDULER,
        extra={"reload_guard": FAST_GUARD, "http": {"debug_pages": True}},
    )  # fmt: skip
    config_path = tmp_path / f"{scheduler.replica}.yaml"
    good = yaml.safe_load(config_path.read_text())  # reload_interval_s: the default 5 s
    wait_for(lambda: get(scheduler.http_port, "/readyz")[0] == 200, "the scheduler to be ready")
    wait_for(scheduler.leading, "the scheduler to lead")
    kube.create_pod(NAMESPACE, "before", SCHEDULER)
    wait_for(lambda: bound(kube, ["before"]), "a pod bound under the good configuration")

    # A typo: nothing changes, the replica stays ready, an Event and a metric say so.
    rewrite(config_path, {**good, "cycle": {"relax_after_s": "soon"}})
    invalid = wait_for(
        lambda: named(kube, CONFIG_MAP, "InvalidConfiguration"), "the InvalidConfiguration Event"
    )
    assert invalid[0]["type"] == "Warning"
    assert "cycle.relax_after_s: must be a number, got 'soon'" in invalid[0]["note"]
    code, body = get(scheduler.http_port, "/readyz")
    assert code == 200 and "the configuration file is invalid" in body, body
    metrics = scheduler.metrics()
    assert metrics['interference_scheduler_config_reloads_total{result="invalid"}'] == 1
    assert metrics["interference_scheduler_config_rejected"] == 1
    kube.create_pod(NAMESPACE, "during-typo", SCHEDULER)
    wait_for(lambda: bound(kube, ["during-typo"]), "a pod bound while the typo is on disk")

    # A valid file whose filters reject every node: pods stay Pending, then a roll back.
    rewrite(config_path, {**good, "cycle": REJECT_EVERY_NODE})
    wait_for(lambda: "ConfigReloaded" in reasons(kube, CONFIG_MAP), "the bad file applied")
    pending = [f"after-{i}" for i in range(4)]
    for name in pending:
        kube.create_pod(NAMESPACE, name, SCHEDULER)
    rolled = wait_for(
        lambda: named(kube, CONFIG_MAP, "ConfigRolledBack"), "the roll back", timeout_s=60
    )
    assert rolled[0]["type"] == "Warning"
    assert "Pending rate 100%" in rolled[0]["note"], rolled[0]["note"]
    assert "returned to the last good configuration" in rolled[0]["note"]
    assert "PendingRateHigh" in reasons(kube, CONFIG_MAP)
    failed = [e for e in kube.events(NAMESPACE) if e["reason"] == "FailedScheduling"]
    assert failed, "the pods were Pending under the bad configuration"
    wait_for(lambda: bound(kube, pending), "the pods bound after the roll back", timeout_s=60)

    metrics = scheduler.metrics()
    assert metrics['interference_scheduler_config_reloads_total{result="rolled_back"}'] == 1
    assert metrics["interference_scheduler_config_rejected"] == 1  # the file is not served
    code, rejected = get(scheduler.http_port, "/config/rejected")
    assert code == 200 and "stale_policy: reject" in rejected and "rolled back at" in rejected
    code, running = get(scheduler.http_port, "/config")
    assert code == 200 and "stale_policy: reject" not in running
    assert "the file on disk was rolled back" in running
    assert "ConfigRolledBack" in scheduler.log() or "returned to the last good" in scheduler.log()


def test_an_extender_stays_ready_through_a_config_typo(
    kube: Kube,
    nodes: tuple[str, ...],
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path: Path,
) -> None:
    port = free_port()
    config = {
        "loop": {"scheduler_name": SCHEDULER},
        "redis": {"url": redis_url},
        "http": {"port": port, "host": "127.0.0.1"},
        # no kube-scheduler calls it here: the verbs' port on loopback, without TLS
        "extender": {"port": free_port(), "host": "127.0.0.1", "plaintext": True},
        "reload_interval_s": 0.5,
    }
    config_path = tmp_path / "extender.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "POD_NAME": "extender-0",
        "POD_NAMESPACE": SYSTEM_NAMESPACE,
        "INTERFERENCE_SCHEDULER_CONFIGMAP": CONFIG_MAP + "-extender",
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.pop("REDIS_URL", None)
    log_path = tmp_path / "extender.log"
    argv = [*scheduler_command(), "extender", "--config", str(config_path),
            "--kubeconfig", str(scheduler_kubeconfig)]  # fmt: skip
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    extender = SchedulerProcess("extender-0", popen, log_path, port)
    try:
        wait_for(lambda: get(port, "/readyz") == (200, "ok (extender)\n"), "the extender ready")
        rewrite(config_path, {**config, "cycle": {"profile": {"scores": {"Interference": "high"}}}})
        invalid = wait_for(
            lambda: named(kube, CONFIG_MAP + "-extender", "InvalidConfiguration"),
            "the extender's InvalidConfiguration Event",
        )
        assert "cycle.profile.scores.Interference: must be a number" in invalid[0]["note"]
        code, body = get(port, "/readyz")
        assert code == 200 and body.startswith("ok (extender); the configuration file is invalid")
        metrics = extender.metrics()
        assert metrics['interference_scheduler_config_reloads_total{result="invalid"}'] == 1
        assert metrics["interference_scheduler_config_rejected"] == 1
        assert "still serving the last valid configuration" in extender.log()
        rewrite(config_path, config)
        wait_for(
            lambda: extender.metrics().get("interference_scheduler_config_rejected") == 0,
            "the fixed file served",
        )
        assert get(port, "/readyz") == (200, "ok (extender)\n")
    finally:
        extender.stop()
        print("--- extender log (last 40 lines) ---")
        print("\n".join(extender.log().splitlines()[-40:]))
    extender.assert_no_rejected_writes()
