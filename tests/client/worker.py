"""A worker as a team would deploy it, for the tests that kill brokers and workers under it:

    python -m tests.client.worker asyncio|trio|sync URL QUEUE RECORDS [--batch N] [--partitions N]
                                  [--lease S] [--hold-after N] [--loops N] [--handle-s S]

Runs `process()` on QUEUE (asyncio, Trio, or the blocking SyncClient) and appends one line per
handled message to RECORDS: "<payload> <retryCount> <pid>", written before the handler returns,
so the file is the worker's own record of what it completed. With --hold-after N the handler,
from the N+1st message on, writes "<payload> held <pid>" and blocks (a handler still busy when
SIGTERM comes). With --loops N it runs N loops, on the queues QUEUE.0 ... QUEUE.N-1: asyncio and
Trio, N process() calls at once on one client; sync, one thread each, the SyncClient made in the
main thread, which waits for them. --handle-s S: each handler takes S seconds (sleeping) before
it records. Exits with process()'s own exit: 0 after SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from functools import partial

import queen_client


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("flavour", choices=["asyncio", "trio", "sync"])
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("records")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--lease", default="10s")
    parser.add_argument("--grace", default="10s")
    parser.add_argument("--hold-after", type=int, default=None)
    parser.add_argument("--loops", type=int, default=None)
    parser.add_argument("--handle-s", type=float, default=0.0)
    args = parser.parse_args()
    queues = [args.queue] if args.loops is None else [f"{args.queue}.{i}" for i in range(args.loops)]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    records = open(args.records, "a", buffering=1)
    handled = 0
    release = threading.Event()  # never set: a held handler waits for the grace period's end

    def record(message, what) -> None:
        records.write(f"{message.data} {what} {os.getpid()}\n")
        records.flush()

    def hold(message) -> bool:
        nonlocal handled
        handled += 1
        if args.hold_after is not None and handled > args.hold_after:
            record(message, "held")
            return True
        return False

    options = dict(batch=args.batch, partitions=args.partitions, lease=args.lease, grace=args.grace, wait="5s")
    if args.flavour == "sync":
        import time

        def handle(message) -> None:
            if hold(message):
                release.wait()
            time.sleep(args.handle_s)
            record(message, message.retry_count)

        with queen_client.SyncClient(args.url) as client:
            if args.loops is None:
                client.queue(args.queue).process(handle, **options)
                return 0
            loops = [threading.Thread(target=client.queue(name).process, args=(handle,), kwargs=options)
                     for name in queues]
            for loop in loops:
                loop.start()
            for loop in loops:
                loop.join()
        return 0

    if args.flavour == "trio":
        import trio

        async def handle_trio(message) -> None:
            if hold(message):
                await trio.sleep_forever()
            await trio.sleep(args.handle_s)
            record(message, message.retry_count)

        async def run_trio() -> None:
            async with queen_client.Client(args.url) as client, trio.open_nursery() as loops:
                for name in queues:
                    loops.start_soon(partial(client.queue(name).process, handle_trio, **options))

        trio.run(run_trio)
        return 0

    import asyncio

    async def handle_async(message) -> None:
        if hold(message):
            await asyncio.Event().wait()
        await asyncio.sleep(args.handle_s)
        record(message, message.retry_count)

    async def run() -> None:
        async with queen_client.Client(args.url) as client:
            await asyncio.gather(*(client.queue(name).process(handle_async, **options) for name in queues))

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
