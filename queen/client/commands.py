"""The client side of the `queen` command: `queen kv ...`, `queen lock ...`, `queen run-locked`,
`queen queue ...`, `queen timer ...`.

Argument parsing lives in queen/cli.py with `serve`; this module is imported only when a client
command runs, so the server never loads the SDK.

Exit status, the same for every command (sysexits.h where one fits):
  0   it did what was asked (found, applied, acquired, renewed, released; run-locked: CMD's status)
  1   the server answered no (not found, not applied, lost, absent; nothing to pop, not acked)
  2   usage error
  65  the server rejected the request (400: a limit, a malformed value)
  69  the server could not be reached, or answered 503
  75  the lock is held by somebody else (lock acquire, run-locked): try later
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import UTC, datetime
from urllib.parse import quote

import anyio

from queen.client.client import Client
from queen.client.durations import seconds, ttl_seconds
from queen.client.errors import (
    ApiError,
    BadRequestError,
    ClientError,
    TransportError,
    UnavailableError,
)
from queen.client.locks import mint_owner

EXIT_OK = 0
EXIT_NO = 1
EXIT_USAGE = 2
EXIT_REJECTED = 65
EXIT_UNAVAILABLE = 69
EXIT_HELD = 75
# After SIGTERM, how long a command may take to stop before SIGKILL, unless --grace says otherwise.
GRACE_S_DEFAULT = 10.0


def run(args) -> int:
    """Entry from queen/cli.py: run one client command on Trio, errors turned into exit codes."""
    try:
        return anyio.run(_COMMANDS[(args.command, getattr(args, "action", None))], args, backend="trio")
    except (ValueError, TypeError) as error:
        print(f"queen: {error}", file=sys.stderr)
        return EXIT_USAGE
    except BadRequestError as error:
        print(f"queen: rejected: {error.code}: {error.message}", file=sys.stderr)
        return EXIT_REJECTED
    except (TransportError, UnavailableError) as error:
        print(f"queen: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ApiError as error:
        print(f"queen: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE


def _print_json(document) -> None:
    print(json.dumps(document, ensure_ascii=False), flush=True)


def _iso(ms: int | None) -> str:
    if ms is None:
        return "never"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _show_value(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _lifetime(args) -> dict:
    return {"forever": True} if args.forever else {"ttl": args.ttl}


def _client(args) -> Client:
    return Client(args.url, timeout_s=args.timeout)


# -- kv ----------------------------------------------------------------------------------------------


async def kv_get(args) -> int:
    async with _client(args) as client:
        item = await client.kv.get(args.ns, args.key)
    if args.json:
        _print_json({"key": item.key, "found": item.found, "value": item.value, "version": item.version,
                     "expiresAt": item.expires_at_ms})
    elif item.found:
        print(_show_value(item.value))
    else:
        print(f"queen: {args.ns}/{args.key} not found", file=sys.stderr)
    return EXIT_OK if item.found else EXIT_NO


def _value(args):
    raw = sys.stdin.read() if args.value == "-" else args.value
    if args.string:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # not JSON: taken as a string, as a shell user means it


def _write_answer(args, result, what: str) -> int:
    if args.json:
        document = {"applied": result.applied, "version": result.version}
        if result.value is not None:
            document["value"] = result.value
        if result.reason is not None:
            document["reason"] = result.reason
        if result.current is not None:
            document["current"] = {"value": result.current.value, "version": result.current.version}
        _print_json(document)
    elif result.applied:
        print(f"{what} version {result.version}" if result.value is None else _show_value(result.value))
    else:
        extra = f" (current version {result.current.version})" if result.current is not None else ""
        if result.reason == "limit":
            extra = f" (value {result.value})"
        print(f"queen: not applied: {result.reason}{extra}", file=sys.stderr)
    return EXIT_OK if result.applied else EXIT_NO


async def kv_put(args) -> int:
    value = _value(args)
    async with _client(args) as client:
        if args.if_absent:
            result = await client.kv.put_if_absent(args.ns, args.key, value, **_lifetime(args))
        else:
            result = await client.kv.put(args.ns, args.key, value, expect=args.expect, **_lifetime(args))
    return _write_answer(args, result, "applied")


async def kv_delete(args) -> int:
    async with _client(args) as client:
        result = await client.kv.delete(args.ns, args.key, expect=args.expect)
    return _write_answer(args, result, "deleted")


async def kv_incr(args) -> int:
    async with _client(args) as client:
        result = await client.kv.incr(args.ns, args.key, args.by, max=args.max, min=args.min, **_lifetime(args))
    return _write_answer(args, result, "")


async def kv_list(args) -> int:
    count = 0
    async with _client(args) as client:
        async for item in client.kv.get_prefix(args.ns, args.prefix):
            if args.json:  # one JSON object per line: streams, and `jq` reads it as it is
                _print_json({"key": item.key, "value": item.value, "version": item.version, "expiresAt": item.expires_at_ms})
            else:
                print(f"{item.key}\t{item.version}\t{json.dumps(item.value, ensure_ascii=False)}")
            count += 1
            if args.limit is not None and count >= args.limit:
                break
    return EXIT_OK


# -- lock --------------------------------------------------------------------------------------------


def _holder_line(holder: dict, now_ms: int) -> str:
    left_s = (holder["expiresAt"] - now_ms) / 1000
    return (f"slot {holder['slot']}  owner {holder.get('owner')}  token {holder['token']}  fence {holder['fence']}  "
            f"since {_iso(holder['since'])}  renewed {_iso(holder['renewedAt'])}  "
            f"expires {_iso(holder['expiresAt'])} (in {left_s:.1f}s)")


async def lock_acquire(args) -> int:
    op = {"op": "acquire", "name": args.name, "ttlSeconds": ttl_seconds(args.ttl), "owner": args.owner or mint_owner()}
    if args.limit != 1:
        op["limit"] = args.limit
    if args.wait is not None:
        op["waitMs"] = int(min(seconds(args.wait, "wait"), 60) * 1000)
    async with _client(args) as client:
        [result] = await client.locks.call(op)
    if args.json:
        _print_json(result)
    elif result["acquired"]:
        print(f"acquired {args.name} slot {result['slot']} token {result['token']} fence {result['fence']} "
              f"owner {result['owner']} expires {_iso(result['expiresAt'])}")
    else:
        holders = ", ".join(f"{h.get('owner')} (token {h['token']})" for h in result.get("holders", []))
        print(f"queen: {args.name} not acquired: {result['reason']}; held by {holders or 'nobody'}", file=sys.stderr)
    return EXIT_OK if result["acquired"] else EXIT_HELD


async def lock_renew(args) -> int:
    op = {"op": "renew", "name": args.name, "slot": args.slot, "token": args.token, "ttlSeconds": ttl_seconds(args.ttl)}
    return await _change_held_lock(args, op, "renewed", lambda result: f"renewed {args.name} slot {args.slot} "
                                   f"token {result['token']} expires {_iso(result['expiresAt'])}")


async def lock_release(args) -> int:
    op = {"op": "release", "name": args.name, "slot": args.slot, "token": args.token}
    return await _change_held_lock(args, op, "released", lambda result: f"released {args.name} slot {args.slot}")


async def _change_held_lock(args, op: dict, outcome: str, describe) -> int:
    """Renew or release one held slot: `outcome` is the answer's flag ("renewed"/"released"),
    `describe(result)` the line printed when it is set."""
    if args.owner:
        op["owner"] = args.owner
    async with _client(args) as client:
        [result] = await client.locks.call(op)
    if args.json:
        _print_json(result)
    elif result[outcome]:
        print(describe(result))
    else:
        print(f"queen: {args.name} not {outcome}: {result['reason']}", file=sys.stderr)
    return EXIT_OK if result[outcome] else EXIT_NO


async def lock_status(args) -> int:
    async with _client(args) as client:
        [result] = await client.locks.call({"op": "get", "name": args.name})
    holders = result["holders"]
    if args.json:
        _print_json({"name": args.name, "held": bool(holders), "holders": holders})
    elif not holders:
        print(f"{args.name}: not held")
    else:
        now_ms = int(datetime.now(UTC).timestamp() * 1000)
        print(f"{args.name}: held")
        for holder in holders:
            print("  " + _holder_line(holder, now_ms))
    return EXIT_OK


async def lock_list(args) -> int:
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    async with _client(args) as client:
        async for holder in client.locks.list(args.prefix):
            wire = {"name": holder.name, "slot": holder.slot, "owner": holder.owner, "token": holder.token,
                    "fence": holder.fence, "since": holder.since_ms, "renewedAt": holder.renewed_at_ms,
                    "expiresAt": holder.expires_at_ms}
            if args.json:
                _print_json(wire)
            else:
                print(f"{holder.name}  " + _holder_line(wire, now_ms))
    return EXIT_OK


# -- run-locked --------------------------------------------------------------------------------------


def _exit_status(returncode: int) -> int:
    """A command killed by signal N exits 128+N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


