"""The SDK logs as a library does: through the `queen_client` logger, silent (a NullHandler) until
the program configures logging, each retry at warning; the `queen` command shows the SDK's
warnings on stderr. Each case runs in a process of its own, since logging is process-wide."""

import os
import select
import socket
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READ_A_CLOSED_PORT = """
import anyio, queen_client
async def main():
    async with queen_client.Client(URL, retries_max=2, failover_timeout=None) as client:
        try:
            await client.kv.get("app", "k")
        except queen_client.TransportError:
            print("unreachable")
anyio.run(main)
"""


def closed_port_url() -> str:
    """A loopback port nothing listens on: connections to it are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_the_sdk_says_nothing_until_the_program_configures_logging():
    done = run_python(f"URL = {closed_port_url()!r}\n{READ_A_CLOSED_PORT}")
    assert done.returncode == 0 and done.stdout == "unreachable\n", done.stderr
    assert done.stderr == ""  # two retries happened, logged to the NullHandler only


def test_each_retry_is_a_warning_of_the_queen_client_logger():
    configure = "import logging; logging.basicConfig(format='%(name)s %(levelname)s %(message)s')\n"
    done = run_python(f"{configure}URL = {closed_port_url()!r}\n{READ_A_CLOSED_PORT}")
    assert done.returncode == 0 and done.stdout == "unreachable\n", done.stderr
    lines = done.stderr.splitlines()
    assert [line.split(" attempt=")[0] for line in lines] == [
        "queen_client._http WARNING event=request_retry method=POST path=/api/v1/kv"] * 2, lines
    assert ["attempt=1" in lines[0], "attempt=2" in lines[1]] == [True, True], lines


def test_the_queen_command_shows_the_sdks_warnings_on_stderr():
    """`queen queue consume` against an unreachable broker says it waits for it (the consumer's
    warning, which the SDK alone would keep to its NullHandler)."""
    worker = subprocess.Popen([sys.executable, "-m", "queen", "queue", "consume", "nowhere", "--url", closed_port_url(),
                               "--", "true"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([worker.stderr], [], [], 30)  # a generous deadline on a busy machine
        first = worker.stderr.readline() if ready else "(nothing in 30 s)"
        assert first.startswith("event=consumer_waiting_for_broker queue=nowhere attempt=1"), first
    finally:
        # Killed: how it stops on SIGTERM while it waits is tests/test_cli_workers.py's to check.
        worker.kill()
        worker.communicate(timeout=30)
