"""The one freshness rule for node reports, used by the agent, the scheduler and the CLI.

A report of interval ``T`` seconds published at ``ts`` is **fresh** while::

    now − ts ≤ stale_after_s(T) = max(5, round(3 · T))

i.e. for three missed intervals, at least 5 s. The agent writes every key of its node
with exactly this TTL (:func:`ttl_seconds`), so a node's keys exist exactly as long as
its report is fresh; afterwards the scheduler applies its ``stale_policy`` and
``interference top`` shows the node as ``stale``. A report is **usable** only when it is
fresh *and* measured the core signal families (:data:`interference.signals.CORE_FAMILIES`);
a fresh report without them is **degraded** and treated exactly like a stale one.

A family is measured in an interval only when its probes saw all of it: the agent lists
:func:`complete_families`, which leaves out every family whose BPF probe lost map entries
(a full map, an evicted queued task: counts that vanished, so the family would read
quieter than it was). An interval that lost run-queue entries is therefore degraded by
the same rule, for every reader, including readers older than the ``bpf_lost_entries``
field.

The ranking ``intf:nodes`` is the scheduler's: it rewrites it from the records it
accepted, and a node without a usable record leaves it at the next rewrite
(:mod:`scheduler.adapters.ranking`). Agents write only their own node's keys and
never sweep other nodes; readers show a member whose hash has expired as stale.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from interference.signals import CORE_FAMILIES

MISSED_INTERVALS = 3
"""Intervals a report stays fresh for."""
MIN_STALE_AFTER_S = 5
"""Lower bound of the freshness window, so 1 s agents survive a short hiccup."""


def ttl_seconds(interval_s: float) -> int:
    """``max(5, round(3 · interval_s))``: how long a report stays fresh, and the TTL of
    every key the agent writes."""
    return max(MIN_STALE_AFTER_S, round(MISSED_INTERVALS * interval_s))


def stale_after_s(interval_s: float) -> float:
    """Age (s) after which a report of ``interval_s`` is stale (same as its TTL)."""
    return float(ttl_seconds(interval_s))


def fresh_until(updated_at: float, interval_s: float) -> float:
    """Unix time until which a report published at ``updated_at`` is fresh."""
    return updated_at + stale_after_s(interval_s)


def is_fresh(updated_at: float, interval_s: float, now: float) -> bool:
    """``now − updated_at ≤ stale_after_s(interval_s)``."""
    return now - updated_at <= stale_after_s(interval_s)


def missing_core(measured: Collection[str] | None) -> tuple[str, ...]:
    """Core families absent from ``measured`` (None: the report did not say, so all)."""
    have = set(measured or ())
    return tuple(f for f in sorted(CORE_FAMILIES) if f not in have)


def complete_families(measured: Iterable[str], lost_entries: Iterable[str]) -> tuple[str, ...]:
    """The families an interval lists as measured: ``measured`` less ``lost_entries``
    (the families of every probe that lost BPF map entries in the interval), sorted."""
    incomplete = set(lost_entries)
    return tuple(sorted({f for f in measured if f not in incomplete}))


def node_state(
    updated_at: float, interval_s: float, measured: Collection[str] | None, now: float
) -> str:
    """``stale`` (too old), ``degraded`` (fresh but a core family was not measured) or
    ``ok``; the scheduler acts only on ``ok`` reports."""
    if not is_fresh(updated_at, interval_s, now):
        return "stale"
    if missing_core(measured):
        return "degraded"
    return "ok"
