"""Extender mode end to end: the real kube-scheduler (a second profile named like ours)
calls ``interference-scheduler extender`` over HTTPS with its client certificate, as the
overlay configures it, with certificates from the install script, on a real
kube-apiserver, with signals from a real redis-server.

kube-scheduler keeps every one of its own rules — a PVC bound to a node-affine PV, a
``DoNotSchedule`` topology spread, required pod affinity — and binds; the extender's
interference filter still keeps a tolerance-bearing pod off the noisy node. Nodes are
Node objects without a kubelet (status written through ``nodes/status``).

The extender's port refuses what is not kube-scheduler: a client without a certificate
from the install's CA, a body over the limit (413); connections that never finish their
TLS handshake hold no thread, and kube-scheduler's calls are answered meanwhile; a filter
call about a pod the informers do not know is answered and writes no decision record.

A pod with an ``interference.io/`` annotation typo gets one Warning Event naming the
closest known key, however often kube-scheduler (or anyone) asks about it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from interference import keys
from interference.annotations import unknown_annotation_message
from interference.decision import parse_decision_hash
from interference.signals import SIGNAL_FAMILIES, NodeMetrics, NodeReport
from interference_cli.redis_process import free_port
from scheduler.adapters.event_recorder import SCHEDULER_NAME
from scheduler.api.objects import ANNOTATION_MAX_RUNQ_P99_US
from scheduler.plugins.interference import RUNQ_EXCEEDED
from tests.deploy.manifests import DEPLOY, find, render
from tests.deploy.test_references import BOOTSTRAP_ROLES
from tests.e2e.agents import agents_publishing
from tests.e2e.conftest import NAMESPACE as SYSTEM_NAMESPACE
from tests.e2e.conftest import RBAC_KINDS, scheduler_command
from tests.e2e.control_plane import Assets, ControlPlane, terminate
from tests.e2e.kube import Kube, Obj, SchedulerProcess, wait_for
from tests.e2e.parity import kube_scheduler_argv, read_log
from tests.interference_infra.test_http_limits import SERVER_NAME, make_certs

pytestmark = [pytest.mark.e2e]

OVERLAY = DEPLOY / "overlays" / "extender"
SCHEDULER = "e2e-extender"
NAMESPACE = "e2e-extender"
POOL = {"e2e-pool": "extender"}
"""Every pod here selects these nodes, so nodes of other tests never count."""
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
NODES = {"ext-a1": "a", "ext-a2": "a", "ext-b1": "b", "ext-noisy": "b"}
"""Node → zone."""
TOLERANCE_TIER = {"ext-a2", "ext-noisy"}
"""Nodes labelled ``tier: tol`` (where the tolerance-bearing pod may go)."""
REPORT_INTERVAL_S = 1.0
"""Interval the published reports claim: they stay fresh (3 intervals) for the whole test."""
TIMEOUT_S = 60.0


MAX_CONNECTIONS = 8
"""The extender's thread pool (``extender.max_connections``' default)."""


@dataclass
class ExtenderSetup:
    kube: Kube
    extender: SchedulerProcess
    redis: redis.Redis[bytes]
    workdir: Path
    restart: Callable[[], SchedulerProcess]
    """Start the extender again (same ports and configuration) after a test stopped it."""
    extender_port: int
    """The HTTPS port of /filter and /prioritize."""
    certs: Path
    """The install script's files: ca.crt, serving.*, client.* (kube-scheduler's)."""

    def client(self, certificate: Path | None) -> ssl.SSLContext:
        """A TLS client trusting the install's CA, presenting ``certificate``'s
        ``client.crt`` (a directory of the script's files) when given."""
        context = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        if certificate is not None:
            context.load_cert_chain(
                str(certificate / "client.crt"), str(certificate / "client.key")
            )
        return context

    def connect(self, certificate: Path | None) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.extender_port), timeout=10)
        return self.client(certificate).wrap_socket(raw, server_hostname=SERVER_NAME)


def _labels(node: str) -> dict[str, str]:
    labels = {**POOL, ZONE: NODES[node], HOSTNAME: node}
    if node in TOLERANCE_TIER:
        labels["tier"] = "tol"
    return labels


