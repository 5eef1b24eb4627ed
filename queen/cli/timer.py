"""`queen timer schedule|cancel|get|list`: timers from the shell, through the SDK's `client.timers`.
A recurring timer is `schedule --cron EXPR [--timezone TZ]` or `schedule --every DURATION`."""

from __future__ import annotations

from datetime import datetime

from queen.cli.output import (
    EXIT_NO,
    EXIT_OK,
    VALUE_HELP,
    add_value_options,
    iso,
    open_client,
    print_json,
    read_value,
    say_no,
    show_value,
)

HORIZON_S = 365 * 86_400  # the server takes a timer at most this far ahead
QUEUE_HELP = "the queue its message goes to: 1-128 bytes"
KEY_HELP = "the timer's key in that queue: 1-1024 bytes"


def add_parser(commands, parents: dict) -> None:
    client = parents["client"]
    timer = commands.add_parser("timer", help="schedule, cancel and inspect timers (messages into a queue later)",
                                description="A timer is named by QUEUE and KEY; when due, its value is appended to "
                                            "the queue's partition as a message, exactly once, never early. "
                                            "Scheduling a KEY again moves it. Exit status: 0 done, 1 not found / "
                                            "not pending / not scheduled, 2 usage, 65 rejected, 69 unreachable.")
    actions = timer.add_subparsers(dest="action", metavar="ACTION", required=True)
    schedule = actions.add_parser("schedule", parents=[client], help="schedule (or move) a timer, once or recurring",
                                  description="Give --in or --at for a timer that fires once; --cron or --every "
                                              "for one that fires once per period (--every may take --in or --at "
                                              "for its first time). Each period's message has the transactionId "
                                              "<transaction id or KEY>@<period ms>.")
    schedule.add_argument("queue", help=QUEUE_HELP)
    schedule.add_argument("key", help=KEY_HELP)
    schedule.add_argument("value", help="the message's payload: " + VALUE_HELP)
    when = schedule.add_mutually_exclusive_group()
    when.add_argument("--in", dest="delay", metavar="DURATION", help="fire this long from now: 30s, 15m, 2h, 7d")
    when.add_argument("--at", metavar="TIME", help="fire at this time: ISO 8601 (2026-12-01T09:00:00Z) or ms since "
                                                   "the epoch; at most 365 days ahead")
    recurring = schedule.add_mutually_exclusive_group()
    recurring.add_argument("--cron", metavar="EXPR", help='fire at the times a 5-field cron expression names: '
                                                          '"0 9 * * 1-5" (09:00 on weekdays)')
    recurring.add_argument("--every", metavar="DURATION", help="fire once per period: 30s, 15m, 1h (1s to 365d)")
    schedule.add_argument("--timezone", metavar="TZ", help="the IANA time zone --cron is read in (Europe/Berlin); "
                                                           "default UTC")
    schedule.add_argument("--partition", help='the partition its message goes to: 1-256 bytes (default '
                                              '"Default")')
    schedule.add_argument("--transaction-id", help="the message's transactionId (deduplicated in its partition)")
    add_value_options(schedule)
    schedule.set_defaults(handler=timer_schedule)
    for action, handler, helptext in (
            ("cancel", timer_cancel, "cancel a pending timer (exit 1 if none was pending: it may have fired)"),
            ("get", timer_get, "show a pending timer, payload included")):
        sub = actions.add_parser(action, parents=[client], help=helptext)
        sub.add_argument("queue", help=QUEUE_HELP)
        sub.add_argument("key", help=KEY_HELP)
        sub.set_defaults(handler=handler)
    listing = actions.add_parser("list", parents=[client], help="a queue's pending timers in key order (--json: one "
                                 "object a line)")
    listing.add_argument("queue", help=QUEUE_HELP)
    listing.add_argument("--prefix", default="", help="only timers whose key starts with this (default: "
                         "every timer)")
    listing.add_argument("--limit", type=int, metavar="N", help="stop after N timers")
    listing.set_defaults(handler=timer_list)


def _at(raw: str):
    if raw.isdigit():
        return int(raw)
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--at {raw!r}: give an ISO 8601 time (2026-12-01T09:00:00Z) or ms since the epoch") from None
    if moment.tzinfo is None:
        raise ValueError(f"--at {raw!r} has no time zone: add Z or an offset, so the time is the one you mean")
    return moment


def _period(ms: int) -> str:
    """A period as it was most likely written: 1d, 2h, 15m, 30s, or 1500ms."""
    for unit, size_ms in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms % size_ms == 0:
            return f"{ms // size_ms}{unit}"
    return f"{ms}ms"


