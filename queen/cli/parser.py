"""The argument parser of every `queen` command, in one class: a usage error shows the usage of the
command it is about (`queen kv put`, not `queen`), and a misspelt option, command or choice comes
with the closest one that exists ("did you mean --ttl?"), exit status 2.

Python 3.11's argparse gets both wrong for a sub-command: an option it does not know is handed up
to the top-level parser, which prints its own usage; and the sub-command's required options are
checked first, so `queen kv put --ttl-second 5 ...` is told "--ttl is required" rather than what
went wrong. Here every parser refuses an option it does not know before it parses anything, and a
sub-command parses strictly, so its leftovers are its own error.

argparse offers no public hook for either: this leans on `_check_value` and on the `parsers`
action class, both unchanged since Python 3.2, and on `_actions`, as every argparse tool does.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys

# What argparse itself takes for a negative number (a value, not an option), as in `--by -1`.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
# How alike a misspelling and a suggestion must be (difflib's ratio, its default).
_SUGGESTION_CUTOFF = 0.6


def closest(word: str, known) -> str | None:
    """The known word closest to `word`, or None when none is close."""
    matches = difflib.get_close_matches(word, list(known), n=1, cutoff=_SUGGESTION_CUTOFF)
    return matches[0] if matches else None


class QueenParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _StrictSubcommands)

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        self._refuse_unknown_options(args)
        return super().parse_known_args(args, namespace)

    def _check_value(self, action, value) -> None:
        if action.choices is not None and value not in action.choices:
            suggestion = closest(str(value), (str(choice) for choice in action.choices))
            hint = f"; did you mean {suggestion!r}?" if suggestion else ""
            choices = ", ".join(repr(str(choice)) for choice in action.choices)
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint} (choose from {choices})")
        super()._check_value(action, value)

    def _option_strings(self) -> list[str]:
        return [option for action in self._actions for option in action.option_strings]

    def _refuse_unknown_options(self, args: list[str]) -> None:
        """Fail on the first option this parser does not know, before any other check. A parser of
        sub-commands looks only up to the command's name: what follows is that command's."""
        has_commands = any(isinstance(action, argparse._SubParsersAction) for action in self._actions)
        known = self._option_strings()
        for arg in args:
            if arg == "--":
                return
            if not _is_option(arg, self.prefix_chars):
                if has_commands:
                    return
                continue
            name = arg.split("=", 1)[0] if arg.startswith("--") else arg
            if name in known or arg[:2] in known:  # -xVALUE: a short option with its value
                continue
            if self.allow_abbrev and name.startswith("--") and any(option.startswith(name) for option in known):
                continue  # an abbreviation: argparse takes it, or says it is ambiguous
            self.error(f"unrecognized option {name}{_did_you_mean(name, known)}")


def _is_option(arg: str, prefix_chars: str) -> bool:
    """Whether argparse reads `arg` as an option rather than a value (its own rules)."""
    if len(arg) < 2 or arg[0] not in prefix_chars:
        return False
    return not (_NEGATIVE_NUMBER.match(arg) or " " in arg)


def _did_you_mean(name: str, known: list[str]) -> str:
    suggestion = closest(name, known)
    if suggestion is None:  # `--ttl-second` for `--ttl`: a known option it starts with, the longest
        suggestion = max((option for option in known if option.startswith("--") and name.startswith(option)),
                         key=len, default=None)
    return f"; did you mean {suggestion}?" if suggestion else ""


class _StrictSubcommands(argparse._SubParsersAction):
    """Parses the chosen sub-command with parse_args, not parse_known_args: an argument it does
    not take fails with that sub-command's usage instead of climbing to the top-level parser."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        name, *arg_strings = values
        if self.dest is not argparse.SUPPRESS:
            setattr(namespace, self.dest, name)
        chosen = self.choices[name]  # a known name: _check_value came first
        for key, value in vars(chosen.parse_args(arg_strings)).items():
            setattr(namespace, key, value)
