"""What the SIGKILL workloads of the fault suite share: the server their clients talk to (whose port
changes at each restart), a client that records an answer or an unknown outcome, and the loop that
kills and restarts the server while the clients run.

Nothing here sleeps for time to pass: clients wait on the real process (answers, restarts), and
the killer waits on the clients' progress.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections.abc import Callable

from queen.testing import ServerProcess


class Target:
    """The server under test, as its clients find it across restarts."""

    def __init__(self, server: ServerProcess):
        self.server = server
        self.port = server.port
        self.restarted = threading.Event()
        self.stopped = threading.Event()

    def wait_until_up(self, deadline_s: float = 30.0) -> None:
        """Until the (restarted) server answers its health check, or the run stops."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline and not self.stopped.is_set():
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                connection.request("GET", "/healthz")
                ok = connection.getresponse().status == 200
                connection.close()
                if ok:
                    return
            except OSError:
                pass
            self.restarted.wait(0.05)


class JsonClient:
    """One keep-alive connection posting to one route; after a failure it waits for the server."""

    def __init__(self, target: Target, path: str):
        self.target = target
        self.path = path
        self.connection = None

    def call(self, operation: dict) -> dict | None:
        """The route's first result for {"operations": [operation]}, or None when the server went
        away mid-call (the outcome is unknown)."""
        try:
            if self.connection is None:
                self.connection = http.client.HTTPConnection("127.0.0.1", self.target.port, timeout=10)
            self.connection.request("POST", self.path, json.dumps({"operations": [operation]}),
                                    {"content-type": "application/json"})
            response = self.connection.getresponse()
            body = response.read()
            if response.status != 200:
                raise OSError(f"status {response.status}")
            return json.loads(body)["results"][0]
        except (OSError, http.client.HTTPException, ValueError):
            self.close()
            self.target.wait_until_up()
            return None

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
        self.connection = None


def kill_while_running(target: Target, threads: list[threading.Thread], progress: Callable[[], int], kills: int,
                       rng: random.Random, between: tuple[int, int]) -> None:
    """Start the client threads; `kills` times, once they have made a random number (in `between`)
    more records, SIGKILL the server and restart it; then wait for the clients to finish."""
    try:
        for thread in threads:
            thread.start()
        for _ in range(kills):
            goal = progress() + rng.randrange(*between)
            deadline = time.monotonic() + 30
            while progress() < goal and any(t.is_alive() for t in threads) and time.monotonic() < deadline:
                threads[0].join(0.01)  # waiting on the clients' progress, not on time
            target.server.kill()
            target.server.start()
            target.port = target.server.port
            target.restarted.set()
        for thread in threads:
            thread.join(120)
    finally:
        target.stopped.set()
        target.server.stop()
