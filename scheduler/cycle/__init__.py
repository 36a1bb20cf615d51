"""The scheduling cycle and what it runs on: the queue, the cache, the boundaries
adapters implement, preemption, nominations and the signal gate."""
