"""A worker as a team would deploy it, for the tests that kill brokers and workers under it:

    python -m tests.client.worker asyncio|sync URL QUEUE RECORDS [--batch N] [--partitions N] [--lease S]
                                                                  [--hold-after N]

Runs `process()` on QUEUE (asyncio or the blocking SyncClient) and appends one line per handled
message to RECORDS: "<payload> <retryCount> <pid>", written before the handler returns, so the
file is the worker's own record of what it completed. With --hold-after N the handler, from the
N+1st message on, writes "<payload> held <pid>" and blocks (a handler still busy when SIGTERM
comes). Exits with process()'s own exit: 0 after SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

import queen_client


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("flavour", choices=["asyncio", "sync"])
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("records")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--lease", default="10s")
    parser.add_argument("--grace", default="10s")
    parser.add_argument("--hold-after", type=int, default=None)
    args = parser.parse_args()
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
        def handle(message) -> None:
            if hold(message):
                release.wait()
            record(message, message.retry_count)

        with queen_client.SyncClient(args.url) as client:
            client.queue(args.queue).process(handle, **options)
        return 0

    import asyncio

    async def handle_async(message) -> None:
        if hold(message):
            await asyncio.Event().wait()
        record(message, message.retry_count)

    async def run() -> None:
        async with queen_client.Client(args.url) as client:
            await client.queue(args.queue).process(handle_async, **options)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
