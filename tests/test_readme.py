"""README.md's examples, run as a new user runs them: every fenced block, top to bottom, against one
`queen serve`, so an example that leaves something behind (a lock held, a recurring timer left
running) and breaks a later one fails here, not in a user's first hour.

- ```sh blocks run with `bash -euo pipefail`, their `localhost:6632` / `127.0.0.1:6632` rewritten to
  the test server's port; `curl` is wrapped so that an HTTP answer of 400 or more fails the block
  (curl -s itself exits 0 on those). ```python blocks run as scripts. Both get QUEEN_URL (the SDK
  and the CLI read it) and one working directory for the whole run, as a user's terminal would.
- A block that cannot run against one single-node server (installs, `queen serve` itself, cluster
  and TLS set-ups, answer samples) carries `<!-- not run: <reason> -->` on the line before its
  fence. A block that is neither run nor marked fails the test: no example goes untested silently.
- ANSWERS holds the key parts of the answers the README prints beside its examples; each must
  appear in the block's output, so the printed samples stay true.
- Every run block also runs on its own, on a fresh server: a reader may start anywhere.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

from queen.testing import ServerProcess
from tests import system_tools

README = Path(__file__).resolve().parent.parent / "README.md"
RUN_LANGUAGES = ("sh", "python")
BLOCK_TIMEOUT_S = 120  # generous: the machine may be busy; a block waits on real server behaviour only
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<language>[^`\s]*)\s*$")
_HEADING = re.compile(r"^(?P<level>#{1,6}) (?P<title>.+?)\s*$")
_NOT_RUN = re.compile(r"^\s*<!-- not run: (?P<reason>\S.*?) -->\s*$")
_PORT = re.compile(r"\b(?:localhost|127\.0\.0\.1):6632\b")
_CURL_STATUS = re.compile(r"^readme-curl-status (\d{3})\n", re.M)

# The key parts of the answers the README prints (in comments, or as the sample after a block):
# (the block's section, a line of the block) -> fragments its output must hold (one starting with a
# newline must start a line).
ANSWERS: dict[tuple[str, str], tuple[str, ...]] = {
    ("KV", "# write with a lifetime, then read it"): (
        '{"applied":true,"version":1,"index":0,"op":"put"}', '{"found":true,"value":{"items":3},"version":1,'),
    ("KV", 'curl -s -X PUT localhost:6632/api/v1/kv/files/logo'): ('"value":{"$bytes":"iVBORw0KGgo="}',),
    # The json sample after it: the KV section's writes took versions 1 to 6.
    ("Locks and semaphores", '{"op":"acquire","name":"daily-report","ttlSeconds":30,"owner":"cron-7"}]}\''): (
        '{"results":[{"name":"daily-report","acquired":true,"slot":0,"token":7,"fence":7,"owner":"cron-7",',
        '"guard":{"op":"check","ns":"queen-locks","key":"daily-report#0","expect":7,"required":true},'),
    ("Locks and semaphores > A lease, not a mutex", "/api/v1/transaction"): (
        '{"success":true,"kv":[{"applied":true,"version":7,"index":0,"op":"check"},{"applied":true,',
        '{"results":[{"name":"daily-report","released":true,"index":0,"op":"release"}]}'),
    ("Queues", "# a queue with its options"): (
        '"configured":true', '"status":"queued"', '"success":true,"queue":"orders"',
        '"leaseReleased":true,"dlq":false,"retryCount":1', '"dlq":true', '"total":1', '"error":"bad address"',
        '"items":[{"partition":"customer-42"'),
    ("Timers", "# a payment timeout in 15 minutes"): (
        '"scheduled":true', '"cancelled":false,"reason":"absent"', '"found":true,',
        '"partition":"customer-42"', '"key":"order-42:payment-timeout"', '"key":"order-42:reminder"',
        '"data":"ding"', '"cron":"0 9 * * 1-5","timezone":"Europe/Berlin"', '"everyMs":30000',
        '"key":"heartbeat","cancelled":true', '"key":"daily-sales","cancelled":true'),
    ("Transactions", "# a step that acks a message"): (
        '"success":true,"kv":[{"applied":true,', '"leaseReleased":true', '"status":"queued"',
        '"cancelled":true', '"scheduled":true',
        '{"success":false,"reason":"lease_lost",', '"failed":{"section":"ack","index":0,"reason":"lease_lost",',
        '"current":{"state":"completed"}'),
    ("Transactions", "async def main():"): ("placed -> committed", "paid -> committed"),
    ("Transactions", "for replica in"): ("cron-1 published", "cron-2 skipped: kv_precondition"),
    ("Python SDK", 'client.lock("daily-report", ttl="30s").hold(wait="10s")'): (
        "building the report under fence",),
    ("Python SDK > KV", "client.kv.incr"): ("of 100 this minute", "customer-42 {'items': 4}"),
    ("Python SDK > Locks, loss and fencing", 'client.lock("sync:crm"'): ("\ncommitted\n",),
    ("Python SDK > Queues", 'orders = client.queue("sdk-orders")'): ("order 0 from customer-0 retry 0",),
    ("Python SDK > Running workers", 'mail = client.queue("sdk-mail")'): ("mailing ada@example.com attempt 1",),
    ("Python SDK > Blocking scripts and cron jobs", 'client.lock("nightly-report"'): ("building the report for",),
    ("CLI", "queen kv put app greeting hello --ttl 1h"): ("hello", '"value": {"$bytes": "iVBORw0KGgo="}'),
    ("CLI", "queen lock acquire report --ttl 30s --owner cron-7"): ("somebody else holds it",),
    ("CLI", "queen run-locked nightly-report"): ("fenced by ", "my turn"),
    ("CLI", "queen timer schedule cli-jobs job-8:retry"): ("more than 365 days ahead: refused",),
    ("CLI", "queen queue consume cli-resize"): ("resized",),
}


@dataclass(frozen=True)
class Block:
    number: int  # 1 for the README's first fenced block, in README order
    line: int  # of its opening fence
    heading: str  # "Locks and semaphores > A lease, not a mutex"
    language: str
    text: str  # dedented, as a user copies it
    not_run: str | None  # the reason its `<!-- not run: ... -->` marker gives

    def describe(self) -> str:
        first = "\n".join("    " + line for line in self.text.splitlines()[:3])
        return f"README block {self.number} (line {self.line}, under '{self.heading}', ```{self.language}):\n{first}"

    def holds(self, section: str, line: str) -> bool:
        return self.heading == section and line in self.text


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, with the headings it sits under and its marker."""
    blocks: list[Block] = []
    headings: list[tuple[int, str]] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        heading = _HEADING.match(lines[index])
        fence = _FENCE.match(lines[index])
        if heading:
            level = len(heading["level"])
            headings = [(lvl, title) for lvl, title in headings if lvl < level] + [(level, heading["title"])]
        elif fence:
            start = index
            index += 1
            while index < len(lines) and lines[index].strip() != "```":
                index += 1
            assert index < len(lines), f"README line {start + 1}: a fence that never closes"
            above = next((line for line in reversed(lines[:start]) if line.strip()), "")
            marker = _NOT_RUN.match(above)
            blocks.append(Block(
                number=len(blocks) + 1, line=start + 1,
                heading=" > ".join(title for level, title in headings if level > 1) or "(top)",  # not the title
                language=fence["language"], text=textwrap.dedent("\n".join(lines[start + 1:index])) + "\n",
                not_run=marker["reason"] if marker else None))
        index += 1
    return blocks


