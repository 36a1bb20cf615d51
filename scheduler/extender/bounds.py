"""How much one extender request may ask for: bounds checked on the request's JSON before
any scheduling work, so no caller (kube-scheduler passes on whatever Pod the API server
stored) makes one request cost seconds of CPU for everyone.

The body is at most 6 MiB (:data:`scheduler.endpoint.http.EXTENDER_MAX_BODY_BYTES`), but what a
request costs follows its item counts, not its bytes: 6 MiB of ``nodeSelector`` keys
cost minutes under the cache lock, 6 MiB of node-affinity terms or of unknown node names
seconds (docs/BENCHMARKS.md, "Costly extender requests"). Each bound below is far above
any pod a person writes, and each check is a ``len`` per list, so a refused request
costs about its ``json.loads``:

* the Pod: the lists the scheduler reads, each counted over the whole spec
  (:data:`POD_BOUNDS`), and its annotations' total size as the API server bounds it
  (256 KiB);
* ``NodeNames``: at most the nodes the cache knows plus :data:`UNKNOWN_NODES_ALLOWED`
  (nodes kube-scheduler may list before our informer does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

TOO_COMPLEX = "too_complex"
"""The refusal reason (``interference_scheduler_extender_refused_total{reason}``)."""
UNKNOWN_NODES_ALLOWED = 5000
"""Offered names beyond the cache's node count that are still answered."""
MAX_ANNOTATION_BYTES = 256 * 1024
"""The API server's own limit on a Pod's annotations (keys and values together)."""


@dataclass(frozen=True, slots=True)
class Bound:
    """At most ``limit`` of ``what`` in one Pod, counted by ``count``."""

    what: str
    limit: int
    count: Callable[[Mapping[str, Any]], int]


def _mapping(value: Any, *keys: str) -> Mapping[str, Any]:
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _size(value: Any) -> int:
    return len(value) if isinstance(value, list | Mapping) else 0


def _node_terms(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    node_affinity = _mapping(pod, "spec", "affinity", "nodeAffinity")
    required = _mapping(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution")
    for term in _items(required.get("nodeSelectorTerms")):
        yield _mapping(term)
    for preferred in _items(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")):
        yield _mapping(preferred, "preference")


def _node_requirements(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for term in _node_terms(pod):
        for kind in ("matchExpressions", "matchFields"):
            yield from map(_mapping, _items(term.get(kind)))


def _pod_terms(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    affinity = _mapping(pod, "spec", "affinity")
    for kind in ("podAffinity", "podAntiAffinity"):
        section = _mapping(affinity, kind)
        yield from map(
            _mapping, _items(section.get("requiredDuringSchedulingIgnoredDuringExecution"))
        )
        for preferred in _items(section.get("preferredDuringSchedulingIgnoredDuringExecution")):
            yield _mapping(preferred, "podAffinityTerm")


def _selector_items(pod: Mapping[str, Any]) -> int:
    """Labels, expressions and values in the pod-affinity terms' selectors."""
    total = 0
    for term in _pod_terms(pod):
        for name in ("labelSelector", "namespaceSelector"):
            selector = _mapping(term, name)
            total += _size(selector.get("matchLabels"))
            for expression in _items(selector.get("matchExpressions")):
                total += 1 + _size(_mapping(expression).get("values"))
        total += _size(term.get("namespaces"))
    return total


def _containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    spec = _mapping(pod, "spec")
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        yield from map(_mapping, _items(spec.get(kind)))


POD_BOUNDS = (
    Bound("nodeSelector labels", 256, lambda p: _size(_mapping(p, "spec").get("nodeSelector"))),
    Bound("node-affinity terms", 256, lambda p: sum(1 for _ in _node_terms(p))),
    Bound("node-affinity requirements", 1024, lambda p: sum(1 for _ in _node_requirements(p))),
    Bound(
        "node-affinity values",
        65536,
        lambda p: sum(_size(r.get("values")) for r in _node_requirements(p)),
    ),
    Bound("pod (anti-)affinity terms", 256, lambda p: sum(1 for _ in _pod_terms(p))),
    Bound("pod (anti-)affinity selector labels and values", 65536, _selector_items),
    Bound("tolerations", 1024, lambda p: _size(_mapping(p, "spec").get("tolerations"))),
    Bound(
        "topologySpreadConstraints",
        256,
        lambda p: _size(_mapping(p, "spec").get("topologySpreadConstraints")),
    ),
    Bound("containers", 1024, lambda p: sum(1 for _ in _containers(p))),
    Bound("container ports", 4096, lambda p: sum(_size(c.get("ports")) for c in _containers(p))),
    Bound("volumes", 4096, lambda p: _size(_mapping(p, "spec").get("volumes"))),
    Bound("labels", 4096, lambda p: _size(_mapping(p, "metadata").get("labels"))),
)
"""Far above any pod a person writes (a handful of each), low enough that the worst pod
within them is answered in well under a second (docs/BENCHMARKS.md)."""


def pod_over_bounds(pod: Mapping[str, Any]) -> str:
    """What ``pod`` (its JSON) has more of than :data:`POD_BOUNDS` allow, as one sentence;
    empty when it is within them."""
    for bound in POD_BOUNDS:
        found = bound.count(pod)
        if found > bound.limit:
            return f"the Pod has {found} {bound.what}, more than the {bound.limit} allowed"
    annotations = _mapping(pod, "metadata", "annotations")
    if len(annotations) > MAX_ANNOTATION_BYTES:
        size = len(annotations)  # each takes a byte at least: counting stops here
    else:
        size = sum(len(str(k)) + len(str(v)) for k, v in annotations.items())
    if size > MAX_ANNOTATION_BYTES:
        return (
            f"the Pod's annotations take {size} bytes or more, more than the"
            f" {MAX_ANNOTATION_BYTES} the API server allows"
        )
    return ""


def names_over_bound(offered: int, known_nodes: int) -> str:
    """Why ``offered`` node names are too many for a cache of ``known_nodes``; empty when
    they are not."""
    limit = known_nodes + UNKNOWN_NODES_ALLOWED
    if offered <= limit:
        return ""
    return (
        f"the request offers {offered} node names, more than the {known_nodes} nodes"
        f" interference-scheduler knows plus {UNKNOWN_NODES_ALLOWED}"
    )
