"""Volume filters' parity with the real kube-scheduler, on a real kube-apiserver.

Each case has three nodes, one per zone (values unique to the case), and an incoming pod
that selects the case's nodes and uses claims made for it. kube-scheduler (default
plugins, a profile of its own) schedules the incoming pod; our cycle decides for the same
pod over the same objects read back from the API server. Both must choose the same node,
or both leave the pod pending with the same ``FailedScheduling`` reasons (kube-scheduler's
message goes on with what its PostFilter plugins say: preemption, DRA). No PV controller
runs: a bound claim carries ``spec.volumeName`` and ``pv.kubernetes.io/bind-completed``
as that controller leaves it.

Unbound ``WaitForFirstConsumer`` claims are left out: kube-scheduler binds them, standalone
mode refuses them (tests/e2e/test_volumes.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.control_plane import Assets
from tests.e2e.kube import Kube, Obj
from tests.e2e.parity import PENDING, cluster_table, decide, kube_decision, kube_scheduler

pytestmark = [pytest.mark.e2e]

SCHEDULER = "e2e-volume-parity"
NAMESPACE = "volume-parity"
ZONE = "topology.kubernetes.io/zone"
BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
CASE_LABEL = "e2e-volume-parity-case"
DRIVER = "parity.csi.example.com"
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Volume:
    """A PersistentVolume and the claim bound to it (``bound=False``: the claim only
    names it, as a prebound claim the PV controller has not finished)."""

    claim: str
    on_node: int | None = None
    """Node affinity to the case's node 1–3 (hostname)."""
    zones: tuple[int, ...] = ()
    """Node affinity to these zones of the case."""
    zone_label: tuple[str, int] | None = None
    """A (label key, zone) label on the PV, for VolumeZone."""
    csi: bool = False
    access_mode: str = "ReadWriteOnce"
    bound: bool = True


@dataclass(frozen=True)
class Case:
    name: str
    volumes: tuple[Volume, ...] = ()
    unbound_claims: tuple[str, ...] = ()
    """Claims without a volume and without a class (immediate binding)."""
    deleting_claims: tuple[str, ...] = ()
    """Bound claims deleted while a finalizer keeps them."""
    uses: tuple[str, ...] = ()
    """Claims the incoming pod mounts, in order."""
    placed: tuple[tuple[int, tuple[str, ...]], ...] = ()
    """Pods already on node 1–3, with the claims they mount."""
    csi_limits: dict[int, int] = field(default_factory=dict)
    """Node 1–3 → attach limit of :data:`DRIVER` in its CSINode."""
    expected_node: int | None = None
    ephemeral: int = 0
    """Generic ephemeral volumes of the incoming pod, whose claims no controller creates."""


CASES = (
    Case("bound-claim-pv-on-node-2", (Volume("c0", on_node=2),), uses=("c0",), expected_node=2),
    Case(
        "pv-zones-affinity-and-zone-label",
        (Volume("c1", zones=(1, 2), zone_label=(ZONE, 2)),),
        uses=("c1",),
        expected_node=2,
    ),
    Case(
        "beta-zone-label-on-pv-read-from-ga-node-label",
        (Volume("c2", zone_label=(BETA_ZONE, 3)),),
        uses=("c2",),
        expected_node=3,
    ),
    Case(
        "two-claims-pvs-on-different-nodes",
        (Volume("c3a", on_node=1), Volume("c3b", on_node=2)),
        uses=("c3a", "c3b"),
    ),
    Case("claim-not-found", uses=("missing",)),
    Case("unbound-immediate-claim", unbound_claims=("c5",), uses=("c5",)),
    Case("prebound-claim-not-bind-completed", (Volume("c6", bound=False),), uses=("c6",)),
    Case("claim-being-deleted", (Volume("c7"),), deleting_claims=("c7",), uses=("c7",)),
    Case(
        "read-write-once-pod-claim-in-use",
        (Volume("c8", access_mode="ReadWriteOncePod"),),
        uses=("c8",),
        placed=((1, ("c8",)),),
    ),
    Case(
        "volume-zone-conflict",
        (Volume("c10", on_node=2, zone_label=(ZONE, 1)),),
        uses=("c10",),
    ),
    Case(
        "csi-attach-limits-everywhere",
        (Volume("c11-old", csi=True), Volume("c11-other", csi=True), Volume("c11-new", csi=True)),
        uses=("c11-new",),
        placed=((1, ("c11-old",)), (2, ("c11-other",))),
        csi_limits={1: 1, 2: 1, 3: 0},
    ),
    Case("ephemeral-claim-not-created-yet", ephemeral=1),
    Case(
        "csi-attach-limits",
        (Volume("c9-old", csi=True), Volume("c9-other", csi=True), Volume("c9-new", csi=True)),
        uses=("c9-new",),
        placed=((1, ("c9-old",)), (2, ("c9-other",))),
        csi_limits={1: 1, 2: 1},
        expected_node=3,
    ),
)


def _node(case: int, index: int) -> str:
    return f"vparity-{case}-n{index}"


def _zone(case: int, index: int) -> str:
    return f"vparity-{case}-{index}"


