"""Parsing of Pod API JSON into :class:`scheduler.api.objects.PodInfo` (requests are
counted in :mod:`scheduler.api.requests`).

Interference tolerance — annotations a pod may set to keep off noisy nodes (each optional;
a node whose fresh signals exceed any of them is filtered out):

``interference.io/max-runq-p99-us``
    highest node run-queue p99 the pod accepts, microseconds (non-negative number, ``"500"``).
``interference.io/max-reclaim-stall-ms-per-s``
    highest node memory-reclaim stall, milliseconds per second (non-negative number, ``"2"``).
``interference.io/max-index``
    highest node interference index, 0–100 (``"40"``); the index includes load bound to the
    node since its last report.

Any other key under ``interference.io/`` that no program reads
(:mod:`interference.annotations`), and any key under a domain a typo away from it
(``interferance.io/``, ``interference.com/``), is a warning too — a Warning ``UnknownAnnotation``
Event naming the closest known key — since the pod would otherwise run unprotected by a
typo.

Fields a pod asks for that standalone mode does not implement (volumes that need binding
or volume topology, DRA resource claims, …) are listed in
:attr:`~scheduler.api.objects.PodInfo.unsupported`: the cycle refuses such a pod (it stays
Pending with a ``FailedScheduling`` Event naming the field) rather than place it with a
constraint ignored.

Size: just over 500 lines: one Pod spec, field by field, with kube's validation messages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from interference.annotations import (
    flag_value,
    invalid_flag_messages,
    unknown_annotation_messages,
)
from scheduler.api.objects import (
    ANNOTATION_MAX_INDEX,
    ANNOTATION_MAX_RECLAIM_STALL_MS_PER_S,
    ANNOTATION_MAX_RUNQ_P99_US,
    ANNOTATION_REBALANCE,
    PREEMPT_LOWER_PRIORITY,
    PREEMPT_NEVER,
    WILDCARD_IP,
    AntiAffinityTerm,
    ControllerRef,
    HostPort,
    InterferenceTolerance,
    PodAffinityTerm,
    PodInfo,
    PodVolumeClaim,
    PodWarning,
    SpreadConstraint,
    Toleration,
    WeightedTerm,
)
from scheduler.api.reader import ObjectError, Reader
from scheduler.api.requests import pod_requests
from scheduler.api.selectors import (
    LabelSelector,
    NodeSelectorTerm,
    Requirement,
    parse_label_selector,
    parse_node_selector_term,
)
from scheduler.api.storage import INLINE_DISK_VOLUMES, MIGRATED_IN_TREE_SOURCES

_T = TypeVar("_T")


def parse_pod(obj: Mapping[str, Any]) -> PodInfo:
    """A pod from its API JSON; :class:`ObjectError` names the malformed field or annotation."""
    reader = Reader(obj, "pod")
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
    requests, nonzero_cpu_m, nonzero_memory = pod_requests(
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
    rebalance: bool | None = None  # absent: neither opts in nor out
    if ANNOTATION_REBALANCE in annotations:  # neither true nor false: false, and a warning
        rebalance = flag_value(annotations[ANNOTATION_REBALANCE]) is True
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
        warnings=own_scheduling(lambda: _annotation_warnings(annotations), ()),
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
        controller=_controller(reader, metadata),
        rebalance_opt_out=rebalance is False,
        rebalance_opt_in=rebalance is True,
        priority_class=own_scheduling(
            lambda: reader.string(spec, "priorityClassName", "spec.priorityClassName"), ""
        ),
        local_storage=_local_storage(spec),
        mirror=MIRROR_ANNOTATION in annotations,
        static=annotations.get(CONFIG_SOURCE_ANNOTATION, "api") != "api",
    )


MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
"""The kubelet's mark of a mirror pod (the API's copy of a static pod)."""
CONFIG_SOURCE_ANNOTATION = "kubernetes.io/config.source"
"""Where the kubelet got the pod from: ``api``, or ``file``/``http`` for a static pod."""
LOCAL_STORAGE_SOURCES = ("emptyDir", "hostPath")
"""Volume sources whose data stay on the node (the descheduler's local storage)."""


def _local_storage(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """``<source> <volume name>`` of each volume in :data:`LOCAL_STORAGE_SOURCES`; a
    malformed entry is left out here (the volume parsers name it)."""
    found: list[str] = []
    volumes = spec.get("volumes")
    for volume in volumes if isinstance(volumes, list) else ():
        if not isinstance(volume, Mapping):
            continue
        for source in LOCAL_STORAGE_SOURCES:
            if volume.get(source) is not None:
                found.append(f"{source} {volume.get('name', '')}")
    return tuple(found)


def _controller(reader: Reader, metadata: Mapping[str, Any]) -> ControllerRef | None:
    """The owner reference with ``controller: true`` (the API allows at most one); ``None``
    also for one that does not read, which only makes the pod one the rebalancer leaves
    alone (it is no reason to refuse scheduling it)."""
    try:
        for i, owner in enumerate(reader.sequence(metadata, "metadata.ownerReferences")):
            owner = reader.as_mapping(owner, f"metadata.ownerReferences[{i}]")
            if owner.get("controller") is True:
                field = f"metadata.ownerReferences[{i}]"
                return ControllerRef(
                    kind=reader.string(owner, "kind", f"{field}.kind"),
                    name=reader.string(owner, "name", f"{field}.name"),
                    uid=reader.string(owner, "uid", f"{field}.uid"),
                )
    except ObjectError:
        pass
    return None


def _preemption_policy(reader: Reader, spec: Mapping[str, Any]) -> str:
    policy = reader.string(spec, "preemptionPolicy", "spec.preemptionPolicy")
    policy = policy or PREEMPT_LOWER_PRIORITY
    if policy not in (PREEMPT_LOWER_PRIORITY, PREEMPT_NEVER):
        raise reader.error(
            "spec.preemptionPolicy",
            f"{policy!r} is not {PREEMPT_LOWER_PRIORITY} or {PREEMPT_NEVER}",
        )
    return policy


def _host_ports(reader: Reader, spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
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


def _tolerations(reader: Reader, spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
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


def _node_affinity(
    reader: Reader, affinity: Mapping[str, Any]
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
        parse_node_selector_term(reader, term, f"{terms_path}[{i}]")
        for i, term in enumerate(reader.sequence(required, terms_path))
    )


def _preferred_node_affinity(
    reader: Reader, affinity: Mapping[str, Any]
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
        term = parse_node_selector_term(reader, item.get("preference"), f"{field}.preference")
        if term.parse_errors:
            raise reader.error(f"{field}.preference", "; ".join(term.parse_errors))
        if weight and (term.match_expressions or term.match_fields):
            preferred.append((weight, term))
    return tuple(preferred)


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
    def parse(cls, reader: Reader, affinity: Mapping[str, Any]) -> _InterPodTerms:
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
    reader: Reader, term: Any, field: str, namespace: str, labels: Mapping[str, str]
) -> PodAffinityTerm:
    """One ``PodAffinityTerm`` of a pod in ``namespace`` with ``labels`` (see
    :class:`_InterPodTerms`)."""
    if not isinstance(term, Mapping):
        raise reader.error(field, "expected an object")
    selector = parse_label_selector(reader, term.get("labelSelector"), f"{field}.labelSelector")
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
    namespace_selector = parse_label_selector(
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


def _spread_constraints(
    reader: Reader, spec: Mapping[str, Any]
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
        selector = parse_label_selector(reader, item.get("labelSelector"), f"{field}.labelSelector")
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


def _unsupported_spec_fields(reader: Reader, spec: Mapping[str, Any]) -> list[str]:
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


def _inline_attached(reader: Reader, spec: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
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


def _volume_claims(reader: Reader, spec: Mapping[str, Any]) -> tuple[PodVolumeClaim, ...]:
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


def _tolerance(reader: Reader, annotations: Mapping[str, str]) -> InterferenceTolerance | None:
    bounds = {
        ANNOTATION_MAX_RUNQ_P99_US: ("a non-negative number of microseconds", '"500"', None),
        ANNOTATION_MAX_RECLAIM_STALL_MS_PER_S: (
            "a non-negative number of milliseconds per second",
            '"2"',
            None,
        ),
        ANNOTATION_MAX_INDEX: ("a number from 0 to 100", '"40"', 100.0),
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
        max_index=values[ANNOTATION_MAX_INDEX],
    )


def _annotation_warnings(annotations: Mapping[str, str]) -> tuple[PodWarning, ...]:
    """Each ``interference.io/`` key no program reads (a typo would leave the pod
    unprotected while its owner believes it protected), and each flag annotation that reads
    as neither true nor false."""
    unknown = [PodWarning("UnknownAnnotation", m) for m in unknown_annotation_messages(annotations)]
    invalid = [PodWarning("InvalidAnnotation", m) for m in invalid_flag_messages(annotations)]
    return tuple(unknown + invalid)


def _timestamp(reader: Reader, value: Any) -> float:
    if value is None:
        return 0.0
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise reader.error(
            "metadata.creationTimestamp", f"{value!r} is not an RFC 3339 time"
        ) from exc
