"""Node signals whose scheduling record yields a chosen interference index.

The scheduler computes every node's index from the signals in its scheduling record
(docs/design.md §8); the index an agent computes itself (``NodeMetrics.interference_index``,
a window's ``index_mean``/``index_stddev``) reaches no decision. A test that wants "a node
this noisy" therefore sets a signal the record carries: these helpers choose the run-queue
wait ratio (the ``runq`` family, which every usable record measures and no tolerance
filter reads) so that, with the test's other signals, the scheduler's index is the one
asked for — rounded to 2 places, as the scheduler rounds it. A wanted index the other
signals already exceed (or cannot reach) is a ValueError: the test contradicts itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping

from interference.index import IndexReferences, family_saturations, interference_index
from interference.sched_record import MEAN_SIGNALS
from interference.signals import SIGNAL_FAMILIES, NodeMetrics, WindowMetrics

REFS = IndexReferences()
"""The default references: the scheduler's unless its config sets others."""


def runq_wait_for(
    index: float,
    signals: Mapping[str, float],
    measured: Collection[str] = SIGNAL_FAMILIES,
    refs: IndexReferences = REFS,
) -> float:
    """The run-queue wait ratio that, beside ``signals`` (the index's other inputs by
    NodeMetrics field name), makes the interference index ``index``."""
    if "runq" not in measured:
        raise ValueError("the index is set through the run queue, which is not measured")
    others = family_saturations(
        {name: value for name, value in signals.items() if name != "runq_wait_ratio"},
        refs,
        measured,
    )
    p99_level = others.pop("runq", 0.0)
    quiet = math.prod(1.0 - level for level in others.values())
    level = 1.0 - (1.0 - index / 100.0) / quiet if quiet > 0 else 1.0
    if level < p99_level - 1e-9 or level > 1.0 + 1e-9 or level < -1e-9:
        reached = interference_index(signals, refs, measured)
        raise ValueError(f"index {index} cannot be reached: the other signals give {reached}")
    if level <= 0:
        return 0.0
    weight = refs.weight_runq_wait
    quiet_point, saturated = refs.runq_wait_ratio_quiet, refs.runq_wait_ratio
    return float(quiet_point * (saturated / quiet_point) ** min(level / weight, 1.0))


def metrics_with_index(
    index: float, measured: Collection[str] = SIGNAL_FAMILIES, **fields: float
) -> NodeMetrics:
    """NodeMetrics with ``fields`` whose record gives the scheduler's index ``index``."""
    if "runq_wait_ratio" in fields:
        raise ValueError("runq_wait_ratio is what sets the index; leave it out")
    wait = runq_wait_for(index, fields, measured)
    metrics = NodeMetrics(**fields, runq_wait_ratio=wait)
    got = interference_index(dataclasses.asdict(metrics), REFS, measured)
    assert got == round(index, 2), (index, got)
    return metrics


def window_with_index(
    span_s: float,
    index_mean: float,
    index_stddev: float = 0.0,
    measured: Collection[str] = SIGNAL_FAMILIES,
    **fields: float,
) -> WindowMetrics:
    """A full window (``intervals`` = its seconds unless given) whose record gives the
    scheduler's ``index_mean`` (the index of the window's means) and ``index_stddev``
    (the index at mean + σ minus it), beside the other window ``fields``."""
    if "runq_wait_ratio_mean" in fields or "runq_wait_ratio_stddev" in fields:
        raise ValueError("the run-queue wait ratio is what sets the index; leave it out")
    p99 = fields.get("runq_p99_us", 0.0)
    means = {s: fields.get(f"{s}_mean", 0.0) for s in MEAN_SIGNALS} | {"runq_p99_us": p99}
    spreads = {s: means[s] + fields.get(f"{s}_stddev", 0.0) for s in MEAN_SIGNALS} | {
        "runq_p99_us": p99
    }
    wait_mean = runq_wait_for(index_mean, means, measured)
    wait_spread = runq_wait_for(index_mean + index_stddev, spreads, measured)
    if wait_spread < wait_mean:
        raise ValueError(f"index σ {index_stddev} is below what the other signals' σ give")
    settings: dict[str, float] = {"covered_s": span_s, "intervals": int(span_s)}
    settings |= fields
    return WindowMetrics(
        span_s,
        runq_wait_ratio_mean=wait_mean,
        runq_wait_ratio_max=wait_spread,
        runq_wait_ratio_stddev=wait_spread - wait_mean,
        **settings,  # type: ignore[arg-type]
    )
