"""The README's examples are executed: every ```python block of "Python SDK" and "Transactions"
as a script, every ```sh block of "CLI" with bash, against a real server named by QUEEN_URL; the
curl blocks of "Queues", "Timers" and "Transactions" on a fresh server, their answers checked. An
example that stops working fails here."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from queen.testing import ServerProcess

README = Path(__file__).resolve().parent.parent / "README.md"


def section_blocks(heading: str, language: str) -> list[str]:
    text = README.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end != -1 else None]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


PYTHON_BLOCKS = section_blocks("Python SDK", "python")
SH_BLOCKS = section_blocks("CLI", "sh")
QUEUE_CURL_BLOCKS = section_blocks("Queues", "sh")
TIMER_CURL_BLOCKS = section_blocks("Timers", "sh")
TXN_CURL_BLOCKS = section_blocks("Transactions", "sh")
TXN_PYTHON_BLOCKS = section_blocks("Transactions", "python")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with ServerProcess(str(tmp_path_factory.mktemp("queen") / "data")) as server:
        bin_dir = os.path.dirname(sys.executable)  # where `queen` is installed beside this python
        yield dict(os.environ, QUEEN_URL=server.url, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))


@pytest.fixture
def fresh_server(tmp_path):
    with ServerProcess(str(tmp_path / "data")) as server:
        yield server


def test_the_sections_have_examples():
    assert len(PYTHON_BLOCKS) >= 4 and len(SH_BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_python_sdk_example_runs(env, index):
    done = subprocess.run([sys.executable, "-c", PYTHON_BLOCKS[index]], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_cli_examples_run_in_order(env):
    for block in SH_BLOCKS:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{block}\n{done.stdout}\n{done.stderr}"


def test_the_queue_curl_examples_answer_what_they_say(fresh_server):
    """Run as a user would, on a fresh server: the README's address is this test server's."""
    [block] = QUEUE_CURL_BLOCKS
    script = block.replace("localhost:6632", f"127.0.0.1:{fresh_server.port}")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert '"configured":true' in out and '"status":"queued"' in out
    assert '"success":true,"queue":"orders"' in out  # the pop
    assert '"leaseReleased":true,"dlq":false,"retryCount":1' in out  # the failed ack
    assert '"dlq":true' in out and '"total":1' in out and '"error":"bad address"' in out
    assert '"found":true' in out and '"items":[{"partition":"customer-42"' in out


def run_curl_block(block: str, server) -> str:
    script = block.replace("localhost:6632", f"127.0.0.1:{server.port}")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_timer_curl_examples_answer_what_they_say(fresh_server):
    [block] = TIMER_CURL_BLOCKS
    out = run_curl_block(block, fresh_server)
    assert '"scheduled":true' in out and '"cancelled":false,"reason":"absent"' in out and '"found":true' in out
    assert '"key":"order-42:payment-timeout"' in out and '"key":"order-42:reminder"' in out
    assert '"success":true' in out and '"data":"ding"' in out  # the timer due now was delivered
    assert '"cron":"0 9 * * 1-5","timezone":"Europe/Berlin"' in out and '"everyMs":30000' in out


def test_the_transaction_curl_examples_answer_what_they_say(fresh_server):
    [block] = TXN_CURL_BLOCKS
    out = run_curl_block(block, fresh_server)
    assert '"success":true,"kv":' in out and '"status":"queued"' in out and '"scheduled":true' in out
    assert '"success":false,"reason":"lease_lost"' in out and '"current":{"state":"completed"}' in out


@pytest.mark.parametrize("index", range(len(TXN_PYTHON_BLOCKS)))
def test_the_transaction_stories_run(env, index):
    assert len(TXN_PYTHON_BLOCKS) == 2  # the order workflow and the cron story
    done = subprocess.run([sys.executable, "-c", TXN_PYTHON_BLOCKS[index]], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert ("paid -> committed" in done.stdout) if index == 0 else ("cron-2 skipped: kv_precondition" in done.stdout)