async def run_locked(args) -> int:
    """Run CMD only while holding NAME: acquire (or wait), export the token and fence, renew in the
    background, stop CMD (SIGTERM, then SIGKILL after the grace) if the lock is lost, release when
    it ends, and exit with its status."""
    command = args.cmd
    if not command:
        print("queen run-locked: no command given; usage: queen run-locked NAME --ttl 30s -- CMD [ARGS...]", file=sys.stderr)
        return EXIT_USAGE
    grace_s = seconds(args.grace, "grace")
    async with _client(args) as client:
        if args.limit == 1:
            lock = client.lock(args.name, ttl=args.ttl, owner=args.owner)
        else:
            lock = client.semaphore(args.name, args.limit, ttl=args.ttl, owner=args.owner)
        if not await lock.acquire(wait=args.wait):
            reason, holders = lock.refusal
            owners = ", ".join(str(h.owner) for h in holders) or "nobody"
            print(f"queen run-locked: {args.name} is {reason} (held by {owners}); not running the command", file=sys.stderr)
            return EXIT_HELD
        env = dict(os.environ, QUEEN_LOCK_NAME=args.name, QUEEN_LOCK_TOKEN=str(lock.token),
                   QUEEN_LOCK_FENCE=str(lock.fence), QUEEN_LOCK_SLOT=str(lock.slot), QUEEN_LOCK_OWNER=lock.owner)
        stopped_for_loss = False
        try:
            process = await anyio.open_process(command, stdin=None, stdout=None, stderr=None, env=env)
        except OSError as error:
            print(f"queen run-locked: cannot run {command[0]!r}: {error}", file=sys.stderr)
            await lock._release_quietly()
            return 127 if isinstance(error, FileNotFoundError) else 126

        async def forward_signals():
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                async for signum in signals:
                    if process.returncode is None:
                        process.send_signal(signum)

        async def stop_on_loss():
            nonlocal stopped_for_loss
            reason = await lock.wait_lost()
            stopped_for_loss = True
            print(f"queen run-locked: lost the lock {args.name!r} ({reason}); stopping the command", file=sys.stderr)
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(grace_s):
                    await process.wait()
                if process.returncode is None:
                    process.kill()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(forward_signals)
            tasks.start_soon(stop_on_loss)
            returncode = await process.wait()
            tasks.cancel_scope.cancel()
        await lock._release_quietly()
    status = _exit_status(returncode)
    if stopped_for_loss and status == 0:
        return EXIT_NO  # a success that the lock did not cover is not reported as one
    return status


