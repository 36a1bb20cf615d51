"""The node interference index: one pure function and its references.

Agent and scheduler use this one model. The **interference index** runs from 0 (quiet)
to 100 (saturated): the agent publishes it per interval and per window; the scheduler's
**quietness** score (:mod:`scheduler.plugins.interference`, 100 = quiet) is
``100 − min(100, index + load placed since the report)``.

Each signal ``x`` is mapped to a saturation ``s ∈ [0, 1]`` by a log-scale reference
curve between its quiet point ``q`` and its saturation point ``r`` (both in
:class:`IndexReferences`), scaled by the signal's weight ``w ∈ [0, 1]``::

    s(x) = w · clamp(ln(x / q) / ln(r / q), 0, 1)        (x ≤ q → 0, x ≥ r → w)

Signal families combine their signals by maximum (they measure the same contention),
and families combine by a soft OR, so a single saturated family is enough::

    runq     = max(s(runq_p99_us), s(runq_wait_ratio))
    reclaim  = s(reclaim_stall_ms_per_s)
    throttle = s(throttled_ms_per_s)
    psi      = max(s(psi_cpu_some), s(psi_mem_some))
    net      = s(net_drops_per_s)
    index    = 100 · (1 − Π_f (1 − family_f))       over the measured families

Read as probabilities, the index is the chance that at least one family hurts a
latency-sensitive pod. Properties the tests pin: any one family at or past its
saturation point gives ≥ 90 (100 with weight 1); every signal at or below its quiet
point gives 0; more of any signal never lowers the index. NaN and negative inputs count
as 0 (quiet) — callers must therefore fail closed on *missing* signals themselves (the
report's ``measured`` families, see :mod:`interference.signals`); a family not measured
is left out of the product.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields

SIGNALS_BY_FAMILY: Mapping[str, tuple[str, ...]] = {
    "runq": ("runq_p99_us", "runq_wait_ratio"),
    "reclaim": ("reclaim_stall_ms_per_s",),
    "throttle": ("throttled_ms_per_s",),
    "psi": ("psi_cpu_some", "psi_mem_some"),
    "net": ("net_drops_per_s",),
}
"""Which NodeMetrics fields feed each family of the index."""

_WEIGHT_OF = {
    "runq_p99_us": "weight_runq_p99",
    "runq_wait_ratio": "weight_runq_wait",
    "reclaim_stall_ms_per_s": "weight_reclaim",
    "throttled_ms_per_s": "weight_throttled",
    "psi_cpu_some": "weight_psi_cpu",
    "psi_mem_some": "weight_psi_mem",
    "net_drops_per_s": "weight_net_drops",
}


@dataclass(frozen=True, slots=True)
class IndexReferences:
    """The reference curve of every signal: its saturation point (the field named like
    the signal), its quiet point (``…_quiet``) and its weight (``weight_…``, 0 leaves the
    signal out). The one set of references; the agent's ``--index-ref NAME=VALUE``
    overrides them.

    Run-queue defaults come from the recorded lab (``tests/data/lab-trace.msgpack``, four
    cgroup-partition nodes, ``stress-ng`` on two of them): nodes running only a latency
    probe had a per-second p99 of 1.5 / 3.8 / 6.4 ms (p10 / median / p90) and a wait ratio
    of 0.02 / 0.05 / 0.09; the CPU-saturated nodes 16 / 31 / 430 ms and 1.3 / 1.4 / 1.9.
    So a p99 of 4 ms (the quiet median) is quiet and 16 ms (the saturated p10) saturated;
    a wait ratio of 0.1 (the quiet p90) is quiet and 1.0 (one waiting task per CPU)
    saturated. That lab still counted waits for an idle CPU to wake up as run-queue wait,
    so these points are lenient for quiet nodes. Others: reclaim stall 0.25 → 5 ms per
    second; CFS throttling 5 → 100 ms per second; CPU PSI some 10 → 60 %, memory PSI some
    1 → 20 %; network drops 10 → 1000 per second.
    """

    runq_p99_us: float = 16_000.0
    """The node's run-queue latency p99 (µs) read as saturated (100)."""
    runq_p99_us_quiet: float = 4_000.0
    """The node's run-queue latency p99 (µs) read as quiet (0)."""
    runq_wait_ratio: float = 1.0
    """Run-queue wait ratio (waiting tasks per CPU) read as saturated (100)."""
    runq_wait_ratio_quiet: float = 0.1
    """Run-queue wait ratio (waiting tasks per CPU) read as quiet (0)."""
    reclaim_stall_ms_per_s: float = 5.0
    """Memory reclaim stall (ms per second) read as saturated (100)."""
    reclaim_stall_ms_per_s_quiet: float = 0.25
    """Memory reclaim stall (ms per second) read as quiet (0)."""
    throttled_ms_per_s: float = 100.0
    """CFS throttling (ms per second) read as saturated (100)."""
    throttled_ms_per_s_quiet: float = 5.0
    """CFS throttling (ms per second) read as quiet (0)."""
    psi_cpu_some: float = 60.0
    """CPU PSI ``some`` (%) read as saturated (100)."""
    psi_cpu_some_quiet: float = 10.0
    """CPU PSI ``some`` (%) read as quiet (0)."""
    psi_mem_some: float = 20.0
    """Memory PSI ``some`` (%) read as saturated (100)."""
    psi_mem_some_quiet: float = 1.0
    """Memory PSI ``some`` (%) read as quiet (0)."""
    net_drops_per_s: float = 1000.0
    """Network drops per second read as saturated (100)."""
    net_drops_per_s_quiet: float = 10.0
    """Network drops per second read as quiet (0)."""
    weight_runq_p99: float = 1.0
    """Weight of ``runq_p99_us`` in the index, 0–1 (0 leaves the signal out)."""
    weight_runq_wait: float = 1.0
    """Weight of ``runq_wait_ratio`` in the index, 0–1 (0 leaves the signal out)."""
    weight_reclaim: float = 1.0
    """Weight of ``reclaim_stall_ms_per_s`` in the index, 0–1 (0 leaves the signal out)."""
    weight_throttled: float = 1.0
    """Weight of ``throttled_ms_per_s`` in the index, 0–1 (0 leaves the signal out)."""
    weight_psi_cpu: float = 1.0
    """Weight of ``psi_cpu_some`` in the index, 0–1 (0 leaves the signal out)."""
    weight_psi_mem: float = 1.0
    """Weight of ``psi_mem_some`` in the index, 0–1 (0 leaves the signal out)."""
    weight_net_drops: float = 1.0
    """Weight of ``net_drops_per_s`` in the index, 0–1 (0 leaves the signal out)."""

    def __post_init__(self) -> None:
        for signal, weight_name in _WEIGHT_OF.items():
            quiet, saturated = getattr(self, f"{signal}_quiet"), getattr(self, signal)
            if not 0 < quiet < saturated < math.inf:
                raise ValueError(
                    f"{signal}: need 0 < {signal}_quiet < {signal} (quiet point below the "
                    f"saturation point), got {quiet!r} and {saturated!r}"
                )
            weight = getattr(self, weight_name)
            if not 0 <= weight <= 1:
                raise ValueError(f"{weight_name}: {weight!r} must be between 0 and 1")


