"""What the SIGKILL workloads of the fault suite share: the server their clients talk to (whose port
changes at each restart), a client that records an answer or an unknown outcome, and the loop that
crashes and restarts the server while the clients run. A crash is a SIGKILL, or, when the server
runs on a journaling disk (tests/faults/power.py), a SIGKILL followed by power loss.

Nothing here sleeps for time to pass: clients wait on the real process (answers, restarts), and
the killer waits on the clients' progress.
"""

from __future__ import annotations

import http.client
import json
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable

from queen.testing import ServerProcess
from tests.faults.power import lose_power

# Named failpoints a restarted server may be armed with (tests/faults/sut.py), each with the range
# its n is drawn from: log writes and fsyncs come many to a second, files and renames a few a run.
FAILPOINTS = {"write": (1, 30), "fsync": (1, 30), "create": (1, 2), "rename": (1, 1), "fsync_dir": (1, 2)}


class Target:
    """The server under test, as its clients find it across restarts.

    journal: the server's power-loss journal (QUEEN_FAULT_JOURNAL), or None: crashes are then
    SIGKILLs only. `faults` counts the crashes by kind: sigkill, power_loss (SIGKILL, then the
    data directory cut back to what was fsynced), and failpoint_<point> (the server killed itself
    at a named failpoint), with "+power_loss" when power was lost after it."""

    def __init__(self, server: ServerProcess, journal: str | None = None):
        self.server = server
        self.journal = journal
        self.port = server.port
        self.restarted = threading.Event()
        self.stopped = threading.Event()
        self.faults: Counter = Counter()
        self.env = dict(server.env or {})
        self.armed: str | None = None  # the failpoint of the running server, if any
        self.unexpected_exits: list[dict] = []  # the server died, and not at its failpoint: a violation
        self.headers: dict = {}  # sent with every client request (a token, when auth is on)

    def died(self) -> bool:
        """The server process has exited (at its failpoint, or not)."""
        return self.server.process.poll() is not None

    def crash(self, power_loss: bool, failpoint: tuple[str, int] | None = None) -> None:
        """SIGKILL the server (unless its failpoint did), drop what it never fsynced if
        power_loss, and start it again, armed with `failpoint` (point, n) if one is given."""
        kind = "sigkill"
        if self.died():
            code = self.server.process.returncode
            if self.armed and code == -signal.SIGKILL:
                kind = f"failpoint_{self.armed}"
            else:
                self.unexpected_exits.append({"kind": "server_exited", "returncode": code, "armed": self.armed,
                                              "log_tail": self.server.log_text()[-2000:]})
        self._end(kind, power_loss)
        if not self._start(failpoint):
            # The failpoint was reached during recovery, before the server listened: that is a
            # crash too; start again without it.
            self._end(f"failpoint_{failpoint[0]}", power_loss)
            self._start(None)
        self.port = self.server.port
        self.restarted.set()

    def _end(self, kind: str, power_loss: bool) -> None:
        """Make sure the server is dead, lose power if asked, and count the crash."""
        self.server.kill()
        if power_loss and self.journal is not None:
            lose_power(self.server.data_dir, self.journal)
            kind = "power_loss" if kind == "sigkill" else kind + "+power_loss"
        self.faults[kind] += 1

    def _start(self, failpoint: tuple[str, int] | None) -> bool:
        """Start the server, armed with failpoint if given; False when it died at that failpoint
        before it listened."""
        self.armed = failpoint[0] if failpoint else None
        self.server.env = {**self.env, "QUEEN_FAULT_KILL_AT": f"{failpoint[0]}:{failpoint[1]}"} if failpoint else self.env
        try:
            self.server.start()
        except RuntimeError:
            if failpoint and self.died() and self.server.process.returncode == -signal.SIGKILL:
                return False
            raise
        return True

    def restart(self) -> None:
        """Start the stopped server again, without a failpoint, for a workload's final reads."""
        self._start(None)
        self.port = self.server.port
        self.stopped.clear()

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
    """One keep-alive connection to the server; after a failure it waits for the server to be back."""

    def __init__(self, target: Target, path: str = "/"):
        self.target = target
        self.path = path
        self.connection = None

    def call(self, operation: dict) -> dict | None:
        """The route's first result for {"operations": [operation]}, or None when the server went
        away mid-call (the outcome is unknown)."""
        answer = self.request("POST", self.path, {"operations": [operation]})
        return None if answer is None else answer["results"][0]

    def request(self, method: str, path: str, body: dict | None = None, timeout_s: float = 10) -> dict | None:
        """The decoded 200 answer, or None when the server went away mid-call (outcome unknown)."""
        try:
            if self.connection is None:
                self.connection = http.client.HTTPConnection("127.0.0.1", self.target.port, timeout=timeout_s)
            self.connection.request(method, path, None if body is None else json.dumps(body),
                                    {"content-type": "application/json", **self.target.headers})
            response = self.connection.getresponse()
            data = response.read()
            if response.status != 200:
                # Only a server going away refuses (503 while draining); anything else is a bug.
                assert response.status == 503, (response.status, data[:300])
                raise OSError(f"status {response.status}")
            return json.loads(data)
        except (OSError, http.client.HTTPException, ValueError):
            self.close()
            self.target.wait_until_up()
            return None

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
        self.connection = None


def kill_while_running(target: Target, threads: list[threading.Thread], progress: Callable[[], int], kills: int,
                       rng: random.Random, between: tuple[int, int], power_loss_share: float = 0.5,
                       failpoint_share: float = 0.4) -> None:
    """Start the client threads; `kills` times, once they have made a random number (in `between`)
    more records, crash the server (power loss in power_loss_share of them, when it has a journal)
    and restart it; then wait for the clients to finish. In failpoint_share of the restarts but
    the last, the server is armed with a random named failpoint, and a crash comes from it when
    it is reached first."""
    try:
        for thread in threads:
            thread.start()
        for kill in range(kills):
            # Armed, the server gets three times the room to reach its failpoint first.
            goal = progress() + rng.randrange(*between) * (3 if target.armed else 1)
            deadline = time.monotonic() + 30
            while (progress() < goal and any(t.is_alive() for t in threads) and time.monotonic() < deadline
                   and not target.died()):
                threads[0].join(0.01)  # waiting on the clients' progress (or the failpoint), not on time
            power_loss = rng.random() < power_loss_share
            failpoint = None
            if kill < kills - 1 and rng.random() < failpoint_share:
                point = rng.choice(sorted(FAILPOINTS))
                failpoint = (point, rng.randrange(FAILPOINTS[point][0], FAILPOINTS[point][1] + 1))
            target.crash(power_loss, failpoint)
        for thread in threads:
            thread.join(120)
    finally:
        target.stopped.set()
        target.server.stop()
