"""A write load as fast as answers come, in its own process: `LoadProcess(url, work_dir).start()`.

CONNECTIONS tasks on one trio loop, each with its own keep-alive connection to one node (no
redirect followed), each putting an ever higher value into its own key (ns "load", key "w<i>").
Every POLL_S it replaces a JSON file with what it has so far: {"ok", "failed", "acked": {key:
highest value acknowledged}, "codes": {status or error code: count}}, so a test can see progress
while it runs and, after stopping it (SIGTERM, by pid), check that every acknowledged value
survived. Failures (503s, resets) are counted and the task goes on: the load never ends by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit

CONNECTIONS = 4
POLL_S = 0.1
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class LoadProcess:
    def __init__(self, url: str, work_dir: str, name: str = "load", connections: int = CONNECTIONS):
        self.path = os.path.join(work_dir, f"{name}.json")
        self.argv = [sys.executable, "-m", "tests.cluster.harness.load", "--url", url, "--out", self.path,
                     "--connections", str(connections)]
        self.process: subprocess.Popen | None = None

    def start(self) -> LoadProcess:
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(self.path + ".err", "ab") as err:
            self.process = subprocess.Popen(self.argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        return self

    def progress(self) -> dict:
        try:
            with open(self.path) as file:
                return json.load(file)
        except (FileNotFoundError, ValueError):
            return {"ok": 0, "failed": 0, "acked": {}, "codes": {}}

    def stop(self, timeout_s: float = 30.0) -> dict:
        """SIGTERM, wait for its exit (the calls under way are answered first), and its totals."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            code = self.process.wait(timeout_s)
            assert code == 0, f"the load exited {code}: {open(self.path + '.err').read()[-2000:]}"
        return self.progress()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


def main(argv=None) -> int:
    import h11
    import trio

    from queen.testing import HttpClient

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the node to write to")
    parser.add_argument("--out", required=True, help="the JSON file of what was done so far")
    parser.add_argument("--connections", type=int, default=CONNECTIONS, help="concurrent writers")
    args = parser.parse_args(argv)
    port = urlsplit(args.url).port
    totals = {"ok": 0, "failed": 0, "acked": {}, "codes": {}}

    def save() -> None:
        with open(args.out + ".tmp", "w") as file:
            json.dump(totals, file)
        os.replace(args.out + ".tmp", args.out)

    active = [0]

    async def writer(key: str, stopping: trio.Event) -> None:
        client, value = HttpClient(port), 0
        active[0] += 1
        try:
            while not stopping.is_set():
                value += 1
                if not await write_one(client, key, value):
                    client = HttpClient(port)
                    await trio.sleep(0.05)  # a node that went away: no busy loop while it is gone
        finally:
            active[0] -= 1

    async def write_one(client, key: str, value: int) -> bool:
        """One put, counted; False when its connection is no longer usable."""
        try:
            status, body = await client.request("PUT", f"/api/v1/kv/load/{key}", {"value": value, "forever": True})
        except (OSError, h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError) as error:
            status, body = type(error).__name__, None
        if status == 200:
            totals["ok"] += 1
            totals["acked"][key] = value
        else:
            totals["failed"] += 1
            code = body.get("code", status) if isinstance(body, dict) else status
            totals["codes"][str(code)] = totals["codes"].get(str(code), 0) + 1
        return type(status) is int and body is not None

    async def run() -> None:
        stopping = trio.Event()
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                for i in range(args.connections):
                    nursery.start_soon(writer, f"w{i}", stopping)

                async def save_every_poll() -> None:
                    while True:
                        save()
                        await trio.sleep(POLL_S)

                nursery.start_soon(save_every_poll)
                async for _ in signals:
                    stopping.set()
                    break
                with trio.move_on_after(20):  # the calls under way end as they would
                    while active[0]:
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
        save()

    started = time.monotonic()
    trio.run(run)
    print(f"load: {totals['ok']} ok, {totals['failed']} failed in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
