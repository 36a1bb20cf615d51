"""Volumes: kube-scheduler's VolumeRestrictions, NodeVolumeLimits, VolumeBinding and
VolumeZone, for what standalone mode can judge without binding a claim.

Everything is read at each attempt from the live claims, PersistentVolumes,
StorageClasses and CSINodes (:attr:`scheduler.signals.table.NodeTable.volumes`), so a pod waiting
on a claim is scheduled once the claim is bound (their watch events retry pending pods).

**Pod-wide checks** (kube-scheduler's PreFilter, :func:`check_claims`), in its order; the
first that fails rejects the pod on every node with that message:

1. VolumeRestrictions, over ``persistentVolumeClaim`` volumes: the claim exists
   (``persistentvolumeclaim "c" not found``); whether a ``ReadWriteOncePod`` claim is
   used by a placed pod is noted for its Filter.
2. VolumeBinding, over those and ``ephemeral`` volumes (claim ``<pod>-<volume>``): the
   claim exists (for an ephemeral volume: ``waiting for ephemeral volume controller to
   create the persistentvolumeclaim "c"``), is not ``Lost`` (``persistentvolumeclaim "c"
   bound to non-existent persistentvolume "v"``), is not being deleted
   (``persistentvolumeclaim "c" is being deleted``), and an ephemeral volume's claim is
   controlled by the pod (``PVC ns/c was not created for pod ns/p (pod is not owner)``).
3. Claims not fully bound (``spec.volumeName`` and the ``pv.kubernetes.io/bind-completed``
   annotation): any whose class is not ``WaitForFirstConsumer``, or that names a volume
   already, waits for the PV controller (:data:`UNBOUND_IMMEDIATE`); otherwise the claim
   needs the scheduler to bind it, which standalone mode does not do: the pod is
   **refused** (:attr:`ClaimCheck.refused`, naming the claim and extender mode).
4. VolumeZone, over ``persistentVolumeClaim`` volumes: a bound claim's PV exists
   (``persistentvolume "v" not found``).

**Per node** (:func:`volume_filter`), a node counted at its first failing check:

- VolumeRestrictions: a ``ReadWriteOncePod`` claim of the pod that a placed pod uses
  fails every node (:data:`RWOP_CONFLICT`; kube-scheduler makes it a Filter failure so
  that preemption may evict that pod).
- NodeVolumeLimits: for each CSI driver the pod's bound PVs attach as
  (:attr:`scheduler.api.objects.VolumeInfo.attached_as`), the volumes already attached by the
  node's pods plus the pod's new ones (each ``driver/handle`` once) must not exceed the
  node's CSINode ``allocatable.count`` (:data:`MAX_VOLUME_COUNT`); a node without a
  CSINode or a count for the driver has no limit.
- VolumeBinding: the first bound claim (in volume order) that fails on the node decides:
  its PV is gone (:data:`PV_NOT_EXIST`), or the node's labels match none of the PV's
  ``spec.nodeAffinity.required`` terms (:data:`NODE_CONFLICT`) — terms ORed, requirements
  ANDed, as NodeAffinity reads them, against a node that has labels only (kube passes
  the node's labels alone, so ``matchFields`` see an empty name).
- VolumeZone: for each ``persistentVolumeClaim`` volume's PV label among
  :data:`scheduler.api.storage.VOLUME_ZONE_LABELS` (values split at ``__``), a node carrying any
  of those four labels must have that key — a ``failure-domain.beta`` key is also read
  from its ``topology.kubernetes.io`` twin — with one of the values (:data:`ZONE_CONFLICT`);
  a node with none of them passes.

Not implemented (and never silently passed): binding or provisioning claims (refused as
above); a pod with inline in-tree volumes (disk conflicts, or attach limits of the CSI
driver they migrate to) is refused at parse time
(:attr:`scheduler.api.objects.PodInfo.unsupported`), though placed pods' inline volumes
count towards their node's attach limits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scheduler.api.events import Action, EventInterest
from scheduler.api.objects import ClaimInfo, PodInfo, PodVolumeClaim, VolumeInfo
from scheduler.api.selectors import NodeSelectorTerm
from scheduler.api.storage import READ_WRITE_ONCE_POD, VOLUME_ZONE_LABELS, WAIT_FOR_FIRST_CONSUMER
from scheduler.api.volumes import VolumeCatalog
from scheduler.plugins.base import Code, CycleState, Filter, FilterResult, PodRejection
from scheduler.plugins.node_affinity import requirement_mask
from scheduler.signals.node_columns import ABSENT, LabelColumn
from scheduler.signals.table import NodeTable

NAME = "VolumeBinding"
NODE_CONFLICT = "node(s) didn't match PersistentVolume's node affinity"
MAX_VOLUME_COUNT = "node(s) exceed max volume count"
PV_NOT_EXIST = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
ZONE_CONFLICT = "node(s) had no available volume zone"
RWOP_CONFLICT = (
    "node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode already "
    "in-use by another pod"
)
UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
_GA_ZONE_LABELS = {
    "failure-domain.beta.kubernetes.io/zone": "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region": "topology.kubernetes.io/region",
}


@dataclass(frozen=True, slots=True)
class BoundClaim:
    """A fully bound claim of the pod and its PersistentVolume (``None``: not found)."""

    claim: PodVolumeClaim
    volume_name: str
    volume: VolumeInfo | None


@dataclass(frozen=True, slots=True)
class ClaimCheck:
    """The pod-wide outcome of the pod's claims (see the module docstring)."""

    rejection: str | None = None
    """kube-scheduler's PreFilter message when a pod-wide check failed."""
    refused: tuple[str, ...] = ()
    """Claims that need binding, as fields for :func:`scheduler.cycle.messages.refused_message`."""
    bound: tuple[BoundClaim, ...] = ()
    """The bound claims, in volume order, for the per-node checks."""
    read_write_once_pod_conflict: bool = False
    """A ``ReadWriteOncePod`` claim of the pod is used by a placed pod."""


