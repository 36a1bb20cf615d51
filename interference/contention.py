"""Whose fault a pod's run-queue wait is: its own CPU limit, its own tasks, or neighbours.

A pod throttled by its own CFS quota waits for a CPU while its quota is spent; on a busy
node that wait ends after another pod's task ran, so the culprit attribution
(docs/design.md §3) names a neighbour for what the pod's own limit did. Moving such a
pod away finds no quieter node: its limit travels with it. :func:`contention_shares`
splits the measured wait into the three parts from what the agent publishes per pod
(:class:`interference.signals.PodMetrics`), and :attr:`ContentionShares.cause` names the
largest; a rebalancer moves a pod only for ``neighbours``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Cause = Literal["none", "own_limit", "own_tasks", "neighbours"]

MS_PER_S = 1000.0
"""Also the cap on throttled ms/s: the pod's and its containers' cgroups are each
throttled, and their sum can pass one second per second."""


@dataclass(frozen=True, slots=True)
class ContentionShares:
    """A pod's run-queue wait split by cause, ms per second; the three sum to the wait
    whose culprit is known (``own_wait_ms_per_s + neighbour_wait_ms_per_s``)."""

    own_limit_ms_per_s: float
    """Waits its own CFS quota caused (estimated, :func:`contention_shares`)."""
    own_tasks_ms_per_s: float
    """Waits behind its own tasks (more runnable threads than CPUs it gets)."""
    neighbours_ms_per_s: float
    """Waits behind other pods' and system tasks, its own throttling taken out."""

    @property
    def cause(self) -> Cause:
        """The largest part; ``none`` when all are 0. Ties go to the pod's own doing
        (``own_limit``, then ``own_tasks``): a pod is not moved for a tie."""
        parts: list[tuple[float, Cause]] = [
            (self.own_limit_ms_per_s, "own_limit"),
            (self.own_tasks_ms_per_s, "own_tasks"),
            (self.neighbours_ms_per_s, "neighbours"),
        ]
        largest = max(value for value, _ in parts)
        if largest <= 0:
            return "none"
        return next(cause for value, cause in parts if value == largest)


def contention_shares(
    *,
    own_wait_ms_per_s: float,
    neighbour_wait_ms_per_s: float,
    throttled_ms_per_s: float,
    cpu_ms_per_s: float,
) -> ContentionShares:
    """Split a pod's attributed run-queue wait into own limit, own tasks and neighbours.

    With ``O`` = own wait, ``N`` = neighbour wait, ``θ`` = throttled ms/s, ``C`` = on-CPU
    ms/s (all per second of the same interval or window)::

        W          = O + N                          attributed wait
        n          = (W + C) / 1000                 mean runnable tasks (running or waiting)
        limit      = min(min(θ, 1000) · n, W)       while throttled, every runnable task waits
        neighbours = max(0, N − limit)
        own_tasks  = max(0, O − max(0, limit − N))

    ``n`` assumes the pod's runnable count does not depend on whether it is throttled
    (exact for busy threads: one busy thread with quota 0.2 CPU behind two busy
    neighbours runs 200 ms/s, waits 400 ms/s behind them and 400 ms/s throttled, and
    ``n = 1``). The limit's waits come out of the neighbour part first: on a node busy
    enough to matter, the CPUs a throttled pod leaves are taken by other pods' tasks,
    which are then named as the culprits. On an idle node those waits end by a wake-up
    from idle and are no run-queue wait at all, so ``limit`` is capped at ``W``. Negative
    inputs (never published) count as 0.
    """
    own = max(0.0, own_wait_ms_per_s)
    neighbour = max(0.0, neighbour_wait_ms_per_s)
    throttled = min(max(0.0, throttled_ms_per_s), MS_PER_S)
    waited = own + neighbour
    runnable = (waited + max(0.0, cpu_ms_per_s)) / MS_PER_S
    limit = min(throttled * runnable, waited)
    return ContentionShares(
        own_limit_ms_per_s=limit,
        own_tasks_ms_per_s=max(0.0, own - max(0.0, limit - neighbour)),
        neighbours_ms_per_s=max(0.0, neighbour - limit),
    )
