"""The programs the test suite needs beyond Python and PyPI, and how to get them. A test that
needs one asks here; without it, the test skips with one loud line naming what did not run, the
Debian package, the command that installs it, and that `.ci/run` installs it (tests/conftest.py
repeats each such line once at the end of the run).

QUEEN_TEST_HIDE_TOOLS=openssl,etcd (or `all`) makes tools look missing, so that the skips
themselves are tested (tests/test_system_tools.py)."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass

import pytest

HIDE_VARIABLE = "QUEEN_TEST_HIDE_TOOLS"


@dataclass(frozen=True)
class Tool:
    command: str
    package: str  # Debian's
    path: str | None = None  # where Debian's package puts it, looked at before PATH
    variable: str | None = None  # names another binary to use instead


TOOLS = {tool.command: tool for tool in (
    Tool("openssl", "openssl"),  # throwaway certificates for the TLS tests
    Tool("promtool", "prometheus"),  # checks /metrics and ops/queen-alerts.yml
    Tool("etcd", "etcd-server", path="/usr/bin/etcd", variable="QUEEN_TEST_ETCD"),  # the cluster suite
    Tool("chromium", "chromium", path="/usr/bin/chromium"),  # the dashboard's browser test
    Tool("curl", "curl"),  # the README's examples (tests/test_readme.py)
)}


def find(command: str) -> str | None:
    """Where the tool is, or None when it is not installed (or hidden by QUEEN_TEST_HIDE_TOOLS)."""
    tool = TOOLS[command]
    hidden = {name.strip() for name in os.environ.get(HIDE_VARIABLE, "").split(",")}
    if command in hidden or "all" in hidden:
        return None
    named = os.environ.get(tool.variable) if tool.variable else None
    if named:
        return named if os.access(named, os.X_OK) else None
    if tool.path and os.access(tool.path, os.X_OK):
        return tool.path
    return shutil.which(command)


def missing_message(command: str, what: str) -> str:
    """The loud skip line for `what` (the tests that did not run) when `command` is missing."""
    tool = TOOLS[command]
    return (f"SKIPPED LOUDLY: {what} did not run: {command} is not installed (Debian package {tool.package}: "
            f"apt-get install {tool.package}; .ci/run installs it)")


def require(command: str, what: str) -> str:
    """The tool's path; without it, skip the calling test loudly (on stderr too, which pytest -s
    and a failing run's capture show)."""
    path = find(command)
    if path is None:
        message = missing_message(command, what)
        print(message, file=sys.stderr)
        pytest.skip(message)
    return path
