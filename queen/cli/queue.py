"""`queen queue configure|push|pop|ack|list|dlq`: one queue call each, through the SDK's
`client.queue(name)` and `client.queues()`."""

from __future__ import annotations

import argparse
import sys

from queen.cli.output import (
    EXIT_NO,
    EXIT_OK,
    iso,
    open_client,
    print_json,
    read_value,
    say_no,
    show_value,
)

# flag dest -> (option, how its value converts: "duration" in seconds, "lease" whole seconds >= 1, or a type)
_OPTION_FLAGS = {
    "lease_time": ("leaseTimeSeconds", "lease"),
    "retry_limit": ("retryLimit", int),
    "dlq": ("dlqAfterMaxRetries", bool),
    "delay": ("delayedProcessingSeconds", "duration"),
    "retention": ("retentionSeconds", "duration"),
    "completed_retention": ("completedRetentionSeconds", "duration"),
    "dedup_window": ("dedupWindowSeconds", "lease"),
    "max_size": ("maxSize", int),
}


def add_parser(commands, parents: dict) -> None:
    client = parents["client"]
    queue = commands.add_parser("queue", help="push, pop, ack and inspect queues",
                                description="One queue call each. Exit status: 0 done, 1 nothing to pop / not queued / "
                                            "not acked / empty DLQ, 65 rejected, 69 unreachable.")
    actions = queue.add_subparsers(dest="action", metavar="ACTION", required=True)
    configure = actions.add_parser("configure", parents=[client], help="create a queue or change its options "
                                   "(those not given keep their value); prints every option")
    configure.add_argument("queue")
    configure.add_argument("--lease-time", metavar="DURATION", help="lease a pop grants (default 5m)")
    configure.add_argument("--retry-limit", type=int, metavar="N", help="redeliveries before the DLQ (default 3)")
    configure.add_argument("--dlq", action=argparse.BooleanOptionalAction, default=None,
                           help="past the retry limit, to the DLQ (default) or redeliver until retention")
    configure.add_argument("--delay", metavar="DURATION", help="a message is delivered this long after its push")
    configure.add_argument("--retention", metavar="DURATION", help="remove messages this old, consumed or not")
    configure.add_argument("--completed-retention", metavar="DURATION", help="keep consumed messages this long")
    configure.add_argument("--dedup-window", metavar="DURATION", help="how long a transaction id stays known (default 15m)")
    configure.add_argument("--max-size", type=int, metavar="N", help="retained messages at most (0: the server's limit)")
    configure.set_defaults(handler=queue_configure)
    push = actions.add_parser("push", parents=[client], help="append a message")
    push.add_argument("queue")
    push.add_argument("value", help="JSON, or any other text as a string; - reads stdin")
    push.add_argument("--partition", help='default "Default"')
    push.add_argument("--transaction-id", help="makes the push idempotent (one is generated if not given)")
    push.add_argument("--string", action="store_true", help="push VALUE as a string even if it parses as JSON")
    push.set_defaults(handler=queue_push)
    pop = actions.add_parser("pop", parents=[client], help="take messages under a lease (prints the lease id on stderr)")
    pop.add_argument("queue")
    pop.add_argument("--partition", help="only this partition")
    pop.add_argument("--group", help="consumer group (default __QUEUE_MODE__)")
    pop.add_argument("--batch", type=int, default=1, metavar="N")
    pop.add_argument("--wait", metavar="DURATION", help="wait up to this long (at most 60s) for a message")
    pop.add_argument("--auto-ack", action="store_true", help="resolve them at once: at most once, no lease")
    pop.set_defaults(handler=queue_pop)
    ack = actions.add_parser("ack", parents=[client], help="acknowledge a delivered message")
    ack.add_argument("queue")
    ack.add_argument("--lease", type=int, required=True, metavar="ID", help="the lease id the pop printed")
    ack.add_argument("--partition-id", type=int, required=True, metavar="ID")
    ack.add_argument("--offset", type=int, required=True, metavar="N")
    ack.add_argument("--status", choices=("completed", "failed", "dlq"), default="completed")
    ack.add_argument("--error", help="kept with a DLQ entry")
    ack.add_argument("--group", help="the consumer group (default: the lease's)")
    ack.set_defaults(handler=queue_ack)
    listing = actions.add_parser("list", parents=[client], help="every queue with its counts (--json: one object a line)")
    listing.add_argument("--prefix", default="")
    listing.set_defaults(handler=queue_list)
    dlq = actions.add_parser("dlq", parents=[client], help="list a queue's dead letters, or --requeue / --purge them")
    dlq.add_argument("queue")
    dlq.add_argument("--group", help="only this consumer group's")
    what = dlq.add_mutually_exclusive_group()
    what.add_argument("--requeue", action="store_true", help="put every entry back, first in its partition")
    what.add_argument("--purge", action="store_true", help="drop every entry")
    dlq.set_defaults(handler=queue_dlq)


