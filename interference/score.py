"""The node interference index: one pure function and its references (DESIGN §3)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScoreReferences:
    """Where each signal saturates (counts fully) in the interference index, and its weight.

    Defaults follow DESIGN §3: run-queue p99 against 1 ms, direct reclaim against 5 ms
    per second of stall.
    """

    runq_p99_us: float = 1000.0
    """Run-queue p99 that counts as fully contended."""
    runq_wait_ratio: float = 0.5
    """Waiting-task seconds per CPU-second that count as fully contended."""
    reclaim_stall_ms_per_s: float = 5.0
    """Reclaim stall per second that counts as fully memory-starved."""
    throttled_ms_per_s: float = 100.0
    """CFS throttling per second that counts fully."""
    psi_cpu_some: float = 50.0
    """CPU PSI some (%) that counts fully."""
    psi_mem_some: float = 20.0
    """Memory PSI some (%) that counts fully."""
    net_drops_per_s: float = 1000.0
    """Packet drops per second that count fully."""
    weight_runq_p99: float = 0.30
    weight_runq_wait: float = 0.15
    weight_reclaim: float = 0.25
    weight_throttled: float = 0.10
    weight_psi_cpu: float = 0.05
    weight_psi_mem: float = 0.10
    weight_net_drops: float = 0.05


def interference_score(
    *,
    runq_p99_us: float,
    runq_wait_ratio: float,
    reclaim_stall_ms_per_s: float,
    throttled_ms_per_s: float,
    psi_cpu_some: float,
    psi_mem_some: float,
    net_drops_per_s: float,
    refs: ScoreReferences = ScoreReferences(),
) -> float:
    """Interference index 0 (quiet) – 100 (saturated on every signal).

    ``score = 100 · Σ wᵢ · min(1, xᵢ / refᵢ) / Σ wᵢ`` over run-queue p99, run-queue wait
    ratio, reclaim stall, CFS throttling, CPU PSI some, memory PSI some and network drops,
    with the references and weights of :class:`ScoreReferences`. Negative or NaN inputs
    count as 0; a reference ≤ 0 disables its term.
    """
    terms = (
        (runq_p99_us, refs.runq_p99_us, refs.weight_runq_p99),
        (runq_wait_ratio, refs.runq_wait_ratio, refs.weight_runq_wait),
        (reclaim_stall_ms_per_s, refs.reclaim_stall_ms_per_s, refs.weight_reclaim),
        (throttled_ms_per_s, refs.throttled_ms_per_s, refs.weight_throttled),
        (psi_cpu_some, refs.psi_cpu_some, refs.weight_psi_cpu),
        (psi_mem_some, refs.psi_mem_some, refs.weight_psi_mem),
        (net_drops_per_s, refs.net_drops_per_s, refs.weight_net_drops),
    )
    weighted = 0.0
    weights = 0.0
    for value, ref, weight in terms:
        if ref <= 0 or weight <= 0:
            continue
        x = value if value == value and value > 0 else 0.0  # NaN != NaN
        weighted += weight * min(1.0, x / ref)
        weights += weight
    if weights == 0:
        return 0.0
    return round(100.0 * weighted / weights, 2)
