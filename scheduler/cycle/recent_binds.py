"""The pods the watch saw leave the pending set by a bind, for a while.

In extender mode kube-scheduler binds, and its bind can reach our watch right behind the
pod's creation; the cache (:meth:`scheduler.cycle.cache.ClusterCache.vouches_for`) still
vouches for such a pod for :data:`VOUCHED_AFTER_BIND_S`, so the extender's decision
records and Events do not depend on which of the two events a poll falls between.
:class:`RecentBinds` remembers them, bounded in time and in number; not thread-safe:
callers hold the cache lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

VOUCHED_AFTER_BIND_S = 30.0
"""How long a pod seen pending is still vouched for once seen bound (the extender holds a
record for a pod our watch has not delivered for 10 s; this outlasts that wait)."""
VOUCHED_AFTER_BIND_PODS = 65536
"""At most this many bound pods are remembered (the oldest forgotten first)."""


class RecentBinds:
    """Pod key → (UID, when the watch showed it bound), the oldest first."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._bound: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def remember(self, key: str, uid: str) -> None:
        """The pod ``key`` with this UID left the pending set by a bind just now."""
        now = self._clock()
        remembered = self._bound
        remembered.pop(key, None)
        remembered[key] = (uid, now)
        while remembered:
            oldest_key, (_, bound_at) = next(iter(remembered.items()))
            if len(remembered) <= VOUCHED_AFTER_BIND_PODS and now - bound_at < VOUCHED_AFTER_BIND_S:
                break
            del remembered[oldest_key]

    def bound_lately(self, key: str, uid: str) -> bool:
        """The pod ``key`` with this UID was seen bound less than
        :data:`VOUCHED_AFTER_BIND_S` ago."""
        bound = self._bound.get(key)
        return (
            bound is not None
            and bound[0] == uid
            and self._clock() - bound[1] < VOUCHED_AFTER_BIND_S
        )
