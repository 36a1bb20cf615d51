"""Cheap parsing of raw API JSON (camelCase dicts) into what the scheduler needs.

Large lists never go through the ``kubernetes`` client's model classes; adapters hand the
JSON dicts straight to :func:`parse_node` and :func:`parse_pod`, which read only the fields
scheduling needs and raise :class:`ObjectError` naming the offending field.

Pod requests are counted as kube-scheduler v1.36 counts them (``resource.PodRequests``
with status resources, as for in-place resize)::

    agg(list)  = max(Σ containers + Σ sidecars, max over init containers i of
                     (init_i + Σ sidecars started before i))        per resource
    spec       = agg(each container's spec requests)
    allocated  = agg(status allocatedResources, else spec requests)
    actuated   = agg(status resources.requests, else allocatedResources, else spec requests)
    containers = max(actuated, allocated)           if a resize is Infeasible (no spec
                                                    fallback then: a container without
                                                    status counts nothing)
               = max(spec, actuated, allocated)     otherwise
    requests   = containers, with pod-level spec.resources.requests replacing it for cpu,
                 memory and hugepages-* (only those), + overhead

where sidecars are init containers with ``restartPolicy: Always`` and a resize is
Infeasible when the pod's ``PodResizePending`` condition has reason ``Infeasible``. A
pending pod has no status, so its requests are its spec's. Pod-level status resources
(an alpha gate in kube) are not read. CPU is in millicores, memory and ephemeral storage in
bytes, extended resources (``nvidia.com/gpu``) in units.

Interference tolerance — annotations a pod may set to keep off noisy nodes (each optional;
a node whose fresh signals exceed any of them is filtered out):

``interference.io/max-runq-p99-us``
    highest node run-queue p99 the pod accepts, microseconds (non-negative number, ``"500"``).
``interference.io/max-reclaim-stall-ms-per-s``
    highest node memory-reclaim stall, milliseconds per second (non-negative number, ``"2"``).
``interference.io/max-score``
    highest node interference index, 0–100 (``"40"``); the index includes load bound to the
    node since its last report.

Fields a pod asks for that standalone mode does not implement (volumes that need binding
or volume topology, DRA resource claims, …) are listed in :attr:`PodInfo.unsupported`: the
engine refuses such a pod (it stays Pending with a ``FailedScheduling`` Event naming the
field) rather than place it with a constraint ignored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from scheduler.quantity import CPU, MEMORY, QuantityError, resource_amount

_T = TypeVar("_T")

HOSTNAME_LABEL = "kubernetes.io/hostname"
UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT_KEY = "node.kubernetes.io/not-ready"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"

HUGEPAGES = "hugepages-"
"""Prefix of the hugepage resources kube-scheduler takes at pod level, besides cpu and memory."""

ANNOTATION_MAX_RUNQ_P99_US = "interference.io/max-runq-p99-us"
ANNOTATION_MAX_RECLAIM_STALL_MS_PER_S = "interference.io/max-reclaim-stall-ms-per-s"
ANNOTATION_MAX_SCORE = "interference.io/max-score"

DEFAULT_MILLI_CPU_REQUEST = 100
"""kube-scheduler's stand-in for a container without a CPU request, in scoring only."""
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024
"""kube-scheduler's stand-in for a container without a memory request, in scoring only."""

NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"
NODE_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
LABEL_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
PREEMPT_NEVER = "Never"


class ObjectError(ValueError):
    """A malformed object or annotation; the message names the object and the field."""


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str
    """``Equal`` or ``Exists``."""
    value: str
    effect: str
    """Empty tolerates every effect."""

    def tolerates(self, taint: Taint) -> bool:
        """kube's ``ToleratesTaint``: effect (if set) and key (if set) equal, then
        ``Exists`` matches any value and ``Equal`` needs the same value."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator == "Equal" and self.value == taint.value


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``key operator values`` expression of a node or label selector."""

    key: str
    operator: str
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """Expressions over labels and fields (``metadata.name``), all of which must hold."""

    match_expressions: tuple[Requirement, ...]
    match_fields: tuple[Requirement, ...]
    parse_errors: tuple[str, ...] = ()
    """Why kube-scheduler could not build this term's selector (an invalid key or value,
    a ``Gt``/``Lt`` bound that is not a base-10 int64, …); such a term matches no node,
    while the pod's other terms still count."""


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """``matchLabels`` (as ``In`` requirements) and ``matchExpressions``, ANDed."""

    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when every requirement holds (an empty selector matches everything)."""
        for requirement in self.requirements:  # a plain loop: this runs per pod per term
            if not _label_requirement_holds(requirement, labels):
                return False
        return True


NO_LABELS: Mapping[str, str] = {}


@dataclass(frozen=True, slots=True)
class AntiAffinityTerm:
    """A pod (anti-)affinity term with a label selector (also the pod matcher other
    filters use): kube-scheduler's ``AffinityTerm``."""

    selector: LabelSelector
    namespaces: frozenset[str] | None
    """Namespaces whose pods it considers; ``None`` means all namespaces."""
    topology_key: str = HOSTNAME_LABEL
    """Two pods are together when their nodes share this label's value."""
    namespace_selector: LabelSelector | None = None
    """A non-empty ``namespaceSelector``: pods in namespaces whose labels it matches are
    considered too (ORed with :attr:`namespaces`)."""

    def matches(
        self,
        namespace: str,
        labels: Mapping[str, str],
        namespace_labels: Mapping[str, str] = NO_LABELS,
    ) -> bool:
        """True when a pod in ``namespace`` (labelled ``namespace_labels``) with ``labels``
        falls under this term."""
        in_scope = (
            self.namespaces is None
            or namespace in self.namespaces
            or (
                self.namespace_selector is not None
                and self.namespace_selector.matches(namespace_labels)
            )
        )
        return in_scope and self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """A required pod affinity term: the node's ``topology_key`` domain must hold a pod
    the term matches."""

    selector: LabelSelector | None
    """``None`` (no label selector) matches no pod."""
    namespaces: frozenset[str] | None
    """Namespaces whose pods it considers; ``None`` means all namespaces."""
    topology_key: str
    namespace_selector: LabelSelector | None = None
    """As :attr:`AntiAffinityTerm.namespace_selector`."""

    def matcher(self) -> AntiAffinityTerm | None:
        """The same term as an :class:`AntiAffinityTerm`; ``None`` when it matches no pod."""
        if self.selector is None:
            return None
        return AntiAffinityTerm(
            self.selector, self.namespaces, self.topology_key, self.namespace_selector
        )

    def matches(
        self,
        namespace: str,
        labels: Mapping[str, str],
        namespace_labels: Mapping[str, str] = NO_LABELS,
    ) -> bool:
        """True when a pod in ``namespace`` with ``labels`` falls under this term."""
        matcher = self.matcher()
        return matcher is not None and matcher.matches(namespace, labels, namespace_labels)


