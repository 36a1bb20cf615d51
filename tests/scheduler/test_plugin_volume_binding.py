"""Volumes: kube-scheduler's VolumeRestrictions, VolumeBinding and VolumeZone verdicts for
claims standalone mode can judge without binding (scheduler/plugins/volume_binding.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from scheduler.adapters.object_builders import (
    claim_object,
    csi_node_object,
    storage_class_object,
    volume_object,
)
from scheduler.api.objects import PodVolumeClaim
from scheduler.api.pods import parse_pod
from scheduler.api.storage import parse_claim, parse_csi_node, parse_storage_class, parse_volume
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.queue import QueueState
from scheduler.cycle.settings import CycleSettings
from scheduler.plugins.base import CycleState, PodRejection
from scheduler.plugins.volume_binding import (
    FILTER,
    MAX_VOLUME_COUNT,
    NODE_CONFLICT,
    PV_NOT_EXIST,
    RWOP_CONFLICT,
    UNBOUND_IMMEDIATE,
    ZONE_CONFLICT,
    check_claims,
    volume_filter,
)
from scheduler.signals.table import NodeTable
from tests.builders import node_obj, pod_obj, table_of
from tests.scheduler.runtime_helpers import LoopHarness

ZONE = "topology.kubernetes.io/zone"
BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"


def pvc_volume(claim: str, name: str = "data") -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}


def ephemeral_volume(name: str = "scratch") -> dict[str, Any]:
    return {"name": name, "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}


def pod_with(*volumes: dict[str, Any], name: str = "p") -> dict[str, Any]:
    return pod_obj(name, requests={"cpu": "100m"}, volumes=list(volumes))


def term(key: str, operator: str, *values: str) -> dict[str, Any]:
    """One nodeSelectorTerm with one expression."""
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


def volumes_table(
    nodes: Iterable[dict[str, Any]],
    objects: Iterable[dict[str, Any]] = (),
    placed: Iterable[tuple[dict[str, Any], str]] = (),
) -> NodeTable:
    """A table with nodes, claims / PersistentVolumes / StorageClasses and placed pods."""
    table = table_of(nodes, placed)
    for obj in objects:
        if obj["kind"] == "PersistentVolumeClaim":
            table.volumes.upsert_claim(parse_claim(obj))
        elif obj["kind"] == "PersistentVolume":
            table.volumes.upsert_volume(parse_volume(obj))
        elif obj["kind"] == "CSINode":
            table.volumes.upsert_csi_node(parse_csi_node(obj))
        else:
            table.volumes.upsert_storage_class(parse_storage_class(obj))
    return table


def verdicts(table: NodeTable, pod: dict[str, Any]) -> list[list[str]]:
    """Per node, the volume filter's reasons (``[]``: passes)."""
    info = parse_pod(pod)
    check = check_claims(info, table.volumes)
    assert check.rejection is None and not check.refused, check
    result = volume_filter(table, info, check)
    if result is None:
        return [[] for _ in range(len(table))]
    return [result.reasons_for(row) for row in range(len(table))]


THREE_NODES = [
    node_obj("n1", labels={ZONE: "a"}),
    node_obj("n2", labels={ZONE: "b"}),
    node_obj("n3", labels={ZONE: "b", "disk": "ssd"}),
]