def _options(args) -> dict:
    from queen.client.durations import seconds, ttl_seconds

    options = {}
    for dest, (option, kind) in _OPTION_FLAGS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        flag = "--" + dest.replace("_", "-")
        if kind == "lease":
            options[option] = ttl_seconds(value, flag)
        elif kind == "duration":
            options[option] = int(seconds(value, flag))
        else:
            options[option] = kind(value)
    return options


async def queue_configure(args) -> int:
    options = _options(args)
    async with open_client(args) as client:
        effective = await client.queue(args.queue).configure(**options)
    if args.json:
        print_json({"queue": args.queue, "options": effective})
    else:
        for option, value in effective.items():
            print(f"{option} {show_value(value)}")
    return EXIT_OK


async def queue_push(args) -> int:
    async with open_client(args) as client:
        result = await client.queue(args.queue).push(read_value(args), partition=args.partition,
                                                     transaction_id=args.transaction_id)
    if args.json:
        print_json({"status": result.status, "queue": result.queue, "partition": result.partition,
                    "partitionId": result.partition_id, "messageId": result.message_id, "offset": result.offset,
                    "transactionId": result.transaction_id, "reason": result.reason})
    elif result.status == "failed":
        say_no(f"not queued: {result.reason}")
    else:
        print(f"{result.status} {result.partition} offset {result.offset} (message {result.message_id})")
    return EXIT_OK if result else EXIT_NO


async def queue_pop(args) -> int:
    async with open_client(args) as client:
        delivery = await client.queue(args.queue).pop(group=args.group, batch=args.batch, partition=args.partition,
                                                      wait=args.wait, auto_ack=args.auto_ack)
    if args.json:
        print_json({"leaseId": delivery.lease_id, "expiresAt": delivery.expires_at_ms, "reason": delivery.reason,
                    "messages": [{"partition": m.partition, "partitionId": m.partition_id, "offset": m.offset,
                                  "messageId": m.message_id, "transactionId": m.transaction_id, "data": m.data,
                                  "retryCount": m.retry_count, "leaseId": m.lease_id} for m in delivery.messages]})
    elif delivery.messages:
        if delivery.lease_id is not None:
            print(f"lease {delivery.lease_id} until {iso(delivery.expires_at_ms)}; ack with: queen queue ack "
                  f"{args.queue} --lease {delivery.lease_id} --partition-id {delivery.messages[0].partition_id} "
                  f"--offset N", file=sys.stderr)
        for m in delivery.messages:
            print(f"{m.partition}\t{m.offset}\t{show_value(m.data)}" + (f"\tretry {m.retry_count}" if m.retry_count else ""))
    else:
        say_no(f"nothing to deliver ({delivery.reason})")
    return EXIT_OK if delivery.messages else EXIT_NO


async def queue_ack(args) -> int:
    async with open_client(args) as client:
        result = await client.queue(args.queue).ack_offset(args.lease, args.partition_id, args.offset, args.status,
                                                           error=args.error, group=args.group)
    if args.json:
        print_json({"success": result.success, "already": result.already, "leaseReleased": result.lease_released,
                    "dlq": result.dlq, "retryCount": result.retry_count, "reason": result.reason})
    elif result.success:
        print("already acked" if result.already else ("moved to the DLQ" if result.dlq else f"acked {args.status}"))
    else:
        say_no(f"not acked: {result.reason}")
    return EXIT_OK if result else EXIT_NO


async def queue_list(args) -> int:
    async with open_client(args) as client:
        async for row in client.queues(args.prefix):
            if args.json:
                print_json(row)
            else:
                print(f"{row['queue']}\tmessages {row['messages']}\tpending {row['pending']}\tin flight "
                      f"{row['inFlight']}\tdlq {row['dlq']}\tpartitions {row['partitions']}\tgroups "
                      f"{','.join(row['groups']) or '-'}")
    return EXIT_OK


async def queue_dlq(args) -> int:
    async with open_client(args) as client:
        queue = client.queue(args.queue)
        if args.purge:
            purged = await queue.purge_dlq(group=args.group)
            print_json({"purged": purged}) if args.json else print(f"purged {purged}")
            return EXIT_OK
        entries = [entry async for entry in queue.dlq(group=args.group)]
        if args.requeue:
            done = 0
            for group in sorted({e["consumerGroup"] for e in entries}):
                chosen = [e for e in entries if e["consumerGroup"] == group]
                done += sum(await queue.requeue(chosen, group=group))
            print_json({"requeued": done}) if args.json else print(f"requeued {done}")
            return EXIT_OK
    for entry in entries:
        if args.json:
            print_json(entry)
        else:
            print(f"{entry['consumerGroup']}\t{entry['partition']}\t{entry['offset']}\tretry {entry['retryCount']}"
                  f"\t{entry['error'] or '-'}\t{show_value(entry['data'])}")
    return EXIT_OK if entries else EXIT_NO
