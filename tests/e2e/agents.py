"""Agents for e2e tests: the agent's real publisher writing a report per node every
interval from a thread, for as long as a test needs the nodes to report."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from interference.signals import NodeReport
from node_agent.publisher import PublisherSettings, RedisPublisher


@contextmanager
def agents_publishing(
    redis_url: str, reports: Callable[[float], list[NodeReport]], interval_s: float = 0.5
) -> Iterator[RedisPublisher]:
    """Publish ``reports(now)`` every ``interval_s`` until the block ends."""
    publisher = RedisPublisher(PublisherSettings(redis_url=redis_url))
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            for report in reports(time.time()):
                publisher.publish(report)
            stop.wait(interval_s)

    thread = threading.Thread(target=run, name="agents", daemon=True)
    thread.start()
    try:
        yield publisher
    finally:
        stop.set()
        thread.join(10)
        publisher.close()