REFERENCE_NAMES = tuple(f.name for f in fields(IndexReferences))
"""Every field of :class:`IndexReferences` (what ``--index-ref`` accepts)."""


def weight_of(signal: str, refs: IndexReferences) -> float:
    """The weight ``refs`` gives ``signal`` (a NodeMetrics field the index reads)."""
    weight: float = getattr(refs, _WEIGHT_OF[signal])
    return weight


def saturation(value: float, quiet: float, saturated: float) -> float:
    """``clamp(ln(value / quiet) / ln(saturated / quiet), 0, 1)``; NaN and values ≤ quiet
    give 0, ``inf`` gives 1."""
    if not value > quiet:  # also NaN
        return 0.0
    if value >= saturated:
        return 1.0
    return math.log(value / quiet) / math.log(saturated / quiet)


def family_saturations(
    signals: Mapping[str, float],
    refs: IndexReferences = IndexReferences(),
    measured: Collection[str] | None = None,
) -> dict[str, float]:
    """Family → its saturation (max over its weighted signals), for the families in
    ``measured`` (None: every family). A signal missing from ``signals`` counts as 0."""
    out: dict[str, float] = {}
    for family, names in SIGNALS_BY_FAMILY.items():
        if measured is not None and family not in measured:
            continue
        level = 0.0
        for name in names:
            weight = weight_of(name, refs)
            if weight > 0:
                s = saturation(
                    float(signals.get(name, 0.0)),
                    getattr(refs, f"{name}_quiet"),
                    getattr(refs, name),
                )
                level = max(level, weight * s)
        out[family] = level
    return out


def interference_index(
    signals: Mapping[str, float],
    refs: IndexReferences = IndexReferences(),
    measured: Collection[str] | None = None,
) -> float:
    """Interference index 0 (quiet) – 100 (saturated), rounded to 2 places; the module
    docstring has the formula. ``signals`` maps NodeMetrics field names to values."""
    quiet_chance = 1.0
    for level in family_saturations(signals, refs, measured).values():
        quiet_chance *= 1.0 - level
    return round(100.0 * (1.0 - quiet_chance), 2)