def _pod_body(name: str, claims: tuple[str, ...], ephemeral: int = 0, **spec: Any) -> Obj:
    volumes: list[Obj] = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}}
                          for i, c in enumerate(claims)]  # fmt: skip
    template = {"spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                         "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    volumes += [{"name": f"e{i}", "ephemeral": {"volumeClaimTemplate": template}}
                for i in range(ephemeral)]  # fmt: skip
    return {
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "schedulerName": SCHEDULER,
            "containers": [{"name": "c", "image": "registry.invalid/pause:1",
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
            "volumes": volumes,
            **spec,
        },
    }  # fmt: skip


def _create_volume(kube: Kube, case: int, volume: Volume) -> None:
    name = f"vparity-{volume.claim}"
    terms = []
    if volume.on_node is not None:
        node = _node(case, volume.on_node)
        terms.append({"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [node]}]})
    if volume.zones:
        values = [_zone(case, z) for z in volume.zones]
        terms.append({"matchExpressions": [{"key": ZONE, "operator": "In", "values": values}]})
    spec: Obj = {
        "capacity": {"storage": "1Gi"},
        "accessModes": [volume.access_mode],
        "storageClassName": "",
    }
    if volume.csi:
        spec["csi"] = {"driver": DRIVER, "volumeHandle": name}
    else:
        spec["hostPath"] = {"path": f"/mnt/{name}"}
    if terms:  # ANDed in one term, as the cases need
        expressions = [e for t in terms for e in t["matchExpressions"]]
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [
            {"matchExpressions": expressions}]}}  # fmt: skip
    labels = {} if volume.zone_label is None else {
        volume.zone_label[0]: _zone(case, volume.zone_label[1])}  # fmt: skip
    kube.request("POST", "/api/v1/persistentvolumes",
                 {"metadata": {"name": name, "labels": labels}, "spec": spec})  # fmt: skip
    metadata: Obj = {"name": volume.claim, "namespace": NAMESPACE}
    if volume.bound:
        metadata["annotations"] = {"pv.kubernetes.io/bind-completed": "yes"}
    claim = {
        "metadata": metadata,
        "spec": {"accessModes": [volume.access_mode], "storageClassName": "", "volumeName": name,
                 "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip
    kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims", claim)


@pytest.fixture(scope="module")
def cluster(assets: Assets, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """The cases' nodes, volumes, claims, CSINodes and placed pods, and a kube-scheduler
    that has seen them (it bound a pod created after them)."""
    if assets.kube_scheduler is None:
        pytest.skip("kube-scheduler is not among the assets (KUBEBUILDER_ASSETS or ../shared/k8s)")
    workdir = tmp_path_factory.mktemp("volume-parity")
    kube.ensure_namespace(NAMESPACE)
    claims = f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims"
    nodes = [_node(i, n) for i in range(len(CASES)) for n in (1, 2, 3)]
    for i, case in enumerate(CASES):
        for n in (1, 2, 3):
            labels = {ZONE: _zone(i, n), HOSTNAME: _node(i, n), CASE_LABEL: str(i)}
            kube.create_node(_node(i, n), cpu="8", memory="32Gi", labels=labels)
            if n in case.csi_limits:
                kube.request("POST", "/apis/storage.k8s.io/v1/csinodes", {
                    "metadata": {"name": _node(i, n)},
                    "spec": {"drivers": [{"name": DRIVER, "nodeID": _node(i, n),
                                          "allocatable": {"count": case.csi_limits[n]}}]},
                })  # fmt: skip
        for volume in case.volumes:
            _create_volume(kube, i, volume)
        for claim in case.unbound_claims:
            kube.request("POST", claims, {"metadata": {"name": claim}, "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                "resources": {"requests": {"storage": "1Gi"}}}})  # fmt: skip
        for claim in case.deleting_claims:
            finalizer = {"metadata": {"finalizers": ["e2e.example.com/keep"]}}
            kube.request("PATCH", f"{claims}/{claim}", finalizer, "application/merge-patch+json")
            kube.request("DELETE", f"{claims}/{claim}")
        for j, (n, used) in enumerate(case.placed):
            body = _pod_body(f"placed-{i}-{j}", used, nodeName=_node(i, n))
            kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body)
    sentinel = _pod_body("sentinel", (), nodeSelector={CASE_LABEL: "0"})
    try:
        with kube_scheduler(assets, kube, workdir, SCHEDULER, sentinel, TIMEOUT_S):
            yield kube
    finally:
        for pod in kube.pods(NAMESPACE):
            kube.delete_pod(NAMESPACE, pod["metadata"]["name"])
        for case in CASES:
            for claim in case.deleting_claims:
                release = {"metadata": {"finalizers": None}}
                kube.request("PATCH", f"{claims}/{claim}", release, "application/merge-patch+json")
        for claim in kube.request("GET", claims)["items"]:
            kube.request("DELETE", f"{claims}/{claim['metadata']['name']}")
        for volume in kube.request("GET", "/api/v1/persistentvolumes")["items"]:
            if volume["metadata"]["name"].startswith("vparity-"):
                kube.request("DELETE", f"/api/v1/persistentvolumes/{volume['metadata']['name']}")
        for node in nodes:
            kube.delete_node(node)
            if any(n == node for n in _csi_nodes()):
                kube.request("DELETE", f"/apis/storage.k8s.io/v1/csinodes/{node}")


def _csi_nodes() -> list[str]:
    return [_node(i, n) for i, case in enumerate(CASES) for n in case.csi_limits]


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.name for c in CASES])
def test_volume_filters_match_kube_scheduler(cluster: Kube, index: int) -> None:
    case = CASES[index]
    body = _pod_body(
        f"incoming-{index}", case.uses, case.ephemeral, nodeSelector={CASE_LABEL: str(index)}
    )
    table = cluster_table(cluster)  # before kube-scheduler can bind the pod
    created = cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body)
    ours = decide(table, created)
    theirs = kube_decision(cluster, NAMESPACE, created["metadata"]["name"], TIMEOUT_S)
    expected = PENDING if case.expected_node is None else _node(index, case.expected_node)
    assert theirs[0] == expected, theirs
    assert ours[0] == theirs[0]
    # kube-scheduler's message goes on with its PostFilter's (preemption, DRA) after a space
    assert theirs[1] == ours[1] or theirs[1].startswith(ours[1] + " "), (ours[1], theirs[1])