def _reports(now: float) -> list[NodeReport]:
    """Every node's report: ext-noisy's run queue saturated (p99 20 ms), the others quiet."""
    return [
        NodeReport(
            node=node,
            ts=now,
            interval_s=REPORT_INTERVAL_S,
            metrics=NodeMetrics(runq_p99_us=20_000 if node == "ext-noisy" else 40),
            measured=SIGNAL_FAMILIES,
        )
        for node in NODES
    ]


def _pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    node_name: str = "",
    cpu: str = "100m",
    annotations: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    **spec: Any,
) -> Obj:
    body: Obj = {
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {},
                     "annotations": annotations or {}},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": {**POOL, **(node_selector or {})},
            "containers": [{"name": "c", "image": "registry.invalid/pause:1",
                            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}],
            **spec,
        },
    }  # fmt: skip
    if node_name:
        body["spec"]["nodeName"] = node_name
    return body


def _create(kube: Kube, obj: Obj, path: str) -> None:
    kube.request("POST", path, obj)


def _node_of(kube: Kube, name: str) -> str:
    return str(
        wait_for(
            lambda: kube.pod(NAMESPACE, name)["spec"].get("nodeName"),
            f"{name} to be bound by kube-scheduler",
            TIMEOUT_S,
        )
    )


def _wait_http(url: str, what: str) -> None:
    def ok() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    wait_for(ok, what, TIMEOUT_S)


