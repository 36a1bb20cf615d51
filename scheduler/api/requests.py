"""A pod's resource requests.

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.api.quantity import CPU, MEMORY
from scheduler.api.reader import Reader

HUGEPAGES = "hugepages-"
"""Prefix of the hugepage resources kube-scheduler takes at pod level, besides cpu and memory."""


DEFAULT_MILLI_CPU_REQUEST = 100
"""kube-scheduler's stand-in for a container without a CPU request, in scoring only."""


DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024
"""kube-scheduler's stand-in for a container without a memory request, in scoring only."""


def pod_requests(
    reader: Reader, spec: Mapping[str, Any], status: Mapping[str, Any]
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


def _pod_level_requests(reader: Reader, spec: Mapping[str, Any]) -> dict[str, int]:
    """``spec.resources.requests`` for the resources kube-scheduler takes at pod level (cpu,
    memory, hugepages-*); any other name there is ignored, as kube ignores it."""
    requested = reader.resources(
        reader.mapping(reader.mapping(spec, "spec.resources"), "spec.resources.requests"),
        "spec.resources.requests",
    )
    return {r: a for r, a in requested.items() if r in (CPU, MEMORY) or r.startswith(HUGEPAGES)}


def _resize_infeasible(reader: Reader, status: Mapping[str, Any]) -> bool:
    """The first ``PodResizePending`` condition has reason ``Infeasible``."""
    for i, condition in enumerate(reader.sequence(status, "status.conditions")):
        condition = reader.as_mapping(condition, f"status.conditions[{i}]")
        if condition.get("type") == "PodResizePending":
            return condition.get("reason") == "Infeasible"
    return False


def _container_statuses(
    reader: Reader, status: Mapping[str, Any]
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
