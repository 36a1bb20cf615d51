"""What the scheduler keeps of API objects: frozen dataclasses for nodes, pods, namespaces
and volumes, with the well-known labels, taints and annotations they are read from (the
interference tolerance annotations are described in :mod:`scheduler.api.pods`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from interference import annotations as pod_annotations
from scheduler.api.selectors import LabelSelector, NodeSelectorTerm

HOSTNAME_LABEL = "kubernetes.io/hostname"


UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"


NOT_READY_TAINT_KEY = "node.kubernetes.io/not-ready"


GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"


ANNOTATION_MAX_RUNQ_P99_US = pod_annotations.MAX_RUNQ_P99_US


ANNOTATION_MAX_RECLAIM_STALL_MS_PER_S = pod_annotations.MAX_RECLAIM_STALL_MS_PER_S


ANNOTATION_MAX_INDEX = pod_annotations.MAX_INDEX


ANNOTATION_REBALANCE = pod_annotations.REBALANCE
"""``"false"`` keeps the rebalancer from ever evicting the pod (scheduler/rebalancing/rebalance.py);
read by :func:`interference.annotations.flag_value`."""


NO_SCHEDULE = "NoSchedule"


NO_EXECUTE = "NoExecute"


PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"


PREEMPT_NEVER = "Never"


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
    """Each of :data:`scheduler.api.storage.VOLUME_ZONE_LABELS` the PV carries, with its
    values split at ``__``."""
    attached_as: tuple[str, str] | None = None
    """(CSI driver, volume handle) a node attaches it as, for attach limits: ``spec.csi``,
    or an in-tree source under the CSI driver kube migrates it to
    (:data:`scheduler.api.storage.MIGRATED_IN_TREE_SOURCES`); ``None`` for volumes without
    attach limits (local, hostPath, NFS, …)."""
    local: bool = False
    """``spec.local`` or ``spec.hostPath``: its data live on one node's disk."""


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


@dataclass(frozen=True, slots=True)
class InterferenceTolerance:
    """Upper bounds a pod accepts on its node's signals; ``None`` = no bound."""

    max_runq_p99_us: float | None = None
    max_reclaim_stall_ms_per_s: float | None = None
    max_index: float | None = None


@dataclass(frozen=True, slots=True)
class ControllerRef:
    """The owner reference with ``controller: true``: the workload that recreates the pod."""

    kind: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    allocatable: Mapping[str, int]
    """Resource → amount (cpu in millicores), as in :mod:`scheduler.api.quantity`."""
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


class PodWarning(NamedTuple):
    """One thing a pod's owner should fix: the Warning Event's reason and note."""

    reason: str
    """``UnknownAnnotation`` or ``InvalidAnnotation``."""
    message: str


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
    """Effective requests as kube-scheduler counts them (see :mod:`scheduler.api.requests`)."""
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
    warnings: tuple[PodWarning, ...] = ()
    """What the pod's owner should fix though the pod was understood (a deprecated or an
    unknown ``interference.io/`` annotation): the scheduler says so in Warning Events."""
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
    attach limits once it is placed (:data:`scheduler.api.storage.MIGRATED_IN_TREE_SOURCES`)."""
    controller: ControllerRef | None = None
    """Its controlling owner (``ownerReferences[].controller: true``), ``None`` when none."""
    rebalance_opt_out: bool = False
    """Annotation :data:`ANNOTATION_REBALANCE` is ``"false"`` (or ``no``/``off``/``0``, or
    a value that reads as neither: :func:`interference.annotations.flag_value`): never
    evicted to move it."""
    rebalance_opt_in: bool = False
    """Annotation :data:`ANNOTATION_REBALANCE` is ``"true"`` (or ``yes``/``on``/``1``): the
    owner accepts what an eviction loses (its local storage, a Job's attempt;
    scheduler/rebalancing/evictable.py)."""
    priority_class: str = ""
    """``spec.priorityClassName``."""
    local_storage: tuple[str, ...] = ()
    """Its volumes whose data stay on the node (``emptyDir data``, ``hostPath logs``)."""
    mirror: bool = False
    """A mirror pod: annotation ``kubernetes.io/config.mirror`` (the kubelet's static pod)."""
    static: bool = False
    """A static pod: annotation ``kubernetes.io/config.source`` other than ``api``."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def signature(self) -> tuple[object, ...]:
        """Hashable key of everything the cached constraint masks depend on."""
        return (self.tolerations, self.node_selector, self.required_node_affinity)
