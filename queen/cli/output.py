"""What every client command shares: the exit statuses, the options every one takes, reading a
value, printing for people and for scripts (a byte string in the wire's {"$bytes": ...} form, so
no answer is unprintable), and running a handler with the SDK's errors turned into exit statuses.

Exit status, the same for every command (sysexits.h where one fits):
  0   it did what was asked (found, applied, acquired, renewed, released; run-locked: CMD's status)
  1   the server answered no (not found, not applied, lost, absent; nothing to pop, not acked)
  2   usage error
  65  the server rejected the request (400: a limit, a malformed value)
  69  the server could not be reached, or answered 503
  75  the lock is held by somebody else (lock acquire, run-locked): try later

The SDK is imported when a client command runs, never when the parser is built, so `queen serve`
does not load it.
"""

from __future__ import annotations

import argparse
import base64
import codecs
import json
import logging
import math
import os
import sys
from datetime import UTC, datetime

EXIT_OK = 0
EXIT_NO = 1
EXIT_USAGE = 2
EXIT_REJECTED = 65
EXIT_UNAVAILABLE = 69
EXIT_HELD = 75


def parents() -> dict[str, argparse.ArgumentParser]:
    """Option groups that client commands share: `client` (every one), `lifetime` (KV writes)."""
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--url", default=None, metavar="URL",
                        help="the broker, or a cluster's nodes separated by commas (calls follow the "
                             "leader) [env QUEEN_URL] (default: http://127.0.0.1:6632)")
    # Not --token: in `queen lock renew|release` that is the lock's fencing token.
    client.add_argument("--auth-token", default=None, metavar="SECRET", dest="auth_token",
                        help="the API token, sent as Authorization: Bearer (prefer the variable: a flag shows "
                             "in `ps`) [env QUEEN_TOKEN]")
    client.add_argument("--ca-file", default=None, metavar="FILE",
                        help="the CA that signed an https server's certificate [env QUEEN_CA_FILE] "
                             "(default: the system's)")
    client.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="per request (default: 10)")
    client.add_argument("--json", action="store_true", help="print the answer as JSON instead of for people")
    lifetime = argparse.ArgumentParser(add_help=False)
    choice = lifetime.add_mutually_exclusive_group(required=True)
    choice.add_argument("--ttl", metavar="DURATION", help="lifetime of the write: 30s, 5m, 2h, 7d or seconds")
    choice.add_argument("--forever", action="store_true", help="the write never expires")
    return {"client": client, "lifetime": lifetime}


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: whoever read our output (| head) stopped reading