def _start(argv: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _kube_scheduler_config(kubeconfig: Path, extender_port: int, certs: Path, path: Path) -> Path:
    """The overlay's KubeSchedulerConfiguration as rendered, pointed at this apiserver,
    this test's scheduler name and the extender on loopback, with the install script's
    client certificate for the overlay's tlsConfig files and the serving certificate's
    name for the loopback address (everything else as shipped: HTTPS, leader election with
    its own Lease, nodeCacheCapable, ignorable false)."""
    rendered = find(render(OVERLAY), "ConfigMap", "interference-kube-scheduler-config")
    config = yaml.safe_load(rendered["data"]["config.yaml"])
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    (profile,) = config["profiles"]
    profile["schedulerName"] = SCHEDULER
    (extender,) = config["extenders"]
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False
    assert extender["enableHTTPS"] is True
    assert extender["urlPrefix"].startswith(f"https://{SERVER_NAME}:")
    shipped = extender["tlsConfig"]
    assert set(shipped) == {"certFile", "keyFile", "caFile"}
    extender["urlPrefix"] = f"https://127.0.0.1:{extender_port}"
    extender["tlsConfig"] = {
        "certFile": str(certs / "client.crt"),
        "keyFile": str(certs / "client.key"),
        "caFile": str(certs / "ca.crt"),
        "serverName": SERVER_NAME,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _kube_scheduler_identity(plane: ControlPlane, kube: Kube, workdir: Path) -> Path:
    """The overlay's RBAC for kube-scheduler applied; a kubeconfig with its account's token."""
    objects = [o for o in render(OVERLAY) if o["kind"] in RBAC_KINDS
               and o["metadata"]["name"].startswith("interference-kube-scheduler")]  # fmt: skip
    kube.kubectl("apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump_all(objects))
    for kind, name in BOOTSTRAP_ROLES:  # the roles it binds come with every apiserver
        namespace = "/namespaces/kube-system" if kind == "Role" else ""
        plural = "roles" if kind == "Role" else "clusterroles"
        kube.request("GET", f"/apis/rbac.authorization.k8s.io/v1{namespace}/{plural}/{name}")
    token = plane.service_account_token(SYSTEM_NAMESPACE, "interference-kube-scheduler")
    return plane.kubeconfig(workdir / "kube-scheduler.kubeconfig", token, "kube-scheduler")


@pytest.fixture(scope="module")
def setup(
    assets: Assets,
    control_plane: ControlPlane,
    kube: Kube,
    scheduler_kubeconfig: Path,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ExtenderSetup]:
    """Nodes, signals (ext-noisy noisy), the extender, then kube-scheduler calling it."""
    if assets.kube_scheduler is None:
        pytest.skip("kube-scheduler is not among the assets (KUBEBUILDER_ASSETS or ../shared/k8s)")
    workdir = tmp_path_factory.mktemp("extender")
    kube.ensure_namespace(NAMESPACE)
    for node in NODES:
        kube.create_node(node, cpu="4", labels=_labels(node))
    store: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    agents = contextlib.ExitStack()
    agents.enter_context(agents_publishing(redis_url, _reports))
    port = free_port()
    extender_port = free_port()
    certs = make_certs(workdir / "certs")
    config = {
        "loop": {"scheduler_name": SCHEDULER},
        "redis": {"url": redis_url},
        "http": {"port": port, "host": "127.0.0.1"},
        "extender": {
            "port": extender_port,
            "host": "127.0.0.1",
            "tls_cert_file": str(certs / "serving.crt"),
            "tls_key_file": str(certs / "serving.key"),
            "client_ca_file": str(certs / "ca.crt"),
        },
    }
    config_path = workdir / "extender.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "POD_NAME": "extender-0", "POD_NAMESPACE": SYSTEM_NAMESPACE}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.pop("REDIS_URL", None)
    log_path = workdir / "extender.log"
    argv = [*scheduler_command(), "extender", "--config", str(config_path),
            "--kubeconfig", str(scheduler_kubeconfig)]  # fmt: skip
    extender = SchedulerProcess("extender-0", _start(argv, log_path, env), log_path, port)
    started = [extender]

    def restart() -> SchedulerProcess:
        again = SchedulerProcess("extender-0", _start(argv, log_path, env), log_path, port)
        started.append(again)
        return again

    kube_scheduler: subprocess.Popen[bytes] | None = None
    try:
        _wait_http(f"http://127.0.0.1:{port}/readyz", "the extender to list nodes and pods")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            assert answer.read() == b"ok (extender)\n"  # every replica answers, none leads
        identity = _kube_scheduler_identity(control_plane, kube, workdir)
        scheduler_config = _kube_scheduler_config(
            identity, extender_port, certs, workdir / "kube-scheduler.yaml"
        )
        kube_scheduler_args = kube_scheduler_argv(
            assets.kube_scheduler, scheduler_config, identity, workdir / "kube-scheduler-certs"
        )
        kube_scheduler = _start(
            [*kube_scheduler_args, "--v=2"], workdir / "kube-scheduler.log", env
        )
        yield ExtenderSetup(kube, extender, store, workdir, restart, extender_port, certs)
    finally:
        agents.close()
        if kube_scheduler is not None:
            terminate(kube_scheduler, grace_s=20)
        for proc in started:
            proc.stop()
        print("--- extender log (last 40 lines) ---")
        print("\n".join(extender.log().splitlines()[-40:]))
        print("--- kube-scheduler log (last 40 lines) ---")
        print("\n".join(read_log(workdir / "kube-scheduler.log").splitlines()[-40:]))
        for pod in kube.pods(NAMESPACE):
            kube.delete_pod(NAMESPACE, pod["metadata"]["name"])
        for path in ("/api/v1/persistentvolumes/ext-pv",
                     f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/data"):  # fmt: skip
            # no controller manager removes the protection finalizers: drop them first
            with contextlib.suppress(OSError):
                kube.request("PATCH", path, {"metadata": {"finalizers": None}},
                             "application/merge-patch+json")  # fmt: skip
                kube.request("DELETE", path)
        for node in NODES:
            kube.delete_node(node)
        store.close()
    extender.assert_no_rejected_writes()
    assert kube_scheduler is None or kube_scheduler.returncode is not None
    refused = [line for line in read_log(workdir / "kube-scheduler.log").splitlines()
               if "forbidden" in line.lower()]  # fmt: skip
    assert not refused, "kube-scheduler's RBAC (the overlay's) is short:\n" + "\n".join(refused)


def test_pvc_bound_to_node_affine_pv_lands_on_that_node(setup: ExtenderSetup) -> None:
    kube = setup.kube
    pv = {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "ext-pv"},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "local",
            "local": {"path": "/mnt/data"},
            "claimRef": {"namespace": NAMESPACE, "name": "data"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": HOSTNAME, "operator": "In", "values": ["ext-b1"]}]}]}},
        },
    }  # fmt: skip
    _create(kube, pv, "/api/v1/persistentvolumes")
    pvc = {
        "metadata": {"name": "data", "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                 "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "ext-pv"},
    }  # fmt: skip
    _create(kube, pvc, f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims")
    bound = {"status": {"phase": "Bound"}}
    kube.request("PATCH", "/api/v1/persistentvolumes/ext-pv/status", bound,
                 "application/merge-patch+json")  # fmt: skip
    kube.request(
        "PATCH", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/data/status", bound,
        "application/merge-patch+json",
    )  # fmt: skip
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    _create(kube, _pod("with-pvc", volumes=volumes), f"/api/v1/namespaces/{NAMESPACE}/pods")
    assert _node_of(kube, "with-pvc") == "ext-b1"


def test_do_not_schedule_spread_lands_in_the_emptier_zone(setup: ExtenderSetup) -> None:
    kube = setup.kube
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    _create(kube, _pod("web-0", labels={"app": "web"}, node_name="ext-a1"), path)
    spread = [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"app": "web"}}}]  # fmt: skip
    _create(kube, _pod("web-1", labels={"app": "web"}, topologySpreadConstraints=spread), path)
    assert NODES[_node_of(kube, "web-1")] == "b"  # zone a already has one


def test_required_pod_affinity_lands_beside_its_peer(setup: ExtenderSetup) -> None:
    kube = setup.kube
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    _create(kube, _pod("db-0", labels={"app": "db"}, node_name="ext-a2"), path)
    affinity = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOSTNAME}]}}  # fmt: skip
    _create(kube, _pod("cache-0", affinity=affinity), path)
    assert _node_of(kube, "cache-0") == "ext-a2"


