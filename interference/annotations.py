"""Every pod annotation under ``interference.io/`` the project reads, and the check that
tells a typo from one of them (docs/operations.md, "Pods: interference tolerance").

An annotation a program does not know is ignored by it, so a typo such as
``interference.io/max-runq-p99`` (without ``-us``) would leave a pod unprotected while its
owner believes it protected. The scheduler therefore gives a pod with an unknown
``interference.io/`` key a Warning Event naming the closest known key, and ``interference
simulate`` refuses it. A new annotation is added here (tests/interference/
test_annotations.py fails while a program reads one that is not listed).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

PREFIX = "interference.io/"

MAX_RUNQ_P99_US = "interference.io/max-runq-p99-us"
"""Highest node run-queue p99 the pod accepts, µs (the scheduler's Interference filter)."""
MAX_RECLAIM_STALL_MS_PER_S = "interference.io/max-reclaim-stall-ms-per-s"
"""Highest node memory-reclaim stall the pod accepts, ms per second (the same filter)."""
MAX_INDEX = "interference.io/max-index"
"""Highest node interference index the pod accepts, 0–100 (the same filter)."""
DEPRECATED_MAX_SCORE = "interference.io/max-score"
"""The deprecated earlier name of :data:`MAX_INDEX` (read, with a Warning Event)."""
REBALANCE = "interference.io/rebalance"
"""``"false"`` keeps the rebalancer from evicting the pod (scheduler/rebalance.py);
``"true"`` lets it evict one it would otherwise spare (scheduler/evictable.py)."""
DEGRADABLE = "interference.io/degradable"
"""``"true"`` lets the node agent degrade the pod (node_agent/degrade.py)."""

KNOWN_POD_ANNOTATIONS = (
    MAX_RUNQ_P99_US,
    MAX_RECLAIM_STALL_MS_PER_S,
    MAX_INDEX,
    DEPRECATED_MAX_SCORE,
    REBALANCE,
    DEGRADABLE,
)


def unknown_annotations(annotations: Iterable[str]) -> list[str]:
    """The keys under ``interference.io/`` (prefix in any case) that no program reads."""
    return [
        key
        for key in annotations
        if key[: len(PREFIX)].lower() == PREFIX and key not in KNOWN_POD_ANNOTATIONS
    ]


def unknown_annotation_message(key: str) -> str:
    """What to tell the owner of a pod with ``key``: it has no effect, and the closest
    known key (one it begins or ends early, else difflib's closest over the names after
    the prefix; the deprecated one is never suggested), or every known key when none is
    close."""
    suggested = [k for k in KNOWN_POD_ANNOTATIONS if k != DEPRECATED_MAX_SCORE]
    names = {k[len(PREFIX) :]: k for k in suggested}
    name = key[len(PREFIX) :].lower().strip()
    # a name cut short or run on (max-reclaim, max-index-10s) is that name's typo
    close = [n for n in names if name and (n.startswith(name) or name.startswith(n))][:1]
    close = close or difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"did you mean {names[close[0]]}?" if close else f"known: {', '.join(suggested)}"
    return f"annotation {key} is not one interference-scheduler reads and has no effect; {hint}"


def unknown_annotation_messages(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """One :func:`unknown_annotation_message` per unknown key, in the pod's order."""
    return tuple(unknown_annotation_message(key) for key in unknown_annotations(annotations))
