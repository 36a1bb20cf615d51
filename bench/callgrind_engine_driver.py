"""One tree's engine phase under callgrind, counting only the scheduling decisions.

Run by :mod:`bench.engine_instructions` as
``valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no python
callgrind_engine_driver.py TOGGLE_LIB TREE DRIVER_ARGS…``: it loads ``TREE``'s own
``bench/scheduler_throughput.py``, wraps that tree's cycle class (``SchedulingCycle``,
``Engine`` before the cycle refactor) so callgrind collects inside each ``schedule`` call
from the second decision on (the first may build indexes lazily, as the base did), and
dumps the counts when the engine phase ends.

The driver's signal reporter re-reports every 500 decisions instead of every second, and
``time.time`` is a clock that moves 0.5 ms per decision (about the engine's pace at full
speed), installed before the tree's modules are loaded: under valgrind's 50× slowdown
wall-clock time would run the reporter all the time or, between two reports, age every
node's signals past their freshness limit, and the counts would depend on how loaded the
machine was (a slower side would count more decisions on the stale-signals path).
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPORT_EVERY = 500
"""Decisions between two signal reports (the driver's 1 s at ~500 µs a decision)."""
DECISION_S = 0.0005
"""How far ``time.time`` moves per decision."""


class DecisionClock:
    """``time.time`` for the counted process: the start's wall-clock time, then
    :data:`DECISION_S` more per decision."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now


def main(argv: list[str]) -> int:
    toggle_lib, tree, *driver_args = argv
    clock = DecisionClock()
    time.time = clock.time  # before the tree's modules bind it as a default argument
    sys.path.insert(0, tree)
    callgrind = ctypes.CDLL(toggle_lib)
    spec = importlib.util.spec_from_file_location(
        "tree_scheduler_throughput", Path(tree) / "bench" / "scheduler_throughput.py"
    )
    assert spec is not None and spec.loader is not None
    driver: Any = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = driver
    spec.loader.exec_module(driver)
    cycle_class = getattr(driver, "SchedulingCycle", None) or driver.Engine
    reporters: list[Any] = []
    reporter_init = driver.ReportingSignals.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        reporter_init(self, *args, **kwargs)
        reporters.append(self)

    def run(self: Any, stop: threading.Event) -> None:
        stop.wait()

    driver.ReportingSignals.__init__ = init
    driver.ReportingSignals.run = run
    schedule = cycle_class.schedule
    decisions = [0]

    def counted_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        decisions[0] += 1
        clock.now += DECISION_S
        if decisions[0] % REPORT_EVERY == 0:
            reporters[0]._report()
        if decisions[0] == 1:
            return schedule(self, *args, **kwargs)
        if decisions[0] == 2:
            callgrind.start_counting()
        callgrind.toggle_collect()
        try:
            return schedule(self, *args, **kwargs)
        finally:
            callgrind.toggle_collect()

    cycle_class.schedule = counted_schedule
    bench_engine = driver.bench_engine

    def counted_bench_engine(*args: Any, **kwargs: Any) -> Any:
        figures = bench_engine(*args, **kwargs)
        callgrind.stop_counting()
        print(f"decisions counted {decisions[0] - 1}", file=sys.stderr, flush=True)
        return figures

    driver.bench_engine = counted_bench_engine
    result: int = driver.main(driver_args)
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
