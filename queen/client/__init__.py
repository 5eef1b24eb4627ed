"""The Python SDK: `Client` (async; asyncio and Trio), `SyncClient` (blocking), their lock and
semaphore handles, KV calls, queues and their consumers, timers, and transactions. The server never imports this package."""

from queen.client.client import DEFAULT_URL, Client
from queen.client.errors import (
    ApiError,
    AuthError,
    BadRequestError,
    ClientError,
    Interrupted,
    LockLost,
    LockNotAcquired,
    RateLimited,
    RequestTimeout,
    TransportError,
    UnavailableError,
)
from queen.client.kv import CheckResult, Current, Item, Page, WriteResult
from queen.client.locks import Holder, Lock, LockAnswer, RunResult, Semaphore
from queen.client.queues import AckResult, Delivery, Message, Push, PushResult, Queue
from queen.client.sync import SyncClient, SyncLock, SyncQueue, SyncTimers, SyncTransaction
from queen.client.timers import Timer, TimerResult, Timers
from queen.client.txn import Transaction, TxnResult

__all__ = [
    "DEFAULT_URL", "Client", "SyncClient", "Lock", "Semaphore", "SyncLock", "Transaction", "SyncTransaction",
    "Item", "Current", "Page", "WriteResult", "CheckResult", "TxnResult", "Holder", "RunResult", "LockAnswer",
    "ClientError", "TransportError", "RequestTimeout", "ApiError", "BadRequestError", "UnavailableError",
    "AuthError", "RateLimited",
    "LockLost", "LockNotAcquired", "Interrupted", "Queue", "SyncQueue", "Message", "Delivery", "Push", "PushResult", "AckResult",
    "Timers", "SyncTimers", "Timer", "TimerResult",
]
