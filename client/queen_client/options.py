"""Option names: each call takes its Python names and, where the wire names the same thing, the
wire's too (`retry_limit=3` or `retryLimit=3`, `group=` or `consumerGroup=`, `wait="5s"` or
`waitMs=5000`); a name that is neither raises TypeError before anything is sent, saying which one
was probably meant ("did you mean 'retry_limit'?").

`wire_names(...)` decorates a call with its wire spellings; `queue_options` does it for the one
call whose options are open-ended, `Queue.configure`. The decorated call keeps its signature (for
help() and the blocking twins), written in Python names.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from collections.abc import Callable, Iterable

# A queue's options as the wire spells them (the server's list: a test keeps the two in step), and
# the public Queen MQ client's names the server takes for two of them.
QUEUE_OPTIONS = ("leaseTimeSeconds", "retryLimit", "dlqAfterMaxRetries", "retryDelayMs", "retryDelayMaxMs",
                 "delayedProcessingSeconds", "retentionSeconds", "completedRetentionSeconds", "dedupWindowSeconds",
                 "maxSize")
QUEEN_MQ_OPTIONS = {"leaseTime": "leaseTimeSeconds", "delayedProcessing": "delayedProcessingSeconds"}


def ms(value):
    """A wire duration in milliseconds as the seconds a Python option takes."""
    return value if value is None else value / 1000


# The wire names of options several calls share.
GROUP = {"consumerGroup": "group"}
WAIT = {"waitMs": ("wait", ms)}
TTL = {"ttlSeconds": "ttl"}
IDS = {"transactionId": "transaction_id", "traceId": "trace_id"}


def snake(name: str) -> str:
    """retryLimit -> retry_limit."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def suggestion(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` most likely misspells: the same letters but for case and underscores
    (in its style: snake_case for a name with an underscore, else camelCase), else the closest one
    difflib finds."""
    known = list(known)
    same = [candidate for candidate in known if candidate.replace("_", "").lower() == name.replace("_", "").lower()]
    if same:
        return min(same, key=lambda candidate: ("_" in candidate) != ("_" in name))
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_option(call: str, name: str, known: Iterable[str], listed: Iterable[str] | None = None) -> TypeError:
    """The error for an option `call` does not take: the known one it is closest to, or the list."""
    known = sorted(known)
    hint = suggestion(name, known)
    said = f"did you mean {hint!r}?" if hint else f"it takes {', '.join(sorted(listed or known))}"
    return TypeError(f"{call}() has no option {name!r}: {said}")


def wire_names(**aliases: str | tuple[str, Callable]) -> Callable:
    """A decorator: the call also takes each wire name of `aliases` for the Python option it maps to
    (a name, or (name, convert) when the units differ: waitMs=("wait", ms)); an option that is
    neither raises TypeError with a suggestion; one given under both names raises too."""

    def decorate(fn):
        parameters = inspect.signature(fn).parameters.values()
        python = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
        assert all((alias[0] if isinstance(alias, tuple) else alias) in python for alias in aliases.values()), fn
        call = fn.__qualname__

        def python_names(options: dict) -> dict:
            named = {}
            for name, value in options.items():
                if name in python:
                    target = name
                elif name in aliases:
                    target, convert = aliases[name] if isinstance(aliases[name], tuple) else (aliases[name], None)
                    value = convert(value) if convert is not None else value
                else:
                    raise unknown_option(call, name, python | set(aliases))
                if target in named:
                    raise TypeError(f"{call}() got {target!r} twice: under its Python name and its wire name")
                named[target] = value
            return named

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def with_wire_names(*args, **options):
                return await fn(*args, **python_names(options))
        else:
            @functools.wraps(fn)
            def with_wire_names(*args, **options):
                return fn(*args, **python_names(options))
        return with_wire_names

    return decorate


def queue_options(options: dict) -> dict:
    """Queue.configure's options as the wire spells them, from either spelling (retry_limit=3 or
    retryLimit=3; leaseTime and delayedProcessing as the Queen MQ client says them)."""
    ours = {**{name: name for name in QUEUE_OPTIONS}, **{snake(name): name for name in QUEUE_OPTIONS}}
    spellings = {**ours, **QUEEN_MQ_OPTIONS}
    wire = {}
    for name, value in options.items():
        if name not in spellings:
            raise unknown_option("Queue.configure", name, ours, [snake(option) for option in QUEUE_OPTIONS])
        option = spellings[name]
        if option in wire:
            raise TypeError(f"Queue.configure() got {snake(option)!r} twice: under two of its names")
        wire[option] = value
    return wire