@dataclass(frozen=True, slots=True)
class WeightedTerm:
    """A preferred pod (anti-)affinity term with its weight (1–100)."""

    weight: int
    term: AntiAffinityTerm


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    """What namespace selectors read of a namespace."""

    name: str
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """A topology spread constraint (kube-scheduler's PodTopologySpread)."""

    max_skew: int
    topology_key: str
    selector: LabelSelector | None
    """``labelSelector`` with ``matchLabelKeys`` merged in (``key In (the pod's value)``);
    ``None`` (no selector) matches no pod."""
    min_domains: int
    """``minDomains`` (1 when unset): with fewer eligible domains the global minimum is 0."""
    honor_node_affinity: bool
    """``nodeAffinityPolicy: Honor`` (the default): only nodes matching the pod's node
    selector and required node affinity count."""
    honor_node_taints: bool
    """``nodeTaintsPolicy: Honor`` (default ``Ignore``): only nodes whose taints the pod
    tolerates count."""


@dataclass(frozen=True, slots=True)
class HostPort:
    protocol: str
    port: int
    host_ip: str
    """``0.0.0.0`` when the pod binds every address."""

    def conflicts(self, other: HostPort) -> bool:
        """Same protocol and port, and either binds every address or both the same one."""
        if self.protocol != other.protocol or self.port != other.port:
            return False
        return WILDCARD_IP in (self.host_ip, other.host_ip) or self.host_ip == other.host_ip


WILDCARD_IP = "0.0.0.0"


ANNOTATION_BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
"""Set on a claim by the PV controller once its binding is complete (kube-scheduler counts
a claim as bound only with it and ``spec.volumeName``)."""
ANNOTATION_BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"
"""The legacy storage class annotation, which wins over ``spec.storageClassName``."""
READ_WRITE_ONCE_POD = "ReadWriteOncePod"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
VOLUME_ZONE_LABELS = (
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
)
"""PV labels kube-scheduler's VolumeZone filter reads (a value may list zones joined by
``__``)."""
INLINE_DISK_VOLUMES = ("gcePersistentDisk", "awsElasticBlockStore", "rbd", "iscsi")
"""Inline volume types whose disk conflicts kube-scheduler's VolumeRestrictions checks
(not implemented: such pods are refused, as are other inline in-tree volumes that count
towards attach limits, :data:`MIGRATED_IN_TREE_SOURCES`)."""


@dataclass(frozen=True, slots=True)
class PodVolumeClaim:
    """A PersistentVolumeClaim one of the pod's volumes uses."""

    field: str
    """Where the pod asks for it: ``spec.volumes[0].persistentVolumeClaim`` or
    ``spec.volumes[1].ephemeral``."""
    claim_name: str
    """``claimName``; for an ephemeral volume ``<pod>-<volume>``, the claim its controller
    creates."""
    ephemeral: bool


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    """What the volume filters read of a PersistentVolumeClaim."""

    namespace: str
    name: str
    volume_name: str
    """``spec.volumeName``; empty while unbound."""
    bind_completed: bool
    """The ``pv.kubernetes.io/bind-completed`` annotation is present."""
    storage_class: str
    """The legacy annotation, else ``spec.storageClassName``; empty for none."""
    access_modes: frozenset[str]
    deleting: bool
    """``metadata.deletionTimestamp`` is set."""
    lost: bool
    """``status.phase`` is ``Lost`` (its volume is gone)."""
    controller_uid: str
    """UID of the owner reference with ``controller: true`` (empty when none): an ephemeral
    volume's claim must be controlled by its pod."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def bound(self) -> bool:
        """kube-scheduler's ``isPVCFullyBound``: a volume name and the bind-completed mark."""
        return bool(self.volume_name) and self.bind_completed


@dataclass(frozen=True, slots=True)
class VolumeInfo:
    """What the volume filters read of a PersistentVolume."""

    name: str
    node_affinity: tuple[NodeSelectorTerm, ...] | None
    """``spec.nodeAffinity.required.nodeSelectorTerms`` (ORed); ``None`` when unset."""
    zones: tuple[tuple[str, frozenset[str]], ...]
    """Each of :data:`VOLUME_ZONE_LABELS` the PV carries, with its values split at ``__``."""
    attached_as: tuple[str, str] | None = None
    """(CSI driver, volume handle) a node attaches it as, for attach limits: ``spec.csi``,
    or an in-tree source under the CSI driver kube migrates it to
    (:data:`MIGRATED_IN_TREE_SOURCES`); ``None`` for volumes without attach limits
    (local, hostPath, NFS, …)."""


@dataclass(frozen=True, slots=True)
class StorageClassInfo:
    name: str
    binding_mode: str
    """``volumeBindingMode``: ``Immediate`` (the API default) or ``WaitForFirstConsumer``."""
    provisioner: str = ""
    """``provisioner``, an in-tree one as the CSI driver kube migrates it to."""


@dataclass(frozen=True, slots=True)
class CSINodeInfo:
    """A node's CSINode: how many volumes of each CSI driver it can attach."""

    name: str
    limits: Mapping[str, int]
    """Driver → ``spec.drivers[].allocatable.count`` (drivers without a count left out)."""


MIGRATED_IN_TREE_SOURCES = {
    "awsElasticBlockStore": ("ebs.csi.aws.com", "volumeID"),
    "gcePersistentDisk": ("pd.csi.storage.gke.io", "pdName"),
    "azureDisk": ("disk.csi.azure.com", "diskURI"),
    "azureFile": ("file.csi.azure.com", "shareName"),
    "cinder": ("cinder.csi.openstack.org", "volumeID"),
    "vsphereVolume": ("csi.vsphere.vmware.com", "volumePath"),
    "portworxVolume": ("pxd.portworx.com", "volumeID"),
}
"""In-tree PV source → (the CSI driver kube translates it to, the field naming the volume)."""
MIGRATED_IN_TREE_PROVISIONERS = {
    "kubernetes.io/aws-ebs": "ebs.csi.aws.com",
    "kubernetes.io/gce-pd": "pd.csi.storage.gke.io",
    "kubernetes.io/azure-disk": "disk.csi.azure.com",
    "kubernetes.io/azure-file": "file.csi.azure.com",
    "kubernetes.io/cinder": "cinder.csi.openstack.org",
    "kubernetes.io/vsphere-volume": "csi.vsphere.vmware.com",
    "kubernetes.io/portworx-volume": "pxd.portworx.com",
}
"""In-tree provisioner → the CSI driver kube translates it to."""