def _recurrence(timer) -> str:
    """How a recurring timer recurs, for a line of text; "" for a one-shot timer."""
    if timer.cron is not None:
        return f"cron {timer.cron} ({timer.timezone})"
    return f"every {_period(timer.every_ms)}" if timer.every_ms else ""


def _timer_line(timer) -> str:
    recurrence = _recurrence(timer)
    return (f"{timer.key}\tat {iso(timer.at_ms)}\tpartition {timer.partition}\tversion {timer.version}"
            + (f"\ttransaction {timer.transaction_id}" if timer.transaction_id else "")
            + (f"\t{recurrence}" if recurrence else ""))


def _schedule_json(timer) -> dict:
    if timer.cron is not None:
        return {"cron": timer.cron, "timezone": timer.timezone}
    return {"everyMs": timer.every_ms} if timer.every_ms else {}


def _timer_json(timer) -> dict:
    return {"queue": timer.queue, "key": timer.key, "at": timer.at_ms, "partition": timer.partition,
            "version": timer.version, "scheduledAt": timer.scheduled_at_ms, "transactionId": timer.transaction_id,
            **_schedule_json(timer)}


async def timer_schedule(args) -> int:
    from queen_client.durations import seconds

    once = args.delay is not None or args.at is not None
    if args.cron is not None and once:
        raise ValueError("--cron names its own times: give no --in or --at with it")
    if args.timezone is not None and args.cron is None:
        raise ValueError("--timezone is the zone --cron is read in: give it with --cron")
    if not once and args.cron is None and args.every is None:
        raise ValueError("give --in or --at (once), or --cron or --every (recurring)")
    if args.delay is not None and not 0 <= seconds(args.delay, "--in") <= HORIZON_S:
        raise ValueError(f"--in {args.delay}: a timer fires from now (0s) to at most 365 days ahead (365d)")
    if args.every is not None and not 1 <= seconds(args.every, "--every") <= HORIZON_S:
        raise ValueError(f"--every {args.every}: a period is from 1s to 365 days (365d)")
    when = {"at": _at(args.at)} if args.at is not None else {"delay": args.delay} if args.delay is not None else {}
    value = read_value(args)
    async with open_client(args) as client:
        result = await client.timers.schedule(args.queue, args.key, value, partition=args.partition,
                                              transaction_id=args.transaction_id, cron=args.cron,
                                              timezone=args.timezone, every=args.every, **when)
    if args.json:
        print_json({"scheduled": result.scheduled, "at": result.at_ms, "version": result.version,
                    "replaced": result.replaced, "reason": result.reason, **_schedule_json(result)})
    elif result.scheduled:
        recurrence = _recurrence(result)
        print(f"{'moved' if result.replaced else 'scheduled'} {args.queue}/{args.key} at {iso(result.at_ms)} "
              f"(version {result.version})" + (f", then {recurrence}" if recurrence else ""))
    else:
        say_no(f"not scheduled: {result.reason}")
    return EXIT_OK if result.scheduled else EXIT_NO


async def timer_cancel(args) -> int:
    async with open_client(args) as client:
        cancelled = await client.timers.cancel(args.queue, args.key)
    if args.json:
        print_json({"cancelled": cancelled})
    elif cancelled:
        print(f"cancelled {args.queue}/{args.key}")
    else:
        say_no(f"{args.queue}/{args.key} is not pending (never scheduled, cancelled, or already fired)")
    return EXIT_OK if cancelled else EXIT_NO


async def timer_get(args) -> int:
    async with open_client(args) as client:
        timer = await client.timers.get(args.queue, args.key)
    if args.json:
        print_json({"found": False} if timer is None else {"found": True, **_timer_json(timer), "payload": timer.payload})
    elif timer is not None:
        print(_timer_line(timer))
        print(show_value(timer.payload))
    else:
        say_no(f"{args.queue}/{args.key} is not pending")
    return EXIT_OK if timer is not None else EXIT_NO


async def timer_list(args) -> int:
    if args.limit is not None and args.limit < 1:
        raise ValueError("--limit must be 1 or more")
    shown = 0
    async with open_client(args) as client:
        async for timer in client.timers.list(args.queue, prefix=args.prefix):
            if args.limit is not None and shown >= args.limit:
                break
            print_json(_timer_json(timer)) if args.json else print(_timer_line(timer))
            shown += 1
    return EXIT_OK
