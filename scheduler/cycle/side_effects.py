"""Writes to the cluster whose failure must not stop the thread that makes them.

Events, decision records and condition updates are side effects of a decision: when one
fails it is counted in ``interference_scheduler_side_effect_errors{kind}`` and logged, and
the caller goes on (the binder's threads, the extender's pod-warning writer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from scheduler.cycle.ports import ClusterError
from scheduler.endpoint.metrics import SchedulerMetrics

log = logging.getLogger(__name__)


def write_guarded(write: Callable[[], None], kind: str, metrics: SchedulerMetrics) -> bool:
    """Run ``write``; an API error is logged as a warning, anything else with its
    traceback, both counted under ``kind``. Whether it succeeded."""
    try:
        write()
    except ClusterError as exc:
        metrics.side_effect_errors.labels(kind).inc()
        log.warning("could not write %s: %s", kind, exc)
        return False
    except Exception:
        metrics.side_effect_errors.labels(kind).inc()
        log.exception("unexpected error writing %s", kind)
        return False
    return True