def test_interference_filter_keeps_tolerance_bearing_pod_off_noisy_node(
    setup: ExtenderSetup,
) -> None:
    kube = setup.kube
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    # ext-a2 carries load, so kube-scheduler's own scores would prefer ext-noisy
    _create(kube, _pod("busy", node_name="ext-a2", cpu="2500m"), path)
    tolerance = {ANNOTATION_MAX_RUNQ_P99_US: "500"}
    _create(kube, _pod("latency", annotations=tolerance, node_selector={"tier": "tol"}), path)
    assert _node_of(kube, "latency") == "ext-a2"
    key = keys.decision_key(NAMESPACE, "latency")
    record = parse_decision_hash(
        wait_for(
            lambda: setup.redis.hgetall(key), "the decision record (written in the background)"
        )
    )
    assert record.node == ""  # kube-scheduler chose and bound
    rejected = {c.node: c.reasons for c in record.candidates if not c.passed}
    assert rejected["ext-noisy"][0].startswith(RUNQ_EXCEEDED)

    # only the noisy node offered: the pod stays Pending with the extender's reason
    _create(kube, _pod("latency-2", annotations=tolerance,
                       node_selector={HOSTNAME: "ext-noisy"}), path)  # fmt: skip

    def failed_scheduling() -> list[Obj]:
        events = kube.events(NAMESPACE)
        return [e for e in events if e["regarding"]["name"] == "latency-2"
                and e["reason"] == "FailedScheduling"]  # fmt: skip

    events = wait_for(failed_scheduling, "a FailedScheduling Event for latency-2", TIMEOUT_S)
    assert all(RUNQ_EXCEEDED in e["note"] for e in events), [e["note"] for e in events]
    assert not kube.pod(NAMESPACE, "latency-2")["spec"].get("nodeName")

    # kube-scheduler, not the extender, bound the pods: its Scheduled Events name its profile
    scheduled = [e for e in kube.events(NAMESPACE) if e["reason"] == "Scheduled"]
    assert {e["regarding"]["name"] for e in scheduled} >= {"latency"}
    assert {e["reportingController"] for e in scheduled} == {SCHEDULER}
    metrics = setup.extender.metrics()
    count = 'interference_scheduler_extender_request_duration_seconds_count{verb="filter"}'
    assert metrics.get(count, 0) >= 2


def _warnings_about(kube: Kube, pod: str) -> list[Obj]:
    return [e for e in kube.events(NAMESPACE) if e["regarding"]["name"] == pod
            and e["reason"] == "UnknownAnnotation"]  # fmt: skip


def test_an_annotation_typo_gets_a_warning_event_naming_the_closest_key(
    setup: ExtenderSetup,
) -> None:
    """kube-scheduler places a pod whose tolerance lacks its ``-us`` (no tolerance at all):
    the extender tells its owner in a Warning Event on the pod, as standalone mode does."""
    kube = setup.kube
    typo = "interference.io/max-runq-p99"
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    _create(kube, _pod("typo", annotations={typo: "500"}, node_selector={"tier": "tol"}), path)
    assert _node_of(kube, "typo") in TOLERANCE_TIER  # placed without any tolerance read
    (event,) = wait_for(lambda: _warnings_about(kube, "typo"), "the Warning Event", TIMEOUT_S)
    assert event["type"] == "Warning" and event["reportingController"] == SCHEDULER_NAME
    assert event["note"] == unknown_annotation_message(typo)
    assert event["note"].endswith(f"did you mean {ANNOTATION_MAX_RUNQ_P99_US}?")


