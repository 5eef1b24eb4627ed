"""The dashboard's browser: a fresh headless Chromium page (Debian's /usr/bin/chromium, driven by
Playwright) for each test, or a loud skip saying how to get what is missing.

Playwright's sync API runs its own event loop, so the tests that use it are plain test functions
(trio_mode only affects async tests). Every wait is one of Playwright's auto-waiting expectations,
which poll the page until a deadline: no fixed sleeps.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

from tests import system_tools

# Without the networking flags Chromium tries to reach Google's services and, on a closed network,
# its own connections are refused.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 20_000  # generous: the machine may be busy


def _skip_loudly(why: str) -> None:
    message = f"SKIPPED LOUDLY: the dashboard browser test needs {why}"
    print(message, file=sys.stderr)
    pytest.skip(message)


@pytest.fixture
def browser_page(tmp_path):
    """A fresh Chromium page (an empty profile), closed after the test; expectations wait up to
    WAIT_MS."""
    chromium = system_tools.require("chromium", "the dashboard browser tests")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _skip_loudly("the playwright package (pip install -e '.[test]')")
    expect.set_options(timeout=WAIT_MS)
    # The profile lives outside pytest's temporary directory: Chromium writes session storage,
    # the signed-in token included, to *.log files there, which the secret scan would flag.
    profile = tempfile.mkdtemp(prefix="queen-chromium-")
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile, executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 1400, "height": 900})
            try:
                page = context.pages[0] if context.pages else context.new_page()
                page.set_default_timeout(WAIT_MS)
                yield page
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def shots(tmp_path) -> str:
    """Where screenshots go: $QUEEN_SCREENSHOTS, or the test's tmp_path."""
    directory = os.environ.get("QUEEN_SCREENSHOTS") or str(tmp_path / "screenshots")
    os.makedirs(directory, exist_ok=True)
    return directory
