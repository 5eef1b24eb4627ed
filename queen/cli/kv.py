"""`queen kv get|put|delete|incr|list`: KV keys from the shell, through the SDK's `client.kv`."""

from __future__ import annotations

from queen.cli.output import (
    EXIT_NO,
    EXIT_OK,
    VALUE_HELP,
    add_value_options,
    open_client,
    print_json,
    print_value,
    read_value,
    say_no,
    show_value,
    wire_json,
)


def add_parser(commands, parents: dict) -> None:
    client, lifetime = parents["client"], parents["lifetime"]
    kv = commands.add_parser("kv", help="read and write KV keys", description="Read and write KV keys. "
                             "Exit status: 0 done, 1 not found / not applied, 65 rejected, 69 unreachable.")
    actions = kv.add_subparsers(dest="action", metavar="ACTION", required=True)
    get = actions.add_parser("get", parents=[client], help="print a key's value (bytes as they are, to a file or "
                             "a pipe)")
    get.add_argument("ns", help="the namespace: 1-128 bytes")
    get.add_argument("key", help="the key: 1-1024 bytes")
    get.set_defaults(handler=kv_get)
    put = actions.add_parser("put", parents=[client, lifetime], help="write a key")
    put.add_argument("ns", help="the namespace: 1-128 bytes")
    put.add_argument("key", help="the key: 1-1024 bytes")
    put.add_argument("value", help=VALUE_HELP)
    add_value_options(put)
    put.add_argument("--expect", type=int, metavar="VERSION", help="only if the key's version is this (0 = absent)")
    put.add_argument("--if-absent", action="store_true", help="only if the key does not exist")
    put.set_defaults(handler=kv_put)
    delete = actions.add_parser("delete", parents=[client], help="delete a key")
    delete.add_argument("ns", help="the namespace: 1-128 bytes")
    delete.add_argument("key", help="the key: 1-1024 bytes")
    delete.add_argument("--expect", type=int, metavar="VERSION", help="only if the key's version is this")
    delete.set_defaults(handler=kv_delete)
    incr = actions.add_parser("incr", parents=[client, lifetime], help="add to a counter, within bounds")
    incr.add_argument("ns", help="the namespace: 1-128 bytes")
    incr.add_argument("key", help="the key: 1-1024 bytes")
    incr.add_argument("--by", type=int, default=1, metavar="N", help="what to add; negative subtracts "
                      "(default: 1)")
    incr.add_argument("--max", type=int, metavar="N", help="do not go above")
    incr.add_argument("--min", type=int, metavar="N", help="do not go below")
    incr.set_defaults(handler=kv_incr)
    listing = actions.add_parser("list", parents=[client], help="list keys by prefix (--json: one object a line)")
    listing.add_argument("ns", help="the namespace: 1-128 bytes")
    listing.add_argument("--prefix", default="", help="only keys that start with this (default: every key)")
    listing.add_argument("--limit", type=int, metavar="N", help="stop after N keys")
    listing.set_defaults(handler=kv_list)


def _lifetime(args) -> dict:
    return {"forever": True} if args.forever else {"ttl": args.ttl}


async def kv_get(args) -> int:
    async with open_client(args) as client:
        item = await client.kv.get(args.ns, args.key)
    if args.json:
        print_json({"key": item.key, "found": item.found, "value": item.value, "version": item.version,
                    "expiresAt": item.expires_at_ms})
    elif item.found:
        print_value(item.value, f"{args.ns}/{args.key}")
    else:
        say_no(f"{args.ns}/{args.key} not found")
    return EXIT_OK if item.found else EXIT_NO


def _write_answer(args, result, what: str) -> int:
    if args.json:
        document = {"applied": result.applied, "version": result.version}
        if result.value is not None:
            document["value"] = result.value
        if result.reason is not None:
            document["reason"] = result.reason
        if result.current is not None:
            document["current"] = {"value": result.current.value, "version": result.current.version}
        print_json(document)
    elif result.applied:
        print(f"{what} version {result.version}" if result.value is None else show_value(result.value))
    else:
        extra = f" (current version {result.current.version})" if result.current is not None else ""
        if result.reason == "limit":
            extra = f" (value {result.value})"
        say_no(f"not applied: {result.reason}{extra}")
    return EXIT_OK if result.applied else EXIT_NO


async def kv_put(args) -> int:
    value = read_value(args)
    async with open_client(args) as client:
        if args.if_absent:
            result = await client.kv.put_if_absent(args.ns, args.key, value, **_lifetime(args))
        else:
            result = await client.kv.put(args.ns, args.key, value, expect=args.expect, **_lifetime(args))
    return _write_answer(args, result, "applied")


async def kv_delete(args) -> int:
    async with open_client(args) as client:
        result = await client.kv.delete(args.ns, args.key, expect=args.expect)
    return _write_answer(args, result, "deleted")


async def kv_incr(args) -> int:
    async with open_client(args) as client:
        result = await client.kv.incr(args.ns, args.key, args.by, max=args.max, min=args.min, **_lifetime(args))
    return _write_answer(args, result, "")


async def kv_list(args) -> int:
    count = 0
    async with open_client(args) as client:
        async for item in client.kv.get_prefix(args.ns, args.prefix):
            if args.json:  # one JSON object per line: streams, and `jq` reads it as it is
                print_json({"key": item.key, "value": item.value, "version": item.version,
                            "expiresAt": item.expires_at_ms})
            else:
                print(f"{item.key}\t{item.version}\t{wire_json(item.value)}")
            count += 1
            if args.limit is not None and count >= args.limit:
                break
    return EXIT_OK
