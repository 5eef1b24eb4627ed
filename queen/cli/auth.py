"""`queen auth add|list|remove`: the tokens in an auth file, edited where the server runs.

The file is written whole and atomically (mode 0600); a running server reads it again on SIGHUP.
`add` prints the new secret once, on stdout, and nowhere else: the file keeps only its keyed hash.
"""

from __future__ import annotations

import json
import os
import sys

from queen.auth import ROLES, SETTINGS, AuthFile, AuthFileError
from queen.cli.output import EXIT_NO, EXIT_OK, EXIT_USAGE


def add_parser(commands) -> None:
    auth = commands.add_parser(
        "auth", help="create, list and remove API tokens in an auth file",
        description="Tokens for `queen serve --auth-file FILE`. Roles: reader (reads), writer (reads and writes: "
                    "KV, locks, queues, timers, transactions), admin (also deletes queues and groups, purges "
                    "DLQs, pauses). Every name a tenant uses is its own; tenant '*' with role admin is the "
                    "server's operator (every tenant's views, the default tenant's names). Per-tenant quotas and "
                    "rates go in the file's \"tenants\" object: " + ", ".join(SETTINGS) + ". After a change, "
                    "send the server SIGHUP (kill -HUP PID) to use it.")
    actions = auth.add_subparsers(dest="action", metavar="ACTION", required=True)
    file_help = "the auth file [env QUEEN_AUTH_FILE]"
    add = actions.add_parser("add", help="create a token and print its secret once")
    add.add_argument("name", help="what the token is for (shown in logs and listings): 1-64 printable characters")
    add.add_argument("--role", required=True, choices=ROLES, help="what it may do: reader reads; writer "
                     "also writes; admin also deletes, purges and pauses")
    add.add_argument("--tenant", default="default", help="the tenant whose names it uses (default: default); "
                                                         "'*' for the server's operators")
    add.add_argument("--auth-file", metavar="FILE", help=file_help + "; created if missing")
    add.set_defaults(run=_add)
    listing = actions.add_parser("list", help="the tokens: name, id, role, tenant, created (never secrets)")
    listing.add_argument("--auth-file", metavar="FILE", help=file_help)
    listing.add_argument("--json", action="store_true", help="print JSON lines")
    listing.set_defaults(run=_list)
    remove = actions.add_parser("remove", help="remove a token (by name); it stops working at the server's next "
                                               "SIGHUP or restart")
    remove.add_argument("name", help="the token's name, as `queen auth list` shows it")
    remove.add_argument("--auth-file", metavar="FILE", help=file_help)
    remove.set_defaults(run=_remove)


def _path(args) -> str:
    path = args.auth_file or os.environ.get("QUEEN_AUTH_FILE")
    if not path:
        raise AuthFileError("give --auth-file FILE (or QUEEN_AUTH_FILE)")
    return path


def _run(action):
    def run(args) -> int:
        try:
            return action(args)
        except AuthFileError as error:
            print(f"queen: {error}", file=sys.stderr)
            return EXIT_USAGE
    return run


@_run
def _add(args) -> int:
    path = _path(args)
    auth_file = AuthFile.load(path, missing_ok=True)
    secret = auth_file.add(args.name, args.role, args.tenant)
    auth_file.save()
    print(secret)
    print(f"queen: token {args.name!r} ({args.role}, tenant {args.tenant}) added to {path}; the secret above is "
          "shown only now. Send the server SIGHUP to use it.", file=sys.stderr)
    return EXIT_OK


@_run
def _list(args) -> int:
    auth_file = AuthFile.load(_path(args))
    for token in auth_file.tokens:
        row = {"name": token.name, "id": token.id, "role": token.role, "tenant": token.tenant,
               "createdAt": token.created_at}
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{token.name}\t{token.id}\t{token.role}\t{token.tenant}\t{token.created_at}")
    return EXIT_OK


@_run
def _remove(args) -> int:
    path = _path(args)
    auth_file = AuthFile.load(path)
    if not auth_file.remove(args.name):
        print(f"queen: no token named {args.name!r} in {path}", file=sys.stderr)
        return EXIT_NO
    auth_file.save()
    print(f"queen: token {args.name!r} removed from {path}; send the server SIGHUP to stop it working now",
          file=sys.stderr)
    return EXIT_OK