BLOCKS = readme_blocks(README.read_text())
RUN = [block for block in BLOCKS if block.not_run is None and block.language in RUN_LANGUAGES]


@dataclass
class Outcome:
    block: Block
    variant: str  # "" for the block as written; "under trio" for its trio twin
    returncode: int
    stdout: str
    stderr: str
    http_statuses: list[int]

    def failure(self, check_answers: bool) -> str | None:
        """What went wrong, or None. check_answers: also hold the output to ANSWERS, whose samples
        are those of a run in README order."""
        why = []
        if self.returncode != 0:
            why.append(f"exit status {self.returncode}")
        if "Traceback (most recent call last)" in self.stderr:
            why.append("a traceback on stderr")
        bad = [status for status in self.http_statuses if status >= 400 or status == 0]
        if bad:
            why.append(f"curl got HTTP {', '.join(map(str, bad))} (000: no answer)")
        missing = [part for part in expected_answers(self.block) if part not in "\n" + self.stdout]
        if missing and check_answers and not self.variant:
            why.append("its output lacks what the README says it answers: " + "; ".join(map(repr, missing)))
        if not why:
            return None
        return (f"{self.block.describe()}\n{(self.variant + ': ') if self.variant else ''}{', '.join(why)}\n"
                f"--- stdout (last 3000 characters) ---\n{self.stdout[-3000:]}\n"
                f"--- stderr (last 3000 characters) ---\n{self.stderr[-3000:]}")