def test_the_typo_warning_is_written_once_however_often_the_pod_is_filtered(
    setup: ExtenderSetup,
) -> None:
    """A pod kube-scheduler keeps asking about (only the noisy node offered, its tolerance
    refuses it), and three more /filter calls about it: one Event, no repeats counted."""
    kube = setup.kube
    annotations = {ANNOTATION_MAX_RUNQ_P99_US: "500", "interference.io/max-reclaim-stall": "2"}
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    _create(kube, _pod("typo-pending", annotations=annotations,
                       node_selector={HOSTNAME: "ext-noisy"}), path)  # fmt: skip

    def failed_scheduling() -> int:
        return sum(e["regarding"]["name"] == "typo-pending" and e["reason"] == "FailedScheduling"
                   for e in kube.events(NAMESPACE))  # fmt: skip

    wait_for(failed_scheduling, "kube-scheduler to have asked the extender", TIMEOUT_S)
    stored = kube.pod(NAMESPACE, "typo-pending")  # with its UID, as kube-scheduler sends it
    for _ in range(3):
        answer = _exchange(setup.connect(setup.certs), _post("/filter", _filter_body(stored)))
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    (event,) = wait_for(
        lambda: _warnings_about(kube, "typo-pending"), "the Warning Event", TIMEOUT_S
    )
    time.sleep(2.0)  # the writer comes round every 0.25 s: a second Event would be here
    assert _warnings_about(kube, "typo-pending") == [event]
    assert event.get("series") is None  # not written again as a repeat either
    assert event["note"].endswith("did you mean interference.io/max-reclaim-stall-ms-per-s?")
    assert event["regarding"]["uid"] == stored["metadata"]["uid"]
    assert not kube.pod(NAMESPACE, "typo-pending")["spec"].get("nodeName")


def test_while_the_extender_is_down_pods_wait_and_then_are_scheduled(
    setup: ExtenderSetup,
) -> None:
    """``ignorable: false``: kube-scheduler places nothing without the extender's answer,
    says why in the pod's Events, and schedules the pod once the extender is back."""
    kube = setup.kube
    setup.extender.stop()
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    _create(kube, _pod("while-down"), path)

    def extender_failures() -> list[Obj]:
        events = kube.events(NAMESPACE)
        return [e for e in events if e["regarding"]["name"] == "while-down"
                and e["reason"] == "FailedScheduling"]  # fmt: skip

    events = wait_for(extender_failures, "a FailedScheduling Event naming the extender", TIMEOUT_S)
    url = f"https://127.0.0.1:{setup.extender_port}/filter"
    assert all(url in e["note"] for e in events), [e["note"] for e in events]
    assert not kube.pod(NAMESPACE, "while-down")["spec"].get("nodeName")
    back = setup.restart()
    setup.extender = back
    _wait_http(f"http://127.0.0.1:{back.http_port}/readyz", "the extender to come back")
    assert _node_of(kube, "while-down") in NODES


REFUSED = 'interference_scheduler_extender_refused_total{{reason="{}"}}'
UNKNOWN_POD_RECORDS = "interference_scheduler_extender_unknown_pod_records_total"


def _metric(setup: ExtenderSetup, name: str) -> float:
    return setup.extender.metrics().get(name, 0.0)


def _exchange(connection: socket.socket, request: bytes) -> bytes:
    """Send ``request`` and read until the server closes; b"" when it answers nothing (a
    refused handshake surfaces here under TLS 1.3)."""
    answer = b""
    try:
        connection.sendall(request)
        while chunk := connection.recv(65536):
            answer += chunk
    except (ssl.SSLError, OSError):
        pass
    finally:
        connection.close()
    return answer


def _post(path: str, body: bytes, length: int | None = None) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {SERVER_NAME}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _filter_body(pod: Obj) -> bytes:
    return json.dumps({"Pod": pod, "NodeNames": list(NODES)}).encode()


