"""`queen lock acquire|renew|release|status|list` (one lock call each, through `client.locks`) and
`queen run-locked` (a command run only while a lock is held: flock(1) across machines, through a
lock handle that renews in the background)."""

from __future__ import annotations

import math
import os
import signal
import sys

from queen.cli.output import (
    EXIT_HELD,
    EXIT_NO,
    EXIT_OK,
    EXIT_USAGE,
    iso,
    now_ms,
    open_client,
    print_json,
    say_no,
    wait_s,
)

RUN_LOCKED_USAGE = "queen run-locked NAME --ttl DURATION [--wait DURATION] -- CMD [ARGS...]"
NAME_HELP = "the lock's name: 1-256 bytes, no '#'"
TTL_HELP = "the lease: 30s, 5m, 2h or seconds (at most 90d); it ends then unless renewed"


def add_parser(commands, parents: dict) -> None:
    client = parents["client"]
    lock = commands.add_parser("lock", help="acquire, renew, release and inspect locks",
                               description="One lock call each. Exit status: 0 done, 1 lost / not released, "
                                           "75 held by somebody else, 65 rejected, 69 unreachable.")
    actions = lock.add_subparsers(dest="action", metavar="ACTION", required=True)
    acquire = actions.add_parser("acquire", parents=[client], help="take a lock (exit 75 if held)")
    acquire.add_argument("name", help=NAME_HELP)
    acquire.add_argument("--ttl", required=True, metavar="DURATION", help=TTL_HELP)
    acquire.add_argument("--wait", metavar="DURATION", help="wait up to this long (at most 60s, or 'forever': asked "
                         "again every 60s, keeping its place in line) for a permit")
    acquire.add_argument("--owner", help="who holds it (default: host:pid:random)")
    acquire.add_argument("--limit", type=int, default=1, metavar="N", help="permits, for a semaphore: "
                         "1-1024 (default: 1, a plain lock)")
    acquire.set_defaults(handler=lock_acquire)
    for action, handler, helptext in (("renew", lock_renew, "extend a lease (prints the new token)"),
                                      ("release", lock_release, "give a permit back")):
        sub = actions.add_parser(action, parents=[client], help=helptext)
        sub.add_argument("name", help=NAME_HELP)
        sub.add_argument("--token", type=int, required=True, help="the token of the last answer")
        sub.add_argument("--slot", type=int, default=0, help="the permit's slot, as the acquire printed it "
                         "(default: 0, a plain lock's only one)")
        sub.add_argument("--owner", help="the owner it was acquired with: makes a retry safe, and a token of "
                         "that owner's that a renew already replaced still counts (default: none)")
        if action == "renew":
            sub.add_argument("--ttl", required=True, metavar="DURATION", help="the new lifetime, from now: "
                             "30s, 5m, 2h or seconds (at most 90d)")
        sub.set_defaults(handler=handler)
    status = actions.add_parser("status", parents=[client], help="who holds a lock: since, renewed, expires")
    status.add_argument("name", help=NAME_HELP)
    status.set_defaults(handler=lock_status)
    every = actions.add_parser("list", parents=[client], help="every held permit (--json: one object a line)")
    every.add_argument("--prefix", default="", help="only locks whose name starts with this (default: every "
                       "lock)")
    every.set_defaults(handler=lock_list)

    run_locked = commands.add_parser(
        "run-locked", parents=[client], usage=RUN_LOCKED_USAGE,
        help="run a command only while holding a lock (flock(1) across machines)",
        description="Run CMD only while holding the lock NAME, renewing it in the background. CMD gets "
                    "QUEEN_LOCK_TOKEN, QUEEN_LOCK_FENCE, QUEEN_LOCK_SLOT, QUEEN_LOCK_NAME and QUEEN_LOCK_OWNER. "
                    "If the lock is lost, CMD gets SIGTERM, then SIGKILL after --grace. SIGTERM, SIGINT and "
                    "SIGHUP are passed on to CMD. Exits with CMD's status (128+N if killed by signal N; never 0 "
                    "when the lock was lost under it), 75 when somebody else holds the lock, 69 when the broker "
                    "cannot be reached.")
    run_locked.add_argument("name", help=NAME_HELP)
    run_locked.add_argument("--ttl", required=True, metavar="DURATION", help="the lease; renewed every third of it")
    run_locked.add_argument("--wait", metavar="DURATION", help="wait up to this long for the lock, or 'forever' "
                            "(default: do not wait)")
    run_locked.add_argument("--owner", help="who holds it (default: host:pid:random)")
    run_locked.add_argument("--limit", type=int, default=1, metavar="N", help="permits, for a semaphore: "
                            "1-1024 (default: 1, a plain lock)")
    run_locked.add_argument("--grace", default="10s", metavar="DURATION", help="between SIGTERM and SIGKILL (default: 10s)")
    run_locked.set_defaults(handler=run_locked_command, cmd=[])


