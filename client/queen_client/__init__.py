"""The Python SDK for the Queen broker: `Client` (async; asyncio and Trio), `SyncClient` (blocking),
their lock and semaphore handles, KV calls, queues and their consumers, timers, and transactions.

A distribution of its own (`queen-client`, needing only anyio, h11 and orjson), importable beside
the public `queen-mq` client, whose import name is `queen`. It never imports the server.

It logs through the `queen_client` logger (retries, lost locks and leases, a worker's graceful
stop) and adds only a NullHandler, as a library should: the application decides where records go,
e.g. `logging.basicConfig(level=logging.INFO)`.
"""

import logging

from queen_client.client import DEFAULT_URL, Client
from queen_client.errors import (
    ApiError,
    AuthError,
    BadRequestError,
    CannotConnect,
    ClientError,
    Interrupted,
    LockLost,
    LockNotAcquired,
    OutcomeUnknown,
    RateLimited,
    RequestTimeout,
    TransportError,
    UnavailableError,
)
from queen_client.kv import CheckResult, Current, Item, Page, WriteResult
from queen_client.locks import Holder, Lock, LockAnswer, RunResult, Semaphore
from queen_client.queues import AckResult, Delivery, Message, Push, PushResult, Queue
from queen_client.sync import SyncClient, SyncLock, SyncQueue, SyncTimers, SyncTransaction
from queen_client.timers import Timer, TimerResult, Timers
from queen_client.txn import Transaction, TxnResult

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "DEFAULT_URL", "Client", "SyncClient", "Lock", "Semaphore", "SyncLock", "Transaction", "SyncTransaction",
    "Item", "Current", "Page", "WriteResult", "CheckResult", "TxnResult", "Holder", "RunResult", "LockAnswer",
    "ClientError", "TransportError", "RequestTimeout", "CannotConnect", "OutcomeUnknown", "ApiError", "BadRequestError", "UnavailableError",
    "AuthError", "RateLimited",
    "LockLost", "LockNotAcquired", "Interrupted", "Queue", "SyncQueue", "Message", "Delivery", "Push", "PushResult", "AckResult",
    "Timers", "SyncTimers", "Timer", "TimerResult",
]
