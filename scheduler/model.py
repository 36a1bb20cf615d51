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

Fields a pod asks for that standalone mode does not implement (pod affinity, anti-affinity
on other topology keys, topology spread, volumes that need binding or volume topology, …)
are listed in :attr:`PodInfo.unsupported`: the engine refuses such a pod (it stays Pending
with a ``FailedScheduling`` Event naming the field) rather than place it with a constraint
ignored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from interference.signals import GpuDevice
from scheduler.quantity import CPU, MEMORY, QuantityError, resource_amount

HOSTNAME_LABEL = "kubernetes.io/hostname"
UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT_KEY = "node.kubernetes.io/not-ready"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_LABELS = (GPU_PRODUCT_LABEL, GPU_MEMORY_LABEL)
"""Node labels a node without them gets from its agent's GPUs (:func:`gpu_labels`)."""

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


@dataclass(frozen=True, slots=True)
class AntiAffinityTerm:
    """A required pod anti-affinity term (also the pod matcher other filters use)."""

    selector: LabelSelector
    namespaces: frozenset[str] | None
    """Namespaces whose pods it considers; ``None`` means all namespaces."""
    topology_key: str = HOSTNAME_LABEL
    """Two pods conflict when their nodes share this label's value."""

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """True when a pod in ``namespace`` with ``labels`` falls under this term."""
        in_scope = self.namespaces is None or namespace in self.namespaces
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

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """True when a pod in ``namespace`` with ``labels`` falls under this term."""
        in_scope = self.namespaces is None or namespace in self.namespaces
        return in_scope and self.selector is not None and self.selector.matches(labels)


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
    """Required pod anti-affinity terms on ``kubernetes.io/hostname``."""
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
    preferred_node_affinity: tuple[tuple[int, NodeSelectorTerm], ...] = ()
    """(weight, term) of the preferred node affinity terms (a score)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def signature(self) -> tuple[object, ...]:
        """Hashable key of everything the cached constraint masks depend on."""
        return (self.tolerations, self.node_selector, self.required_node_affinity)


def gpu_labels(devices: Sequence[GpuDevice]) -> dict[str, str]:
    """The GPU labels NVIDIA's GPU feature discovery would set, from the agent's devices.

    Of the device with the lowest index (GFD labels a node by one device, too)::

        nvidia.com/gpu.product = model, each run of characters a label value cannot hold
                                 (not alphanumeric, ``-``, ``_``, ``.``) replaced by ``-``,
                                 trimmed to alphanumeric ends and 63 characters
                                 ("NVIDIA A100-SXM4-80GB" → "NVIDIA-A100-SXM4-80GB")
        nvidia.com/gpu.memory  = memory_total_mib rounded to a whole MiB ("81920")

    A label is left out when its value would be empty (no model, no memory) — and both
    without devices.
    """
    if not devices:
        return {}
    first = min(devices, key=lambda d: d.index)
    labels = {}
    product = _LABEL_VALUE_TRIM.sub("", _LABEL_VALUE_INVALID.sub("-", first.model)[:63])
    if product:
        labels[GPU_PRODUCT_LABEL] = product
    if first.memory_total_mib >= 1:
        labels[GPU_MEMORY_LABEL] = str(round(first.memory_total_mib))
    return labels


_LABEL_VALUE_INVALID = re.compile(r"[^A-Za-z0-9_.-]+")
_LABEL_VALUE_TRIM = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


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
    unsupported: list[str] = []
    spread, soft_spread = _spread_constraints(reader, spec)
    pod_affinity = _pod_affinity(reader, reader.mapping(spec, "spec.affinity"), unsupported)
    requests, nonzero_cpu_m, nonzero_memory = _pod_requests(
        reader, spec, reader.mapping(obj, "status")
    )
    annotations = reader.string_map(metadata, "annotations", "metadata.annotations")
    priority = spec.get("priority") or 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise reader.error("spec.priority", f"{priority!r} is not an integer")
    gates = tuple(
        reader.string(g, "name", f"spec.schedulingGates[{i}].name")
        for i, g in enumerate(reader.sequence(spec, "spec.schedulingGates"))
    )
    affinity = reader.mapping(spec, "spec.affinity")
    preemption_policy = (
        reader.string(spec, "preemptionPolicy", "spec.preemptionPolicy") or PREEMPT_LOWER_PRIORITY
    )
    if preemption_policy not in (PREEMPT_LOWER_PRIORITY, PREEMPT_NEVER):
        raise reader.error(
            "spec.preemptionPolicy",
            f"{preemption_policy!r} is not {PREEMPT_LOWER_PRIORITY} or {PREEMPT_NEVER}",
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
        tolerations=_tolerations(reader, spec),
        node_selector=tuple(
            sorted(reader.string_map(spec, "nodeSelector", "spec.nodeSelector").items())
        ),
        required_node_affinity=_node_affinity(reader, affinity),
        anti_affinity=_pod_anti_affinity(reader, affinity, unsupported),
        labels=reader.string_map(metadata, "labels", "metadata.labels"),
        tolerance=_tolerance(reader, annotations),
        scheduling_gates=gates,
        unsupported=tuple(unsupported + _unsupported_spec_fields(reader, spec)),
        preemption_policy=preemption_policy,
        spread=spread,
        soft_spread=soft_spread,
        pod_affinity=pod_affinity,
        preferred_node_affinity=_preferred_node_affinity(reader, affinity),
    )


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


def _pod_affinity(
    reader: _Reader, affinity: Mapping[str, Any], unsupported: list[str]
) -> tuple[PodAffinityTerm, ...]:
    """Required pod affinity terms; the preferred ones and the fields not implemented
    (``matchLabelKeys``, ``mismatchLabelKeys``, a non-empty ``namespaceSelector``) are named
    unsupported."""
    path = "spec.affinity.podAffinity"
    pod_affinity = reader.mapping(affinity, path)
    if pod_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"):
        unsupported.append(f"{path}.preferredDuringSchedulingIgnoredDuringExecution")
    namespace = reader.string(reader.metadata, "namespace", "metadata.namespace") or "default"
    terms = []
    required_path = f"{path}.requiredDuringSchedulingIgnoredDuringExecution"
    for i, term in enumerate(reader.sequence(pod_affinity, required_path)):
        field = f"{required_path}[{i}]"
        term = reader.as_mapping(term, field)
        skipped = [k for k in ("matchLabelKeys", "mismatchLabelKeys") if term.get(k)]
        namespace_selector = term.get("namespaceSelector")
        if namespace_selector:
            skipped.append("namespaceSelector")
        if skipped:
            unsupported.extend(f"{field}.{k}" for k in skipped)
            continue
        names = reader.sequence(term, f"{field}.namespaces")
        if not all(isinstance(n, str) for n in names):
            raise reader.error(f"{field}.namespaces", "expected a list of strings")
        namespaces: frozenset[str] | None
        if namespace_selector is not None:  # an empty namespaceSelector selects all namespaces
            namespaces = None
        else:
            namespaces = frozenset(names) if names else frozenset({namespace})
        terms.append(
            PodAffinityTerm(
                _label_selector(reader, term.get("labelSelector"), f"{field}.labelSelector"),
                namespaces,
                reader.string(term, "topologyKey", f"{field}.topologyKey"),
            )
        )
    return tuple(terms)


def _pod_anti_affinity(
    reader: _Reader, affinity: Mapping[str, Any], unsupported: list[str]
) -> tuple[AntiAffinityTerm, ...]:
    path = "spec.affinity.podAntiAffinity"
    anti = reader.mapping(affinity, path)
    if anti.get("preferredDuringSchedulingIgnoredDuringExecution"):
        unsupported.append(f"{path}.preferredDuringSchedulingIgnoredDuringExecution")
    namespace = reader.string(reader.metadata, "namespace", "metadata.namespace") or "default"
    terms = []
    required_path = f"{path}.requiredDuringSchedulingIgnoredDuringExecution"
    for i, term in enumerate(reader.sequence(anti, required_path)):
        field = f"{required_path}[{i}]"
        if not isinstance(term, Mapping):
            raise reader.error(field, "expected an object")
        topology_key = reader.string(term, "topologyKey", f"{field}.topologyKey")
        skipped = [k for k in ("matchLabelKeys", "mismatchLabelKeys") if term.get(k)]
        namespace_selector = term.get("namespaceSelector")
        if namespace_selector:
            skipped.append("namespaceSelector")
        if skipped:
            unsupported.extend(f"{field}.{k}" for k in skipped)
            continue
        selector = _label_selector(reader, term.get("labelSelector"), f"{field}.labelSelector")
        if selector is None:  # a null selector matches no pod: the term can never conflict
            continue
        names = reader.sequence(term, f"{field}.namespaces")
        if not all(isinstance(n, str) for n in names):
            raise reader.error(f"{field}.namespaces", "expected a list of strings")
        namespaces: frozenset[str] | None
        if namespace_selector is not None:  # an empty namespaceSelector selects all namespaces
            namespaces = None
        else:
            namespaces = frozenset(names) if names else frozenset({namespace})
        terms.append(AntiAffinityTerm(selector, namespaces, topology_key))
    return tuple(terms)


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
        claim = volume.get("persistentVolumeClaim")
        if claim is not None:
            name = reader.string(
                reader.as_mapping(claim, f"spec.volumes[{i}].persistentVolumeClaim"),
                "claimName",
                f"spec.volumes[{i}].persistentVolumeClaim.claimName",
            )
            fields.append(f"spec.volumes[{i}].persistentVolumeClaim (claim {name})")
        if "ephemeral" in volume:  # its claim is named <pod>-<volume>
            volume_name = reader.string(volume, "name", f"spec.volumes[{i}].name")
            fields.append(f"spec.volumes[{i}].ephemeral (claim {reader.name}-{volume_name})")
    return fields


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
