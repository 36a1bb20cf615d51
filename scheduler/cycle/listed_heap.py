"""The garbage collector's settings once the informers have listed the cluster.

The listed cluster is a heap of long-lived objects that every full collection would walk
again; the cache calls :func:`freeze_listed_heap` once every kind is listed and after
each later relist (docs/design.md §5, step 1).
"""

from __future__ import annotations

import gc

FULL_COLLECTION_THRESHOLD = 100
"""Collections of the middle generation between two full collections once the listed
heap is frozen (CPython's default is 10; see :func:`freeze_listed_heap`)."""


def freeze_listed_heap() -> None:
    """Keep the listed cluster out of the garbage collector's walks (process-wide).

    A listed cluster is a heap of long-lived objects (about 730,000 for 5,000 nodes and
    60,000 pods) that every full collection walked again: 0.44-0.65 s each, twice per
    10,000 pods bound. ``gc.freeze`` moves it out of the collector's reach; frozen objects
    are still freed by their reference counts, and the parsed objects hold no cycles
    (tested). With nothing long-lived left to weigh against, CPython would then collect
    fully every 10 middle-generation collections, five times per 10,000 pods (0.07-0.27 s
    each) and find nothing; :data:`FULL_COLLECTION_THRESHOLD` makes that ten times rarer.
    In-memory loop, 10,000 pods (bench/scheduler_throughput.py, ``gc.callbacks``): full
    collections 2 (1.02-1.12 s) → 5 (0.74-0.84 s) with the freeze → 0 with both; longest
    pause 0.53-0.65 s → 0.23-0.27 s → 3 ms; 907-1,085 → 919-1,382 → 1,479-1,485 pods/s.
    """
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_THRESHOLD)
