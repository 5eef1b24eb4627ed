"""The `queen` command. Settings resolve once, here: flags over QUEEN_* variables over defaults."""

from __future__ import annotations

import argparse
import errno
import gc
import logging
import os
import signal
import sys

import trio

from queen import __version__
from queen.config import Config, config_fields, validate
from queen.errors import CorruptLog, RefusedToStart

logger = logging.getLogger("queen")


def _env_name(field_name: str) -> str:
    return "QUEEN_" + field_name.upper()


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="queen", description="Queen: durable KV, leased locks with fencing tokens, partitioned queues, timers and "
                                  "transactions, over HTTP.")
    parser.add_argument("--version", action="version", version=f"queen {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="run the broker",
        description="Run the broker. Every setting can also come from the QUEEN_* variable named "
                    "beside it; a flag wins over the variable, the variable over the default.")
    for name, kind, default, help_text, metavar in config_fields():
        serve.add_argument(_flag(name), dest=name, default=None, metavar=metavar,
                           type={"int": int, "float": float}.get(kind, str),
                           help=f"{help_text} [env {_env_name(name)}] (default: {default})")
    _add_client_commands(commands)
    return parser


def _add_client_commands(commands) -> None:
    """`queen kv ...`, `queen lock ...`, `queen run-locked`, `queen queue ...` and `queen timer ...`: the
    SDK from the shell. Their code is
    in queen/client/commands.py, imported only when one of them runs."""
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--url", default=None, metavar="URL",
                        help="the broker [env QUEEN_URL] (default: http://127.0.0.1:6632)")
    client.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="per request (default: 10)")
    client.add_argument("--json", action="store_true", help="print the answer as JSON instead of for people")
    lifetime = argparse.ArgumentParser(add_help=False)
    choice = lifetime.add_mutually_exclusive_group(required=True)
    choice.add_argument("--ttl", metavar="DURATION", help="lifetime of the write: 30s, 5m, 2h, 7d or seconds")
    choice.add_argument("--forever", action="store_true", help="the write never expires")

    kv = commands.add_parser("kv", help="read and write KV keys", description="Read and write KV keys. "
                             "Exit status: 0 done, 1 not found / not applied, 65 rejected, 69 unreachable.")
    kv_actions = kv.add_subparsers(dest="action", metavar="ACTION", required=True)
    get = kv_actions.add_parser("get", parents=[client], help="print a key's value")
    get.add_argument("ns")
    get.add_argument("key")
    put = kv_actions.add_parser("put", parents=[client, lifetime], help="write a key")
    put.add_argument("ns")
    put.add_argument("key")
    put.add_argument("value", help="JSON, or any other text as a string; - reads stdin")
    put.add_argument("--string", action="store_true", help="store VALUE as a string even if it parses as JSON")
    put.add_argument("--expect", type=int, metavar="VERSION", help="only if the key's version is this (0 = absent)")
    put.add_argument("--if-absent", action="store_true", help="only if the key does not exist")
    delete = kv_actions.add_parser("delete", parents=[client], help="delete a key")
    delete.add_argument("ns")
    delete.add_argument("key")
    delete.add_argument("--expect", type=int, metavar="VERSION", help="only if the key's version is this")
    incr = kv_actions.add_parser("incr", parents=[client, lifetime], help="add to a counter, within bounds")
    incr.add_argument("ns")
    incr.add_argument("key")
    incr.add_argument("--by", type=int, default=1, metavar="N")
    incr.add_argument("--max", type=int, metavar="N", help="do not go above")
    incr.add_argument("--min", type=int, metavar="N", help="do not go below")
    listing = kv_actions.add_parser("list", parents=[client], help="list keys by prefix (--json: one object a line)")
    listing.add_argument("ns")
    listing.add_argument("--prefix", default="")
    listing.add_argument("--limit", type=int, metavar="N", help="stop after N keys")

    lock = commands.add_parser("lock", help="acquire, renew, release and inspect locks",
                               description="One lock call each. Exit status: 0 done, 1 lost / not released, "
                                           "75 held by somebody else, 65 rejected, 69 unreachable.")
    lock_actions = lock.add_subparsers(dest="action", metavar="ACTION", required=True)
    acquire = lock_actions.add_parser("acquire", parents=[client], help="take a lock (exit 75 if held)")
    acquire.add_argument("name")
    acquire.add_argument("--ttl", required=True, metavar="DURATION")
    acquire.add_argument("--wait", metavar="DURATION", help="wait up to this long (at most 60s) for a permit")
    acquire.add_argument("--owner", help="who holds it (default: host:pid:random)")
    acquire.add_argument("--limit", type=int, default=1, metavar="N", help="permits, for a semaphore")
    for action, helptext in (("renew", "extend a lease (prints the new token)"), ("release", "give a permit back")):
        sub = lock_actions.add_parser(action, parents=[client], help=helptext)
        sub.add_argument("name")
        sub.add_argument("--token", type=int, required=True, help="the token of the last answer")
        sub.add_argument("--slot", type=int, default=0)
        sub.add_argument("--owner")
        if action == "renew":
            sub.add_argument("--ttl", required=True, metavar="DURATION")
    status = lock_actions.add_parser("status", parents=[client], help="who holds a lock: since, renewed, expires")
    status.add_argument("name")
    every = lock_actions.add_parser("list", parents=[client], help="every held permit (--json: one object a line)")
    every.add_argument("--prefix", default="")

    run_locked = commands.add_parser(
        "run-locked", parents=[client], usage="queen run-locked NAME --ttl DURATION [--wait DURATION] -- CMD [ARGS...]",
        help="run a command only while holding a lock (flock(1) across machines)",
        description="Run CMD only while holding the lock NAME, renewing it in the background. CMD gets "
                    "QUEEN_LOCK_TOKEN, QUEEN_LOCK_FENCE, QUEEN_LOCK_SLOT, QUEEN_LOCK_NAME and QUEEN_LOCK_OWNER. "
                    "If the lock is lost, CMD gets SIGTERM, then SIGKILL after --grace. SIGTERM, SIGINT and "
                    "SIGHUP are passed on to CMD. Exits with CMD's status (128+N if killed by signal N; never 0 "
                    "when the lock was lost under it), 75 when somebody else holds the lock, 69 when the broker "
                    "cannot be reached.")
    _add_queue_commands(commands, client)
    _add_timer_commands(commands, client)
    run_locked.add_argument("name")
    run_locked.add_argument("--ttl", required=True, metavar="DURATION", help="the lease; renewed every third of it")
    run_locked.add_argument("--wait", metavar="DURATION", help="wait up to this long for the lock (default: do not wait)")
    run_locked.add_argument("--owner", help="who holds it (default: host:pid:random)")
    run_locked.add_argument("--limit", type=int, default=1, metavar="N", help="permits, for a semaphore")
    run_locked.add_argument("--grace", default="10s", metavar="DURATION", help="between SIGTERM and SIGKILL (default: 10s)")


