"""Queen: a single-process coordination broker (durable KV, leased locks, timers, queues).

This package is the server and the `queen` command. The Python SDK is a distribution of its own,
`queen-client` (client/ in this repository), imported as `queen_client`: `queen` is also the import
name of the public Queen MQ client, so the SDK keeps out of its way.
"""

__version__ = "0.1.0"

# Decides, before any hot module is imported, whether the compiled ones run (queen/_native.py).
from queen import _native  # noqa: E402,F401