@dataclass(frozen=True, slots=True)
class InterferenceTolerance:
    """Upper bounds a pod accepts on its node's signals; ``None`` = no bound."""

    max_runq_p99_us: float | None = None
    max_reclaim_stall_ms_per_s: float | None = None
    max_score: float | None = None


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    allocatable: Mapping[str, int]
    """Resource → amount (cpu in millicores), as in :mod:`scheduler.quantity`."""
    ready: bool
    """The ``Ready`` condition is ``True``."""
    unschedulable: bool
    """``spec.unschedulable`` (cordoned)."""

    def constraints_equal(self, other: NodeInfo) -> bool:
        """True when every field a cached constraint mask depends on is the same."""
        return (
            self.labels == other.labels
            and self.taints == other.taints
            and self.ready == other.ready
            and self.unschedulable == other.unschedulable
        )


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    priority: int
    created_at: float
    """Unix time of ``metadata.creationTimestamp`` (0 when absent)."""
    scheduler_name: str
    node_name: str
    """``spec.nodeName``; empty while pending."""
    terminating: bool
    """``metadata.deletionTimestamp`` is set."""
    finished: bool
    """``status.phase`` is ``Succeeded`` or ``Failed``: it no longer holds node resources."""
    requests: Mapping[str, int]
    """Effective requests as kube-scheduler counts them (see the module docstring)."""
    nonzero_cpu_m: int
    """CPU request for scoring: containers without one count as 100m."""
    nonzero_memory: int
    """Memory request for scoring: containers without one count as 200Mi."""
    host_ports: tuple[HostPort, ...]
    tolerations: tuple[Toleration, ...]
    node_selector: tuple[tuple[str, str], ...]
    """``spec.nodeSelector`` as sorted pairs."""
    required_node_affinity: tuple[NodeSelectorTerm, ...] | None
    """Required node affinity terms (ORed); ``None`` when the pod sets none."""
    anti_affinity: tuple[AntiAffinityTerm, ...]
    """Required pod anti-affinity terms (any topology key; a term without a label
    selector is left out: it matches no pod)."""
    labels: Mapping[str, str]
    tolerance: InterferenceTolerance | None
    """Interference tolerance from annotations; ``None`` when the pod declares none."""
    scheduling_gates: tuple[str, ...]
    """``spec.schedulingGates`` names; a gated pod must not be scheduled yet."""
    unsupported: tuple[str, ...]
    """Fields the pod asks for that standalone mode does not implement (the pod is refused)."""
    preemption_policy: str = PREEMPT_LOWER_PRIORITY
    """``spec.preemptionPolicy``: ``PreemptLowerPriority`` or ``Never``."""
    spread: tuple[SpreadConstraint, ...] = ()
    """``DoNotSchedule`` topology spread constraints (a filter)."""
    soft_spread: tuple[SpreadConstraint, ...] = ()
    """``ScheduleAnyway`` topology spread constraints (a score)."""
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    """Required pod affinity terms (any topology key)."""
    preferred_affinity: tuple[WeightedTerm, ...] = ()
    """Preferred pod affinity terms (a score; weight 0 and selector-less terms left out)."""
    preferred_anti_affinity: tuple[WeightedTerm, ...] = ()
    """Preferred pod anti-affinity terms (a score), left out as :attr:`preferred_affinity`."""
    preferred_node_affinity: tuple[tuple[int, NodeSelectorTerm], ...] = ()
    """(weight, term) of the preferred node affinity terms (a score)."""
    claims: tuple[PodVolumeClaim, ...] = ()
    """The PersistentVolumeClaims its volumes use, in volume order (checked against the
    live claims at each attempt: scheduler/plugins/volume_binding.py)."""
    inline_attached: tuple[tuple[str, str], ...] = ()
    """(CSI driver, volume) of its inline in-tree volumes, which count towards a node's
    attach limits once it is placed (:data:`MIGRATED_IN_TREE_SOURCES`)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def signature(self) -> tuple[object, ...]:
        """Hashable key of everything the cached constraint masks depend on."""
        return (self.tolerations, self.node_selector, self.required_node_affinity)


def parse_node(obj: Mapping[str, Any]) -> NodeInfo:
    """A node from its API JSON; :class:`ObjectError` names the malformed field."""
    reader = _Reader(obj, "node")
    name = reader.name
    spec = reader.mapping(obj, "spec")
    status = reader.mapping(obj, "status")
    quantities = reader.mapping(status, "status.allocatable") or reader.mapping(
        status, "status.capacity"
    )
    allocatable = reader.resources(quantities, "status.allocatable")
    conditions = [
        reader.as_mapping(c, f"status.conditions[{i}]")
        for i, c in enumerate(reader.sequence(status, "status.conditions"))
    ]
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = tuple(
        Taint(
            key=reader.string(t, "key", f"spec.taints[{i}].key"),
            value=reader.string(t, "value", f"spec.taints[{i}].value"),
            effect=reader.string(t, "effect", f"spec.taints[{i}].effect"),
        )
        for i, t in enumerate(reader.sequence(spec, "spec.taints"))
    )
    return NodeInfo(
        name=name,
        labels=reader.string_map(reader.metadata, "labels", "metadata.labels"),
        taints=taints,
        allocatable=allocatable,
        ready=ready,
        unschedulable=bool(spec.get("unschedulable", False)),
    )


def parse_pod(obj: Mapping[str, Any]) -> PodInfo:
    """A pod from its API JSON; :class:`ObjectError` names the malformed field or annotation."""
    reader = _Reader(obj, "pod")
    metadata = reader.metadata
    spec = reader.mapping(obj, "spec")
    placed = bool(reader.string(spec, "nodeName", "spec.nodeName"))

    def own_scheduling(parse: Callable[[], _T], default: _T) -> _T:
        """A field only the pod's own scheduling reads. A placed pod is never scheduled
        again, so a value there we cannot read must not drop it from the table: its
        requests, ports, labels, pod-affinity terms and volumes still count on its node."""
        if not placed:
            return parse()
        try:
            return parse()
        except ObjectError:
            return default

    unsupported: list[str] = []
    no_spread: tuple[tuple[SpreadConstraint, ...], tuple[SpreadConstraint, ...]] = ((), ())
    spread, soft_spread = own_scheduling(lambda: _spread_constraints(reader, spec), no_spread)
    inter_pod = _InterPodTerms.parse(reader, reader.mapping(spec, "spec.affinity"))
    requests, nonzero_cpu_m, nonzero_memory = _pod_requests(
        reader, spec, reader.mapping(obj, "status")
    )
    annotations = reader.string_map(metadata, "annotations", "metadata.annotations")
    priority = spec.get("priority") or 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise reader.error("spec.priority", f"{priority!r} is not an integer")
    gates = own_scheduling(
        lambda: tuple(
            reader.string(g, "name", f"spec.schedulingGates[{i}].name")
            for i, g in enumerate(reader.sequence(spec, "spec.schedulingGates"))
        ),
        tuple[str, ...](),
    )
    affinity = reader.mapping(spec, "spec.affinity")
    preemption_policy = own_scheduling(
        lambda: _preemption_policy(reader, spec), PREEMPT_LOWER_PRIORITY
    )
    return PodInfo(
        namespace=reader.string(metadata, "namespace", "metadata.namespace") or "default",
        name=reader.name,
        uid=reader.string(metadata, "uid", "metadata.uid"),
        priority=priority,
        created_at=_timestamp(reader, metadata.get("creationTimestamp")),
        scheduler_name=reader.string(spec, "schedulerName", "spec.schedulerName")
        or "default-scheduler",
        node_name=reader.string(spec, "nodeName", "spec.nodeName"),
        terminating=metadata.get("deletionTimestamp") is not None,
        finished=reader.mapping(obj, "status").get("phase") in ("Succeeded", "Failed"),
        requests=requests,
        nonzero_cpu_m=nonzero_cpu_m,
        nonzero_memory=nonzero_memory,
        host_ports=_host_ports(reader, spec),
        tolerations=own_scheduling(lambda: _tolerations(reader, spec), ()),
        node_selector=own_scheduling(
            lambda: tuple(
                sorted(reader.string_map(spec, "nodeSelector", "spec.nodeSelector").items())
            ),
            (),
        ),
        required_node_affinity=own_scheduling(lambda: _node_affinity(reader, affinity), None),
        anti_affinity=inter_pod.required_anti_affinity,
        labels=reader.string_map(metadata, "labels", "metadata.labels"),
        tolerance=own_scheduling(lambda: _tolerance(reader, annotations), None),
        scheduling_gates=gates,
        unsupported=tuple(
            unsupported
            + own_scheduling(lambda: _unsupported_spec_fields(reader, spec), list[str]())
        ),
        preemption_policy=preemption_policy,
        spread=spread,
        soft_spread=soft_spread,
        pod_affinity=inter_pod.required_affinity,
        preferred_affinity=inter_pod.preferred_affinity,
        preferred_anti_affinity=inter_pod.preferred_anti_affinity,
        preferred_node_affinity=own_scheduling(
            lambda: _preferred_node_affinity(reader, affinity), ()
        ),
        claims=_volume_claims(reader, spec),
        inline_attached=_inline_attached(reader, spec),
    )


def _preemption_policy(reader: _Reader, spec: Mapping[str, Any]) -> str:
    policy = reader.string(spec, "preemptionPolicy", "spec.preemptionPolicy")
    policy = policy or PREEMPT_LOWER_PRIORITY
    if policy not in (PREEMPT_LOWER_PRIORITY, PREEMPT_NEVER):
        raise reader.error(
            "spec.preemptionPolicy",
            f"{policy!r} is not {PREEMPT_LOWER_PRIORITY} or {PREEMPT_NEVER}",
        )
    return policy


class _Reader:
    """Typed access to one object's JSON, raising :class:`ObjectError` with the field path."""

    def __init__(self, obj: Mapping[str, Any], kind: str) -> None:
        if not isinstance(obj, Mapping):
            raise ObjectError(f"{kind}: expected a JSON object, got {type(obj).__name__}")
        self.kind = kind
        self.label = kind
        self.metadata = self.mapping(obj, "metadata")
        name = self.metadata.get("name")
        if not isinstance(name, str) or not name:
            raise self.error("metadata.name", "missing or not a string")
        self.name = name
        namespace = self.metadata.get("namespace")
        self.label = f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"

    def error(self, field: str, problem: str) -> ObjectError:
        return ObjectError(f"{self.label}: {field}: {problem}")

    def mapping(self, parent: Mapping[str, Any], path: str) -> Mapping[str, Any]:
        """The object at ``path``'s last segment under ``parent`` (``{}`` when absent)."""
        return self.as_mapping(parent.get(path.rsplit(".", 1)[-1]), path)

    def as_mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(path, f"expected an object, got {type(value).__name__}")
        return value

    def sequence(self, parent: Mapping[str, Any], path: str) -> list[Any]:
        """The list at ``path``'s last segment under ``parent`` (``[]`` when absent)."""
        value = parent.get(path.rsplit(".", 1)[-1])
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(path, f"expected a list, got {type(value).__name__}")
        return value

    def string(self, parent: Mapping[str, Any], key: str, path: str) -> str:
        if not isinstance(parent, Mapping):
            raise self.error(path.rsplit(".", 1)[0], "expected an object")
        value = parent.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.error(path, f"expected a string, got {value!r}")
        return value

    def string_map(self, parent: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
        value = parent.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise self.error(path, "expected an object of string values")
        return dict(value)

    def resources(self, quantities: Mapping[str, Any], path: str) -> dict[str, int]:
        amounts: dict[str, int] = {}
        for resource, quantity in quantities.items():
            try:
                amounts[resource] = resource_amount(resource, quantity)
            except QuantityError as exc:
                raise self.error(f"{path}.{resource}", str(exc)) from exc
        return amounts


def _pod_requests(
    reader: _Reader, spec: Mapping[str, Any], status: Mapping[str, Any]
) -> tuple[dict[str, int], int, int]:
    """Effective requests, plus CPU and memory with kube's scoring defaults per container
    (see the module docstring)."""
    infeasible = _resize_infeasible(reader, status)
    statuses = _container_statuses(reader, status)
    containers: list[tuple[str, Mapping[str, Any], bool]] = []
    for group, sidecars_allowed in (("containers", False), ("initContainers", True)):
        for i, c in enumerate(reader.sequence(spec, f"spec.{group}")):
            path = f"spec.{group}[{i}]"
            if not isinstance(c, Mapping):
                raise reader.error(path, "expected an object")
            containers.append((path, c, sidecars_allowed and c.get("restartPolicy") == "Always"))
    spec_lists: list[dict[str, int]] = []
    allocated_lists: list[dict[str, int] | None] = []
    actuated_lists: list[dict[str, int] | None] = []
    for path, c, _ in containers:
        resources = reader.mapping(c, f"{path}.resources")
        requested = reader.resources(
            reader.mapping(resources, f"{path}.resources.requests"), f"{path}.resources.requests"
        )
        spec_lists.append(requested)
        allocated, actuated = statuses.get(c.get("name"), (None, None))
        fallback = None if infeasible else requested
        allocated_lists.append(allocated if allocated is not None else fallback)
        actuated_lists.append(actuated if actuated is not None else allocated_lists[-1])
    uses_status = infeasible or any(
        a != r or b != r
        for a, b, r in zip(allocated_lists, actuated_lists, spec_lists, strict=True)
    )
    init_flags = [
        (path.startswith("spec.initContainers"), sidecar) for path, _, sidecar in containers
    ]
    pod_level = _pod_level_requests(reader, spec)
    overhead = reader.resources(reader.mapping(spec, "spec.overhead"), "spec.overhead")

    def effective(defaults: bool) -> dict[str, int]:
        candidates: list[Sequence[Mapping[str, int] | None]] = [] if infeasible else [spec_lists]
        if uses_status:
            candidates += [allocated_lists, actuated_lists]
        total: dict[str, int] = {}
        for lists in candidates:
            for resource, amount in _aggregate(lists, init_flags, defaults).items():
                total[resource] = max(total.get(resource, 0), amount)
        total.update(pod_level)
        _add(total, overhead)
        return total

    requests = {r: a for r, a in effective(defaults=False).items() if a > 0}
    scoring = effective(defaults=True)
    return requests, scoring.get(CPU, 0), scoring.get(MEMORY, 0)


def _aggregate(
    lists: Sequence[Mapping[str, int] | None], init_flags: list[tuple[bool, bool]], defaults: bool
) -> dict[str, int]:
    """``agg`` of the module docstring over per-container request lists (``None``: the
    container counts nothing); ``defaults`` fills a missing cpu/memory with kube's scoring
    stand-ins."""
    total: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for amounts, (is_init, is_sidecar) in zip(lists, init_flags, strict=True):
        amounts = dict(amounts or {})
        if defaults:
            amounts.setdefault(CPU, DEFAULT_MILLI_CPU_REQUEST)
            amounts.setdefault(MEMORY, DEFAULT_MEMORY_REQUEST)
        if not is_init:
            _add(total, amounts)
            continue
        if is_sidecar:
            _add(total, amounts)
            _add(sidecars, amounts)
            running = dict(sidecars)
        else:
            running = dict(amounts)
            _add(running, sidecars)
        for resource, amount in running.items():
            init_peak[resource] = max(init_peak.get(resource, 0), amount)
    for resource, amount in init_peak.items():
        total[resource] = max(total.get(resource, 0), amount)
    return total


def _pod_level_requests(reader: _Reader, spec: Mapping[str, Any]) -> dict[str, int]:
    """``spec.resources.requests`` for the resources kube-scheduler takes at pod level (cpu,
    memory, hugepages-*); any other name there is ignored, as kube ignores it."""
    requested = reader.resources(
        reader.mapping(reader.mapping(spec, "spec.resources"), "spec.resources.requests"),
        "spec.resources.requests",
    )
    return {r: a for r, a in requested.items() if r in (CPU, MEMORY) or r.startswith(HUGEPAGES)}


def _resize_infeasible(reader: _Reader, status: Mapping[str, Any]) -> bool:
    """The first ``PodResizePending`` condition has reason ``Infeasible``."""
    for i, condition in enumerate(reader.sequence(status, "status.conditions")):
        condition = reader.as_mapping(condition, f"status.conditions[{i}]")
        if condition.get("type") == "PodResizePending":
            return condition.get("reason") == "Infeasible"
    return False


def _container_statuses(
    reader: _Reader, status: Mapping[str, Any]
) -> dict[Any, tuple[dict[str, int] | None, dict[str, int] | None]]:
    """Container name → (``allocatedResources``, ``resources.requests``), each ``None``
    when the status does not report it."""
    found: dict[Any, tuple[dict[str, int] | None, dict[str, int] | None]] = {}
    for group in ("initContainerStatuses", "containerStatuses"):  # containers win a name
        for i, cs in enumerate(reader.sequence(status, f"status.{group}")):
            path = f"status.{group}[{i}]"
            cs = reader.as_mapping(cs, path)
            allocated = cs.get("allocatedResources")
            resources = reader.mapping(cs, f"{path}.resources")
            actuated = resources.get("requests")
            found[cs.get("name")] = (
                None
                if allocated is None
                else reader.resources(
                    reader.as_mapping(allocated, f"{path}.allocatedResources"),
                    f"{path}.allocatedResources",
                ),
                None
                if actuated is None
                else reader.resources(
                    reader.as_mapping(actuated, f"{path}.resources.requests"),
                    f"{path}.resources.requests",
                ),
            )
    return found


def _add(total: dict[str, int], amounts: Mapping[str, int]) -> None:
    for resource, amount in amounts.items():
        total[resource] = total.get(resource, 0) + amount


def _host_ports(reader: _Reader, spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    ports: list[HostPort] = []
    containers = [
        (f"spec.containers[{i}]", c) for i, c in enumerate(reader.sequence(spec, "spec.containers"))
    ] + [
        (f"spec.initContainers[{i}]", c)
        for i, c in enumerate(reader.sequence(spec, "spec.initContainers"))
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
    ]
    for path, container in containers:
        for j, p in enumerate(reader.sequence(container, f"{path}.ports")):
            field = f"{path}.ports[{j}]"
            if not isinstance(p, Mapping):
                raise reader.error(field, "expected an object")
            host_port = p.get("hostPort", 0)
            if not isinstance(host_port, int) or not 0 <= host_port <= 65535:
                raise reader.error(f"{field}.hostPort", f"{host_port!r} is not a port number")
            if host_port:
                ports.append(
                    HostPort(
                        protocol=reader.string(p, "protocol", f"{field}.protocol") or "TCP",
                        port=host_port,
                        host_ip=reader.string(p, "hostIP", f"{field}.hostIP") or WILDCARD_IP,
                    )
                )
    return tuple(ports)


def _tolerations(reader: _Reader, spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    tolerations = []
    for i, t in enumerate(reader.sequence(spec, "spec.tolerations")):
        field = f"spec.tolerations[{i}]"
        operator = reader.string(t, "operator", f"{field}.operator") or "Equal"
        if operator not in ("Equal", "Exists"):
            raise reader.error(f"{field}.operator", f"{operator!r} is not Equal or Exists")
        tolerations.append(
            Toleration(
                key=reader.string(t, "key", f"{field}.key"),
                operator=operator,
                value=reader.string(t, "value", f"{field}.value"),
                effect=reader.string(t, "effect", f"{field}.effect"),
            )
        )
    return tuple(tolerations)


def _requirements(
    reader: _Reader, items: list[Any], path: str, operators: frozenset[str]
) -> tuple[Requirement, ...]:
    requirements = []
    for i, item in enumerate(items):
        field = f"{path}[{i}]"
        operator = reader.string(item, "operator", f"{field}.operator")
        if operator not in operators:
            raise reader.error(
                f"{field}.operator", f"{operator!r} is not one of {', '.join(sorted(operators))}"
            )
        values = reader.sequence(item, f"{field}.values")
        if not all(isinstance(v, str) for v in values):
            raise reader.error(f"{field}.values", "expected a list of strings")
        requirements.append(
            Requirement(reader.string(item, "key", f"{field}.key"), operator, tuple(values))
        )
    return tuple(requirements)


def _node_affinity(
    reader: _Reader, affinity: Mapping[str, Any]
) -> tuple[NodeSelectorTerm, ...] | None:
    node_affinity = reader.mapping(affinity, "spec.affinity.nodeAffinity")
    path = "spec.affinity.nodeAffinity"
    required = reader.mapping(
        node_affinity, f"{path}.requiredDuringSchedulingIgnoredDuringExecution"
    )
    if "nodeSelectorTerms" not in required:
        return None
    terms_path = f"{path}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    return tuple(
        _node_selector_term(reader, term, f"{terms_path}[{i}]")
        for i, term in enumerate(reader.sequence(required, terms_path))
    )


def _preferred_node_affinity(
    reader: _Reader, affinity: Mapping[str, Any]
) -> tuple[tuple[int, NodeSelectorTerm], ...]:
    """(weight, term) of each preferred node affinity term that counts: weight 0 and empty
    terms are skipped, as kube-scheduler skips them; a term kube-scheduler cannot parse
    fails its scoring, so it makes the pod unparseable here."""
    path = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    node_affinity = reader.mapping(affinity, "spec.affinity.nodeAffinity")
    preferred = []
    for i, item in enumerate(reader.sequence(node_affinity, path)):
        field = f"{path}[{i}]"
        item = reader.as_mapping(item, field)
        weight = item.get("weight", 0)
        if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= 100:
            raise reader.error(f"{field}.weight", f"{weight!r} is not an integer from 0 to 100")
        term = _node_selector_term(reader, item.get("preference"), f"{field}.preference")
        if term.parse_errors:
            raise reader.error(f"{field}.preference", "; ".join(term.parse_errors))
        if weight and (term.match_expressions or term.match_fields):
            preferred.append((weight, term))
    return tuple(preferred)


def _node_selector_term(reader: _Reader, term: Any, field: str) -> NodeSelectorTerm:
    """One node selector term; what kube-scheduler could not parse in it is kept in
    :attr:`NodeSelectorTerm.parse_errors`."""
    if not isinstance(term, Mapping):
        raise reader.error(field, "expected an object")
    expressions = _requirements(
        reader,
        reader.sequence(term, f"{field}.matchExpressions"),
        f"{field}.matchExpressions",
        NODE_SELECTOR_OPERATORS,
    )
    fields = _requirements(
        reader,
        reader.sequence(term, f"{field}.matchFields"),
        f"{field}.matchFields",
        frozenset({"In", "NotIn"}),
    )
    errors = []
    for j, requirement in enumerate(fields):
        if requirement.key != "metadata.name":
            raise reader.error(
                f"{field}.matchFields[{j}].key",
                f"{requirement.key!r} is not supported; only metadata.name is",
            )
        if len(requirement.values) != 1:
            errors.append(f"{field}.matchFields[{j}].values: must have one element")
    for j, requirement in enumerate(expressions):
        errors.extend(
            f"{field}.matchExpressions[{j}].{problem}"
            for problem in node_requirement_errors(requirement)
        )
    return NodeSelectorTerm(expressions, fields, tuple(errors))


def _label_selector(reader: _Reader, selector: Any, path: str) -> LabelSelector | None:
    if selector is None:
        return None
    if not isinstance(selector, Mapping):
        raise reader.error(path, "expected an object")
    match_labels = reader.string_map(selector, "matchLabels", f"{path}.matchLabels")
    requirements = tuple(Requirement(k, "In", (v,)) for k, v in sorted(match_labels.items()))
    expressions = _requirements(
        reader,
        reader.sequence(selector, f"{path}.matchExpressions"),
        f"{path}.matchExpressions",
        LABEL_SELECTOR_OPERATORS,
    )
    return LabelSelector(requirements + expressions)


@dataclass(frozen=True, slots=True)
class _InterPodTerms:
    """``spec.affinity.podAffinity`` and ``podAntiAffinity``, parsed.

    Each term as kube-scheduler builds an ``AffinityTerm``: a null ``labelSelector``
    matches no pod, an empty one every pod; ``namespaces`` default to the pod's own
    namespace unless ``namespaces`` or ``namespaceSelector`` is set; an empty
    ``namespaceSelector`` means all namespaces, a non-empty one is ORed with
    ``namespaces``. ``matchLabelKeys`` / ``mismatchLabelKeys`` add ``key In (value)`` /
    ``key NotIn (value)`` with the pod's value of each key it has, unless the selector
    already has a requirement on that key (the API server merged it when the pod was
    created, with the labels of that time).
    """

    required_affinity: tuple[PodAffinityTerm, ...]
    required_anti_affinity: tuple[AntiAffinityTerm, ...]
    preferred_affinity: tuple[WeightedTerm, ...]
    preferred_anti_affinity: tuple[WeightedTerm, ...]

    @classmethod
    def parse(cls, reader: _Reader, affinity: Mapping[str, Any]) -> _InterPodTerms:
        namespace = reader.string(reader.metadata, "namespace", "metadata.namespace") or "default"
        labels = reader.string_map(reader.metadata, "labels", "metadata.labels")
        found: dict[str, tuple[list[PodAffinityTerm], list[WeightedTerm]]] = {}
        for kind in ("podAffinity", "podAntiAffinity"):
            path = f"spec.affinity.{kind}"
            section = reader.mapping(affinity, path)
            required_path = f"{path}.requiredDuringSchedulingIgnoredDuringExecution"
            required = [
                _affinity_term(reader, term, f"{required_path}[{i}]", namespace, labels)
                for i, term in enumerate(reader.sequence(section, required_path))
            ]
            preferred_path = f"{path}.preferredDuringSchedulingIgnoredDuringExecution"
            preferred = []
            for i, item in enumerate(reader.sequence(section, preferred_path)):
                field = f"{preferred_path}[{i}]"
                item = reader.as_mapping(item, field)
                weight = item.get("weight", 0)
                if (
                    not isinstance(weight, int)
                    or isinstance(weight, bool)
                    or not 0 <= weight <= 100
                ):
                    raise reader.error(
                        f"{field}.weight", f"{weight!r} is not an integer from 0 to 100"
                    )
                term = _affinity_term(
                    reader,
                    item.get("podAffinityTerm"),
                    f"{field}.podAffinityTerm",
                    namespace,
                    labels,
                ).matcher()
                if weight and term is not None:  # neither can change a score
                    preferred.append(WeightedTerm(weight, term))
            found[kind] = (required, preferred)
        anti = (m for m in (t.matcher() for t in found["podAntiAffinity"][0]) if m is not None)
        return cls(
            required_affinity=tuple(found["podAffinity"][0]),
            required_anti_affinity=tuple(anti),
            preferred_affinity=tuple(found["podAffinity"][1]),
            preferred_anti_affinity=tuple(found["podAntiAffinity"][1]),
        )


def _affinity_term(
    reader: _Reader, term: Any, field: str, namespace: str, labels: Mapping[str, str]
) -> PodAffinityTerm:
    """One ``PodAffinityTerm`` of a pod in ``namespace`` with ``labels`` (see
    :class:`_InterPodTerms`)."""
    if not isinstance(term, Mapping):
        raise reader.error(field, "expected an object")
    selector = _label_selector(reader, term.get("labelSelector"), f"{field}.labelSelector")
    merged: list[Requirement] = []
    for name, operator in (("matchLabelKeys", "In"), ("mismatchLabelKeys", "NotIn")):
        keys = reader.sequence(term, f"{field}.{name}")
        if not all(isinstance(k, str) for k in keys):
            raise reader.error(f"{field}.{name}", "expected a list of strings")
        if selector is None:  # the API server rejects keys without a selector
            continue
        present = {r.key for r in selector.requirements}
        merged += (
            Requirement(k, operator, (labels[k],)) for k in keys if k in labels and k not in present
        )
    if selector is not None and merged:
        selector = LabelSelector(selector.requirements + tuple(merged))
    names = reader.sequence(term, f"{field}.namespaces")
    if not all(isinstance(n, str) for n in names):
        raise reader.error(f"{field}.namespaces", "expected a list of strings")
    namespace_selector = _label_selector(
        reader, term.get("namespaceSelector"), f"{field}.namespaceSelector"
    )
    namespaces: frozenset[str] | None
    if namespace_selector is not None and not namespace_selector.requirements:
        namespaces, namespace_selector = None, None  # an empty selector: every namespace
    elif names or namespace_selector is not None:
        namespaces = frozenset(names)
    else:
        namespaces = frozenset({namespace})
    return PodAffinityTerm(
        selector,
        namespaces,
        reader.string(term, "topologyKey", f"{field}.topologyKey"),
        namespace_selector,
    )


def parse_namespace(obj: Mapping[str, Any]) -> NamespaceInfo:
    """A namespace from its API JSON (name and labels)."""
    reader = _Reader(obj, "namespace")
    return NamespaceInfo(
        reader.name, reader.string_map(reader.metadata, "labels", "metadata.labels")
    )


def _spread_constraints(
    reader: _Reader, spec: Mapping[str, Any]
) -> tuple[tuple[SpreadConstraint, ...], tuple[SpreadConstraint, ...]]:
    """The ``DoNotSchedule`` and the ``ScheduleAnyway`` constraints."""
    labels = reader.string_map(reader.metadata, "labels", "metadata.labels")
    hard: list[SpreadConstraint] = []
    soft: list[SpreadConstraint] = []
    path = "spec.topologySpreadConstraints"
    for i, item in enumerate(reader.sequence(spec, path)):
        field = f"{path}[{i}]"
        item = reader.as_mapping(item, field)
        when = reader.string(item, "whenUnsatisfiable", f"{field}.whenUnsatisfiable")
        if when not in ("DoNotSchedule", "ScheduleAnyway"):
            raise reader.error(
                f"{field}.whenUnsatisfiable", f"{when!r} is not DoNotSchedule or ScheduleAnyway"
            )
        max_skew, min_domains = item.get("maxSkew"), item.get("minDomains", 1)
        for name, value in (("maxSkew", max_skew), ("minDomains", min_domains)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise reader.error(f"{field}.{name}", f"{value!r} is not an integer ≥ 1")
        assert isinstance(max_skew, int) and isinstance(min_domains, int)  # checked above
        policies = []
        for name in ("nodeAffinityPolicy", "nodeTaintsPolicy"):
            policy = reader.string(item, name, f"{field}.{name}")
            if policy not in ("", "Honor", "Ignore"):
                raise reader.error(f"{field}.{name}", f"{policy!r} is not Honor or Ignore")
            policies.append(policy)
        selector = _label_selector(reader, item.get("labelSelector"), f"{field}.labelSelector")
        keys = reader.sequence(item, f"{field}.matchLabelKeys")
        if not all(isinstance(k, str) for k in keys):
            raise reader.error(f"{field}.matchLabelKeys", "expected a list of strings")
        if selector is not None:  # kube merges the pod's values of these keys into it
            extra = tuple(Requirement(k, "In", (labels[k],)) for k in keys if k in labels)
            selector = LabelSelector(selector.requirements + extra)
        (hard if when == "DoNotSchedule" else soft).append(
            SpreadConstraint(
                max_skew=max_skew,
                topology_key=reader.string(item, "topologyKey", f"{field}.topologyKey"),
                selector=selector,
                min_domains=min_domains,
                honor_node_affinity=policies[0] != "Ignore",
                honor_node_taints=policies[1] == "Honor",
            )
        )
    return tuple(hard), tuple(soft)


def _unsupported_spec_fields(reader: _Reader, spec: Mapping[str, Any]) -> list[str]:
    fields: list[str] = []
    if spec.get("resourceClaims"):
        fields.append("spec.resourceClaims")
    for i, volume in enumerate(reader.sequence(spec, "spec.volumes")):
        if not isinstance(volume, Mapping):
            raise reader.error(f"spec.volumes[{i}]", "expected an object")
        for kind in (*INLINE_DISK_VOLUMES, *MIGRATED_IN_TREE_SOURCES):
            if volume.get(kind) is not None:
                why = "disk conflicts" if kind in INLINE_DISK_VOLUMES else "attach limits"
                fields.append(f"spec.volumes[{i}].{kind} (inline in-tree volume: {why})")
                break
    return fields


def _inline_attached(reader: _Reader, spec: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(CSI driver, volume) of each inline in-tree volume kube migrates to a CSI driver:
    what a placed pod attaches besides its claims (a pending one with them is refused)."""
    found = []
    for i, volume in enumerate(reader.sequence(spec, "spec.volumes")):
        for source, (driver, field) in MIGRATED_IN_TREE_SOURCES.items():
            inline = reader.mapping(reader.as_mapping(volume, f"spec.volumes[{i}]"), source)
            if inline:
                path = f"spec.volumes[{i}].{source}.{field}"
                found.append((driver, reader.string(inline, field, path)))
    return tuple(found)


def _volume_claims(reader: _Reader, spec: Mapping[str, Any]) -> tuple[PodVolumeClaim, ...]:
    """The claims of ``persistentVolumeClaim`` and ``ephemeral`` volumes, in volume order
    (an ephemeral volume's claim is named ``<pod>-<volume>``, as its controller names it)."""
    claims: list[PodVolumeClaim] = []
    for i, volume in enumerate(reader.sequence(spec, "spec.volumes")):
        field = f"spec.volumes[{i}]"
        volume = reader.as_mapping(volume, field)
        claim = volume.get("persistentVolumeClaim")
        if claim is not None:
            path = f"{field}.persistentVolumeClaim"
            name = reader.string(reader.as_mapping(claim, path), "claimName", f"{path}.claimName")
            if not name:
                raise reader.error(f"{path}.claimName", "missing")
            claims.append(PodVolumeClaim(path, name, ephemeral=False))
        elif volume.get("ephemeral") is not None:
            volume_name = reader.string(volume, "name", f"{field}.name")
            if not volume_name:
                raise reader.error(f"{field}.name", "missing")
            claims.append(
                PodVolumeClaim(f"{field}.ephemeral", f"{reader.name}-{volume_name}", ephemeral=True)
            )
    return tuple(claims)


def parse_claim(obj: Mapping[str, Any]) -> ClaimInfo:
    """A PersistentVolumeClaim from its API JSON; :class:`ObjectError` names the field."""
    reader = _Reader(obj, "persistentvolumeclaim")
    metadata = reader.metadata
    spec = reader.mapping(obj, "spec")
    annotations = reader.string_map(metadata, "annotations", "metadata.annotations")
    modes = reader.sequence(spec, "spec.accessModes")
    if not all(isinstance(m, str) for m in modes):
        raise reader.error("spec.accessModes", "expected a list of strings")
    controller_uid = ""
    for i, owner in enumerate(reader.sequence(metadata, "metadata.ownerReferences")):
        owner = reader.as_mapping(owner, f"metadata.ownerReferences[{i}]")
        if owner.get("controller") is True:
            controller_uid = reader.string(owner, "uid", f"metadata.ownerReferences[{i}].uid")
    storage_class = annotations.get(ANNOTATION_BETA_STORAGE_CLASS)
    if storage_class is None:
        storage_class = reader.string(spec, "storageClassName", "spec.storageClassName")
    return ClaimInfo(
        namespace=reader.string(metadata, "namespace", "metadata.namespace") or "default",
        name=reader.name,
        volume_name=reader.string(spec, "volumeName", "spec.volumeName"),
        bind_completed=ANNOTATION_BIND_COMPLETED in annotations,
        storage_class=storage_class,
        access_modes=frozenset(modes),
        deleting=metadata.get("deletionTimestamp") is not None,
        lost=reader.mapping(obj, "status").get("phase") == "Lost",
        controller_uid=controller_uid,
    )


def parse_volume(obj: Mapping[str, Any]) -> VolumeInfo:
    """A PersistentVolume from its API JSON; :class:`ObjectError` names the field."""
    reader = _Reader(obj, "persistentvolume")
    spec = reader.mapping(obj, "spec")
    required = reader.mapping(
        reader.mapping(spec, "spec.nodeAffinity"), "spec.nodeAffinity.required"
    )
    node_affinity = None
    if required:
        path = "spec.nodeAffinity.required.nodeSelectorTerms"
        node_affinity = tuple(
            _node_selector_term(reader, term, f"{path}[{i}]")
            for i, term in enumerate(reader.sequence(required, path))
        )
    labels = reader.string_map(reader.metadata, "labels", "metadata.labels")
    zones = []
    for key in VOLUME_ZONE_LABELS:
        values = [v.strip() for v in labels.get(key, "").split("__")]
        if all(values):  # kube-scheduler ignores a label with an empty zone (or no value)
            zones.append((key, frozenset(values)))
    return VolumeInfo(reader.name, node_affinity, tuple(zones), _attached_as(reader, spec))


def _attached_as(reader: _Reader, spec: Mapping[str, Any]) -> tuple[str, str] | None:
    csi = reader.mapping(spec, "spec.csi")
    if csi:
        driver = reader.string(csi, "driver", "spec.csi.driver")
        return driver, reader.string(csi, "volumeHandle", "spec.csi.volumeHandle")
    for source, (driver, field) in MIGRATED_IN_TREE_SOURCES.items():
        found = reader.mapping(spec, f"spec.{source}")
        if found:
            return driver, reader.string(found, field, f"spec.{source}.{field}")
    return None


def parse_csi_node(obj: Mapping[str, Any]) -> CSINodeInfo:
    """A CSINode from its API JSON (per driver, the attach limit when it has one)."""
    reader = _Reader(obj, "csinode")
    limits: dict[str, int] = {}
    path = "spec.drivers"
    for i, driver in enumerate(reader.sequence(reader.mapping(obj, "spec"), path)):
        driver = reader.as_mapping(driver, f"{path}[{i}]")
        allocatable = reader.mapping(driver, f"{path}[{i}].allocatable")
        count = allocatable.get("count")
        if count is None:
            continue
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise reader.error(f"{path}[{i}].allocatable.count", f"{count!r} is not a count")
        limits[reader.string(driver, "name", f"{path}[{i}].name")] = count
    return CSINodeInfo(reader.name, limits)


def parse_storage_class(obj: Mapping[str, Any]) -> StorageClassInfo:
    """A StorageClass from its API JSON (name, binding mode, provisioner)."""
    reader = _Reader(obj, "storageclass")
    mode = reader.string(obj, "volumeBindingMode", "volumeBindingMode") or "Immediate"
    provisioner = reader.string(obj, "provisioner", "provisioner")
    return StorageClassInfo(
        reader.name, mode, MIGRATED_IN_TREE_PROVISIONERS.get(provisioner, provisioner)
    )


def _tolerance(reader: _Reader, annotations: Mapping[str, str]) -> InterferenceTolerance | None:
    bounds = {
        ANNOTATION_MAX_RUNQ_P99_US: ("a non-negative number of microseconds", '"500"', None),
        ANNOTATION_MAX_RECLAIM_STALL_MS_PER_S: (
            "a non-negative number of milliseconds per second",
            '"2"',
            None,
        ),
        ANNOTATION_MAX_SCORE: ("a number from 0 to 100", '"40"', 100.0),
    }
    values: dict[str, float | None] = {}
    for annotation, (expected, example, upper) in bounds.items():
        raw = annotations.get(annotation)
        if raw is None:
            values[annotation] = None
            continue
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not (math.isfinite(value) and value >= 0 and (upper is None or value <= upper)):
            raise reader.error(
                f"annotation {annotation}",
                f"{raw!r} is not valid; expected {expected}, e.g. {annotation}: {example}",
            )
        values[annotation] = value
    if all(v is None for v in values.values()):
        return None
    return InterferenceTolerance(
        max_runq_p99_us=values[ANNOTATION_MAX_RUNQ_P99_US],
        max_reclaim_stall_ms_per_s=values[ANNOTATION_MAX_RECLAIM_STALL_MS_PER_S],
        max_score=values[ANNOTATION_MAX_SCORE],
    )


def _timestamp(reader: _Reader, value: Any) -> float:
    if value is None:
        return 0.0
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise reader.error(
            "metadata.creationTimestamp", f"{value!r} is not an RFC 3339 time"
        ) from exc


def node_requirement_errors(requirement: Requirement) -> list[str]:
    """Why kube's ``labels.NewRequirement`` would reject a node-selector expression (none
    when it is valid): the key must be a qualified name; ``In``/``NotIn`` need values,
    ``Exists``/``DoesNotExist`` none, ``Gt``/``Lt`` exactly one base-10 int64; and every
    value must be a valid label value (so a negative ``Gt`` bound is rejected too)."""
    errors = []
    if not _is_qualified_name(requirement.key):
        errors.append(f"key: {requirement.key!r} is not a valid label key")
    op, values = requirement.operator, requirement.values
    if op in ("In", "NotIn") and not values:
        errors.append(f"values: {op} needs at least one value")
    elif op in ("Exists", "DoesNotExist") and values:
        errors.append(f"values: {op} takes no values")
    elif op in ("Gt", "Lt"):
        if len(values) != 1:
            errors.append(f"values: {op} needs exactly one value")
        errors.extend(
            f"values[{i}]: {v!r} is not a base-10 64-bit integer"
            for i, v in enumerate(values)
            if parse_int64(v) is None
        )
    errors.extend(
        f"values[{i}]: {v!r} is not a valid label value"
        for i, v in enumerate(values)
        if not is_label_value(v)
    )
    return errors


def parse_int64(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 10, 64)``: an optional sign and ASCII digits only
    (no spaces, no ``_``), within the signed 64-bit range; ``None`` otherwise."""
    if not _DECIMAL.fullmatch(text):
        return None
    number = int(text)
    return number if -(2**63) <= number < 2**63 else None


def is_label_value(text: str) -> bool:
    """A valid label value: empty, or at most 63 alphanumerics, ``-``, ``_``, ``.``,
    beginning and ending with an alphanumeric."""
    return len(text) <= 63 and _LABEL_VALUE.fullmatch(text) is not None


def _is_qualified_name(text: str) -> bool:
    prefix, slash, name = text.rpartition("/")
    if slash and not (0 < len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and _LABEL_VALUE.fullmatch(name) is not None


_DECIMAL = re.compile(r"[+-]?[0-9]+", re.ASCII)
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?", re.ASCII)
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")


def _label_requirement_holds(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    """Label-selector semantics: ``NotIn`` and ``DoesNotExist`` hold when the key is absent."""
    value = labels.get(requirement.key)
    op = requirement.operator
    if op == "In":
        return value is not None and value in requirement.values
    if op == "NotIn":
        return value is None or value not in requirement.values
    if op == "Exists":
        return value is not None
    return value is None  # DoesNotExist