def _add_queue_commands(commands, client) -> None:
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
    push = actions.add_parser("push", parents=[client], help="append a message")
    push.add_argument("queue")
    push.add_argument("value", help="JSON, or any other text as a string; - reads stdin")
    push.add_argument("--partition", help='default "Default"')
    push.add_argument("--transaction-id", help="makes the push idempotent (one is generated if not given)")
    push.add_argument("--string", action="store_true", help="push VALUE as a string even if it parses as JSON")
    pop = actions.add_parser("pop", parents=[client], help="take messages under a lease (prints the lease id on stderr)")
    pop.add_argument("queue")
    pop.add_argument("--partition", help="only this partition")
    pop.add_argument("--group", help="consumer group (default __QUEUE_MODE__)")
    pop.add_argument("--batch", type=int, default=1, metavar="N")
    pop.add_argument("--wait", metavar="DURATION", help="wait up to this long (at most 60s) for a message")
    pop.add_argument("--auto-ack", action="store_true", help="resolve them at once: at most once, no lease")
    ack = actions.add_parser("ack", parents=[client], help="acknowledge a delivered message")
    ack.add_argument("queue")
    ack.add_argument("--lease", type=int, required=True, metavar="ID", help="the lease id the pop printed")
    ack.add_argument("--partition-id", type=int, required=True, metavar="ID")
    ack.add_argument("--offset", type=int, required=True, metavar="N")
    ack.add_argument("--status", choices=("completed", "failed", "dlq"), default="completed")
    ack.add_argument("--error", help="kept with a DLQ entry")
    ack.add_argument("--group", help="the consumer group (default: the lease's)")
    listing = actions.add_parser("list", parents=[client], help="every queue with its counts (--json: one object a line)")
    listing.add_argument("--prefix", default="")
    dlq = actions.add_parser("dlq", parents=[client], help="list a queue's dead letters, or --requeue / --purge them")
    dlq.add_argument("queue")
    dlq.add_argument("--group", help="only this consumer group's")
    what = dlq.add_mutually_exclusive_group()
    what.add_argument("--requeue", action="store_true", help="put every entry back, first in its partition")
    what.add_argument("--purge", action="store_true", help="drop every entry")