def check_claims(pod: PodInfo, volumes: VolumeCatalog) -> ClaimCheck:
    """The pod-wide checks 1–4 of the module docstring."""
    claims = [(c, volumes.claim(pod.namespace, c.claim_name)) for c in pod.claims]
    conflict = False
    for wanted, claim in claims:  # 1. VolumeRestrictions
        if wanted.ephemeral:
            continue
        if claim is None:
            return ClaimCheck(f'persistentvolumeclaim "{wanted.claim_name}" not found')
        if READ_WRITE_ONCE_POD in claim.access_modes:
            conflict = conflict or volumes.in_use(pod.namespace, claim.name)
    for wanted, claim in claims:  # 2. VolumeBinding: the claims are usable
        problem = _claim_problem(pod, wanted, claim)
        if problem is not None:
            return ClaimCheck(problem)
    bound: list[BoundClaim] = []
    refused: list[str] = []
    for wanted, claim in claims:  # 3. bound, waiting for the PV controller, or to bind
        assert claim is not None  # checked in 2
        if claim.bound:
            volume = volumes.volume(claim.volume_name)
            bound.append(BoundClaim(wanted, claim.volume_name, volume))
            continue
        # kube's IsDelayBindingMode: no class, or a class not found, binds immediately
        storage_class = volumes.storage_class(claim.storage_class) if claim.storage_class else None
        delayed = (
            storage_class is not None and storage_class.binding_mode == WAIT_FOR_FIRST_CONSUMER
        )
        if not delayed or claim.volume_name:
            return ClaimCheck(UNBOUND_IMMEDIATE)
        refused.append(
            f"{wanted.field} (claim {claim.name} is unbound and its StorageClass "
            f"{claim.storage_class} binds WaitForFirstConsumer: volume binding)"
        )
    if refused:
        return ClaimCheck(refused=tuple(refused))
    for entry in bound:  # 4. VolumeZone reads each persistentVolumeClaim volume's PV
        if entry.volume is None and not entry.claim.ephemeral:
            return ClaimCheck(f'persistentvolume "{entry.volume_name}" not found')
    return ClaimCheck(bound=tuple(bound), read_write_once_pod_conflict=conflict)


