"""The server's log lines: logfmt (the default) or JSON, one line per record, UTC timestamps.

Call sites write `key=value` messages (`"event=snapshot version=%d path=%s"`, a literal value with
spaces in single quotes); this formatter reads the pairs out of the message's template and takes
each %-value from its argument, so a value with spaces, quotes, `=` or newlines comes out whole,
quoted as the format wants, and never breaks a line. An argument that is itself rendered pairs
(`... %s` of "a=1 b=2") is read as pairs too. Text that is not a pair (another library's message)
goes under `msg`, a traceback under `exc`.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import time

FORMATS = ("logfmt", "json")
# key=value, the value a Python string literal ('...' or "...", as %r writes one) or a bare word.
_PAIR = re.compile(r"""([A-Za-z_][A-Za-z0-9_.]*)=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s]*)""")
_BARE = re.compile(r'[^\s="\\]+')
_SPEC = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa%]")
_HOLE = re.compile("\x00(\\d+)\x00")


def fields_of(record: logging.LogRecord) -> tuple[list[tuple[str, str]], str]:
    """A record's pairs, each %-value taken whole from its argument, and its other text."""
    template, args = record.msg, record.args
    if not isinstance(template, str) or not isinstance(args, tuple) or not args:
        return pairs_of(record.getMessage())
    values: list[str] = []

    def hole(match) -> str:
        spec = match.group(0)
        if spec == "%%":
            return "%"
        arg = args[len(values)]
        values.append(arg if spec[-1] == "r" and isinstance(arg, str) else spec % (arg,))
        return f"\x00{len(values) - 1}\x00"

    try:
        template = _SPEC.sub(hole, template)
    except (IndexError, TypeError, ValueError):
        return pairs_of(record.getMessage())
    if len(values) != len(args):
        return pairs_of(record.getMessage())

    def fill(text: str) -> str:
        return _HOLE.sub(lambda match: values[int(match.group(1))], text)

    pairs, rest = pairs_of(template)
    more, rest = pairs_of(fill(rest))
    return [(key, fill(value)) for key, value in pairs] + more, rest


def pairs_of(message: str) -> tuple[list[tuple[str, str]], str]:
    """The key=value pairs of a message, values unquoted, and the text that was not a pair."""
    pairs, rest, at = [], [], 0
    for match in _PAIR.finditer(message):
        rest.append(message[at:match.start()])
        at = match.end()
        key, value = match.groups()
        if value[:1] in ("'", '"') and len(value) >= 2:
            try:
                value = str(ast.literal_eval(value))
            except (ValueError, SyntaxError):
                pass
        pairs.append((key, value))
    rest.append(message[at:])
    return pairs, " ".join(part.strip() for part in rest if part.strip())


def logfmt_value(value: str) -> str:
    if value and _BARE.fullmatch(value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


class LineFormatter(logging.Formatter):
    """A record as one logfmt or JSON line."""

    def __init__(self, kind: str = "logfmt"):
        super().__init__()
        if kind not in FORMATS:
            raise ValueError(f"log format {kind!r} is not one of {', '.join(FORMATS)}")
        self.kind = kind

    def format(self, record: logging.LogRecord) -> str:
        pairs, text = fields_of(record)
        fields = [("ts", _utc(record.created)), ("level", record.levelname.lower()), ("logger", record.name)]
        fields += pairs
        if text:
            fields.append(("msg", text))
        if record.exc_info:
            fields.append(("exc", self.formatException(record.exc_info)))
        if self.kind == "json":
            document: dict = {}
            for key, value in fields:
                document[key if key not in document else f"{key}_"] = value
            return json.dumps(document, ensure_ascii=False)
        return " ".join(f"{key}={logfmt_value(str(value))}" for key, value in fields)


def _utc(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"