# -- queues --------------------------------------------------------------------------------------------

_OPTION_FLAGS = {  # flag dest -> (option, converter)
    "lease_time": ("leaseTimeSeconds", lambda v: ttl_seconds(v, "--lease-time")),
    "retry_limit": ("retryLimit", int),
    "dlq": ("dlqAfterMaxRetries", bool),
    "delay": ("delayedProcessingSeconds", lambda v: int(seconds(v, "--delay"))),
    "retention": ("retentionSeconds", lambda v: int(seconds(v, "--retention"))),
    "completed_retention": ("completedRetentionSeconds", lambda v: int(seconds(v, "--completed-retention"))),
    "dedup_window": ("dedupWindowSeconds", lambda v: ttl_seconds(v, "--dedup-window")),
    "max_size": ("maxSize", int),
}


async def queue_configure(args) -> int:
    options = {}
    for dest, (option, convert) in _OPTION_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            options[option] = convert(value)
    async with _client(args) as client:
        effective = await client.queue(args.queue).configure(**options)
    if args.json:
        _print_json({"queue": args.queue, "options": effective})
    else:
        for option, value in effective.items():
            print(f"{option} {_show_value(value)}")
    return EXIT_OK


async def queue_push(args) -> int:
    async with _client(args) as client:
        result = await client.queue(args.queue).push(_value(args), partition=args.partition,
                                                     transaction_id=args.transaction_id)
    if args.json:
        _print_json({"status": result.status, "queue": result.queue, "partition": result.partition,
                     "partitionId": result.partition_id, "messageId": result.message_id, "offset": result.offset,
                     "transactionId": result.transaction_id, "reason": result.reason})
    elif result.status == "failed":
        print(f"queen: not queued: {result.reason}", file=sys.stderr)
    else:
        print(f"{result.status} {result.partition} offset {result.offset} (message {result.message_id})")
    return EXIT_OK if result else EXIT_NO


