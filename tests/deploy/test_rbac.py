"""Acceptance 2: the rendered RBAC is exactly what the code uses.

The real adapters — the scheduler's ``KubernetesCluster`` and ``LeaderElector``, the credential
issuer's ``KubernetesTokenReviewer`` — run every API call they make with the real
``kubernetes`` client against the HTTP API emulator (tests/scheduler/k8s_emulator.py, on
kmock); the agent's ``KubeletPodDirectory`` asks a kubelet, whose requests are mapped to the
permissions the kubelet checks. Each recorded request becomes a permission (API
group, resource[/subresource], verb, namespace), which is compared both ways with the
ClusterRoles and Roles bound to the workload's ServiceAccount in every rendered
kustomization: nothing missing, nothing extra, no wildcards.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry

from credential_issuer.node_events import KubernetesNodeEvents, NodeEventMetrics
from credential_issuer.review import (
    KubernetesPodBinding,
    KubernetesTokenReviewer,
    ReviewUnavailable,
    TokenRejected,
)
from credential_issuer.settings import DEFAULT_AUDIENCE
from interference.signals import PodMetrics
from interference_cli.redis_process import free_port
from node_agent.events import EVENT_PERMISSIONS, KubernetesEvents
from node_agent.kubelet_pods import KUBELET_PERMISSION
from scheduler.adapters.eviction import EVICTION_PERMISSIONS, KubernetesEvictor
from scheduler.adapters.kubernetes import REQUIRED_PERMISSIONS, KubernetesCluster
from scheduler.adapters.leader import LEASE_PERMISSIONS, LeaderElectionSettings, LeaderElector
from scheduler.adapters.move_journal import JOURNAL_PERMISSIONS, ConfigMapMoveJournal, journal_name
from scheduler.adapters.preemption import (
    PREEMPTION_PERMISSIONS,
    KubernetesPreemptor,
    PreemptionMetrics,
)
from scheduler.cycle.ports import (
    BindConflict,
    ClusterError,
    EventType,
    K8sObject,
    ObjectKind,
    PodRef,
    Preemption,
)
from scheduler.cycle.settings import CycleSettings
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.entry.config import parse_config
from scheduler.entry.extender_cli import ExtenderProcess
from scheduler.rebalancing.rebalance import Moved
from scheduler.standalone.loop import LoopSettings, SchedulingLoop
from tests.builders import node_obj
from tests.deploy.manifests import Obj, container, find, kustomizations, render
from tests.scheduler.k8s_emulator import EmulatorThread, pod, running_emulator
from tests.scheduler.runtime_helpers import MemoryDecisions, MemorySignals

ALL_NAMESPACES = "*"


@dataclass(frozen=True, order=True)
class Permission:
    """One RBAC verb on one resource, in one namespace or (``*``) cluster-wide."""

    group: str
    resource: str
    verb: str
    namespace: str

    def covers(self, used: Permission) -> bool:
        same = (self.group, self.resource, self.verb) == (used.group, used.resource, used.verb)
        return same and self.namespace in (ALL_NAMESPACES, used.namespace)


def permission_of(method: str, path: str, query: dict[str, str]) -> Permission:
    """The permission the API server checks for one request (its authorizer's view)."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    elif parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        raise AssertionError(f"non-resource request {method} {path}: RBAC needs nonResourceURLs")
    namespace = ALL_NAMESPACES
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) == 3 else "")
    named = len(rest) >= 2
    watching = query.get("watch") in ("true", "1")
    verb = {
        "GET": "watch" if watching else ("get" if named else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }[method]
    return Permission(group, resource, verb, namespace)


def used_permissions(emulator: EmulatorThread) -> set[Permission]:
    return {permission_of(method, path, query) for method, path, query, _ in emulator.requests()}


def granted_permissions(objects: tuple[Obj, ...], workload_kind: str, name: str) -> set[Permission]:
    """What the rendered RBAC grants the ServiceAccount of a rendered workload."""
    workload = find(objects, workload_kind, name)
    account = workload["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = workload["metadata"]["namespace"]
    granted: set[Permission] = set()
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        subjects = binding.get("subjects", [])
        if not any(
            s["kind"] == "ServiceAccount"
            and s["name"] == account
            and s.get("namespace") == namespace
            for s in subjects
        ):
            continue
        role = find(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        scope = (
            ALL_NAMESPACES
            if binding["kind"] == "ClusterRoleBinding"
            else binding["metadata"]["namespace"]
        )
        for rule in role["rules"]:
            for value in (*rule["apiGroups"], *rule["resources"], *rule["verbs"]):
                assert "*" not in value, f"wildcard {value!r} in {role['metadata']['name']}"
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
            granted |= {
                Permission(group, resource, verb, scope)
                for group in rule["apiGroups"]
                for resource in rule["resources"]
                for verb in rule["verbs"]
            }
    return granted


def compare(used: set[Permission], granted: set[Permission]) -> tuple[list[str], list[str]]:
    missing = sorted(str(u) for u in used if not any(g.covers(u) for g in granted))
    extra = sorted(str(g) for g in granted if not any(g.covers(u) for u in used))
    return missing, extra


# --- driving the real adapters ------------------------------------------------------


class Handler:
    """A ClusterHandler that just counts what the informers deliver."""

    def __init__(self) -> None:
        self.applied: list[tuple[ObjectKind, EventType, str]] = []

    def replace(self, kind: ObjectKind, objects: list[K8sObject]) -> None:
        pass

    def apply(self, kind: ObjectKind, event: EventType, obj: K8sObject) -> None:
        self.applied.append((kind, event, obj["metadata"]["name"]))


def api_client(url: str) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = url
    return client.ApiClient(configuration)


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def emulator() -> Iterator[EmulatorThread]:
    with running_emulator() as server:
        yield server


def exercise_scheduler(emulator: EmulatorThread, lease_namespace: str) -> None:
    """Every call of KubernetesCluster, the elector, the preemptor and the rebalancer's
    evictor: informers (list + watch) of nodes, pods and PodDisruptionBudgets, bind (also
    a conflicting one), an Event, the PodScheduled condition, a nomination, a preemption
    (condition, delete, Event, a nomination cleared), an eviction (dry run and real), and a
    Lease acquired, renewed and released."""
    emulator.put("nodes", node_obj("gpu-node-1"))
    emulator.put("pods", pod("pending-a", namespace="shop"))
    emulator.put("pods", pod("pending-b", namespace="shop"))
    victim = emulator.put("pods", pod("victim", namespace="shop", node="gpu-node-1"))
    api = api_client(emulator.url)
    cluster = KubernetesCluster(api)
    handler, stop = Handler(), threading.Event()
    informers = threading.Thread(target=cluster.run_informers, args=(handler, stop), daemon=True)
    leading = threading.Event()
    elector = LeaderElector(
        api,
        LeaderElectionSettings(
            namespace=lease_namespace, lease_duration_s=4, renew_deadline_s=3, retry_period_s=1
        ),
        leading,
        identity="scheduler-0",
    )
    election = threading.Thread(target=elector.run, args=(stop,), daemon=True)
    informers.start()
    election.start()
    try:
        wait_until(cluster.synced, "the informers to sync")
        emulator.put("pods", pod("pending-c", namespace="shop"))
        wait_until(lambda: ("Pod", "ADDED", "pending-c") in handler.applied, "a watch event")
        cluster.bind(PodRef("shop", "pending-a"), "gpu-node-1")
        with pytest.raises(BindConflict):
            cluster.bind(PodRef("shop", "pending-a"), "gpu-node-1")
        for _ in range(2):  # a repeat PATCHes the Event's series
            cluster.record_event(PodRef("shop", "pending-b"), "Warning", "FailedScheduling", "0/1")
        cluster.set_unschedulable(PodRef("shop", "pending-b"), "0/1 nodes are available")
        preemptor = KubernetesPreemptor(cluster, PreemptionMetrics(CollectorRegistry()))
        preemptor.nominate(PodRef("shop", "pending-b"), "gpu-node-1")
        preemptor.preempt(
            Preemption(
                PodRef("shop", "pending-b", "uid-b"),
                "interference-scheduler",
                "gpu-node-1",
                (PodRef("shop", "victim", victim["metadata"]["uid"]),),
                clear_nominated=(PodRef("shop", "pending-a"),),
            )
        )
        assert emulator.get("pods", "shop", "victim") is None
        evictor = KubernetesEvictor(api)  # the rebalancer: the answer does not matter here
        for dry_run in (True, False):
            with contextlib.suppress(ClusterError):
                evictor.evict(PodRef("shop", "pending-a"), dry_run)
        journal = ConfigMapMoveJournal(api, lease_namespace, journal_name("interference-scheduler"))
        for at in (1.0, 2.0):  # its journal: created, then updated
            journal.add(Moved(at, "gpu-node-1", "shop", "rs-web"), None, keep_s=600)
        assert [m.at for m, _ in journal.since(0)] == [1.0, 2.0]
        wait_until(lambda: elector.renewals >= 3 and leading.is_set(), "a renewed lease")
    finally:
        stop.set()
        informers.join(30)
        election.join(30)
    assert not leading.is_set()
    lease = emulator.get("leases", lease_namespace, "interference-scheduler")
    assert lease is not None and not lease["spec"].get("holderIdentity"), "lease not released"


def exercise_dry_run_scheduler(emulator: EmulatorThread, lease_namespace: str) -> None:
    """The real loop with ``dry_run``, leading through a real Lease, over the real adapter:
    it decides a pod that fits, one that fits nowhere and one asking for an unsupported
    field, records each decision, and writes nothing else to the API."""
    emulator.put("nodes", node_obj("gpu-node-1"))
    emulator.put("pods", pod("fits", namespace="shop"))
    too_big = pod("too-big", namespace="shop")
    too_big["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "64"}}
    emulator.put("pods", too_big)
    unsupported = pod("with-pod-affinity", namespace="shop")
    unsupported["spec"]["affinity"] = {"podAffinity": {}}
    emulator.put("pods", unsupported)
    api = api_client(emulator.url)
    leading, stop, decisions = threading.Event(), threading.Event(), MemoryDecisions()
    loop = SchedulingLoop(
        KubernetesCluster(api),
        MemorySignals(),
        decisions,
        CycleSettings(),
        LoopSettings(dry_run=True),
        leading,
        SchedulerMetrics(CollectorRegistry()),
    )
    elector = LeaderElector(
        api,
        LeaderElectionSettings(
            namespace=lease_namespace, lease_duration_s=4, renew_deadline_s=3, retry_period_s=1
        ),
        leading,
        identity="scheduler-0",
    )
    threads = [
        threading.Thread(target=loop.run, args=(stop,), daemon=True),
        threading.Thread(target=elector.run, args=(stop,), daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        wait_until(
            lambda: {d.pod for d in decisions.items} == {"fits", "too-big", "with-pod-affinity"},
            "a decision record for each pod",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert {d.pod: d.result for d in decisions.items}["too-big"] == "unschedulable"
    assert decisions.last("fits", "shop").result == "dry_run"


def exercise_extender(emulator: EmulatorThread, workdir: Path) -> None:
    """The real ``interference-scheduler extender`` process object over the real adapter:
    it lists and watches nodes and pods, answers a filter and a prioritize call (Redis
    is unreachable: signals and decision records fail without any API call), warns about
    a pod's annotation typo in an Event (and again, a repeat of the series, when its owner
    makes another) and tells about an invalid configuration file in an Event on its
    ConfigMap."""
    emulator.put("nodes", node_obj("gpu-node-1"))
    emulator.put("pods", pod("pending-a", namespace="shop"))
    typo = pod("typo", namespace="shop")
    typo["metadata"]["annotations"] = {"interference.io/max-runq-p99": "500"}
    typo = emulator.put("pods", typo)  # with the UID the informers know it by
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "e", "cluster": {"server": emulator.url}}],
                "users": [{"name": "e", "user": {}}],
                "contexts": [{"name": "e", "context": {"cluster": "e", "user": "e"}}],
                "current-context": "e",
            }
        )
    )
    config = parse_config(
        {
            "kubernetes": {"kubeconfig": str(kubeconfig)},
            "redis": {
                "url": f"redis://127.0.0.1:{free_port()}/0",
                "socket_timeout_s": 0.5,
            },
            "http": {"host": "127.0.0.1", "port": free_port()},
            # the verbs' port without TLS: this test is about the API calls it makes
            "extender": {"host": "127.0.0.1", "port": free_port(), "plaintext": True},
        }
    )
    config_path = workdir / "extender.yaml"
    config_path.write_text("reload_interval_s: 0.1\n")
    process = ExtenderProcess(
        config, str(config_path), env={"POD_NAMESPACE": "interference-system"}
    )
    stop = threading.Event()
    thread = threading.Thread(target=process.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: process.extender_http is not None and process.cache.synced(), "the extender"
        )
        emulator.put("pods", pod("pending-b", namespace="shop"))
        wait_until(lambda: process.cache.pending_pod("shop/pending-b") is not None, "a watch event")
        body = json.dumps({"Pod": pod("pending-a", namespace="shop"), "NodeNames": ["gpu-node-1"]})
        assert process.extender_http is not None
        for verb in ("filter", "prioritize"):
            request = urllib.request.Request(
                f"http://127.0.0.1:{process.extender_http.port}/{verb}",
                body.encode(),
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert answer.status == 200
        wait_until(lambda: process.cache.pending_pod("shop/typo") is not None, "the typo pod")
        port = process.extender_http.port

        def filter_with_annotation(key: str) -> None:
            typo["metadata"]["annotations"] = {key: "500"}
            edited = emulator.put("pods", typo)  # a new resourceVersion, the same UID
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/filter",
                json.dumps({"Pod": edited, "NodeNames": ["gpu-node-1"]}).encode(),
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert answer.status == 200

        filter_with_annotation("interference.io/max-runq-p99")
        wait_until(lambda: ("POST", "shop") in event_writes(emulator), "the UnknownAnnotation")
        filter_with_annotation("interference.io/max-reclaim-stall")  # another: the same series
        wait_until(lambda: ("PATCH", "shop") in event_writes(emulator), "the series' repeat")
        config_path.write_text("reload_interval_s: soon\n")  # an invalid reload: an Event
        wait_until(
            lambda: ("POST", "interference-system") in event_writes(emulator),
            "the InvalidConfiguration Event",
        )
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()


def event_writes(emulator: EmulatorThread) -> set[tuple[str, str]]:
    """(method, namespace) of the Event requests the emulator served."""
    return {
        (method, path.split("/namespaces/")[1].split("/")[0])
        for method, path, _, _ in emulator.requests()
        if path.startswith("/apis/events.k8s.io/") and "/namespaces/" in path
    }


KUBELET_SUBRESOURCES = {
    "pods": "pods",
    "healthz": "healthz",
    "configz": "configz",
    "stats": "stats",
    "metrics": "metrics",
    "logs": "log",
    "spec": "spec",
    "checkpoint": "checkpoint",
}
KUBELET_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update"}
KUBELET_VERBS |= {"PATCH": "patch", "DELETE": "delete"}


def kubelet_permission(method: str, path: str) -> Permission:
    """How a kubelet (v1.36, fine-grained authorisation: pkg/kubelet/server/auth.go)
    authorises a request: the nodes subresource its path names, nodes/proxy for any other
    path (exec, attach, port-forward, run among them); the verb from the method."""
    first = path.lstrip("/").split("/")[0].split("?")[0]
    resource = "nodes/" + KUBELET_SUBRESOURCES.get(first, "proxy")
    return Permission("", resource, KUBELET_VERBS[method], ALL_NAMESPACES)


def exercise_agent(node_name: str, directory: Path) -> set[Permission]:
    """The agent's pod directory against a kubelet: every request it made, as the kubelet
    authorises it. The agent makes no API server request."""
    from node_agent.kubelet_pods import KubeletPodDirectory, KubeletSettings
    from tests.node_agent.test_kubelet_pods import TOKEN, FakeKubelet, pod, self_signed

    kubelet = FakeKubelet(*self_signed(directory, "127.0.0.1"))
    token = directory / "token"
    token.write_text(TOKEN)
    try:
        kubelet.pods = [pod("uid-1", "api-0", node=node_name)]
        agent = KubeletPodDirectory(KubeletSettings(kubelet.url, str(token)), node_name)
        assert agent.list_once() == 1 and agent.lookup("uid-1") == ("shop", "api-0")
    finally:
        kubelet.close()
    assert kubelet.requests
    return {kubelet_permission(method, path) for method, path, _ in kubelet.requests}


@pytest.fixture(scope="module")
def scheduler_calls() -> set[Permission]:
    objects = render(kustomizations()["base"])
    deployment = find(objects, "Deployment", "interference-scheduler")
    env = {e["name"]: e for e in container(deployment, "scheduler")["env"]}
    # The elector puts its Lease in $POD_NAMESPACE: the namespace the scheduler runs in.
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    with running_emulator() as server:
        exercise_scheduler(server, deployment["metadata"]["namespace"])
        return used_permissions(server)


@pytest.fixture(scope="module")
def dry_run_scheduler_calls() -> set[Permission]:
    objects = render(kustomizations()["dry-run"])
    deployment = find(objects, "Deployment", "interference-scheduler")
    with running_emulator() as server:
        exercise_dry_run_scheduler(server, deployment["metadata"]["namespace"])
        return used_permissions(server)


@pytest.fixture(scope="module")
def extender_scheduler_calls(tmp_path_factory: pytest.TempPathFactory) -> set[Permission]:
    with running_emulator() as server:
        exercise_extender(server, tmp_path_factory.mktemp("extender"))
        return used_permissions(server)


def exercise_issuer(emulator: EmulatorThread) -> None:
    """The credential issuer's reviewer, pod binding and Node Events: one TokenReview, one
    read of the token's pod and of its Node, one cut-off's Event (the emulator's answers do
    not matter, only the requests made)."""
    kubernetes = api_client(emulator.url)
    reviewer = KubernetesTokenReviewer(kubernetes, DEFAULT_AUDIENCE, 5.0)
    with contextlib.suppress(TokenRejected, ReviewUnavailable):
        reviewer.review("a-projected-token")
    agent = emulator.put("pods", pod("agent-x", "interference-agent", node="gpu-node-1"))
    answer = KubernetesPodBinding(kubernetes, 5.0).check(
        "interference-agent", "agent-x", agent["metadata"]["uid"], "gpu-node-1"
    )
    assert answer[0] == "unknown_node"  # the pod read and matched, then the Node read
    metrics = NodeEventMetrics(CollectorRegistry())
    events = KubernetesNodeEvents(kubernetes, metrics, 5.0)
    events.cut_off("gpu-node-1", "no_expiry", 300.0)
    events.close()  # after the queued Event is written
    assert metrics.written._value.get() + metrics.failed._value.get() == 1


@pytest.fixture(scope="module")
def issuer_calls() -> set[Permission]:
    with running_emulator() as server:
        exercise_issuer(server)
        calls = used_permissions(server)
    assert calls == {
        Permission("authentication.k8s.io", "tokenreviews", "create", "*"),
        Permission("", "pods", "get", "interference-agent"),
        Permission("", "nodes", "get", "*"),
        Permission("events.k8s.io", "events", "create", "default"),
    }
    return calls


@pytest.mark.parametrize("name", sorted(kustomizations()))
def test_issuer_rbac_is_exactly_what_it_calls(name: str, issuer_calls: set[Permission]) -> None:
    """TokenReviews, the agents' pods and Nodes by name, Events in default (the Nodes'):
    not system:auth-delegator, which adds SubjectAccessReviews."""
    granted = granted_permissions(
        render(kustomizations()[name]), "Deployment", "interference-credentials"
    )
    missing, extra = compare(issuer_calls, granted)
    assert missing == [] and extra == [], f"missing: {missing}\nextra: {extra}"


@pytest.fixture(scope="module")
def agent_calls(tmp_path_factory: pytest.TempPathFactory) -> set[Permission]:
    calls = exercise_agent("gpu-node-1", tmp_path_factory.mktemp("kubelet"))
    assert calls == {Permission(*KUBELET_PERMISSION, ALL_NAMESPACES)}
    return calls


def test_the_kubelet_mapping_tells_pods_from_exec() -> None:
    assert kubelet_permission("GET", "/pods") == Permission("", "nodes/pods", "get", "*")
    assert kubelet_permission("POST", "/exec/ns/pod/c?command=sh").resource == "nodes/proxy"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(kustomizations()))
def test_scheduler_rbac_is_exactly_what_it_calls(
    name: str,
    scheduler_calls: set[Permission],
    dry_run_scheduler_calls: set[Permission],
    extender_scheduler_calls: set[Permission],
) -> None:
    """The dry-run overlay's scheduler binds nothing and writes no Events or conditions,
    and the extender overlay's reads what its informers read and writes only Events
    (kube-scheduler binds), so each is granted only what that mode calls."""
    granted = granted_permissions(
        render(kustomizations()[name]), "Deployment", "interference-scheduler"
    )
    used = {"dry-run": dry_run_scheduler_calls, "extender": extender_scheduler_calls}.get(
        name, scheduler_calls
    )
    missing, extra = compare(used, granted)
    assert missing == [] and extra == [], f"missing: {missing}\nextra: {extra}"


@pytest.fixture(scope="module")
def degrader_calls() -> set[Permission]:
    """The agent's Events writer (deploy/components/degrade), as the degrader uses it."""
    with running_emulator() as server:
        events = KubernetesEvents(client.EventsV1Api(api_client(server.url)), "gpu-node-1")
        events.emit(PodMetrics("shop", "hog", uid="u1"), "InterferenceDegraded", "why", True)
        assert events.written == 1
        used = used_permissions(server)
    assert {(p.group, p.resource, p.verb) for p in used} == {
        (group, resource, verb) for group, resource, verbs in EVENT_PERMISSIONS for verb in verbs
    }
    return used


@pytest.mark.parametrize("name", sorted(kustomizations()))
def test_agent_rbac_is_exactly_what_it_calls(
    name: str, agent_calls: set[Permission], degrader_calls: set[Permission]
) -> None:
    """With deploy/components/degrade the agent also writes Events on pods."""
    granted = granted_permissions(render(kustomizations()[name]), "DaemonSet", "interference-agent")
    used = agent_calls | degrader_calls if name == "degrade" else agent_calls
    missing, extra = compare(used, granted)
    assert missing == [] and extra == [], f"missing: {missing}\nextra: {extra}"


@pytest.mark.slow
def test_the_scheduler_declares_the_permissions_it_uses(scheduler_calls: set[Permission]) -> None:
    """REQUIRED_PERMISSIONS + LEASE_PERMISSIONS + EVICTION_PERMISSIONS +
    PREEMPTION_PERMISSIONS (the code's own lists, used in its Forbidden messages) match
    the recorded calls."""
    declared = {
        (group, resource, verb)
        for group, resource, verbs in (
            *REQUIRED_PERMISSIONS,
            *LEASE_PERMISSIONS,
            *EVICTION_PERMISSIONS,
            *JOURNAL_PERMISSIONS,
            *PREEMPTION_PERMISSIONS,
        )
        for verb in verbs
    }
    assert declared == {(p.group, p.resource, p.verb) for p in scheduler_calls}


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/nodes", {}, Permission("", "nodes", "list", "*")),
        ("GET", "/api/v1/pods", {"watch": "true"}, Permission("", "pods", "watch", "*")),
        (
            "POST",
            "/api/v1/namespaces/shop/pods/p/binding",
            {},
            Permission("", "pods/binding", "create", "shop"),
        ),
        (
            "PATCH",
            "/api/v1/namespaces/shop/pods/p/status",
            {},
            Permission("", "pods/status", "patch", "shop"),
        ),
        (
            "POST",
            "/apis/events.k8s.io/v1/namespaces/shop/events",
            {},
            Permission("events.k8s.io", "events", "create", "shop"),
        ),
        (
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/x/leases/l",
            {},
            Permission("coordination.k8s.io", "leases", "get", "x"),
        ),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/x/leases/l",
            {},
            Permission("coordination.k8s.io", "leases", "update", "x"),
        ),
        (
            "DELETE",
            "/api/v1/namespaces/x/pods",
            {},
            Permission("", "pods", "deletecollection", "x"),
        ),
    ],
    ids=["list", "watch", "binding", "status", "event", "get-lease", "update-lease", "deletecoll"],
)
def test_permission_of_a_request(
    method: str, path: str, query: dict[str, str], expected: Permission
) -> None:
    assert permission_of(method, path, query) == expected


def test_compare_finds_missing_and_extra_grants() -> None:
    used = {Permission("", "pods", "list", "*"), Permission("", "pods/binding", "create", "shop")}
    granted = {Permission("", "pods", "list", "*"), Permission("", "nodes", "get", "*")}
    assert compare(used, granted) == (
        ["Permission(group='', resource='pods/binding', verb='create', namespace='shop')"],
        ["Permission(group='', resource='nodes', verb='get', namespace='*')"],
    )