def test_only_a_client_with_the_installs_certificate_is_answered(
    setup: ExtenderSetup, tmp_path: Path
) -> None:
    refused_before = _metric(setup, REFUSED.format("tls_handshake"))
    request = _post("/filter", _filter_body(_pod("probe")))
    answer = _exchange(setup.connect(setup.certs), request)  # kube-scheduler's certificate
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b'"NodeNames"' in answer
    stranger = make_certs(tmp_path / "another-ca")  # a valid certificate of another CA
    for certificate in (None, stranger):
        try:
            connection = setup.connect(certificate)
        except (ssl.SSLError, OSError):
            continue  # refused during the handshake
        assert _exchange(connection, request) == b""
    plain = socket.create_connection(("127.0.0.1", setup.extender_port), timeout=10)
    assert not _exchange(plain, request).startswith(b"HTTP/")  # no plain-HTTP answer
    wait_for(
        lambda: _metric(setup, REFUSED.format("tls_handshake")) >= refused_before + 3,
        "three refused handshakes counted",
        TIMEOUT_S,
    )


def test_a_body_over_the_limit_is_refused_with_413(setup: ExtenderSetup) -> None:
    before = _metric(setup, REFUSED.format("too_large"))
    seven_mib = 7 * 1024 * 1024  # over the 6 MiB limit: never read
    answer = _exchange(setup.connect(setup.certs), _post("/filter", b"{" * 65536, seven_mib))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"over this endpoint's limit" in answer
    assert _metric(setup, REFUSED.format("too_large")) == before + 1


def test_a_filter_for_a_pod_the_informers_do_not_know_writes_no_record(
    setup: ExtenderSetup,
) -> None:
    before = _metric(setup, UNKNOWN_POD_RECORDS)
    forged = _pod("forged-by-caller", annotations={ANNOTATION_MAX_RUNQ_P99_US: "500"})
    forged["metadata"]["uid"] = "00000000-0000-0000-0000-00000000f0f0"
    answer = _exchange(setup.connect(setup.certs), _post("/filter", _filter_body(forged)))
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer[:200]
    result = json.loads(payload)
    assert "ext-noisy" in result["FailedAndUnresolvableNodes"]  # answered as for any pod
    wait_for(
        lambda: _metric(setup, UNKNOWN_POD_RECORDS) >= before + 1,
        "the held record dropped after its wait for the informer",
        TIMEOUT_S,
    )
    assert not setup.redis.exists(keys.decision_key(NAMESPACE, "forged-by-caller"))


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no Threads line for process {pid}")


def test_stalled_handshakes_hold_no_thread_and_real_calls_are_answered(
    setup: ExtenderSetup,
) -> None:
    """100 connections that never start a handshake and 12 that stall in the middle of
    one, from other addresses (as pods of their own): no thread serves them, 7 of 7 real
    calls with kube-scheduler's certificate are answered 200 at once, the stalled ones are
    closed at the handshake deadline (counted), and kube-scheduler schedules a pod."""
    pid = setup.extender.popen.pid
    threads_before = _threads(pid)
    refused_before = sum(
        _metric(setup, REFUSED.format(reason)) for reason in ("tls_handshake", "per_client")
    )
    addresses = [f"127.0.0.{i}" for i in range(2, 22)]
    held = []
    try:
        for index in range(112):
            connection = socket.create_connection(
                ("127.0.0.1", setup.extender_port), timeout=10,
                source_address=(addresses[index % len(addresses)], 0),
            )  # fmt: skip
            if index >= 100:
                connection.send(b"\x16\x03\x01\x02\x00")  # a handshake record's header only
            held.append(connection)
        time.sleep(1.0)
        request = _post("/filter", _filter_body(_pod("probe")))
        for _ in range(7):
            started = time.monotonic()
            answer = _exchange(setup.connect(setup.certs), request)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
            assert time.monotonic() - started < 1.0
        assert _threads(pid) <= threads_before + MAX_CONNECTIONS
        wait_for(
            lambda: (
                sum(
                    _metric(setup, REFUSED.format(reason))
                    for reason in ("tls_handshake", "per_client")
                )
                >= refused_before + 112
            ),
            "the stalled connections closed at the handshake deadline and counted",
            TIMEOUT_S,
        )
    finally:
        for connection in held:
            connection.close()
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    _create(setup.kube, _pod("after-the-flood"), path)
    assert _node_of(setup.kube, "after-the-flood") in NODES
