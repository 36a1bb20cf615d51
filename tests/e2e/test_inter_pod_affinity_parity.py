"""InterPodAffinity parity with the real kube-scheduler, on a real kube-apiserver.

Each case has three nodes, one per zone (zone values unique to the case), pods already
bound to them, and an incoming pod that selects the case's nodes. kube-scheduler (default
plugins, a profile of its own) schedules the incoming pod; our cycle decides for the same
pod over the same objects read back from the API server — so what the API server does to
them counts too: ``matchLabelKeys`` merged into the label selector at creation, the
``kubernetes.io/metadata.name`` label on every namespace. Every case is built so that one
zone wins by InterPodAffinity alone (its weight-2 score outweighs what the other scores
can differ by on equal, lightly used nodes); both schedulers must pick that node, or both
leave the pod pending.
"""

from __future__ import annotations

import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.control_plane import Assets
from tests.e2e.kube import Kube, Obj
from tests.e2e.parity import PENDING, cluster_table, decide, kube_decision, kube_scheduler

pytestmark = [pytest.mark.e2e]

SCHEDULER = "e2e-parity"
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
CASE_LABEL = "e2e-parity-case"
NAMESPACES = {"parity-a": {"team": "a"}, "parity-b": {"team": "b"}}
TEAM_A = {"matchLabels": {"team": "a"}}
TIMEOUT_S = 60.0


def _term(app: str, key: str = ZONE, **extra: Any) -> Obj:
    return {"topologyKey": key, "labelSelector": {"matchLabels": {"app": app}}, **extra}


def _required(kind: str, term: Obj) -> Obj:
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def _preferred(kind: str, weight: int, term: Obj) -> Obj:
    items = [{"weight": weight, "podAffinityTerm": term}]
    return {kind: {"preferredDuringSchedulingIgnoredDuringExecution": items}}


@dataclass(frozen=True)
class Placed:
    zone: int
    """1–3: which of the case's nodes it is bound to."""
    labels: dict[str, str]
    namespace: str = "parity-b"
    affinity: Obj = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    name: str
    placed: tuple[Placed, ...]
    labels: dict[str, str]
    affinity: Obj
    expected_zone: int | None
    """The zone both schedulers must choose; ``None``: the pod stays pending."""
    namespace: str = "parity-b"


CASES = (
    Case(
        "preferred-affinity-through-a-namespace-selector",
        (Placed(2, {"app": "db"}, "parity-a"), Placed(1, {"app": "db"}, "parity-b")),
        {"app": "web"},
        _preferred("podAffinity", 50, _term("db", namespaceSelector=TEAM_A)),
        2,
    ),
    Case(
        "preferred-anti-affinity-on-hostname",
        (Placed(1, {"app": "web"}), Placed(2, {"app": "web"})),
        {"app": "web"},
        _preferred("podAntiAffinity", 80, _term("web", HOSTNAME)),
        3,
    ),
    Case(
        "placed-pods-preferred-terms-score-the-incoming-pod",
        (
            Placed(1, {"app": "x"}, affinity=_preferred("podAntiAffinity", 100, _term("y"))),
            Placed(3, {"app": "x"}, affinity=_preferred("podAffinity", 30, _term("y"))),
        ),
        {"app": "y"},
        {},
        3,
    ),
    Case(
        "placed-pods-required-affinity-counts-with-hard-pod-affinity-weight",
        (Placed(2, {"app": "web"}, affinity=_required("podAffinity", _term("cache"))),),
        {"app": "cache"},
        {},
        2,
    ),
    Case(
        "required-anti-affinity-through-a-namespace-selector",
        (Placed(1, {"app": "db"}, "parity-a"), Placed(2, {"app": "db"}, "parity-a")),
        {"app": "db"},
        _required("podAntiAffinity", _term("db", HOSTNAME, namespaceSelector=TEAM_A)),
        3,
    ),
    Case(
        "match-label-keys-merged-by-the-api-server",
        (Placed(1, {"app": "db", "rev": "1"}), Placed(3, {"app": "db", "rev": "2"})),
        {"app": "db", "rev": "2"},
        _preferred("podAffinity", 60, _term("db", matchLabelKeys=["rev"])),
        3,
    ),
    Case(
        "required-affinity-to-a-namespace-no-pod-is-in-stays-pending",
        (Placed(1, {"app": "db"}, "parity-a"),),
        {"app": "web"},
        _required("podAffinity", _term("db", namespaceSelector={"matchLabels": {"team": "c"}})),
        None,
    ),
)


def _node(case: int, zone: int) -> str:
    return f"parity-{case}-z{zone}"


def _pod_body(name: str, namespace: str, labels: dict[str, str], affinity: Obj, **spec: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "schedulerName": SCHEDULER,
            "affinity": affinity,
            "containers": [{"name": "c", "image": "registry.invalid/pause:1",
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
            **spec,
        },
    }  # fmt: skip


def _create(kube: Kube, body: Obj) -> Obj:
    namespace = body["metadata"]["namespace"]
    created: Obj = kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    return created


@pytest.fixture(scope="module")
def cluster(assets: Assets, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """The cases' namespaces, nodes and placed pods, and a kube-scheduler that has seen
    them (it bound a pod created after them)."""
    if assets.kube_scheduler is None:
        pytest.skip("kube-scheduler is not among the assets (KUBEBUILDER_ASSETS or ../shared/k8s)")
    workdir = tmp_path_factory.mktemp("parity")
    for name, labels in NAMESPACES.items():
        try:
            kube.request(
                "POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": labels}}
            )
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise
    nodes = [_node(i, z) for i in range(len(CASES)) for z in (1, 2, 3)]
    for i, case in enumerate(CASES):
        for z in (1, 2, 3):
            labels = {ZONE: f"parity-{i}-{z}", HOSTNAME: _node(i, z), CASE_LABEL: str(i)}
            kube.create_node(_node(i, z), cpu="8", memory="32Gi", labels=labels)
        for j, placed in enumerate(case.placed):
            body = _pod_body(f"placed-{i}-{j}", placed.namespace, placed.labels, placed.affinity,
                             nodeName=_node(i, placed.zone))  # fmt: skip
            _create(kube, body)
    sentinel = _pod_body("sentinel", "parity-b", {}, {}, nodeSelector={CASE_LABEL: "0"})
    try:
        with kube_scheduler(assets, kube, workdir, SCHEDULER, sentinel, TIMEOUT_S):
            yield kube
    finally:
        for namespace in NAMESPACES:
            for pod in kube.pods(namespace):
                kube.delete_pod(namespace, pod["metadata"]["name"])
        for node in nodes:
            kube.delete_node(node)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.name for c in CASES])
def test_inter_pod_affinity_matches_kube_scheduler(cluster: Kube, index: int) -> None:
    case = CASES[index]
    body = _pod_body(f"incoming-{index}", case.namespace, case.labels, case.affinity,
                     nodeSelector={CASE_LABEL: str(index)})  # fmt: skip
    table = cluster_table(cluster)  # before kube-scheduler can bind the pod
    as_written = decide(table, body)[0]  # our parser merges matchLabelKeys itself
    created = _create(cluster, body)
    ours = decide(table, created)[0]  # as stored, with what the API server merged
    theirs = kube_decision(cluster, case.namespace, created["metadata"]["name"], TIMEOUT_S)[0]
    expected = PENDING if case.expected_zone is None else _node(index, case.expected_zone)
    assert (theirs, ours, as_written) == (expected, expected, expected)