@pytest.mark.parametrize(
    ("terms", "allowed"),
    [
        (None, ["n1", "n2", "n3"]),
        ([term(HOSTNAME, "In", "n2")], ["n2"]),
        ([term(ZONE, "In", "b")], ["n2", "n3"]),
        ([term(ZONE, "In", "a"), term("disk", "Exists")], ["n1", "n3"]),
        ([term(ZONE, "NotIn", "a")], ["n2", "n3"]),
        ([term(ZONE, "In", "bad value!"), term(HOSTNAME, "In", "n1")], ["n1"]),
        ([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}], []),
        ([{"matchExpressions": []}], []),
    ],
    ids=[
        "no-node-affinity",
        "hostname",
        "zone",
        "terms-ored",
        "not-in",
        "invalid-term-matches-nothing-others-count",
        "match-fields-see-labels-only",
        "empty-term-matches-nothing",
    ],
)
def test_bound_claim_pv_node_affinity_conflict_rejects_node(
    terms: list[dict[str, Any]] | None, allowed: list[str]
) -> None:
    table = volumes_table(
        THREE_NODES,
        [claim_object("data", volume_name="pv-1"), volume_object("pv-1", node_affinity=terms)],
    )
    found = verdicts(table, pod_with(pvc_volume("data")))
    expected = [[] if name in allowed else [NODE_CONFLICT] for name in ("n1", "n2", "n3")]
    assert found == expected


def test_every_bound_claim_pv_node_affinity_must_hold() -> None:
    table = volumes_table(
        THREE_NODES,
        [
            claim_object("a", volume_name="pv-a"),
            claim_object("b", volume_name="pv-b"),
            volume_object("pv-a", node_affinity=[term(ZONE, "In", "b")]),
            volume_object("pv-b", node_affinity=[term("disk", "In", "ssd")]),
        ],
    )
    found = verdicts(table, pod_with(pvc_volume("a", "va"), pvc_volume("b", "vb")))
    assert found == [[NODE_CONFLICT], [NODE_CONFLICT], []]


def test_ephemeral_claim_bound_to_missing_pv_rejects_every_node() -> None:
    """VolumeZone reads persistentVolumeClaim volumes only, so an ephemeral volume's
    missing PV is VolumeBinding's per-node reason."""
    pod = pod_with(ephemeral_volume())
    claim = claim_object("p-scratch", volume_name="gone", owner_uid="uid-default-p")
    table = volumes_table(THREE_NODES, [claim])
    assert verdicts(table, pod) == [[PV_NOT_EXIST]] * 3


@pytest.mark.parametrize(
    ("pv_labels", "node_labels", "passes"),
    [
        ({ZONE: "a"}, {ZONE: "a"}, True),
        ({ZONE: "a"}, {ZONE: "b"}, False),
        ({ZONE: "a"}, {}, True),
        ({ZONE: "a"}, {"topology.kubernetes.io/region": "r1"}, False),
        ({ZONE: "a__b"}, {ZONE: "b"}, True),
        ({BETA_ZONE: "a"}, {ZONE: "a"}, True),
        ({BETA_ZONE: "a"}, {BETA_ZONE: "b", ZONE: "a"}, False),
        ({ZONE: "a__"}, {ZONE: "b"}, True),
        ({"topology.kubernetes.io/region": "r1"}, {ZONE: "a"}, False),
    ],
    ids=[
        "same-zone",
        "other-zone",
        "node-without-zone-labels-passes",
        "node-with-region-only-lacks-zone",
        "multi-zone-value",
        "beta-pv-label-read-from-ga-node-label",
        "beta-node-label-wins-over-ga",
        "empty-zone-in-list-ignores-the-label",
        "region-label-missing-on-node",
    ],
)
def test_volume_zone_conflict_rejects_node_outside_the_pv_zones(
    pv_labels: dict[str, str], node_labels: dict[str, str], passes: bool
) -> None:
    table = volumes_table(
        [node_obj("n1", labels=node_labels)],
        [claim_object("data", volume_name="pv-1"), volume_object("pv-1", labels=pv_labels)],
    )
    assert verdicts(table, pod_with(pvc_volume("data"))) == [[] if passes else [ZONE_CONFLICT]]


def test_node_counts_only_its_first_failing_volume_check() -> None:
    """A node failing VolumeBinding is not also counted under VolumeZone."""
    table = volumes_table(
        THREE_NODES,
        [
            claim_object("data", volume_name="pv-1"),
            volume_object("pv-1", node_affinity=[term(ZONE, "In", "b")], labels={ZONE: "a"}),
        ],
    )
    assert verdicts(table, pod_with(pvc_volume("data"))) == [
        [NODE_CONFLICT],
        [ZONE_CONFLICT],
        [ZONE_CONFLICT],
    ]


