"""What the `queen` command reads as a VALUE and how it prints the values it gets back, against a
real server: byte strings (the wire's {"$bytes": base64}) on every output path, --json or not, and
raw to a file or a pipe for `kv get`; stdin as UTF-8 text with one trailing newline dropped, or as
bytes with --bytes; and nothing an auto-acked pop delivered is lost to an output that fails."""

import base64
import json
import os
import pty
import subprocess
import sys

import pytest

import queen_client
from queen.testing import ServerProcess

QUEEN = [sys.executable, "-m", "queen"]
LOGO = b"\x89PNG\r\n\x1a\n"  # the PNG signature: not UTF-8, with a CR, an LF and a ^Z in it
LOGO_WIRE = {"$bytes": base64.b64encode(LOGO).decode()}  # {"$bytes": "iVBORw0KGgo="}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerProcess(str(tmp_path_factory.mktemp("queen") / "data")) as process:
        yield process


@pytest.fixture(scope="module")
def sdk(server):
    with queen_client.SyncClient(server.url) as client:
        yield client


def queen(server, *args, stdin: bytes | None = None, env=None, **run):
    """The command's run, stdout and stderr as bytes (a value may be bytes)."""
    return subprocess.run([*QUEEN, *args], env=dict(os.environ, QUEEN_URL=server.url, **(env or {})),
                          capture_output="stdout" not in run, input=stdin, timeout=60, **run)


def json_lines(out: bytes) -> list:
    return [json.loads(line) for line in out.decode().splitlines()]


