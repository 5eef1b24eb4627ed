"""Queen: a single-process coordination broker (durable KV, leased locks, timers, queues)."""

__version__ = "0.1.0"