def expected_answers(block: Block) -> tuple[str, ...]:
    return tuple(part for (section, line), parts in ANSWERS.items() if block.holds(section, line) for part in parts)


def trio_twin(block: Block) -> str | None:
    """The script under trio, for an asyncio block that says the same code runs under trio.run(main)."""
    if block.language != "python" or "trio.run(main)" not in block.text or "asyncio.run(main())" not in block.text:
        return None
    return block.text.replace("import asyncio", "import trio", 1).replace("asyncio.run(main())", "trio.run(main)")


class Runner:
    """Runs blocks as a user's terminal would, against one server: one working directory, QUEEN_URL
    set, the README's port rewritten, and curl wrapped to report each answer's status on stderr."""

    def __init__(self, server: ServerProcess, workdir: Path):
        self.port = server.port
        self.workdir = workdir
        shims = workdir.parent / f"{workdir.name}-bin"
        shims.mkdir()
        curl = system_tools.require("curl", "the README's examples")
        (shims / "curl").write_text(
            f"#!/bin/sh\nexec {curl} --write-out '%{{stderr}}readme-curl-status %{{http_code}}\\n' \"$@\"\n")
        (shims / "curl").chmod(0o755)
        bin_dir = os.path.dirname(sys.executable)  # `queen` and `python3` of this environment
        self.env = {name: value for name, value in os.environ.items()
                    if not name.startswith("QUEEN_") or name == "QUEEN_PURE"}
        self.env.update(QUEEN_URL=server.url, PYTHONUNBUFFERED="1",
                        PATH=os.pathsep.join([str(shims), bin_dir, os.environ.get("PATH", "")]))

    def run(self, block: Block) -> list[Outcome]:
        outcomes = [self._run(block, "", block.text)]
        twin = trio_twin(block)
        if twin is not None:
            outcomes.append(self._run(block, "under trio", twin))
        return outcomes

    def _run(self, block: Block, variant: str, text: str) -> Outcome:
        text = _PORT.sub(f"127.0.0.1:{self.port}", text)
        command = ["bash", "-euo", "pipefail", "-c", text] if block.language == "sh" else [sys.executable, "-c", text]
        try:
            done = subprocess.run(command, cwd=self.workdir, env=self.env, capture_output=True, text=True,
                                  timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired as timed_out:
            return Outcome(block, variant, -1, _text(timed_out.stdout),
                           _text(timed_out.stderr) + f"\n(killed after {BLOCK_TIMEOUT_S} s)", [])
        statuses = [int(status) for status in _CURL_STATUS.findall(done.stderr)]
        return Outcome(block, variant, done.returncode, done.stdout, _CURL_STATUS.sub("", done.stderr), statuses)


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def test_every_block_is_run_or_excluded_with_a_reason():
    unclaimed = [block.describe() for block in BLOCKS if block.not_run is None and block.language not in RUN_LANGUAGES]
    assert not unclaimed, (
        f"these blocks are neither run (```{' or ```'.join(RUN_LANGUAGES)}) nor marked "
        "`<!-- not run: <reason> -->` on the line before the fence:\n\n" + "\n\n".join(unclaimed))
    assert len(RUN) >= 20, "most of the README's examples run here"


def test_every_expected_answer_names_a_block_that_runs():
    orphans = [key for key in ANSWERS if not any(block.holds(*key) for block in RUN)]
    assert not orphans, f"ANSWERS names blocks the README no longer has (or no longer runs): {orphans}"


def test_the_quick_start_names_ci_run_which_runs_its_test_command():
    """`.ci/run` is how to run everything: it installs what the suite needs beyond PyPI (each
    tool's package is named in the Quick start), then runs the Quick start's test command."""
    text = README.read_text()
    quick_start = text[text.index("\n## Quick start\n"):text.index("\n## ", text.index("\n## Quick start\n") + 1)]
    [command] = [block.text.strip() for block in BLOCKS if block.heading == "Quick start" and "pytest" in block.text]
    ci_run = (README.parent / ".ci" / "run").read_text()
    assert command in ci_run.splitlines(), ".ci/run no longer runs the Quick start's test command as it is written"
    assert "`.ci/run` runs everything" in quick_start
    missing = [tool.package for tool in system_tools.TOOLS.values() if f"`{tool.package}`" not in quick_start]
    assert not missing, f"the Quick start does not name what .ci/run installs: {missing}"


def test_every_block_runs_in_readme_order_against_one_server(tmp_path):
    """A reader follows the README top to bottom against one broker: no example may leave behind
    what breaks a later one, and the whole tour leaves no lock held and no recurring timer running."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    with ServerProcess(str(tmp_path / "data")) as server:
        runner = Runner(server, workdir)
        failures = [failure for block in RUN for outcome in runner.run(block)
                    if (failure := outcome.failure(check_answers=True))]
        left = leftovers(server)
    if left:
        failures.append("after every block ran, the broker still holds what the examples should have ended:\n"
                        + "\n".join(left))
    if failures:
        logged = [line for line in server.log_text().splitlines() if "level=error" in line or "level=warning" in line]
        failures.append("the server's warnings and errors (last 30):\n" + "\n".join(logged[-30:]))
    assert not failures, (f"{len(failures)} failures when the README's blocks ran in README order against one "
                          "server (the first may have caused the rest):\n\n" + "\n\n".join(failures))


def leftovers(server: ServerProcess) -> list[str]:
    """Locks still held and recurring timers still pending: what one example leaves running breaks
    the next one that uses the name (a lock held for its lease, a series firing into a queue)."""
    status, locks = server.request("GET", "/api/v1/locks?limit=1000")
    assert status == 200, locks
    left = [f"lock {item['name']!r} held by {item['owner']!r}" for item in locks["items"]]
    status, queues = server.request("GET", "/api/v1/resources/queues?limit=1000")
    assert status == 200, queues
    for name in (item["queue"] for item in queues["items"]):
        status, timers = server.request("GET", f"/api/v1/timers?queue={quote(name)}&limit=1000")
        assert status == 200, timers
        left += [f"recurring timer {timer['key']!r} of queue {name!r}" for timer in timers["items"]
                 if timer.get("cron") or timer.get("everyMs")]
    return left


@pytest.mark.parametrize("block", RUN, ids=[f"block{block.number}-{re.sub(r'[^A-Za-z]+', '-', block.heading)}"
                                            for block in RUN])
def test_each_block_runs_on_its_own(tmp_path, block):
    """A reader may start at any section, on a fresh broker."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    with ServerProcess(str(tmp_path / "data")) as server:
        outcomes = Runner(server, workdir).run(block)
    failures = [failure for outcome in outcomes if (failure := outcome.failure(check_answers=False))]
    assert not failures, "\n\n".join(failures)


def test_the_certificate_recipe_makes_what_queen_serve_loads(tmp_path):
    """The openssl recipe of "Tokens, tenants and TLS", which needs no server and so is not run in
    order: its CA verifies its certificate, which names the server, and `queen serve` loads it."""
    [block] = [block for block in BLOCKS if block.not_run and "test_the_certificate_recipe" in block.not_run]
    openssl = system_tools.require("openssl", "the README's certificate recipe")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, f"{block.describe()}\n{done.stdout}\n{done.stderr}"
    verified = subprocess.run([openssl, "verify", "-CAfile", "ca.pem", "cert.pem"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
    assert verified.stdout.strip() == "cert.pem: OK", verified.stdout + verified.stderr
    names = subprocess.run([openssl, "x509", "-in", "cert.pem", "-noout", "-ext", "subjectAltName"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert "DNS:queen.internal" in names.stdout and "IP Address:10.0.0.5" in names.stdout, names.stdout
    with ServerProcess(str(tmp_path / "data"), "--tls-cert", str(tmp_path / "cert.pem"),
                       "--tls-key", str(tmp_path / "key.pem")) as server:
        assert "tls=on" in server.log_text()