async def queue_pop(args) -> int:
    async with _client(args) as client:
        delivery = await client.queue(args.queue).pop(group=args.group, batch=args.batch, partition=args.partition,
                                                      wait=args.wait, auto_ack=args.auto_ack)
    if args.json:
        _print_json({"leaseId": delivery.lease_id, "expiresAt": delivery.expires_at_ms, "reason": delivery.reason,
                     "messages": [{"partition": m.partition, "partitionId": m.partition_id, "offset": m.offset,
                                   "messageId": m.message_id, "transactionId": m.transaction_id, "data": m.data,
                                   "retryCount": m.retry_count, "leaseId": m.lease_id} for m in delivery.messages]})
    elif delivery.messages:
        if delivery.lease_id is not None:
            print(f"lease {delivery.lease_id} until {_iso(delivery.expires_at_ms)}; ack with: queen queue ack "
                  f"{args.queue} --lease {delivery.lease_id} --partition-id {delivery.messages[0].partition_id} "
                  f"--offset N", file=sys.stderr)
        for m in delivery.messages:
            print(f"{m.partition}\t{m.offset}\t{_show_value(m.data)}" + (f"\tretry {m.retry_count}" if m.retry_count else ""))
    else:
        print(f"queen: nothing to deliver ({delivery.reason})", file=sys.stderr)
    return EXIT_OK if delivery.messages else EXIT_NO


async def queue_ack(args) -> int:
    wire = {"partitionId": args.partition_id, "leaseId": args.lease, "offset": args.offset, "status": args.status}
    if args.error is not None:
        wire["error"] = args.error
    if args.group is not None:
        wire["consumerGroup"] = args.group
    async with _client(args) as client:
        answer = await client._transport.call("POST", "/api/v1/ack", wire, safe=True)
    if args.json:
        _print_json(answer)
    elif answer["success"]:
        print("already acked" if answer.get("already") else
              ("moved to the DLQ" if answer.get("dlq") else f"acked {args.status}"))
    else:
        print(f"queen: not acked: {answer['reason']}", file=sys.stderr)
    return EXIT_OK if answer["success"] else EXIT_NO


async def queue_list(args) -> int:
    async with _client(args) as client:
        cursor = None
        rows = []
        while True:
            params = f"?prefix={quote(args.prefix)}" + (f"&cursor={cursor}" if cursor else "")
            page = await client._transport.call("GET", "/api/v1/resources/queues" + params, safe=True)
            rows += page["items"]
            cursor = page["cursor"]
            if cursor is None:
                break
    for row in rows:
        if args.json:
            _print_json(row)
        else:
            print(f"{row['queue']}\tmessages {row['messages']}\tpending {row['pending']}\tin flight {row['inFlight']}"
                  f"\tdlq {row['dlq']}\tpartitions {row['partitions']}\tgroups {','.join(row['groups']) or '-'}")
    return EXIT_OK


async def queue_dlq(args) -> int:
    async with _client(args) as client:
        queue = client.queue(args.queue)
        if args.purge:
            purged = await queue.purge_dlq(group=args.group)
            _print_json({"purged": purged}) if args.json else print(f"purged {purged}")
            return EXIT_OK
        entries = [entry async for entry in queue.dlq(group=args.group)]
        if args.requeue:
            done = 0
            for group in sorted({e["consumerGroup"] for e in entries}):
                chosen = [e for e in entries if e["consumerGroup"] == group]
                done += sum(await queue.requeue(chosen, group=group))
            _print_json({"requeued": done}) if args.json else print(f"requeued {done}")
            return EXIT_OK
    for entry in entries:
        if args.json:
            _print_json(entry)
        else:
            print(f"{entry['consumerGroup']}\t{entry['partition']}\t{entry['offset']}\tretry {entry['retryCount']}"
                  f"\t{entry['error'] or '-'}\t{_show_value(entry['data'])}")
    return EXIT_OK if entries else EXIT_NO


