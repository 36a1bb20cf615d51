"""kube-scheduler's HTTP extender protocol on the wire: ``POST /filter`` and ``POST /prioritize``.

Protocol (``k8s.io/kube-scheduler/extender/v1``), JSON over HTTP. Its Go structs have no
JSON tags, so the field names on the wire are the Go names and Go decodes them
case-insensitively; requests are read the same way, answers use the Go names:

* request (both verbs), ``ExtenderArgs``: ``{"Pod": Pod, "NodeNames": [names]}`` with
  ``nodeCacheCapable: true`` (recommended: the extender keeps its own node view from
  the informers), or ``{"Pod": Pod, "Nodes": NodeList}`` without it;
* filter answer, ``ExtenderFilterResult``: ``NodeNames`` (or ``Nodes``) that pass,
  ``FailedNodes`` (name → reason; preemption may help: resources, host ports,
  anti-affinity, a node not yet in our cache), ``FailedAndUnresolvableNodes`` (name →
  reason; preemption cannot help: readiness, cordon, taints, node affinity, interference)
  and ``Error`` (the pod cannot be read, or the informers have not listed nodes and pods
  yet: kube-scheduler fails the attempt with it and retries);
* prioritize answer, ``HostPriorityList``: ``[{"Host": name, "Score": 0..10}]``.

A request is read by :func:`parse_args` (the pod by :func:`read_extender_pod`, without
the fields kube-scheduler enforces itself) and held, before the pod is read, to
:mod:`scheduler.extender.bounds`; the prioritize answer is written by
:meth:`HostPriorities.json`.

Scores: the extender's weighted total over its score plugins is mapped to
kube-scheduler's extender range by :func:`extender_scores`::

    total[i] = Σ_p weight_p · score_p[i]                  (score_p in 0–100)
    score[i] = round(MAX_EXTENDER_PRIORITY · total[i] / (100 · Σ_p weight_p))   ∈ 0..10

kube-scheduler multiplies it by the extender's ``weight`` and by 100 / 10 and adds it to
its own plugins' scores.

What the extender answers, and from what: :mod:`scheduler.extender.extender`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
from numpy.typing import NDArray

from scheduler.api.objects import PodInfo
from scheduler.api.pods import parse_pod
from scheduler.extender.bounds import names_over_bound, pod_over_bounds

MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler's ``extenderv1.MaxExtenderPriority``: extender scores are 0..10."""
FILTER_PATH = "/filter"
PRIORITIZE_PATH = "/prioritize"
VERBS = ("filter", "prioritize")
JSON = "application/json"


class ExtenderRequestError(ValueError):
    """The request is not an ``ExtenderArgs`` object; the message says what is wrong."""


class ExtenderRequestTooCostly(ValueError):
    """The request asks for more than :mod:`scheduler.extender.bounds` allows; the message
    says what."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A parsed request: the pod and the node names kube-scheduler asks about."""

    pod: PodInfo
    names: tuple[str, ...]
    nodes: tuple[Mapping[str, Any], ...] | None
    """The Node objects when the request carried them (``nodeCacheCapable: false``)."""


def read_extender_pod(obj: Mapping[str, Any]) -> PodInfo:
    """:func:`parse_pod` without the fields kube-scheduler enforces itself in extender
    mode (volumes, topology spread, pod affinity: standalone mode refuses or enforces
    them)."""
    return dataclasses.replace(parse_pod(obj), unsupported=(), spread=(), soft_spread=())


