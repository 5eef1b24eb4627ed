"""The `queen` command: one module per command family, each owning its parser and its handlers.

  serve.py       `queen serve`: settings resolved once (flags over QUEEN_* over defaults), the broker
  auth.py        `queen auth ...`: tokens in an auth file
  check.py       `queen check`: a data directory verified offline, as recovery would
  backup.py      `queen backup` and `queen restore`: a running server's state into a file, and back
  kv.py          `queen kv ...`
  lock.py        `queen lock ...` and `queen run-locked`
  queue.py       `queen queue ...`
  timer.py       `queen timer ...`
  cluster.py     `queen cluster status|switchover|force-promote`: a cluster's nodes, over HTTP
  completion.py  `queen completion bash|zsh|fish`: a tab-completion script
  output.py      what client commands share: exit statuses, options, printing, running a handler
  parser.py      the argument parser every command uses: usage errors with their command's usage
                 and a suggestion

Client commands use the SDK's public API only, and import it when they run, so `queen serve`
never loads the SDK and a client command never loads the server.
"""

from __future__ import annotations

import argparse
import sys

from queen import __version__
from queen.cli import (
    auth,
    backup,
    check,
    cluster,
    completion,
    kv,
    lock,
    output,
    queue,
    serve,
    timer,
)
from queen.cli.parser import QueenParser
from queen.cli.serve import resolve_config

__all__ = ["build_parser", "main", "resolve_config"]


def build_parser() -> argparse.ArgumentParser:
    parser = QueenParser(
        prog="queen", description="Queen: durable KV, leased locks with fencing tokens, partitioned queues, timers and "
                                  "transactions, over HTTP.")
    parser.add_argument("--version", action="version", version=f"queen {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve.add_parser(commands)
    auth.add_parser(commands)
    check.add_parser(commands)
    backup.add_parser(commands)
    cluster.add_parser(commands)
    completion.add_parser(commands)
    parents = output.parents()
    for family in (kv, lock, queue, timer):
        family.add_parser(commands, parents)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = []
    if (argv[:1] == ["run-locked"] or argv[:2] == ["queue", "consume"]) and "--" in argv:
        # Everything after `--` is the command, untouched by our option parsing.
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is not None:  # serve, auth, check, backup, restore
        return args.run(args)
    if getattr(args, "handler", None) is not None:
        args.cmd = command
        return output.run(args)
    parser.print_help()
    return 2
