"""PodDisruptionBudgets (``policy/v1``) as preemption reads them: which pods a budget
covers and how many disruptions it allows now (kube-scheduler's
``filterPodsWithPDBViolation``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.api.reader import Reader
from scheduler.api.selectors import LabelSelector, parse_label_selector


@dataclass(frozen=True, slots=True)
class DisruptionBudgetInfo:
    namespace: str
    name: str
    selector: LabelSelector | None
    """``spec.selector``; ``None`` or empty matches no pod (as kube-scheduler)."""
    disruptions_allowed: int
    """``status.disruptionsAllowed``."""
    disrupted_pods: frozenset[str]
    """Names in ``status.disruptedPods``: evictions the API server already counted."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def covers(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether the budget counts a pod: same namespace, a non-empty selector matching
        its labels (a pod without labels matches none)."""
        selector = self.selector
        return (
            namespace == self.namespace
            and bool(labels)
            and selector is not None
            and bool(selector.requirements)
            and selector.matches(labels)
        )


def parse_disruption_budget(obj: Mapping[str, Any]) -> DisruptionBudgetInfo:
    """A budget from its API JSON; a selector that does not parse matches no pod."""
    reader = Reader(obj, "poddisruptionbudget")
    spec = reader.mapping(obj, "spec")
    status = reader.mapping(obj, "status")
    try:
        selector = parse_label_selector(reader, spec.get("selector"), "spec.selector")
    except ValueError:
        selector = None
    allowed = status.get("disruptionsAllowed", 0)
    if not isinstance(allowed, int) or isinstance(allowed, bool):
        raise reader.error("status.disruptionsAllowed", f"{allowed!r} is not an integer")
    disrupted = reader.mapping(status, "status.disruptedPods")
    namespace = reader.metadata.get("namespace")
    return DisruptionBudgetInfo(
        namespace if isinstance(namespace, str) and namespace else "default",
        reader.name,
        selector,
        allowed,
        frozenset(str(name) for name in disrupted),
    )