def _claim_problem(pod: PodInfo, wanted: PodVolumeClaim, claim: ClaimInfo | None) -> str | None:
    """kube-scheduler VolumeBinding's ``podHasPVCs`` verdict on one claim."""
    name = wanted.claim_name
    if claim is None:
        if wanted.ephemeral:
            return (
                "waiting for ephemeral volume controller to create the persistentvolumeclaim "
                f'"{name}"'
            )
        return f'persistentvolumeclaim "{name}" not found'
    if claim.lost:
        return (
            f'persistentvolumeclaim "{name}" bound to non-existent persistentvolume '
            f'"{claim.volume_name}"'
        )
    if claim.deleting:
        return f'persistentvolumeclaim "{name}" is being deleted'
    if wanted.ephemeral and (not claim.controller_uid or claim.controller_uid != pod.uid):
        return (
            f"PVC {claim.namespace}/{name} was not created for pod "
            f"{pod.namespace}/{pod.name} (pod is not owner)"
        )
    return None


def volume_filter(table: NodeTable, pod: PodInfo, check: ClaimCheck) -> FilterResult | None:
    """The per-node checks of the module docstring over the bound claims of ``check`` (a
    check without rejection or refusal); ``None`` when no bound claim constrains nodes."""
    count = len(table)
    if check.read_write_once_pod_conflict:
        return FilterResult(NAME, np.zeros(count, dtype=np.bool_), (RWOP_CONFLICT,))
    if not check.bound:
        return None
    over_limit = _over_attach_limits(table, check.bound)
    undecided = ~over_limit
    missing = np.zeros(count, dtype=np.bool_)
    conflict = np.zeros(count, dtype=np.bool_)
    for entry in check.bound:  # VolumeBinding: the first failing claim decides per node
        if entry.volume is None:
            missing |= undecided
            undecided = np.zeros(count, dtype=np.bool_)
            break
        if entry.volume.node_affinity is None:
            continue
        matches = _affinity_mask(table, entry.volume.node_affinity)
        conflict |= undecided & ~matches
        undecided &= matches
    zone_conflict = undecided & ~_zone_mask(table, check.bound)
    passed = undecided & ~zone_conflict
    if passed.all():
        return None
    columns = (over_limit, conflict, missing, zone_conflict)
    reasons = (MAX_VOLUME_COUNT, NODE_CONFLICT, PV_NOT_EXIST, ZONE_CONFLICT)
    used = [i for i, column in enumerate(columns) if column.any()]
    return FilterResult(
        NAME,
        passed,
        tuple(reasons[i] for i in used),
        explain=(lambda: tuple(columns[i] for i in used)) if len(used) > 1 else None,
    )


def _over_attach_limits(table: NodeTable, bound: tuple[BoundClaim, ...]) -> NDArray[np.bool_]:
    """NodeVolumeLimits: nodes whose CSINode limit for a driver the pod's volumes use would
    be exceeded — ``|attached(d)| + |new(d) ∖ attached| > limit(d)`` for some driver ``d``,
    volumes counted once by ``driver/handle``."""
    exceeded = np.zeros(len(table), dtype=np.bool_)
    new: dict[str, str] = {}
    for entry in bound:
        if entry.volume is not None and entry.volume.attached_as is not None:
            driver, handle = entry.volume.attached_as
            new[f"{driver}/{handle}"] = driver
    if not new:
        return exceeded
    drivers = set(new.values())
    for csi_node in table.volumes.csi_nodes():
        row = table.row_of(csi_node.name)
        if row is None or drivers.isdisjoint(csi_node.limits):
            continue
        attached = table.volumes.attached(csi_node.name)
        attached_per_driver = Counter(attached.values())
        adding = Counter(d for unique, d in new.items() if unique not in attached)
        exceeded[row] = any(
            attached_per_driver[driver] + n > csi_node.limits[driver]
            for driver, n in adding.items()
            if driver in csi_node.limits
        )
    return exceeded


