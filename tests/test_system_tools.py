"""A test that skips because the machine lacks openssl, promtool, etcd, Chromium or curl says how
to get it: the Debian package, `apt-get install <package>`, and that `.ci/run` installs it.
Checked by running the tests that need them with the tools hidden (QUEEN_TEST_HIDE_TOOLS), so a
new check that bypasses tests/system_tools.py, or a message that names no package, fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import system_tools

ROOT = Path(__file__).resolve().parent.parent
# One test (or file) per place that checks for a tool: each must skip, loudly, when it is missing.
NEEDING_TOOLS = (
    "tests/http/test_tls.py",
    "tests/test_backup.py::test_a_backup_over_https_arrives_whole",
    "tests/http/test_metrics_exposition.py::test_promtool_accepts_the_whole_exposition",
    "tests/http/test_metrics_exposition.py::test_promtool_accepts_the_alert_rules",
    "tests/cluster/test_etcd_client.py",
    "tests/test_bench_cluster.py::test_cluster_bench_runs_against_the_leader_beside_single_queen",
    "tests/dashboard/test_dashboard_browser.py",
    "tests/dashboard/test_dashboard_live.py",
    "tests/test_readme.py::test_every_block_runs_in_readme_order_against_one_server",
)
_SKIPPED = re.compile(r"^SKIPPED \[\d+\] (?P<where>\S+): (?P<reason>.+)$", re.M)


@pytest.mark.parametrize("command", sorted(system_tools.TOOLS))
def test_a_missing_tool_is_named_with_its_package_and_the_command_that_installs_it(command):
    package = system_tools.TOOLS[command].package
    message = system_tools.missing_message(command, "the frobnicator test")
    assert message.startswith("SKIPPED LOUDLY: the frobnicator test did not run: ")  # the run's summary repeats it
    assert f"Debian package {package}" in message and f"apt-get install {package};" in message
    assert ".ci/run installs it" in message
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"apt-get install [^\n]*(?<=\s){re.escape(package)}(?=\s|$)", ci_run, re.M), (
        f".ci/run does not install {package}, which the skip message says it does")


def test_every_test_needing_a_tool_skips_naming_its_package_when_the_tool_is_missing():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-o", "addopts=", *NEEDING_TOOLS],
        cwd=ROOT, env=dict(os.environ, **{system_tools.HIDE_VARIABLE: "all"}), capture_output=True, text=True,
        timeout=300)
    out = done.stdout + done.stderr
    summary = [line for line in done.stdout.splitlines() if re.search(r" in [\d.]+s\b", line)][-1:]
    assert done.returncode == 0 and re.fullmatch(r"=*\s*\d+ skipped in [\d.]+s\s*=*", "".join(summary)), (
        f"with every tool hidden, these tests should all have skipped:\n{out[-4000:]}")
    skipped = _SKIPPED.findall(out)
    covered = set()
    for where, reason in skipped:
        named = [tool for tool in system_tools.TOOLS.values() if f"apt-get install {tool.package};" in reason]
        assert named and ".ci/run installs it" in reason, f"{where} skips without saying how to get what it needs: {reason}"
        covered.update(tool.command for tool in named)
    assert covered == set(system_tools.TOOLS), f"no test here needs {set(system_tools.TOOLS) - covered}"


def test_nothing_in_the_suite_looks_for_those_tools_but_system_tools():
    """A check of its own would skip (or fail) without the message."""
    names = "|".join(map(re.escape, system_tools.TOOLS))
    looks = re.compile(rf"""which\(\s*["'](?:{names})["']""")
    offenders = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                 for path in sorted((ROOT / "tests").rglob("*.py")) if path.name != "system_tools.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1) if looks.search(line)]
    assert not offenders, "use tests/system_tools.py (find or require) instead:\n" + "\n".join(offenders)