def test_bytes_print_in_the_wires_json_form_on_every_path(server, sdk):
    sdk.kv.put("cli-bin", "logo", LOGO, forever=True)
    sdk.kv.put("cli-bin", "name", "logo.png", forever=True)
    got = queen(server, "kv", "get", "cli-bin", "logo", "--json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["value"] == LOGO_WIRE
    listed = queen(server, "kv", "list", "cli-bin", "--json")
    assert listed.returncode == 0 and [row["value"] for row in json_lines(listed.stdout)] == [LOGO_WIRE, "logo.png"]
    people = queen(server, "kv", "list", "cli-bin")
    assert people.returncode == 0 and people.stdout.decode().splitlines()[0].endswith(f"\t{json.dumps(LOGO_WIRE)}")

    scheduled = queen(server, "timer", "schedule", "cli-bin-timers", "t", "-", "--bytes", "--in", "1h", stdin=LOGO)
    assert scheduled.returncode == 0, scheduled.stderr
    timer = queen(server, "timer", "get", "cli-bin-timers", "t")
    assert timer.returncode == 0 and timer.stdout.decode().splitlines()[1] == json.dumps(LOGO_WIRE)
    assert json.loads(queen(server, "timer", "get", "cli-bin-timers", "t", "--json").stdout)["payload"] == LOGO_WIRE

    dead = sdk.queue("cli-bin-dlq")
    dead.configure(retryLimit=0)
    dead.push(LOGO)
    [message] = dead.pop().messages
    message.fail("unreadable")
    [entry] = json_lines(queen(server, "queue", "dlq", "cli-bin-dlq", "--json").stdout)
    assert entry["data"] == LOGO_WIRE and entry["error"] == "unreadable"
    shown = queen(server, "queue", "dlq", "cli-bin-dlq")
    assert shown.returncode == 0 and shown.stdout.decode().rstrip("\n").endswith(f"\tunreadable\t{json.dumps(LOGO_WIRE)}")


def test_an_auto_acked_pop_of_bytes_shows_every_message(server, sdk):
    sdk.queue("cli-binq").push(LOGO)
    popped = queen(server, "queue", "pop", "cli-binq", "--json", "--auto-ack")
    assert popped.returncode == 0, popped.stderr
    assert [m["data"] for m in json.loads(popped.stdout)["messages"]] == [LOGO_WIRE]
    sdk.queue("cli-binq2").push_many([LOGO, "text", {"logo": LOGO}])
    popped = queen(server, "queue", "pop", "cli-binq2", "--batch", "5", "--auto-ack")
    assert popped.returncode == 0, popped.stderr
    assert [line.split("\t")[2] for line in popped.stdout.decode().splitlines()] == [
        json.dumps(LOGO_WIRE), "text", json.dumps({"logo": LOGO_WIRE})]


def test_an_auto_acked_pop_is_shown_even_where_stdout_cannot_write_its_text(server, sdk):
    """Under an ASCII-only stdout the text is escaped, never an error after the messages were acked."""
    sdk.queue("cli-ascii").push_many(["café", "日本"])
    scripted = queen(server, "queue", "pop", "cli-ascii", "--json", "--auto-ack", env={"PYTHONIOENCODING": "ascii"})
    assert scripted.returncode == 0, scripted.stderr
    assert scripted.stdout.isascii() and [m["data"] for m in json.loads(scripted.stdout)["messages"]] == ["café"]
    person = queen(server, "queue", "pop", "cli-ascii", "--auto-ack", env={"PYTHONIOENCODING": "ascii"})
    assert person.returncode == 0, person.stderr
    assert person.stdout.decode().split("\t")[2] == "\\u65e5\\u672c\n"


def test_kv_get_writes_a_byte_value_as_it_is_to_a_file_and_as_base64_to_a_terminal(server, sdk, tmp_path):
    sdk.kv.put("cli-files", "logo", LOGO, forever=True)
    saved = tmp_path / "logo.png"
    with open(saved, "wb") as out:
        assert queen(server, "kv", "get", "cli-files", "logo", stdout=out, stderr=subprocess.PIPE).returncode == 0
    assert saved.read_bytes() == LOGO  # nothing added: no newline, no encoding
    assert queen(server, "kv", "get", "cli-files", "logo").stdout == LOGO  # a pipe, as `| file -` reads it

    controller, terminal = pty.openpty()
    try:
        shown = queen(server, "kv", "get", "cli-files", "logo", stdout=terminal, stderr=subprocess.PIPE)
        screen = os.read(controller, 4096).decode()
    finally:
        os.close(controller)
        os.close(terminal)
    assert shown.returncode == 0 and screen.strip() == json.dumps(LOGO_WIRE)
    assert b"cli-files/logo holds 8 bytes" in shown.stderr and b"redirect stdout" in shown.stderr


def test_bytes_takes_stdins_bytes_as_they_are(server, sdk, tmp_path):
    data = LOGO + b"\xff\x00\n"
    put = queen(server, "kv", "put", "cli-files", "raw", "-", "--bytes", "--forever", stdin=data)
    assert put.returncode == 0, put.stderr
    assert sdk.kv.get("cli-files", "raw").value == data  # the trailing newline kept: bytes are not text
    assert queen(server, "kv", "get", "cli-files", "raw").stdout == data
    assert queen(server, "queue", "push", "cli-bytes-q", "-", "--bytes", stdin=data).returncode == 0
    assert queen(server, "queue", "push", "cli-bytes-q", "abc", "--bytes").returncode == 0
    assert [m.data for m in sdk.queue("cli-bytes-q").pop(batch=2, auto_ack=True).messages] == [data, b"abc"]
    both = queen(server, "kv", "put", "cli-files", "x", "-", "--bytes", "--string", "--forever", stdin=b"x")
    assert both.returncode == 2 and b"not allowed with argument" in both.stderr


def test_stdin_that_is_not_utf8_is_refused_saying_so_and_how_to_store_it(server, sdk):
    latin1 = queen(server, "kv", "put", "cli-text", "latin1", "-", "--ttl", "1m", stdin=b"caf\xe9")
    assert latin1.returncode == 2
    assert latin1.stderr.decode().strip() == ("queen: stdin is not UTF-8 text (byte 0xe9 at offset 3), so it has no "
                                              "JSON form; give --bytes to store it as a byte string, as it is")
    argument = queen(server, "kv", "put", "cli-text", "latin1", b"caf\xe9", "--ttl", "1m")
    assert argument.returncode == 2 and b"VALUE is not UTF-8 text (byte 0xe9 at offset 3)" in argument.stderr
    assert not sdk.kv.get("cli-text", "latin1").found  # nothing was sent


def test_stdin_text_loses_one_trailing_newline_as_shell_substitution_does(server, sdk):
    assert queen(server, "queue", "push", "cli-text-q", "-", stdin=b"hi\n").returncode == 0
    assert queen(server, "queue", "push", "cli-text-q", "-", "--string", stdin=b"two lines\n\n").returncode == 0
    assert queen(server, "queue", "push", "cli-text-q", "-", stdin=b'"kept\\n"\n').returncode == 0  # JSON says it
    delivered = sdk.queue("cli-text-q").pop(batch=3, auto_ack=True).messages
    assert [m.data for m in delivered] == ["hi", "two lines\n", "kept\n"]
    assert queen(server, "kv", "put", "cli-text", "n", "-", "--ttl", "1m", stdin=b"42\n").returncode == 0
    assert sdk.kv.get("cli-text", "n").value == 42


def test_a_json_array_pushed_from_the_command_line_is_one_message(server, sdk):
    assert queen(server, "queue", "push", "cli-array", "[1, 2]").returncode == 0
    assert [m.data for m in sdk.queue("cli-array").pop(batch=5, auto_ack=True).messages] == [[1, 2]]