# -- timers ------------------------------------------------------------------------------------------


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


def _timer_line(timer) -> str:
    return (f"{timer.key}\tat {_iso(timer.at_ms)}\tpartition {timer.partition}\tversion {timer.version}"
            + (f"\ttransaction {timer.transaction_id}" if timer.transaction_id else ""))


def _timer_json(timer) -> dict:
    return {"queue": timer.queue, "key": timer.key, "at": timer.at_ms, "partition": timer.partition,
            "version": timer.version, "scheduledAt": timer.scheduled_at_ms, "transactionId": timer.transaction_id}


async def timer_schedule(args) -> int:
    if args.delay is not None and not 0 <= seconds(args.delay, "--in") <= 365 * 86_400:
        raise ValueError(f"--in {args.delay}: a timer fires from now (0s) to at most 365 days ahead (365d)")
    when = {"at": _at(args.at)} if args.at is not None else {"delay": args.delay}
    async with _client(args) as client:
        result = await client.timers.schedule(args.queue, args.key, _value(args), partition=args.partition,
                                              transaction_id=args.transaction_id, **when)
    if args.json:
        _print_json({"scheduled": result.scheduled, "at": result.at_ms, "version": result.version,
                     "replaced": result.replaced, "reason": result.reason})
    elif result.scheduled:
        print(f"{'moved' if result.replaced else 'scheduled'} {args.queue}/{args.key} at {_iso(result.at_ms)} "
              f"(version {result.version})")
    else:
        print(f"queen: not scheduled: {result.reason}", file=sys.stderr)
    return EXIT_OK if result.scheduled else EXIT_NO


async def timer_cancel(args) -> int:
    async with _client(args) as client:
        cancelled = await client.timers.cancel(args.queue, args.key)
    if args.json:
        _print_json({"cancelled": cancelled})
    elif cancelled:
        print(f"cancelled {args.queue}/{args.key}")
    else:
        print(f"queen: {args.queue}/{args.key} is not pending (never scheduled, cancelled, or already fired)",
              file=sys.stderr)
    return EXIT_OK if cancelled else EXIT_NO


async def timer_get(args) -> int:
    async with _client(args) as client:
        timer = await client.timers.get(args.queue, args.key)
    if args.json:
        _print_json({"found": False} if timer is None else {"found": True, **_timer_json(timer),
                                                            "payload": timer.payload})
    elif timer is not None:
        print(_timer_line(timer))
        print(_show_value(timer.payload))
    else:
        print(f"queen: {args.queue}/{args.key} is not pending", file=sys.stderr)
    return EXIT_OK if timer is not None else EXIT_NO


async def timer_list(args) -> int:
    if args.limit is not None and args.limit < 1:
        raise ValueError("--limit must be 1 or more")
    shown = 0
    async with _client(args) as client:
        async for timer in client.timers.list(args.queue, prefix=args.prefix):
            if args.limit is not None and shown >= args.limit:
                break
            _print_json(_timer_json(timer)) if args.json else print(_timer_line(timer))
            shown += 1
    return EXIT_OK


_COMMANDS = {
    ("kv", "get"): kv_get, ("kv", "put"): kv_put, ("kv", "delete"): kv_delete, ("kv", "incr"): kv_incr,
    ("kv", "list"): kv_list,
    ("lock", "acquire"): lock_acquire, ("lock", "renew"): lock_renew, ("lock", "release"): lock_release,
    ("lock", "status"): lock_status, ("lock", "list"): lock_list,
    ("run-locked", None): run_locked,
    ("queue", "configure"): queue_configure, ("queue", "push"): queue_push, ("queue", "pop"): queue_pop,
    ("queue", "ack"): queue_ack, ("queue", "list"): queue_list, ("queue", "dlq"): queue_dlq,
    ("timer", "schedule"): timer_schedule, ("timer", "cancel"): timer_cancel, ("timer", "get"): timer_get,
    ("timer", "list"): timer_list,
}

__all__ = ["run", "ClientError"]