WFFC = storage_class_object("local", "WaitForFirstConsumer")
IMMEDIATE = storage_class_object("fast", "Immediate")


@pytest.mark.parametrize(
    ("volumes", "objects", "rejection"),
    [
        ([pvc_volume("data")], [], 'persistentvolumeclaim "data" not found'),
        (
            [ephemeral_volume()],
            [],
            "waiting for ephemeral volume controller to create the persistentvolumeclaim "
            '"p-scratch"',
        ),
        (
            [ephemeral_volume()],
            [claim_object("p-scratch", volume_name="pv-1", owner_uid="uid-other")],
            "PVC default/p-scratch was not created for pod default/p (pod is not owner)",
        ),
        (
            [ephemeral_volume()],
            [claim_object("p-scratch", volume_name="pv-1")],
            "PVC default/p-scratch was not created for pod default/p (pod is not owner)",
        ),
        (
            [pvc_volume("data")],
            [{**claim_object("data", volume_name="pv-1"), "status": {"phase": "Lost"}}],
            'persistentvolumeclaim "data" bound to non-existent persistentvolume "pv-1"',
        ),
        (
            [pvc_volume("data")],
            [
                {
                    **claim_object("data", volume_name="pv-1"),
                    "metadata": {
                        "name": "data",
                        "namespace": "default",
                        "deletionTimestamp": "2024-05-01T12:00:00Z",
                        "annotations": {"pv.kubernetes.io/bind-completed": "yes"},
                    },
                }
            ],
            'persistentvolumeclaim "data" is being deleted',
        ),
        ([pvc_volume("data")], [claim_object("data")], UNBOUND_IMMEDIATE),
        (
            [pvc_volume("data")],
            [IMMEDIATE, claim_object("data", storage_class="fast")],
            UNBOUND_IMMEDIATE,
        ),
        (
            [pvc_volume("data")],
            [claim_object("data", storage_class="not-yet-created")],
            UNBOUND_IMMEDIATE,
        ),
        (
            [pvc_volume("data")],
            [WFFC, claim_object("data", storage_class="local", volume_name="pv-1", bound=False)],
            UNBOUND_IMMEDIATE,
        ),
        (
            [pvc_volume("wait", "w"), pvc_volume("data")],
            [WFFC, claim_object("wait", storage_class="local"), claim_object("data")],
            UNBOUND_IMMEDIATE,
        ),
        (
            [pvc_volume("data")],
            [claim_object("data", volume_name="pv-gone")],
            'persistentvolume "pv-gone" not found',
        ),
        (
            [ephemeral_volume(), pvc_volume("data")],
            [],
            'persistentvolumeclaim "data" not found',
        ),
    ],
    ids=[
        "claim-not-found",
        "ephemeral-claim-not-created-yet",
        "ephemeral-claim-not-owned-by-pod",
        "ephemeral-claim-without-controller",
        "claim-lost",
        "claim-being-deleted",
        "unbound-claim-without-class-is-immediate",
        "unbound-immediate-class",
        "class-not-found-binds-immediately",
        "prebound-claim-without-bind-completed",
        "immediate-wins-over-wait-for-first-consumer",
        "bound-pv-not-found-volume-zone",
        "volume-restrictions-checks-pvc-volumes-first",
    ],
)
def test_claim_problems_reject_the_pod_on_every_node_as_kube_prefilter(
    volumes: list[dict[str, Any]], objects: list[dict[str, Any]], rejection: str
) -> None:
    table = volumes_table(THREE_NODES, objects)
    pod = parse_pod(pod_with(*volumes))
    assert check_claims(pod, table.volumes).rejection == rejection
    result = SchedulingCycle(CycleSettings()).schedule(pod, table, 0.0)
    assert result.node is None
    assert result.message == f"0/3 nodes are available: {rejection}."


