"""Own limit, own tasks or neighbours (interference.contention): table-driven cases."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from interference.contention import Cause, contention_shares

# (name, own wait, neighbour wait, throttled, on-CPU) → (own limit, own tasks, neighbours, cause)
CASES: list[tuple[str, tuple[float, float, float, float], tuple[float, float, float, Cause]]] = [
    ("quiet pod", (0, 0, 0, 100), (0, 0, 0, "none")),
    ("neighbour contention, no limit", (5, 400, 0, 500), (0, 5, 400, "neighbours")),
    # quota 0.5 CPU, one busy thread on a busy node: runs 500 ms, throttled 500 ms, and
    # those 500 ms of waits end after neighbours' tasks (one runnable task).
    ("own limit on a busy node", (0, 500, 500, 500), (500, 0, 0, "own_limit")),
    # quota 2 CPUs, four threads: each waits out the 500 ms throttled.
    ("own limit, four threads", (100, 1900, 500, 2000), (2000, 0, 0, "own_limit")),
    ("limit and a real neighbour", (0, 900, 200, 400), (260, 0, 640, "neighbours")),
    # quota 0.2 CPU, one busy thread behind two busy neighbours: 400 ms/s waiting behind
    # them, 400 ms/s throttled; a tie goes to the pod itself.
    ("half limit, half neighbours", (0, 800, 400, 200), (400, 0, 400, "own_limit")),
    # throttled on an idle node: the waits ended by waking idle CPUs, not in a run queue.
    ("own limit on an idle node", (0, 0, 500, 500), (0, 0, 0, "none")),
    ("own threads crowd its CPUs", (600, 50, 0, 1000), (0, 600, 50, "own_tasks")),
    ("limit larger than neighbour wait", (300, 100, 500, 500), (400, 0, 0, "own_limit")),
    ("tie goes to the pod itself", (100, 100, 0, 100), (0, 100, 100, "own_tasks")),
    ("throttled over a second (pod + containers)", (0, 800, 1500, 10), (800, 0, 0, "own_limit")),
]


@pytest.mark.parametrize(("inputs", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_contention_shares(
    inputs: tuple[float, float, float, float], expected: tuple[float, float, float, Cause]
) -> None:
    own, neighbour, throttled, cpu = inputs
    shares = contention_shares(
        own_wait_ms_per_s=own,
        neighbour_wait_ms_per_s=neighbour,
        throttled_ms_per_s=throttled,
        cpu_ms_per_s=cpu,
    )
    limit, own_tasks, neighbours, cause = expected
    assert shares.own_limit_ms_per_s == pytest.approx(limit)
    assert shares.own_tasks_ms_per_s == pytest.approx(own_tasks)
    assert shares.neighbours_ms_per_s == pytest.approx(neighbours)
    assert shares.cause == cause


finite = st.floats(min_value=0, max_value=1e5, allow_nan=False)


@given(own=finite, neighbour=finite, throttled=finite, cpu=finite)
def test_the_parts_are_the_attributed_wait(
    own: float, neighbour: float, throttled: float, cpu: float
) -> None:
    shares = contention_shares(
        own_wait_ms_per_s=own,
        neighbour_wait_ms_per_s=neighbour,
        throttled_ms_per_s=throttled,
        cpu_ms_per_s=cpu,
    )
    parts = (shares.own_limit_ms_per_s, shares.own_tasks_ms_per_s, shares.neighbours_ms_per_s)
    assert all(part >= 0 for part in parts)
    assert sum(parts) == pytest.approx(own + neighbour)
    # More throttling never makes neighbours look guiltier.
    more = contention_shares(
        own_wait_ms_per_s=own,
        neighbour_wait_ms_per_s=neighbour,
        throttled_ms_per_s=throttled + 100,
        cpu_ms_per_s=cpu,
    )
    assert more.neighbours_ms_per_s <= shares.neighbours_ms_per_s + 1e-9