def parse_args(
    body: bytes,
    read_pod: Callable[[Mapping[str, Any]], PodInfo] = read_extender_pod,
    known_nodes: int | None = None,
) -> ExtenderArgs:
    """An ``ExtenderArgs`` JSON body → :class:`ExtenderArgs` (the pod read by ``read_pod``).

    :class:`ExtenderRequestError` for a body that is not one;
    :class:`~scheduler.api.reader.ObjectError` for a pod the scheduler cannot read;
    :class:`ExtenderRequestTooCostly` for a pod over
    :data:`~scheduler.extender.bounds.POD_BOUNDS` or, given the cache's ``known_nodes``,
    too many node names (checked before the pod is read).
    """
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise ExtenderRequestError(f"request body is not JSON: {exc}") from exc
    except RecursionError as exc:  # arrays or objects nested thousands deep
        raise ExtenderRequestError("request body is JSON nested too deeply") from exc
    if not isinstance(data, Mapping):
        raise ExtenderRequestError("request body must be a JSON object (ExtenderArgs)")
    fields = {str(key).lower(): value for key, value in data.items()}  # as Go decodes
    pod_obj = fields.get("pod")
    if not isinstance(pod_obj, Mapping):
        raise ExtenderRequestError('ExtenderArgs has no "Pod" object')
    names_value = fields.get("nodenames")
    nodes_value = fields.get("nodes")
    nodes: tuple[Mapping[str, Any], ...] | None = None
    if names_value is not None:
        if not isinstance(names_value, list) or not all(map(isinstance, names_value, repeat(str))):
            raise ExtenderRequestError('"NodeNames" must be a list of node names')
        names = tuple(names_value)
    elif nodes_value is not None:
        items = nodes_value.get("items") if isinstance(nodes_value, Mapping) else None
        if not isinstance(items, list) or not all(isinstance(n, Mapping) for n in items):
            raise ExtenderRequestError('"Nodes" must be a NodeList with an "items" list')
        nodes = tuple(items)
        names = tuple(node_name(node) for node in nodes)
    else:
        raise ExtenderRequestError(
            'ExtenderArgs has neither "NodeNames" nor "Nodes"; set nodeCacheCapable: true'
            " in the extender's configuration"
        )
    costly = "" if known_nodes is None else names_over_bound(len(names), known_nodes)
    costly = costly or pod_over_bounds(pod_obj)
    if costly:
        raise ExtenderRequestTooCostly(costly)
    return ExtenderArgs(read_pod(pod_obj), names, nodes)


@dataclass(frozen=True, slots=True)
class HostPriorities:
    """The prioritize answer: each offered node's score, 0..10, in the offered order."""

    names: Sequence[str]
    scores: Sequence[int]

    def json(self) -> bytes:
        """The ``HostPriorityList`` JSON, ``[{"Host": name, "Score": score}, …]``, built
        as text: a score is one of eleven suffixes, and the names come escaped from one
        encoding of the whole list (an escaped name holds no bare ``","``), five times
        cheaper than encoding a dict per node."""
        if not self.names:
            return b"[]"
        quoted = json.dumps(list(self.names), separators=(",", ":"))[2:-2].split('","')
        suffixes = map(_SCORE_SUFFIXES.__getitem__, self.scores)
        return ('[{"Host":"' + ',{"Host":"'.join(map(str.__add__, quoted, suffixes)) + "]").encode()


_SCORE_SUFFIXES = tuple(f'","Score":{score}}}' for score in range(MAX_EXTENDER_PRIORITY + 1))
"""``HostPriorities.json``'s text after a node name, per score."""


def node_name(node: Mapping[str, Any]) -> str:
    """A Node object's ``metadata.name`` (:class:`ExtenderRequestError` without one)."""
    metadata = node.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ExtenderRequestError('a Node in "Nodes" has no metadata.name')
    return name


def extender_scores(totals: NDArray[np.float64], max_total: float) -> NDArray[np.int64]:
    """``round(MAX_EXTENDER_PRIORITY · total / max_total)`` clipped to 0..10, per node (0
    when ``max_total`` is 0: no score plugin runs); halves round to even, as ``round``."""
    if max_total <= 0:
        return np.zeros(len(totals), dtype=np.int64)
    scaled = np.rint(MAX_EXTENDER_PRIORITY * totals / max_total)
    return np.clip(scaled, 0, MAX_EXTENDER_PRIORITY).astype(np.int64)