def _affinity_mask(table: NodeTable, terms: tuple[NodeSelectorTerm, ...]) -> NDArray[np.bool_]:
    """Nodes whose labels match any of a PV's required terms (cached per terms until node
    labels change)."""

    def build() -> NDArray[np.bool_]:
        matched = np.zeros(len(table), dtype=np.bool_)
        for term in terms:
            if term.parse_errors or not (term.match_expressions or term.match_fields):
                continue
            if not all(_holds_for_unnamed_node(r.operator, r.values) for r in term.match_fields):
                continue
            mask = np.ones(len(table), dtype=np.bool_)
            for requirement in term.match_expressions:
                mask &= requirement_mask(table.label_column(requirement.key), requirement)
            matched |= mask
        return matched

    return table.cached("constraints", (NAME, "affinity", terms), build)


def _holds_for_unnamed_node(operator: str, values: tuple[str, ...]) -> bool:
    """A ``metadata.name`` field requirement on a node known by its labels alone."""
    return ("" in values) == (operator == "In")


def _zone_mask(table: NodeTable, bound: tuple[BoundClaim, ...]) -> NDArray[np.bool_]:
    """Nodes that pass VolumeZone for the PVs of the pod's ``persistentVolumeClaim``
    volumes (all nodes when those PVs carry no zone label)."""
    zones = tuple(
        zone
        for entry in bound
        if entry.volume is not None and not entry.claim.ephemeral
        for zone in entry.volume.zones
    )
    if not zones:
        return table.everyone()

    def build() -> NDArray[np.bool_]:
        count = len(table)
        constrained = np.zeros(count, dtype=np.bool_)
        for key in VOLUME_ZONE_LABELS:
            constrained |= table.label_column(key).codes != ABSENT
        passed = np.ones(count, dtype=np.bool_)
        for key, values in zones:
            column = table.label_column(key)
            allowed = _has_value(column, values)
            twin = _GA_ZONE_LABELS.get(key)
            if twin is not None:  # the beta label, else its GA twin
                present = column.codes != ABSENT
                allowed = np.where(present, allowed, _has_value(table.label_column(twin), values))
            passed &= allowed
        return passed | ~constrained

    return table.cached("constraints", (NAME, "zones", zones), build)


def _has_value(column: LabelColumn, values: frozenset[str]) -> NDArray[np.bool_]:
    """Nodes whose value in ``column`` is one of ``values`` (absent: no)."""
    wanted = [code for code, value in enumerate(column.values) if value in values]
    member: NDArray[np.bool_] = np.isin(column.codes, wanted)
    return member


def _prefilter(state: CycleState) -> PodRejection | None:
    if not state.pod.claims:
        return None
    check = check_claims(state.pod, state.table.volumes)
    state.data[NAME] = check
    if check.refused:
        return PodRejection(unsupported=check.refused)
    if check.rejection is not None:
        return PodRejection(reason=check.rejection)
    return None


def _filter(state: CycleState) -> FilterResult | None:
    if not state.pod.claims:
        return None
    check = state.data.get(NAME)
    if not isinstance(check, ClaimCheck):  # the PreFilter did not run for this pod
        check = check_claims(state.pod, state.table.volumes)
    if check.rejection is not None or check.refused:
        return None  # the PreFilter refused or rejected the pod: no node is looked at
    return volume_filter(state.table, state.pod, check)


FILTER = Filter(
    name=NAME,
    explain=(
        "bound claims' PersistentVolumes: node affinity and zone labels; unbound, missing "
        "or deleted claims and ReadWriteOncePod conflicts reject the pod"
    ),
    filter=_filter,
    events=(
        EventInterest("Node", Action.ADD | Action.UPDATE_NODE_LABEL),
        EventInterest("Pod", Action.DELETE),  # a ReadWriteOncePod claim let go
        *(
            EventInterest(kind, Action.ADD | Action.UPDATE)
            for kind in ("PersistentVolumeClaim", "PersistentVolume", "StorageClass", "CSINode")
        ),
    ),
    statuses={  # kube-scheduler: evicting the pod that holds the claim or the attachments
        RWOP_CONFLICT: Code.UNSCHEDULABLE,
        MAX_VOLUME_COUNT: Code.UNSCHEDULABLE,
    },
    in_extender=False,
    prefilter=_prefilter,
)
