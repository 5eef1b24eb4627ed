"""Fixtures shared by the tests, and two checks over the whole run: no API token's secret in any
log line (of in-process servers and clients, as they are logged) or log file (of the server
processes the tests start, under pytest's temporary directory); and every line every server
process wrote parses as logfmt (or JSON, under --log-format json)."""

import logging
import re
import signal
import sys
from collections import Counter
from functools import partial
from pathlib import Path

import pytest

from queen.testing import SERVER_LOG_FILES, open_server, parse_log_line

# Every secret `queen auth add` makes has this shape, so a leak is found without knowing it.
SECRET = re.compile(r"queen_[a-z2-7]{12}_[A-Za-z0-9_-]{43}")
_SCANNED_SUFFIXES = {".log", ".txt", ".md", ".out", ".err"}


class _SecretWatch(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot be formatted carries no secret
            return
        if SECRET.search(text):
            self.found.append(f"log record of {record.name}: {text[:200]}")


_watch = _SecretWatch()

# A shell starts a background job with SIGINT ignored, and what is ignored is inherited: by pytest,
# its workers and every process a test starts. The Ctrl-C tests would then send a signal nobody
# hears. Ctrl-C means what it means in a foreground terminal, however the suite was started.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
    # Records at the levels the loggers let through (warnings and errors, where a request's
    # content could end up), and the audit lines, which name tokens, at info. Server processes'
    # logs, info included, are files: scanned at the end.
    logging.getLogger().addHandler(_watch)
    logging.getLogger("queen.audit").setLevel(logging.INFO)


# What each pytest-xdist worker's whole-run checks found (a worker's own exit status does not
# reach the controller, so it hands its findings over and the controller fails the run).
_from_workers: list[dict] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {})
    if "whole_run" in output:
        _from_workers.append({**output["whole_run"], "fault_outcomes": output.get("fault_outcomes", [])})


def pytest_sessionfinish(session, exitstatus):
    found = list(_watch.found)
    factory = getattr(session.config, "_tmp_path_factory", None)
    base = factory.getbasetemp() if factory is not None else None
    if base is not None and Path(base).exists():
        for path in Path(base).rglob("*"):
            if path.suffix in _SCANNED_SUFFIXES and path.is_file() and path.stat().st_size < 64 << 20:
                if SECRET.search(path.read_text(errors="replace")):
                    found.append(f"file {path}")
    unparsed = _unparsed_log_lines()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports for it
        workeroutput["whole_run"] = {"found": found, "unparsed": unparsed}
        if "tests.faults.workloads" in sys.modules:  # it ran fault-suite tests
            from tests.faults import summary
            from tests.faults.workloads import OUTCOMES

            workeroutput["fault_outcomes"] = summary.as_plain(OUTCOMES)
        return
    for findings in _from_workers:
        found += findings["found"]
        unparsed += findings["unparsed"]
    if unparsed:
        print(f"\nLOG LINES THAT ARE NEITHER LOGFMT NOR JSON: {len(unparsed)}, first: {unparsed[0]}")
        session.exitstatus = 1
    if found:
        print(f"\nSECRET LEAKED: an API token's secret appears in {len(found)} place(s), first: {found[0]}")
        session.exitstatus = 1


def _unparsed_log_lines() -> list[str]:
    """Every line of every server process's log, each read by a strict parser."""
    bad = []
    for path in sorted(SERVER_LOG_FILES):
        if not Path(path).is_file():  # the test's temporary directory may be gone already
            continue
        for number, line in enumerate(Path(path).read_text(errors="replace").splitlines(), 1):
            if not line:
                continue
            try:
                parse_log_line(line)
            except (AssertionError, ValueError) as e:
                bad.append(f"{path}:{number}: {e}")
    return bad


@pytest.fixture
def serve():
    """`async with serve(tmp_path / "data", segment_bytes_max=...) as server:` runs a real Server
    (recovery, writer, actors, HTTP on server.port) inside the test's trio run.

    Unlike open_server's default, disk work runs on the production disk thread, so the durability
    tests exercise the writer's real concurrency (commits overlapping snapshots and request
    handling). That thread looks idle to autojump_clock, so pair this with the frozen mock_clock
    fixture instead: no tick or timeout then depends on the machine's speed."""
    return partial(open_server, disk_inline=False)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """pytest-xdist (`-n 2 --dist loadfile`, the README's test command) hands tests to its workers
    by node id, and schemathesis gives all the cases of one test the same id (the operation is in
    the name only): they would run once, not 48 times. Each such test takes its name as its id; a
    duplicate left fails the run here instead of quietly running fewer tests."""
    shared = Counter(item.nodeid for item in items)
    for item in items:
        if shared[item.nodeid] > 1:
            _id_from_name(item)
    left = [nodeid for nodeid, count in Counter(item.nodeid for item in items).items() if count > 1]
    if left:
        raise pytest.UsageError(f"{len(left)} test ids name several tests each (first: {left[0]}): "
                                "under pytest-xdist only one of each would run")


def _id_from_name(item) -> None:
    if hasattr(item, "_id"):  # pytest 9.2 and later keep a structured id
        item._id = item.parent.id.child(item.name)
    else:
        item._nodeid = f"{item.parent.nodeid}::{item.name}"


def pytest_terminal_summary(terminalreporter):
    # A test that skips because the machine lacks a tool (tests/system_tools.py) says so here, once
    # per reason, whichever process ran it (its own output is captured, and an xdist worker's is not
    # shown at all).
    loud = []
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        if "SKIPPED LOUDLY" in reason and reason not in loud:
            loud.append(reason)
    for reason in loud:
        terminalreporter.write_line(reason, red=True, bold=True)
    outcomes = [pair for findings in _from_workers for pair in findings.get("fault_outcomes", [])]
    if outcomes or "tests.faults.workloads" in sys.modules:
        from tests.faults import summary
        from tests.faults.workloads import OUTCOMES

        summary.write(terminalreporter, OUTCOMES + summary.from_plain(outcomes))