def _add_timer_commands(commands, client) -> None:
    timer = commands.add_parser("timer", help="schedule, cancel and inspect timers (messages into a queue later)",
                                description="A timer is named by QUEUE and KEY; when due, its value is appended to "
                                            "the queue's partition as a message, exactly once, never early. "
                                            "Scheduling a KEY again moves it. Exit status: 0 done, 1 not found / "
                                            "not pending / not scheduled, 2 usage, 65 rejected, 69 unreachable.")
    actions = timer.add_subparsers(dest="action", metavar="ACTION", required=True)
    schedule = actions.add_parser("schedule", parents=[client], help="schedule (or move) a timer")
    schedule.add_argument("queue")
    schedule.add_argument("key")
    schedule.add_argument("value", help="the message's payload: JSON, or any other text as a string; - reads stdin")
    when = schedule.add_mutually_exclusive_group(required=True)
    when.add_argument("--in", dest="delay", metavar="DURATION", help="fire this long from now: 30s, 15m, 2h, 7d")
    when.add_argument("--at", metavar="TIME", help="fire at this time: ISO 8601 (2026-12-01T09:00:00Z) or ms since "
                                                   "the epoch; at most 365 days ahead")
    schedule.add_argument("--partition", help='default "Default"')
    schedule.add_argument("--transaction-id", help="the message's transactionId (deduplicated in its partition)")
    schedule.add_argument("--string", action="store_true", help="take VALUE as a string even if it parses as JSON")
    for action, helptext in (("cancel", "cancel a pending timer (exit 1 if none was pending: it may have fired)"),
                             ("get", "show a pending timer, payload included")):
        sub = actions.add_parser(action, parents=[client], help=helptext)
        sub.add_argument("queue")
        sub.add_argument("key")
    listing = actions.add_parser("list", parents=[client], help="a queue's pending timers in key order (--json: one "
                                 "object a line)")
    listing.add_argument("queue")
    listing.add_argument("--prefix", default="")
    listing.add_argument("--limit", type=int, metavar="N", help="stop after N timers")


def resolve_config(args: argparse.Namespace, environ=os.environ) -> Config:
    values = {}
    for name, kind, _, _, _ in config_fields():
        value = getattr(args, name, None)
        if value is None and _env_name(name) in environ:
            raw = environ[_env_name(name)]
            try:
                value = {"int": int, "float": float}.get(kind, str)(raw)
            except ValueError:
                raise SystemExit(f"queen: {_env_name(name)}={raw!r} is not a valid {kind}") from None
        if value is not None:
            values[name] = value
    return Config(**values)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = []
    if argv[:1] == ["run-locked"] and "--" in argv:
        # Everything after `--` is the command, untouched by our option parsing.
        cut = argv.index("--")
        argv, cmd = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(resolve_config(args))
    if args.command in ("kv", "lock", "run-locked", "queue", "timer"):
        from queen.client.commands import run

        args.cmd = cmd
        return run(args)
    parser.print_help()
    return 2


def setup_logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(),
                        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")


def serve(config: Config) -> int:
    problems = validate(config)
    if problems:
        for problem in problems:
            print(f"queen: {problem}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    from queen.runtime.server import DataDirBusy, Server

    # Everything imported so far lives as long as the process: out of the cyclic GC's sight, a
    # full collection walks only what the server builds, not the modules under it.
    gc.freeze()
    server = Server(config)

    async def watch_signals():
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                logger.info("event=signal signal=%s", signal.Signals(signum).name)
                server.request_shutdown()

    async def main_task():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_signals)
            await server.run()
            nursery.cancel_scope.cancel()

    failure = None
    try:
        trio.run(main_task)
    except* (DataDirBusy, RefusedToStart, OSError) as group:  # raised inside nurseries, so grouped
        failure = _first_leaf(group)
    if failure is None:
        return 0
    if isinstance(failure, CorruptLog):
        logger.error("event=start_failed reason=corrupt_log detail=%r action=refusing_to_start "
                     "hint='inspect or move the named file; starting would drop acknowledged writes'", str(failure))
    elif isinstance(failure, RefusedToStart):
        logger.error("event=start_failed reason=unreadable_format detail=%r action=refusing_to_start", str(failure))
    elif isinstance(failure, OSError) and failure.errno == errno.EADDRINUSE:
        logger.error("event=start_failed reason=address_in_use host=%s port=%d", config.host, config.port)
    else:
        logger.error("event=start_failed reason=%r", str(failure))
    return 1


def _first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