def test_read_write_once_pod_claim_in_use_rejects_every_node_until_its_user_leaves() -> None:
    user = pod_with(pvc_volume("solo"), name="user")
    table = volumes_table(
        [node_obj("n1"), node_obj("n2"), node_obj("small", cpu="0")],
        [
            claim_object("solo", volume_name="pv-1", access_modes=("ReadWriteOncePod",)),
            volume_object("pv-1"),
        ],
        placed=[(user, "n1")],
    )
    pod = parse_pod(pod_with(pvc_volume("solo")))
    check = check_claims(pod, table.volumes)
    assert check.rejection is None and check.read_write_once_pod_conflict
    assert verdicts(table, pod_with(pvc_volume("solo"))) == [[RWOP_CONFLICT]] * 3
    result = SchedulingCycle(CycleSettings()).schedule(pod, table, 0.0)
    assert result.message == (  # a per-node Filter failure, after NodeResourcesFit
        f"0/3 nodes are available: 1 Insufficient cpu, 2 {RWOP_CONFLICT}."
    )
    table.remove_pod(parse_pod(user))
    assert not check_claims(pod, table.volumes).read_write_once_pod_conflict
    assert SchedulingCycle(CycleSettings()).schedule(pod, table, 0.0).node in ("n1", "n2")


def test_read_write_once_claim_may_be_shared() -> None:
    user = pod_with(pvc_volume("shared"), name="user")
    table = volumes_table(
        THREE_NODES,
        [claim_object("shared", volume_name="pv-1"), volume_object("pv-1")],
        placed=[(user, "n1")],
    )
    pod = parse_pod(pod_with(pvc_volume("shared")))
    check = check_claims(pod, table.volumes)
    assert check.rejection is None and not check.read_write_once_pod_conflict


def test_unbound_wait_for_first_consumer_claim_is_refused_naming_claim_and_extender_mode() -> None:
    table = volumes_table(THREE_NODES, [WFFC, claim_object("data", storage_class="local")])
    pod = parse_pod(pod_with(pvc_volume("data")))
    result = SchedulingCycle(CycleSettings()).schedule(pod, table, 0.0)
    assert result.node is None
    assert result.unsupported == (
        "spec.volumes[0].persistentVolumeClaim (claim data is unbound and its StorageClass "
        "local binds WaitForFirstConsumer: volume binding)",
    )
    assert result.message.startswith("0/3 nodes are available: standalone interference-")
    assert "claim data" in result.message and "extender mode" in result.message


def test_pod_with_bound_claim_is_placed_on_the_node_its_pv_allows() -> None:
    table = volumes_table(
        THREE_NODES,
        [
            claim_object("data", volume_name="pv-1"),
            volume_object("pv-1", node_affinity=[term(HOSTNAME, "In", "n3")]),
        ],
    )
    pod = parse_pod(pod_with(pvc_volume("data")))
    result = SchedulingCycle(CycleSettings(), seed=1).schedule(pod, table, 0.0)
    assert result.node == "n3"
    assert result.reason_counts == {NODE_CONFLICT: 2}


def test_failed_scheduling_counts_volume_node_affinity_conflicts() -> None:
    table = volumes_table(
        [node_obj("n1", cpu="1"), node_obj("n2")],
        [
            claim_object("data", volume_name="pv-1"),
            volume_object("pv-1", node_affinity=[term(HOSTNAME, "In", "n1")]),
        ],
    )
    pod = parse_pod(pod_obj("p", requests={"cpu": "2"}, volumes=[pvc_volume("data")]))
    result = SchedulingCycle(CycleSettings()).schedule(pod, table, 0.0)
    assert result.message == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match PersistentVolume's "
        "node affinity."
    )


