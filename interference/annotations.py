"""Every pod annotation under ``interference.io/`` the project reads, and the check that
tells a typo from one of them (docs/operations.md, "Pods: interference tolerance").

An annotation a program does not know is ignored by it, so a typo such as
``interference.io/max-runq-p99`` (without ``-us``) would leave a pod unprotected while its
owner believes it protected, and so would a key under a misspelt domain
(``interferance.io/max-runq-p99-us``, ``interference.com/…``). The scheduler therefore
gives a pod with an unknown ``interference.io/`` key, or any key under such a domain, a
Warning Event naming the closest known key, and ``interference simulate`` refuses it.
The two yes/no annotations (:data:`FLAG_ANNOTATIONS`) read ``true``/``false``,
``yes``/``no``, ``on``/``off`` and ``1``/``0`` in any case; any other value is read as
false (the pod is neither evicted by the rebalancer nor degraded) with a Warning Event
(:func:`invalid_flag_messages`), never ignored in silence. A new annotation is added here
(tests/interference/test_annotations.py fails while a program reads one that is not
listed).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

DOMAIN = "interference.io"
PREFIX = f"{DOMAIN}/"
DOMAIN_TYPOS = 2
"""Edits at most that make another annotation domain a typo of :data:`DOMAIN`."""

MAX_RUNQ_P99_US = "interference.io/max-runq-p99-us"
"""Highest node run-queue p99 the pod accepts, µs (the scheduler's Interference filter)."""
MAX_RECLAIM_STALL_MS_PER_S = "interference.io/max-reclaim-stall-ms-per-s"
"""Highest node memory-reclaim stall the pod accepts, ms per second (the same filter)."""
MAX_INDEX = "interference.io/max-index"
"""Highest node interference index the pod accepts, 0–100 (the same filter)."""
REBALANCE = "interference.io/rebalance"
"""``"false"`` keeps the rebalancer from evicting the pod (scheduler/rebalancing/rebalance.py);
``"true"`` lets it evict one it would otherwise spare (scheduler/rebalancing/evictable.py)."""
DEGRADABLE = "interference.io/degradable"
"""``"true"`` lets the node agent degrade the pod (node_agent/degrade.py)."""

FLAG_ANNOTATIONS = (REBALANCE, DEGRADABLE)
"""The yes/no annotations, read by :func:`flag_value`."""
TRUE_VALUES = ("true", "yes", "on", "1")
"""Values (any case, spaces around ignored) a flag annotation reads as true."""
FALSE_VALUES = ("false", "no", "off", "0")
"""Values a flag annotation reads as false: ``"no"``, ``"0"`` and ``"off"`` mean what their
owner meant, as ``"false"`` does."""

KNOWN_POD_ANNOTATIONS = (
    MAX_RUNQ_P99_US,
    MAX_RECLAIM_STALL_MS_PER_S,
    MAX_INDEX,
    REBALANCE,
    DEGRADABLE,
)


def unknown_annotations(annotations: Iterable[str]) -> list[str]:
    """The keys under ``interference.io/`` (prefix in any case) that no program reads, and
    the keys under a domain a typo away from it (:func:`misspelt_domain`)."""
    return [
        key
        for key in annotations
        if (key[: len(PREFIX)].lower() == PREFIX and key not in KNOWN_POD_ANNOTATIONS)
        or misspelt_domain(key)
    ]


def misspelt_domain(key: str) -> bool:
    """Whether ``key``'s domain is a typo of ``interference.io``: at most
    :data:`DOMAIN_TYPOS` edits from it (``interferance.io``, ``interfernce.io``,
    ``interference.com``), or ``interference`` under another top-level domain
    (``interference.org``). Its own subdomains (``x.interference.io``) are someone's own
    and not typos. Cheap: a key whose domain's length is not near is not compared."""
    domain, slash, _ = key.partition("/")
    domain = domain.lower()
    if not slash or domain == DOMAIN or domain.endswith("." + DOMAIN):
        return False
    if abs(len(domain) - len(DOMAIN)) > DOMAIN_TYPOS + 1:
        return False
    label, dot, top = domain.partition(".")
    if label == "interference" and dot and top and "." not in top:
        return True
    return _edit_distance(domain, DOMAIN, DOMAIN_TYPOS) <= DOMAIN_TYPOS


def _edit_distance(a: str, b: str, bound: int) -> int:
    """Levenshtein distance of ``a`` and ``b``, or ``bound + 1`` once it is over ``bound``."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        if min(current) > bound:
            return bound + 1
        previous = current
    return previous[-1]


def unknown_annotation_message(key: str) -> str:
    """What to tell the owner of a pod with ``key``: it has no effect, and the closest
    known key (one it begins or ends early, else difflib's closest over the names after
    the prefix), or every known key when none is close. A key under a misspelt domain is
    told so, and the known key its name is closest to."""
    names = {k[len(PREFIX) :]: k for k in KNOWN_POD_ANNOTATIONS}
    name = key.partition("/")[2].lower().strip()
    # a name cut short or run on (max-reclaim, max-index-10s) is that name's typo
    close = [n for n in names if name and (n.startswith(name) or name.startswith(n))][:1]
    close = close or difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    known = ", ".join(KNOWN_POD_ANNOTATIONS)
    hint = f"did you mean {names[close[0]]}?" if close else f"known: {known}"
    domain = f" (its domain is not {DOMAIN})" if misspelt_domain(key) else ""
    return (
        f"annotation {key} is not one interference-scheduler reads and has no effect{domain};"
        f" {hint}"
    )


def flag_value(value: str) -> bool | None:
    """A flag annotation's value: ``True`` for :data:`TRUE_VALUES`, ``False`` for
    :data:`FALSE_VALUES` (any case), ``None`` for anything else (a Warning Event:
    :func:`invalid_flag_messages`)."""
    word = value.strip().lower()
    if word in TRUE_VALUES:
        return True
    if word in FALSE_VALUES:
        return False
    return None


def invalid_flag_messages(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """What to tell the owner of a pod whose flag annotation reads as neither true nor
    false, and how it is read meanwhile (never as the riskier meaning)."""
    meaning = {
        REBALANCE: "the rebalancer never evicts the pod",
        DEGRADABLE: "the node agent never degrades the pod",
    }
    return tuple(
        f'annotation {key}: {annotations[key]!r} is not "true" or "false"'
        f" (also accepted, any case: {', '.join(TRUE_VALUES[1:] + FALSE_VALUES[1:])});"
        f' read as "false" until fixed: {meaning[key]}'
        for key in FLAG_ANNOTATIONS
        if key in annotations and flag_value(annotations[key]) is None
    )


def unknown_annotation_messages(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """One :func:`unknown_annotation_message` per unknown key, in the pod's order."""
    return tuple(unknown_annotation_message(key) for key in unknown_annotations(annotations))