def run(args: argparse.Namespace) -> int:
    """Run the command's handler on Trio; the SDK's errors become exit statuses. Ctrl-C ends it with
    one line, and a reader that stopped reading (| head) ends it quietly: neither is a traceback."""
    try:
        import anyio

        from queen_client.errors import BadRequestError, CannotConnect, ClientError
    except ModuleNotFoundError as missing:  # `queen` installed without its dependencies
        print(f"queen: the Python client is not installed (no module {(missing.name or '').partition('.')[0]!r}); "
              "install it, from a checkout of Queen: pip install ./client", file=sys.stderr)
        return EXIT_USAGE
    sdk_warnings = _sdk_warnings_to_stderr()
    _stdout_never_refuses()
    try:
        return anyio.run(args.handler, args, backend="trio")
    except BaseException as raised:  # noqa: BLE001 - each known kind becomes its status; the rest goes on up
        # Trio wraps what a task of a nursery raised in an exception group (a Ctrl-C that lands
        # while a connection is being opened, an SDK error from a task); one error is one error.
        error = sole(raised)
        if isinstance(error, KeyboardInterrupt):
            print("queen: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        if isinstance(error, BrokenPipeError):
            _quiet_stdout()
            return EXIT_BROKEN_PIPE
        if isinstance(error, (ValueError, TypeError)):
            print(f"queen: {error}", file=sys.stderr)
            return EXIT_USAGE
        if isinstance(error, BadRequestError):
            print(f"queen: rejected: {error.code}: {error.message}", file=sys.stderr)
            return EXIT_REJECTED
        if isinstance(error, CannotConnect):
            print(f"queen: cannot connect to {error.url}: {error.cause}; "
                  f"{connect_hint(error.certificate, error.cause)}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        if isinstance(error, ClientError):  # unreachable, 503, or an answer we could not use
            print(f"queen: {error}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        raise
    finally:
        logging.getLogger("queen_client").removeHandler(sdk_warnings)


def sole(error: BaseException) -> BaseException:
    """The one exception inside nested exception groups that hold one each; else error itself. A
    group of several is not unwrapped: it goes on up whole, traceback and all."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def _sdk_warnings_to_stderr() -> logging.Handler:
    """The SDK logs through the `queen_client` logger with only a NullHandler, as a library does;
    a command shows its warnings (a broker waited for, a lock or lease lost) on stderr, one line
    each. Not the transport's retries: a command's call ends in its answer or its one error line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.addFilter(lambda record: record.name != "queen_client._http")
    logging.getLogger("queen_client").addHandler(handler)
    return handler


def _stdout_never_refuses() -> None:
    """A character stdout's encoding cannot write (a non-UTF-8 locale, PYTHONIOENCODING=ascii) is
    written as an escape rather than raised: the answer may be a popped message, auto-acked, that
    an error here would lose. (print_json writes such text as JSON's own escapes.)"""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="backslashreplace")


def _stdout_is_utf8() -> bool:
    try:
        return codecs.lookup(sys.stdout.encoding or "ascii").name == "utf-8"
    except LookupError:
        return False


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush at exit cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def wait_s(text: str | None, longest_s: float | None, flag: str = "--wait") -> float | None:
    """A --wait value in seconds: a duration, or "forever" (inf). Above `longest_s` it is a usage
    error rather than cut short in silence (None: no bound)."""
    from queen_client.durations import seconds

    if text is None:
        return None
    if text == "forever":
        return math.inf
    value = seconds(text, flag)
    if longest_s is not None and value > longest_s:
        raise ValueError(f"{flag} {text}: one call waits at most {longest_s:g}s; give 'forever' to wait "
                         "until it happens")
    return value


def connect_hint(certificate: bool, cause: str) -> str:
    """What to do when no connection could be made, in the command's words (its flags, not the
    SDK's names): start a server there, name it as its certificate does, or trust its CA."""
    if not certificate:
        return "is a Queen server running there? `queen serve` starts one (or give its address: --url or QUEEN_URL)"
    if "hostname mismatch" in cause.lower() or "ip address mismatch" in cause.lower():
        return ("the server's certificate is not for this host name or address: use a name the certificate lists "
                "in --url")
    return ("the server's certificate is not signed by a CA this command trusts: give the CA's certificate file "
            "with --ca-file FILE or QUEEN_CA_FILE")


def os_error_hint(error: BaseException) -> str:
    """connect_hint for a failed http.client connection (the backup and cluster commands); '' when
    the failure is neither a refusal nor a certificate."""
    import ssl

    if isinstance(error, ssl.SSLCertVerificationError):
        return "; " + connect_hint(True, str(error))
    if isinstance(error, ConnectionRefusedError):
        return "; " + connect_hint(False, str(error))
    return ""


def open_client(args):
    """The SDK's client for this command's --url and --timeout (use it with `async with`). A
    cluster's nodes (several URLs): a call rides a failover, as the SDK's does; one node: a command
    says at once that nothing answers, rather than wait for a server that may never come."""
    from queen_client import Client
    from queen_client.client import default_url

    url = args.url or default_url()
    one_node = {"failover_timeout": None} if "," not in url.strip(", ") else {}
    return Client(url, token=args.auth_token, ca_file=args.ca_file, timeout_s=args.timeout, **one_node)


def wire_json(value, *, ascii_only: bool = False) -> str:
    """value as the HTTP API writes it in JSON: a byte string as {"$bytes": "<standard base64>"},
    the form the server answers with and the SDK decodes to bytes. Never raises for what an answer
    held: what the SDK decoded, this encodes."""
    from queen_client.values import BYTES_KEY

    def bytes_form(item):
        if isinstance(item, (bytes, bytearray, memoryview)):
            return {BYTES_KEY: base64.b64encode(item).decode("ascii")}
        raise TypeError(f"a {type(item).__name__} has no JSON form")

    return json.dumps(value, ensure_ascii=ascii_only, default=bytes_form)


def print_json(document) -> None:
    """One JSON document on one line of stdout (--json), bytes in the wire's form; escaped to ASCII
    when stdout cannot write UTF-8, so it stays JSON."""
    print(wire_json(document, ascii_only=not _stdout_is_utf8()), flush=True)


def say_no(text: str) -> None:
    """Why the command answers no (exit 1 or 75), on stderr."""
    print(f"queen: {text}", file=sys.stderr)


def iso(ms: int | None) -> str:
    if ms is None:
        return "never"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def show_value(value) -> str:
    """A value on a line for people: a string as its text, anything else (bytes included, as
    {"$bytes": ...}) as the wire's JSON."""
    return value if isinstance(value, str) else wire_json(value)


def print_value(value, what: str) -> None:
    """A value alone on stdout (`queen kv get`): a string as its text, anything else as the wire's
    JSON, each with a newline. A byte string goes out as the bytes it is, nothing added, when stdout
    is a file or a pipe (`> logo.png`, `| file -`); to a terminal, where raw bytes would be noise or
    terminal escapes, it is shown as {"$bytes": ...} and stderr says how to get the bytes."""
    if isinstance(value, bytes) and not sys.stdout.isatty():
        sys.stdout.flush()
        sys.stdout.buffer.write(value)
        sys.stdout.buffer.flush()
        return
    print(show_value(value), flush=True)
    if isinstance(value, bytes):
        print(f"queen: {what} holds {len(value)} bytes, shown as base64; redirect stdout (> FILE) for the bytes "
              "themselves", file=sys.stderr)


# How a VALUE that is meant as JSON begins: an object, an array or a string. Text that begins
# otherwise and is not JSON is a string as typed (hello, 1.2.3, 2026-12-01).
JSON_OPENERS = ("{", "[", '"')
VALUE_HELP = ("JSON, or any other text as a string (text that begins with {, [ or \" must be JSON, "
              "or give --string); - reads stdin (UTF-8 text, one trailing newline dropped)")
STRING_HELP = "take VALUE as a string as it is, even if it is JSON or begins like JSON"
BYTES_HELP = ("take VALUE as a byte string: stdin's bytes as they are (-), nothing decoded or dropped, or "
              "VALUE's own bytes")


def add_value_options(parser: argparse.ArgumentParser) -> None:
    """--string and --bytes, the two ways to say how VALUE is taken (read_value), one at a time."""
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--string", action="store_true", help=STRING_HELP)
    how.add_argument("--bytes", action="store_true", help=BYTES_HELP)


def read_value(args):
    """The command's VALUE: JSON, or any other text as a string (as a shell user means it); `-`
    reads stdin, UTF-8 text whose one trailing newline (echo's, a file's last) is dropped, as
    $(...) drops it; --string takes it as a string whatever it is; --bytes takes stdin's bytes (or
    VALUE's) as a byte string, untouched. Text that begins like JSON (an object, an array, a
    string) but does not parse is refused, a ValueError: `{"a":` is a typo or a value cut short,
    which stored as a string would only surface when something reads it. So is text that is not
    UTF-8: it has no JSON form, and --bytes is the way to store it."""
    if args.bytes:
        return sys.stdin.buffer.read() if args.value == "-" else os.fsencode(args.value)
    if args.value == "-":
        raw = _utf8_text(sys.stdin.buffer.read(), "stdin")
        if raw.endswith("\n"):
            raw = raw[:-1]
    else:
        raw = args.value
        if not raw.isascii():
            # Bytes of the argument that the locale could not decode arrive as lone surrogates.
            _utf8_text(raw.encode("utf-8", "surrogateescape"), "VALUE")
    if args.string:
        return raw
    try:
        return json.loads(raw)
    except ValueError as error:
        if raw.lstrip().startswith(JSON_OPENERS):
            shown = raw if len(raw) <= 40 else raw[:40] + "..."
            raise ValueError(f"VALUE {shown!r} begins like JSON but is not JSON ({error}); correct it, "
                             "or give --string to take it as a string") from None
        return raw


def _utf8_text(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{where} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}), so it "
                         "has no JSON form; give --bytes to store it as a byte string, as it is") from None
