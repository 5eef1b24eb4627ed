"""`queen completion bash|zsh|fish`: a tab-completion script for that shell, printed on stdout.

The script is generated from the parser itself by shtab, so it knows every command, option and
choice there is, with their help as descriptions where the shell shows them; arguments that name a
file or a directory complete as paths. shtab is imported only here: no other command loads it.
"""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "fish")
# The metavars of arguments that name a path, and what the shell should complete there.
_PATH_METAVARS = {"FILE": "file", "OUT": "file", "DIR": "directory"}


def add_parser(commands) -> None:
    completion = commands.add_parser(
        "completion", help="print a tab-completion script for bash, zsh or fish",
        description="Print the tab-completion script of the queen command for SHELL on stdout. bash: "
                    "queen completion bash > ~/.local/share/bash-completion/completions/queen; zsh: queen "
                    "completion zsh > ~/.zfunc/_queen, with fpath+=~/.zfunc before compinit in ~/.zshrc; fish: "
                    "queen completion fish > ~/.config/fish/completions/queen.fish. A new shell then completes "
                    "queen's commands and options; print the script again after an upgrade of queen.")
    completion.add_argument("shell", choices=SHELLS, metavar="SHELL", help="the shell the script is for: bash, "
                            "zsh or fish")
    completion.set_defaults(run=_print_script)


def _print_script(args) -> int:
    import shtab

    from queen.cli import build_parser

    parser = build_parser()
    for action in _every_action(parser):
        kind = _PATH_METAVARS.get(action.metavar) if isinstance(action.metavar, str) else None
        if kind is not None:
            action.complete = shtab.FILE if kind == "file" else shtab.DIRECTORY
    print(shtab.complete(parser, shell=args.shell), end="")
    return 0


def _every_action(parser: argparse.ArgumentParser):
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # an alias names the same parser
                yield from _every_action(sub)
