"""Queen: a single-process coordination broker (durable KV, leased locks, timers, queues).

`queen.Client` / `queen.SyncClient` are the Python SDK (queen/client/); they are imported lazily,
so the server, which never uses them, does not load them.
"""

__version__ = "0.1.0"

_SDK_NAMES = frozenset((
    "Client", "SyncClient", "Lock", "Semaphore", "SyncLock", "Transaction", "SyncTransaction", "Item", "Current",
    "Page", "WriteResult", "CheckResult", "TxnResult", "Holder", "RunResult", "LockAnswer", "ClientError", "TransportError",
    "RequestTimeout", "ApiError", "BadRequestError", "UnavailableError", "LockLost", "LockNotAcquired", "Interrupted",
    "Queue", "SyncQueue", "Message", "Delivery", "Push", "PushResult", "AckResult", "Timers", "SyncTimers", "Timer",
    "TimerResult", "AuthError", "RateLimited",
))


def __getattr__(name: str):
    if name in _SDK_NAMES:
        import queen.client

        return getattr(queen.client, name)
    raise AttributeError(f"module 'queen' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SDK_NAMES))