def test_filter_plugin_runs_only_for_pods_with_claims() -> None:
    table = volumes_table(
        THREE_NODES,
        [
            claim_object("data", volume_name="pv-1"),
            volume_object("pv-1", node_affinity=[term(HOSTNAME, "In", "n1")]),
        ],
    )
    settings = CycleSettings()
    assert FILTER.filter(CycleState(parse_pod(pod_obj()), table, settings, 0.0)) is None
    state = CycleState(parse_pod(pod_with(pvc_volume("data"))), table, settings, 0.0)
    result = FILTER.filter(state)
    assert result is not None and result.passed.tolist() == [True, False, False]
    assert not FILTER.in_extender


def test_prefilter_rejects_or_refuses_the_pod_and_hands_bound_claims_to_the_filter() -> None:
    table = volumes_table(
        THREE_NODES,
        [WFFC, claim_object("wait", storage_class="local"), claim_object("data", volume_name="pv")],
    )
    settings = CycleSettings()
    assert FILTER.prefilter is not None

    def prefilter(*volumes: dict[str, Any]) -> PodRejection | None:
        assert FILTER.prefilter is not None
        return FILTER.prefilter(CycleState(parse_pod(pod_with(*volumes)), table, settings, 0.0))

    assert prefilter(pvc_volume("gone")) == PodRejection('persistentvolumeclaim "gone" not found')
    refusal = prefilter(pvc_volume("wait"))
    assert refusal is not None and refusal.reason == ""
    assert refusal.unsupported[0].startswith("spec.volumes[0].persistentVolumeClaim (claim wait")
    assert prefilter({"name": "tmp", "emptyDir": {}}) is None
    table.volumes.upsert_volume(parse_volume(volume_object("pv", [term(ZONE, "In", "a")])))
    state = CycleState(parse_pod(pod_with(pvc_volume("data"))), table, settings, 0.0)
    assert FILTER.prefilter(state) is None
    result = FILTER.filter(state)
    assert result is not None and result.passed.tolist() == [True, False, False]


@pytest.mark.parametrize(
    ("volumes", "claims"),
    [
        ([], ()),
        ([{"name": "tmp", "emptyDir": {}}], ()),
        (
            [pvc_volume("data"), {"name": "tmp", "emptyDir": {}}, ephemeral_volume("s")],
            (
                PodVolumeClaim("spec.volumes[0].persistentVolumeClaim", "data", False),
                PodVolumeClaim("spec.volumes[2].ephemeral", "p-s", True),
            ),
        ),
    ],
    ids=["no-volumes", "no-claims", "claim-and-ephemeral"],
)
def test_pod_claims_are_parsed_in_volume_order(
    volumes: list[dict[str, Any]], claims: Sequence[PodVolumeClaim]
) -> None:
    pod = parse_pod(pod_with(*volumes))
    assert pod.claims == claims and pod.unsupported == ()


def test_claim_and_volume_parsing() -> None:
    claim = parse_claim(
        {
            **claim_object("data", namespace="shop", volume_name="pv-1", owner_uid="uid-p"),
            "spec": {
                "accessModes": ["ReadWriteOncePod"],
                "volumeName": "pv-1",
                "storageClassName": "ignored",
            },
        }
        | {
            "metadata": {
                "name": "data",
                "namespace": "shop",
                "annotations": {
                    "pv.kubernetes.io/bind-completed": "yes",
                    "volume.beta.kubernetes.io/storage-class": "legacy",
                },
                "ownerReferences": [{"uid": "uid-p", "controller": True}],
            }
        }
    )
    assert claim.key == "shop/data" and claim.bound
    assert (claim.storage_class, claim.controller_uid) == ("legacy", "uid-p")
    assert claim.access_modes == frozenset({"ReadWriteOncePod"})
    volume = parse_volume(
        volume_object("pv-1", [term(ZONE, "In", "a")], labels={ZONE: "a__b", "other": "x"})
    )
    assert volume.zones == ((ZONE, frozenset({"a", "b"})),)
    assert volume.node_affinity is not None and len(volume.node_affinity) == 1


