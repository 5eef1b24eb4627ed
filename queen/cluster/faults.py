"""Test-only switches of a cluster node: deliberate bugs and test plumbing for the failover suite
(tests/cluster/). Production never sets them; a node that finds any says so loudly at start.

Read once, when a cluster node starts (`read(environ)`), and passed to the coordinator and the
replicator as one `Faults` value; nothing else in the server looks at the environment for these.

  QUEEN_TEST_FOLLOWER_ACK_BEFORE_FSYNC  a follower acks frames on receipt and writes them 1.5 s later (a
                                        crash inside that window loses what it acked; SIGKILL alone keeps
                                        the page cache, so acking merely before the fsync would lose nothing);
                                        when its leader's stream ends it writes them at once, so only a
                                        follower killed while that stream is up loses them
  QUEEN_TEST_NO_EPOCH_CHECK             the follower's epoch guard is off, both halves of it: it takes every
                                        message of its leader's stream (frames, probes, heartbeats) whatever
                                        their epoch, an older one than it promised included; and when the
                                        leader key goes it keeps that stream open (a sound node closes it
                                        before it promises a newer epoch), through its own campaign and
                                        leadership, acking in the old epoch: so a deposed leader keeps getting
                                        read round trips (and acks of what the node fsynced while it followed)
                                        from its former standby, and answers in its epoch after the new one
                                        began. Its frames, if it writes any, go into the new leader's memory
                                        and log (what the guard is there to prevent)
  QUEEN_TEST_IGNORE_CEILING             a new leader's versions go on from its own log, ignoring etcd's ceiling
  QUEEN_TEST_NO_LEASE_GRACE             EPOCH carries no grace: applying it extends no lease
  QUEEN_TEST_NO_READ_BARRIER            a leader answers a read once what it read is durable (released, as any
                                        answer), without a round trip to its sync set begun after it arrived:
                                        a deposed leader with no write of its own waiting answers reads at once
  QUEEN_TEST_NO_SELF_FENCE              a leader cut from etcd neither fences itself nor steps down
  QUEEN_TEST_NO_HEARD_LEADER_RULE       a sync follower campaigns even while it still hears a serving leader
  QUEEN_TEST_WALL_OFFSET_MS             integer ms added to the node's wall clock at start (a skewed host clock, N7);
                                        read before the clock is made, so every time the node shows is skewed
  QUEEN_TEST_REPLICATION_DIAL           JSON {leader node: "host:port"}: the address a follower dials for
                                        that leader's replication instead of the one in etcd (per-link proxies)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

_BUGS = {
    "QUEEN_TEST_FOLLOWER_ACK_BEFORE_FSYNC": "ack_before_fsync",
    "QUEEN_TEST_NO_EPOCH_CHECK": "no_epoch_check",
    "QUEEN_TEST_IGNORE_CEILING": "ignore_ceiling",
    "QUEEN_TEST_NO_LEASE_GRACE": "no_lease_grace",
    "QUEEN_TEST_NO_READ_BARRIER": "no_read_barrier",
    "QUEEN_TEST_NO_SELF_FENCE": "no_self_fence",
    "QUEEN_TEST_NO_HEARD_LEADER_RULE": "no_heard_leader_rule",
}
REPLICATION_DIAL = "QUEEN_TEST_REPLICATION_DIAL"
WALL_OFFSET = "QUEEN_TEST_WALL_OFFSET_MS"


@dataclass(frozen=True, slots=True)
class Faults:
    ack_before_fsync: bool = False
    no_epoch_check: bool = False
    ignore_ceiling: bool = False
    no_lease_grace: bool = False
    no_read_barrier: bool = False
    no_self_fence: bool = False
    no_heard_leader_rule: bool = False
    replication_dial: dict[str, str] = field(default_factory=dict)
    wall_offset_ms: int = 0

    def dial(self, leader: str, address: str) -> str:
        """The host:port to dial for `leader`'s replication (etcd says `address`)."""
        return self.replication_dial.get(leader, address)


NONE = Faults()


def read(environ) -> Faults:
    """The switches set in `environ`, with one warning line per switch found."""
    flags = {attribute: environ.get(name, "") not in ("", "0") for name, attribute in _BUGS.items()}
    dial = {}
    raw = environ.get(REPLICATION_DIAL, "")
    if raw:
        dial = {str(node): str(address) for node, address in json.loads(raw).items()}
    for name, attribute in _BUGS.items():
        if flags[attribute]:
            logger.warning("event=TEST_FAULT_ENABLED switch=%s detail='a deliberate bug for the failover suite: "
                           "never set this in production'", name)
    if dial:
        logger.warning("event=TEST_FAULT_ENABLED switch=%s detail='replication dialled through %s'", REPLICATION_DIAL,
                       raw)
    wall_offset_ms = int(environ.get(WALL_OFFSET, "") or 0)
    if wall_offset_ms:
        logger.warning("event=TEST_FAULT_ENABLED switch=%s detail='wall clock skewed by %d ms'", WALL_OFFSET,
                       wall_offset_ms)
    return Faults(**flags, replication_dial=dial, wall_offset_ms=wall_offset_ms)