def _holder_wire(holder) -> dict:
    return {"name": holder.name, "slot": holder.slot, "owner": holder.owner, "token": holder.token,
            "fence": holder.fence, "since": holder.since_ms, "renewedAt": holder.renewed_at_ms,
            "expiresAt": holder.expires_at_ms}


def _holder_line(holder, now: int) -> str:
    left_s = (holder.expires_at_ms - now) / 1000
    return (f"slot {holder.slot}  owner {holder.owner}  token {holder.token}  fence {holder.fence}  "
            f"since {iso(holder.since_ms)}  renewed {iso(holder.renewed_at_ms)}  "
            f"expires {iso(holder.expires_at_ms)} (in {left_s:.1f}s)")


async def lock_acquire(args) -> int:
    from queen_client.locks import WAIT_MS_MAX, mint_owner

    wait = wait_s(args.wait, WAIT_MS_MAX / 1000)
    owner = args.owner or mint_owner()  # the same owner at every ask, so a retry is the same acquire
    async with open_client(args) as client:
        while True:
            answer = await client.locks.acquire(args.name, ttl=args.ttl, owner=owner, limit=args.limit,
                                                wait=None if wait is None else min(wait, WAIT_MS_MAX / 1000))
            if answer or wait != math.inf or answer.reason != "timeout":
                break
    if args.json:
        print_json(answer.wire)
    elif answer:
        print(f"acquired {args.name} slot {answer.slot} token {answer.token} fence {answer.fence} "
              f"owner {answer.owner} expires {iso(answer.expires_at_ms)}")
    else:
        holders = ", ".join(f"{h.owner} (token {h.token})" for h in answer.holders)
        say_no(f"{args.name} not acquired: {answer.reason}; held by {holders or 'nobody'}")
    return EXIT_OK if answer else EXIT_HELD


async def lock_renew(args) -> int:
    async with open_client(args) as client:
        answer = await client.locks.renew(args.name, slot=args.slot, token=args.token, ttl=args.ttl, owner=args.owner)
    return _held_lock_answer(args, answer, "renewed", f"renewed {args.name} slot {args.slot} token {answer.token} "
                                                      f"expires {iso(answer.expires_at_ms)}")


async def lock_release(args) -> int:
    async with open_client(args) as client:
        answer = await client.locks.release(args.name, slot=args.slot, token=args.token, owner=args.owner)
    return _held_lock_answer(args, answer, "released", f"released {args.name} slot {args.slot}")


def _held_lock_answer(args, answer, outcome: str, done_line: str) -> int:
    if args.json:
        print_json(answer.wire)
    elif answer:
        print(done_line)
    else:
        say_no(f"{args.name} not {outcome}: {answer.reason}")
    return EXIT_OK if answer else EXIT_NO


async def lock_status(args) -> int:
    async with open_client(args) as client:
        holders = await client.locks.holders(args.name)
    if args.json:
        print_json({"name": args.name, "held": bool(holders),
                    "holders": [{k: v for k, v in _holder_wire(h).items() if k != "name"} for h in holders]})
    elif not holders:
        print(f"{args.name}: not held")
    else:
        now = now_ms()
        print(f"{args.name}: held")
        for holder in holders:
            print("  " + _holder_line(holder, now))
    return EXIT_OK


async def lock_list(args) -> int:
    now = now_ms()
    async with open_client(args) as client:
        async for holder in client.locks.list(args.prefix):
            print_json(_holder_wire(holder)) if args.json else print(f"{holder.name}  " + _holder_line(holder, now))
    return EXIT_OK


def _exit_status(returncode: int) -> int:
    """A command killed by signal N exits 128+N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


async def run_locked_command(args) -> int:
    """Run CMD only while holding NAME: acquire (or wait), export the token and fence, renew in the
    background, stop CMD (SIGTERM, then SIGKILL after the grace) if the lock is lost, release when
    it ends, and exit with its status."""
    import anyio

    from queen_client.durations import seconds

    command = args.cmd
    if not command:
        print(f"queen run-locked: no command given; usage: {RUN_LOCKED_USAGE}", file=sys.stderr)
        return EXIT_USAGE
    grace_s = seconds(args.grace, "grace")
    async with open_client(args) as client:
        if args.limit == 1:
            lock = client.lock(args.name, ttl=args.ttl, owner=args.owner)
        else:
            lock = client.semaphore(args.name, args.limit, ttl=args.ttl, owner=args.owner)
        wait = wait_s(args.wait, None)
        if not await lock.acquire(wait="forever" if wait == math.inf else wait):
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
            await lock.release_quietly()
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
        await lock.release_quietly()
    status = _exit_status(returncode)
    if stopped_for_loss and status == 0:
        return EXIT_NO  # a success that the lock did not cover is not reported as one
    return status