def test_pod_waiting_on_a_claim_is_scheduled_once_the_claim_is_bound() -> None:
    """The whole loop over the in-memory cluster: refused while the WaitForFirstConsumer
    claim is unbound (Event names the claim), placed where the PV allows once it is bound
    (the claim's watch event retries the pod before its backoff ends)."""
    h = LoopHarness()
    try:
        h.cluster.add_node(node_obj("n1"))
        h.cluster.add_node(node_obj("n2"))
        h.cluster.put("StorageClass", WFFC)
        h.cluster.put("PersistentVolumeClaim", claim_object("data", storage_class="local"))
        pod = pod_obj("db")
        pod["spec"]["volumes"] = [pvc_volume("data")]
        h.cluster.add_pod(pod)
        assert h.step() == 1
        [event] = h.cluster.events_for("default", "db")
        assert (event.type, event.reason) == ("Warning", "FailedScheduling")
        assert "claim data is unbound" in event.message and "extender mode" in event.message
        h.clock.advance(1.0)
        assert h.step() == 1  # refused again: the next backoff is 2 s
        assert h.loop.queue.state("default/db") is QueueState.BACKOFF
        h.cluster.put(
            "PersistentVolume", volume_object("pv-1", node_affinity=[term(HOSTNAME, "In", "n2")])
        )
        h.cluster.put(
            "PersistentVolumeClaim",
            claim_object("data", storage_class="local", volume_name="pv-1"),
        )
        h.clock.advance(1.0)  # the earliest retry after a cluster event, before the backoff
        assert h.step() == 1
        assert h.cluster.node_of("default", "db") == "n2"
    finally:
        h.close()


def test_claim_deleted_from_the_cluster_is_forgotten() -> None:
    h = LoopHarness()
    try:
        h.cluster.put("PersistentVolumeClaim", claim_object("data", volume_name="pv-1"))
        h.cluster.put("PersistentVolume", volume_object("pv-1"))
        h.informer.sync()
        volumes = h.loop.cache.table.volumes
        assert volumes.claim("default", "data") is not None and volumes.volume("pv-1")
        h.cluster.delete("PersistentVolumeClaim", "default/data")
        h.cluster.delete("PersistentVolume", "pv-1")
        h.informer.sync()
        assert volumes.claim("default", "data") is None and volumes.volume("pv-1") is None
    finally:
        h.close()


EBS = "ebs.csi.aws.com"


def csi_volume(name: str, driver: str = EBS, handle: str = "") -> dict[str, Any]:
    return volume_object(name, source={"csi": {"driver": driver, "volumeHandle": handle or name}})


@pytest.mark.parametrize(
    ("objects", "passes"),
    [
        ([csi_volume("pv-new")], False),
        ([csi_volume("pv-new", handle="pv-old")], True),
        ([csi_volume("pv-new", driver="other.csi.example.com")], True),
        (
            [volume_object("pv-new", source={"awsElasticBlockStore": {"volumeID": "vol-9"}})],
            False,
        ),
        ([volume_object("pv-new")], True),
        ([csi_volume("pv-new"), csi_node_object("n1", {EBS: 2})], True),
        ([csi_volume("pv-new"), csi_node_object("n1", {})], True),
    ],
    ids=[
        "limit-reached",
        "same-volume-counted-once",
        "other-driver-unlimited",
        "in-tree-source-counts-under-its-csi-driver",
        "local-volume-has-no-attach-limit",
        "room-for-one-more",
        "csinode-without-limits",
    ],
)
def test_node_volume_limits_exceed_max_volume_count(
    objects: list[dict[str, Any]], passes: bool
) -> None:
    """n1 runs a pod with one EBS volume and allows one (unless a row replaces its
    CSINode); n2 has no CSINode: no limit."""
    used = pod_with(pvc_volume("old"), name="user")
    table = volumes_table(
        [node_obj("n1"), node_obj("n2")],
        [
            csi_node_object("n1", {EBS: 1}),
            claim_object("old", volume_name="pv-old"),
            csi_volume("pv-old"),
            claim_object("new", volume_name="pv-new"),
            *objects,
        ],
        placed=[(used, "n1")],
    )
    found = verdicts(table, pod_with(pvc_volume("new")))
    assert found == [[] if passes else [MAX_VOLUME_COUNT], []]


