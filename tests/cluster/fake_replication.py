"""A fake Replicator for coordinator tests: nodes in one process, "replicating" by copying the
leader's last version, with the interface of queen/cluster/replication.py.

Until the real module exists, `StreamEnded` and `FollowerStatus` come from a stub registered as
queen.cluster.replication (what the coordinator imports); once it exists, from it.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass

import trio

try:
    from queen.cluster.replication import FollowerStatus, StreamEnded
except ModuleNotFoundError:
    class StreamEnded(Exception):  # noqa: N818 - the interface's name
        pass

    @dataclass(frozen=True, slots=True)
    class FollowerStatus:
        node: str
        connected: bool
        acked_version: int
        lag_versions: int
        caught_up: bool

    _stub = types.ModuleType("queen.cluster.replication")
    _stub.StreamEnded = StreamEnded
    _stub.FollowerStatus = FollowerStatus
    sys.modules["queen.cluster.replication"] = _stub


class FakeWriter:
    def __init__(self):
        self.ceiling_allowed = 0
        self.ceiling_wanted = trio.Event()


class FakeNet:
    """Every node's fake replicator, and every version any leader handed out: (version, epoch, node)."""

    def __init__(self):
        self.nodes: dict[str, FakeReplicator] = {}
        self.handed: list[tuple[int, int, str]] = []
        self.deaf: set[str] = set()  # followers that stop receiving frames (still connected)


class FakeReplicator:
    def __init__(self, net: FakeNet, node: str, writer: FakeWriter):
        self.net = net
        self.node = node
        self.writer = writer
        net.nodes[node] = self
        self.role = "none"
        self.epoch = 0
        self.promised_epoch = 0
        self.leader_heard_at = -math.inf
        self.clock_floor_ms = 0
        self.last_version = 0
        self.last_epoch = 0
        self.sync: frozenset[str] = frozenset()
        self.alive = True
        self.lead_calls: list[tuple[int, frozenset, int]] = []  # (epoch, sync, version_floor)
        self.stepped_down: list[str] = []
        self.serving = False
        self.acked: dict[str, int] = {}  # follower -> acked version (leader side)
        self.sync_unavailable = False

    def log_position(self) -> tuple[int, int]:
        return self.last_epoch, self.last_version

    async def promise(self, epoch: int) -> None:
        await trio.lowlevel.checkpoint()
        self.promised_epoch = max(self.promised_epoch, epoch)

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    def hand_out(self) -> int | None:
        """One write's version, if the ceiling allows; else ask for more."""
        version = self.last_version + 1
        if version > self.writer.ceiling_allowed:
            self.writer.ceiling_wanted.set()
            return None
        if version > self.writer.ceiling_allowed - 8:
            self.writer.ceiling_wanted.set()
        self.last_version = version
        self.last_epoch = self.epoch
        self.net.handed.append((version, self.epoch, self.node))
        return version

    async def lead(self, epoch: int, sync: frozenset, *, version_floor: int, grace_ms: int) -> None:
        assert self.promised_epoch >= epoch, (self.promised_epoch, epoch)
        self.lead_calls.append((epoch, frozenset(sync), version_floor))
        self.role, self.epoch, self.sync = "leader", epoch, frozenset(sync)
        self.last_version = max(self.last_version, version_floor)
        while self.hand_out() is None:  # the EPOCH record
            await trio.sleep(0.01)
        first = self.last_version
        while not all(self.acked.get(m, 0) >= first for m in self.sync):
            if self.role != "leader" or not self.alive:
                raise RuntimeError("stepped down")
            await trio.sleep(0.01)
        self.serving = True

    def set_sync(self, sync: frozenset) -> None:
        self.sync = frozenset(sync)

    def followers(self) -> list:
        found = []
        for other in self.net.nodes.values():
            if other is self or not other.alive or other.role != "follower" or other.epoch != self.epoch:
                continue
            acked = self.acked.get(other.node, 0)
            # Its first copy took this leader's whole log as it stood then: caught up from then on.
            found.append(FollowerStatus(other.node, True, acked, self.last_version - acked, other.node in self.acked))
        return found

    async def follow(self, epoch: int, leader: str, address: tuple[str, int]) -> None:
        assert self.promised_epoch >= epoch
        self.role, self.epoch = "follower", epoch
        try:
            while True:
                source = self.net.nodes.get(leader)
                if source is None or not source.alive or source.role != "leader" or source.epoch != epoch:
                    raise StreamEnded("the leader is gone")
                if self.promised_epoch > epoch:
                    raise StreamEnded("promised a newer epoch")
                self.leader_heard_at = trio.current_time()
                if self.node not in self.net.deaf:
                    self.last_version, self.last_epoch = source.last_version, source.last_epoch
                    source.acked[self.node] = self.last_version
                await trio.sleep(0.02)
        finally:
            if self.role == "follower":
                self.role = "none"

    def step_down(self, reason: str) -> None:
        self.stepped_down.append(reason)
        self.role = "none"
        self.serving = False

    async def write_forever(self, period_s: float = 0.005) -> None:
        """Client writes: a version each period while serving."""
        while True:
            if self.serving and self.role == "leader" and self.alive:
                self.hand_out()
            await trio.sleep(period_s)
