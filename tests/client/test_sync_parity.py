"""The blocking client is the async one, call for call: every public call of an async handle has
a twin of the same name and parameters on its Sync handle, and every public property a twin, so a call written once in the async
client cannot be missing or drift in the SyncClient. The few differences are listed with why."""

import inspect

import pytest

from queen_client.client import Client
from queen_client.kv import Kv
from queen_client.locks import Lock, Locks
from queen_client.queues import Queue
from queen_client.sync import (
    SyncClient,
    SyncKv,
    SyncLock,
    SyncLocks,
    SyncQueue,
    SyncTimers,
    SyncTransaction,
    _SyncTxnQueue,
)
from queen_client.timers import Timers
from queen_client.txn import Transaction, TxnQueue

PAIRS = [(Client, SyncClient), (Kv, SyncKv), (Locks, SyncLocks), (Lock, SyncLock), (Queue, SyncQueue),
         (Timers, SyncTimers), (Transaction, SyncTransaction), (TxnQueue, _SyncTxnQueue)]
# async call -> why its blocking twin differs or is absent
DIFFERENT = {
    (Client, "aclose"): "the blocking client closes with close(), as files and sockets do",
    (Lock, "wait_lost"): "a blocking wait cannot be cancelled from outside, so it takes a timeout",
    (Queue, "deliveries"): "the async generator that the blocking consume() and process() drive",
}


def parameters(fn) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("async_cls, sync_cls", PAIRS, ids=lambda cls: cls.__name__)
def test_every_public_call_has_a_blocking_twin_with_the_same_parameters(async_cls, sync_cls):
    for name, member in inspect.getmembers(async_cls):
        if name.startswith("_") or not callable(member) or (async_cls, name) in DIFFERENT:
            continue
        twin = getattr(sync_cls, name, None)
        assert callable(twin), f"{sync_cls.__name__}.{name} is missing"
        assert parameters(twin) == parameters(member), f"{sync_cls.__name__}.{name} differs from {async_cls.__name__}'s"


@pytest.mark.parametrize("async_cls, sync_cls", PAIRS, ids=lambda cls: cls.__name__)
def test_every_public_property_has_a_blocking_twin(async_cls, sync_cls):
    for name, member in inspect.getmembers(async_cls):
        if name.startswith("_") or not isinstance(member, property):
            continue
        assert isinstance(getattr(sync_cls, name, None), property), f"{sync_cls.__name__}.{name} is missing"


def test_the_listed_differences_still_exist():
    for async_cls, name in DIFFERENT:
        assert callable(getattr(async_cls, name)), (async_cls, name)