def one_ebs_slot_running(used: dict[str, Any], *objects: dict[str, Any]) -> NodeTable:
    """Node n1, allowing one EBS volume, running ``used``; claim ``new`` bound to the EBS
    volume pv-new; and ``objects``."""
    return volumes_table(
        [node_obj("n1")],
        [
            csi_node_object("n1", {EBS: 1}),
            *objects,
            claim_object("new", volume_name="pv-new"),
            csi_volume("pv-new"),
        ],
        placed=[(used, "n1")],
    )


def test_unbound_claim_of_a_placed_pod_counts_under_its_provisioner() -> None:
    used = pod_with(pvc_volume("provisioning"), name="user")
    table = one_ebs_slot_running(
        used,
        storage_class_object("gp3", "Immediate", provisioner="kubernetes.io/aws-ebs"),
        claim_object("provisioning", storage_class="gp3"),
    )
    assert verdicts(table, pod_with(pvc_volume("new"))) == [[MAX_VOLUME_COUNT]]
    table.remove_pod(parse_pod(used))
    assert verdicts(table, pod_with(pvc_volume("new"))) == [[]]
    table.add_pod(parse_pod(used), "n1", 0.0)
    assert verdicts(table, pod_with(pvc_volume("new"))) == [[MAX_VOLUME_COUNT]]
    # provisioned as a local volume: no attach limit applies to it any more
    table.volumes.upsert_volume(parse_volume(volume_object("pv-local")))
    bound = claim_object("provisioning", storage_class="gp3", volume_name="pv-local")
    table.volumes.upsert_claim(parse_claim(bound))
    assert verdicts(table, pod_with(pvc_volume("new"))) == [[]]


def test_placed_pods_inline_in_tree_volume_counts_towards_the_limit() -> None:
    """kube-scheduler counts a placed pod's inline EBS volume under ebs.csi.aws.com (such a
    pod is never placed by standalone mode, but others may have placed it)."""
    inline = {"name": "disk", "awsElasticBlockStore": {"volumeID": "vol-inline"}}
    used = pod_with(inline, name="user")
    assert parse_pod(used).inline_attached == ((EBS, "vol-inline"),)
    table = one_ebs_slot_running(used)
    assert verdicts(table, pod_with(pvc_volume("new"))) == [[MAX_VOLUME_COUNT]]
    table.remove_pod(parse_pod(used))
    assert verdicts(table, pod_with(pvc_volume("new"))) == [[]]


def test_csi_node_parsing() -> None:
    csi_node = parse_csi_node(
        {
            "metadata": {"name": "n1"},
            "spec": {
                "drivers": [
                    {"name": EBS, "nodeID": "i-1", "allocatable": {"count": 25}},
                    {"name": "nolimit.csi.example.com", "nodeID": "i-1"},
                ]
            },
        }
    )
    assert (csi_node.name, dict(csi_node.limits)) == ("n1", {EBS: 25})


def test_claim_that_no_longer_parses_is_dropped_not_kept_at_its_last_good_version() -> None:
    h = LoopHarness()
    try:
        h.cluster.put("PersistentVolumeClaim", claim_object("data", volume_name="pv-1"))
        h.informer.sync()
        assert h.loop.cache.table.volumes.claim("default", "data") is not None
        broken = claim_object("data", volume_name="pv-1")
        broken["spec"]["accessModes"] = "ReadWriteOnce"  # not a list
        h.cluster.put("PersistentVolumeClaim", broken)
        h.informer.sync()
        assert h.loop.cache.table.volumes.claim("default", "data") is None
        assert (
            h.metric("interference_scheduler_malformed_objects_total", kind="PersistentVolumeClaim")
            == 1
        )
    finally:
        h.close()
