"""`queen queue configure|push|pop|ack|list|dlq`: one queue call each, through the SDK's
`client.queue(name)` and `client.queues()`; and `queen queue consume QUEUE -- CMD`, a worker that
runs CMD once per message, on the SDK's consumer (client/queen_client/consumer.py): broker restarts waited
out, leases extended while CMD runs, SIGTERM and Ctrl-C graceful."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from functools import partial

from queen.cli.output import (
    EXIT_NO,
    EXIT_OK,
    EXIT_USAGE,
    VALUE_HELP,
    add_value_options,
    iso,
    open_client,
    print_json,
    read_value,
    say_no,
    show_value,
    sole,
    wait_s,
)

CONSUME_USAGE = "queen queue consume QUEUE [--group G] [--concurrency N] [--dlq-exit-code CODE] -- CMD [ARGS...]"
QUEUE_HELP = "the queue's name: 1-128 bytes"
# How many of a failed command's stderr bytes are kept for its error (the ack's error holds 1 KiB).
ERROR_TAIL_BYTES = 1024

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
    configure.add_argument("queue", help=QUEUE_HELP)
    configure.add_argument("--lease-time", metavar="DURATION", help="the lease a pop grants: 1s to 1d "
                           "(default 5m)")
    configure.add_argument("--retry-limit", type=int, metavar="N", help="redeliveries before the DLQ: 0-1000 "
                           "(default 3)")
    configure.add_argument("--dlq", action=argparse.BooleanOptionalAction, default=None,
                           help="past the retry limit, to the DLQ (default) or redeliver until retention")
    configure.add_argument("--delay", metavar="DURATION", help="a message is delivered this long after its "
                           "push: up to 7d (default 0)")
    configure.add_argument("--retention", metavar="DURATION", help="remove messages this old, consumed or "
                           "not: up to 365d (default 0: never)")
    configure.add_argument("--completed-retention", metavar="DURATION", help="keep messages every group "
                           "consumed this long: up to 365d (default 0: remove them at once)")
    configure.add_argument("--dedup-window", metavar="DURATION", help="how long a transaction id "
                           "stays known: 1s to 7d (default 15m)")
    configure.add_argument("--max-size", type=int, metavar="N", help="retained messages at most, the "
                           "DLQ included: 0-100000000 (default 1000000; 0: the server's limit)")
    configure.set_defaults(handler=queue_configure)
    push = actions.add_parser("push", parents=[client], help="append a message")
    push.add_argument("queue", help=QUEUE_HELP)
    push.add_argument("value", help="the message's payload: " + VALUE_HELP)
    push.add_argument("--partition", help='the partition to append to: 1-256 bytes (default "Default")')
    push.add_argument("--transaction-id", help="makes the push idempotent (one is generated if not given)")
    add_value_options(push)
    push.set_defaults(handler=queue_push)
    pop = actions.add_parser(
        "pop", parents=[client], help="take messages under a lease",
        description="Take up to --batch messages of one partition under one lease. For people: one message a "
                    "line on stdout (partition, offset, payload, and its retry count once redelivered), and on "
                    "stderr the lease id, when it ends and the `queen queue ack` to settle them with (no lease "
                    "with --auto-ack). With --json: one JSON object on stdout, the lease id (leaseId) and its "
                    "end (expiresAt) in it with the messages, and nothing on stderr but warnings and errors. "
                    "Exit status: 0 delivered, 1 nothing to deliver (--json: messages is empty), 65 rejected, "
                    "69 unreachable.")
    pop.add_argument("queue", help=QUEUE_HELP)
    pop.add_argument("--partition", help="only this partition (default: any with a message "
                     "the group may take)")
    pop.add_argument("--group", help="consumer group (default __QUEUE_MODE__)")
    pop.add_argument("--batch", type=int, default=1, metavar="N", help="messages at most, all of one "
                     "partition, under one lease: 1-1000 (default: 1)")
    pop.add_argument("--wait", metavar="DURATION", help="wait up to this long (at most 60s, or 'forever') for a "
                     "message")
    pop.add_argument("--auto-ack", action="store_true", help="resolve them at once: at most once, no lease")
    pop.set_defaults(handler=queue_pop)
    ack = actions.add_parser("ack", parents=[client], help="acknowledge a delivered message")
    ack.add_argument("queue", help=QUEUE_HELP)
    ack.add_argument("--lease", type=int, required=True, metavar="ID", help="the lease id the pop printed (leaseId "
                     "with --json)")
    ack.add_argument("--partition-id", type=int, required=True, metavar="ID", help="the message's "
                     "partitionId, as the pop printed it")
    ack.add_argument("--offset", type=int, required=True, metavar="N", help="the message's offset in its "
                     "partition, as the pop printed it")
    ack.add_argument("--status", choices=("completed", "failed", "dlq"), default="completed",
                     help="completed: done; failed: it comes back after the retry delay, up to the retry "
                          "limit; dlq: to the dead-letter queue now (default: completed)")
    ack.add_argument("--error", help="why it failed (with failed or dlq), kept with its "
                     "DLQ entry (default: none)")
    ack.add_argument("--group", help="the consumer group (default: the lease's)")
    ack.set_defaults(handler=queue_ack)
    listing = actions.add_parser("list", parents=[client], help="every queue with its counts (--json: one object a line)")
    listing.add_argument("--prefix", default="", help="only queues whose name starts with this (default: "
                         "every queue)")
    listing.set_defaults(handler=queue_list)
    dlq = actions.add_parser("dlq", parents=[client], help="list a queue's dead letters, or --requeue / --purge them")
    dlq.add_argument("queue", help=QUEUE_HELP)
    dlq.add_argument("--group", help="only this consumer group's")
    what = dlq.add_mutually_exclusive_group()
    what.add_argument("--requeue", action="store_true", help="put every entry back, first in its partition")
    what.add_argument("--purge", action="store_true", help="drop every entry")
    dlq.set_defaults(handler=queue_dlq)
    consume = actions.add_parser(
        "consume", parents=[client], usage=CONSUME_USAGE, help="run a command once per message (a worker)",
        description="Run CMD once per message of QUEUE, the payload on its stdin (a string as its text, anything "
                    "else as JSON) and the message in its environment: QUEEN_QUEUE, QUEEN_GROUP, QUEEN_PARTITION, "
                    "QUEEN_PARTITION_ID, QUEEN_OFFSET, QUEEN_MESSAGE_ID, QUEEN_TRANSACTION_ID, QUEEN_RETRY_COUNT, "
                    "QUEEN_LEASE_ID, QUEEN_CREATED_AT. Exit 0 acks it completed; --dlq-exit-code sends it to the "
                    "DLQ; any other exit acks it failed with CMD's last stderr line as the error (it comes back, "
                    "after the queue's retry delay, up to its retry limit). The lease is extended while CMD runs. "
                    "A broker restart is waited out. SIGTERM or Ctrl-C: no new message, running commands get "
                    "--grace to finish, the rest goes back to the queue with its retry count unchanged; exit 0 "
                    "after SIGTERM, 130 after Ctrl-C.")
    consume.add_argument("queue", help=QUEUE_HELP)
    consume.add_argument("--group", help="consumer group (default __QUEUE_MODE__)")
    consume.add_argument("--concurrency", type=int, default=1, metavar="N", help="commands running at once "
                         "(each its own lease; default 1)")
    consume.add_argument("--batch", type=int, default=1, metavar="N", help="messages per pop (default 1)")
    consume.add_argument("--wait", default="30s", metavar="DURATION", help="how long one pop waits (at most 60s; "
                         "the worker waits again for as long as it runs)")
    consume.add_argument("--grace", default="10s", metavar="DURATION", help="how long running commands get to "
                         "finish after SIGTERM or Ctrl-C (default 10s)")
    consume.add_argument("--dlq-exit-code", type=int, default=None, metavar="CODE", help="this exit status sends "
                         "the message to the DLQ at once (default: none)")
    consume.set_defaults(handler=queue_consume, cmd=[])


def _options(args) -> dict:
    from queen_client.durations import seconds, ttl_seconds

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
    from queen_client import Push

    value = read_value(args)
    async with open_client(args) as client:
        # push_many: VALUE is one message's payload whatever it is, a JSON array too.
        [result] = await client.queue(args.queue).push_many([Push(value, args.partition, args.transaction_id)])
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
    from queen_client.queues import DEFAULT_GROUP, WAIT_MS_MAX

    wait = wait_s(args.wait, WAIT_MS_MAX / 1000)
    why_not = None
    async with open_client(args) as client:
        queue = client.queue(args.queue)
        while True:
            delivery = await queue.pop(
                group=args.group, batch=args.batch, partition=args.partition,
                wait=None if wait is None else min(wait, WAIT_MS_MAX / 1000), auto_ack=args.auto_ack)
            if delivery.messages or wait != math.inf:
                break
        if not delivery.messages and not args.json:
            why_not = _nothing_to_deliver(args, delivery.reason, args.group or DEFAULT_GROUP,
                                          None if args.partition is not None else await queue.info())
    # Nothing below may fail: with --auto-ack the messages are already resolved, and shown only here.
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
        say_no(why_not)
    return EXIT_OK if delivery.messages else EXIT_NO


def _nothing_to_deliver(args, reason: str | None, group: str, info: dict | None) -> str:
    """Why a pop delivered nothing, as far as the broker's answer and (without --partition) the
    queue's counts for the group tell: the broker answers "empty" alike for a queue with nothing
    pending and for one whose pending messages sit in partitions other consumers hold."""
    if reason == "lease_held":
        return (f"nothing to deliver: partition {args.partition} is leased to another consumer of group {group} "
                "(its messages come back when that consumer acks them or its lease ends)")
    said = f"nothing to deliver within --wait {args.wait}" if reason == "timeout" else "nothing to deliver now"
    if info is None:  # one partition: the broker looked at it alone
        return f"{said}: partition {args.partition} holds no message group {group} may take now"
    counts = next((g for g in info.get("groups", ()) if g["consumerGroup"] == group), None)
    pending, in_flight = (counts["pending"], counts["inFlight"]) if counts is not None else (0, 0)
    if pending == 0:
        busy = f"; {in_flight} in flight under other consumers' leases" if in_flight else ""
        return f"{said}: no message is pending for group {group}{busy}"
    return (f"{said}: {pending} message(s) pending for group {group}, none of them deliverable now: they are in "
            f"partitions leased to other consumers ({in_flight} in flight) or wait out a delay or a retry backoff")


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


async def queue_consume(args) -> int:
    import signal

    import anyio

    from queen_client.durations import seconds

    command = args.cmd
    if not command:
        print(f"queen queue consume: no command given; usage: {CONSUME_USAGE}", file=sys.stderr)
        return EXIT_USAGE
    if args.concurrency < 1:
        raise ValueError("--concurrency must be 1 or more")
    grace_s = seconds(args.grace, "--grace")
    wait_s(args.wait, 60.0)
    stop = anyio.Event()
    signalled: list[int] = []

    running = [0]  # commands running now

    async def run_command(message) -> None:
        running[0] += 1
        try:
            await run_one(message)
        except CommandFailed:
            raise  # the command's own failure: its stderr, passed on, said why
        except Exception as raised:  # noqa: BLE001 - ours, not the command's: said here, and failed with its cause
            error = sole(raised)
            cause = f"queen queue consume: {type(error).__name__}: {error}"
            print(f"{cause} (message {message.queue}/{message.partition} offset {message.offset}, acked failed)",
                  file=sys.stderr, flush=True)
            raise ConsumeFailed(cause) from error
        finally:
            running[0] -= 1

    async def run_one(message) -> None:
        env = dict(os.environ, QUEEN_QUEUE=message.queue, QUEEN_GROUP=message.consumer_group,
                   QUEEN_PARTITION=message.partition, QUEEN_PARTITION_ID=str(message.partition_id),
                   QUEEN_OFFSET=str(message.offset), QUEEN_MESSAGE_ID=str(message.message_id),
                   QUEEN_TRANSACTION_ID=message.transaction_id, QUEEN_RETRY_COUNT=str(message.retry_count),
                   QUEEN_LEASE_ID=str(message.lease_id), QUEEN_CREATED_AT=str(message.created_at_ms))
        payload = stdin_bytes(message.data)  # before the command starts: it never runs without its stdin
        process = await anyio.open_process(command, stdin=subprocess.PIPE, stdout=None, stderr=subprocess.PIPE,
                                           env=env)
        tail = b""
        async with process:
            async with anyio.create_task_group() as streams:
                async def feed() -> None:
                    try:
                        await process.stdin.send(payload)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        pass  # it did not read its stdin: fine
                    await process.stdin.aclose()

                streams.start_soon(feed)
                async for chunk in process.stderr:  # passed on as it comes, its end kept for the error
                    sys.stderr.buffer.write(chunk)
                    sys.stderr.buffer.flush()
                    tail = (tail + chunk)[-ERROR_TAIL_BYTES:]
            returncode = await process.wait()
        if returncode == 0:
            return
        lines = [line for line in tail.decode(errors="replace").splitlines() if line.strip()]
        error = lines[-1] if lines else f"exit status {returncode}"
        if args.dlq_exit_code is not None and returncode == args.dlq_exit_code:
            await message.dead_letter(error)
            return
        raise CommandFailed(error)

    working = anyio.CancelScope()

    async def on_signals() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            async for signum in received:
                signalled.append(signum)
                if len(signalled) > 1:
                    working.cancel()  # a second signal: no more grace (leases are still released)
                    continue
                if signum == signal.SIGTERM or running[0]:  # an idle Ctrl-C says just "interrupted"
                    print(f"queen queue consume: {signal.Signals(signum).name}: stopping ({running[0]} running "
                          f"command(s) get {args.grace}; a second signal stops them now)", file=sys.stderr)
                stop.set()

    async with open_client(args) as client:
        queue = client.queue(args.queue)
        async with anyio.create_task_group() as workers:
            workers.start_soon(on_signals)
            with working:
                async with anyio.create_task_group() as loops:
                    for _ in range(args.concurrency):
                        loops.start_soon(partial(queue.process, run_command, group=args.group, batch=args.batch,
                                                 wait=args.wait, grace=grace_s, stop=stop, handle_signals=False))
            workers.cancel_scope.cancel()
    if signal.SIGINT in signalled:
        raise KeyboardInterrupt
    return EXIT_OK


def stdin_bytes(payload) -> bytes:
    """What a consumed command reads on its stdin: a byte string as it is, a string as its UTF-8
    text, anything else as the wire's JSON (bytes inside it as {"$bytes": ...})."""
    if isinstance(payload, bytes):
        return payload
    return show_value(payload).encode("utf-8")


class CommandFailed(Exception):
    """A consumed command exited with a status other than 0: its last stderr line is the error."""


class ConsumeFailed(Exception):
    """The worker itself failed to run the command for a message (it could not be started, its
    stdin or stderr failed): the message is acked failed with this, which names the cause."""
