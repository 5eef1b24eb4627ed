"""The node's place in its cluster: who leads, who follows, and the etcd keys that say so.

States: starting -> follower -> candidate -> promoting -> leader -> fenced -> follower.

Decisions are pure functions of what etcd showed (`Observed`), the node's own state and `now`
(the functions before `Coordinator`); the Coordinator does the I/O: it polls etcd, keeps its lease
alive, writes the keys, and drives the Replicator (promise, lead, follow, set_sync, step_down).

etcd keys under /queen/<cluster>/:
  leader           {node, advertise, replication} on the leader's lease; its create_revision is the epoch
  sync             {epoch, leader, members, degraded[, handoff][, forced]}; an epoch of null means
                   "the revision of this very write" (a campaign writes sync in the txn that creates
                   the leader key, whose revision nobody knows before it commits); degraded: fewer
                   members than sync_count, so answers are on fewer copies than wanted (in either
                   mode: at bootstrap, after a force-promote, or once degrade mode dropped one)
  version-ceiling  no version above it is handed out until etcd has confirmed it
  members/<node>   {advertise, role, epoch, lastVersion[, syncUnavailable]} on the node's own lease:
                   information only (syncUnavailable: the leader's, so every node can show it)

Why polling and not a watch: one linearizable txn of ranges every POLL_S (~150 ms) reads the leader,
sync, ceiling and member keys at one revision, and doubles as the check that etcd still answers.
A watch stream through the gateway that a partition silences looks just like a quiet key, so it
would need a poll beside it anyway; at ~7 small reads a second per node, etcd does not notice.

Safety does not rest on timing here: a follower acks only frames of the epoch it promised, and a
leader answers only after its sync set acked (queen/cluster/replication.py). The self-fence below
(no keepalive for T_l - margin) is defence in depth.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from dataclasses import dataclass, field, replace

import trio

from queen.cluster import etcd as e
from queen.cluster import faults as test_faults
from queen.cluster.etcd import EtcdClient, EtcdError, EtcdUnavailable, KeyValue

logger = logging.getLogger(__name__)

STARTING, FOLLOWER, CANDIDATE, PROMOTING, LEADER, FENCED = "starting", "follower", "candidate", "promoting", "leader", "fenced"
STRICT, DEGRADE = "strict", "degrade"
POLL_S = 0.15
CEILING_BLOCK = 1 << 20
EVENTS_KEPT = 256  # role changes, sync changes, switchovers a coordinator remembers


@dataclass(frozen=True, slots=True)
class Settings:
    cluster: str
    node: str
    advertise: str  # the URL clients are redirected to
    replication: str  # host:port followers connect to
    leader_ttl_s: float = 5.0
    sync_mode: str = STRICT
    lease_grace_s: float = 0.0  # 0: the leader ttl
    sync_count: int = 1  # members of the sync set wanted; further followers stay async, to swap in
    ack_timeout_s: float = 1.0  # a sync member with no progress this long counts as failed
    poll_s: float = POLL_S
    ceiling_block: int = CEILING_BLOCK
    members_every_s: float = 1.0

    @property
    def fence_margin_s(self) -> float:
        """Stop leading this long before the lease could expire: room for a keepalive in flight
        and for the poll that notices."""
        return max(self.leader_ttl_s / 4, 2 * self.poll_s)

    @property
    def keepalive_every_s(self) -> float:
        return self.leader_ttl_s / 5

    @property
    def grace_ms(self) -> int:
        return int((self.lease_grace_s or self.leader_ttl_s) * 1000)


class Keys:
    def __init__(self, cluster: str):
        self.prefix = f"/queen/{cluster}/"
        self.leader = self.prefix + "leader"
        self.sync = self.prefix + "sync"
        self.ceiling = self.prefix + "version-ceiling"
        self.members = self.prefix + "members/"

    def member(self, node: str) -> str:
        return self.members + node


# -- what etcd showed --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LeaderKey:
    node: str
    advertise: str
    replication: str
    epoch: int  # the key's create_revision
    lease: int


@dataclass(frozen=True, slots=True)
class SyncKey:
    epoch: int
    leader: str
    members: frozenset[str]
    degraded: bool
    mod_revision: int
    handoff: str | None = None  # a switchover's target: campaigns at once
    forced: str | None = None  # force-promote's target: campaigns at once, without the other checks

    def document(self) -> dict:
        doc = {"epoch": self.epoch, "leader": self.leader, "members": sorted(self.members), "degraded": self.degraded}
        if self.handoff:
            doc["handoff"] = self.handoff
        if self.forced:
            doc["forced"] = self.forced
        return doc


@dataclass(frozen=True, slots=True)
class Observed:
    revision: int
    leader: LeaderKey | None
    sync: SyncKey | None
    ceiling: int
    members: dict = field(default_factory=dict)  # node -> its members/ document


def parse_observed(revision: int, leader: list[KeyValue], sync: list[KeyValue], ceiling: list[KeyValue],
                   members: list[KeyValue], members_prefix: str) -> Observed:
    leader_key = None
    if leader:
        kv = leader[0]
        doc = json.loads(kv.value)
        leader_key = LeaderKey(doc["node"], doc.get("advertise", ""), doc.get("replication", ""), kv.create_revision,
                               kv.lease)
    sync_key = None
    if sync:
        kv = sync[0]
        doc = json.loads(kv.value)
        sync_key = SyncKey(doc.get("epoch") or kv.mod_revision, doc.get("leader", ""), frozenset(doc.get("members", ())),
                           bool(doc.get("degraded", False)), kv.mod_revision, doc.get("handoff"), doc.get("forced"))
    members_info = {}
    for kv in members:
        try:
            members_info[kv.key.decode()[len(members_prefix):]] = json.loads(kv.value)
        except ValueError:
            continue
    return Observed(revision, leader_key, sync_key, int(ceiling[0].value) if ceiling else 0, members_info)


# -- decisions: pure -----------------------------------------------------------------------------------

def campaign_reason(observed: Observed, node: str, promised_epoch: int, leader_heard_at: float, now: float,
                    ttl_s: float) -> str | None:
    """Why this node may campaign now, or None. Only when no leader key exists, and:
    - bootstrap: the cluster has no sync key yet (the first node to try leads);
    - forced: an operator named this node (force-promote);
    - handoff: the leader handed over to this node (switchover), which is a sync member;
    - failover: a sync member that promised the sync set's epoch (so it holds everything that
      epoch acknowledged) and has heard no serving leader for the leader ttl. With no sync member
      (degraded), only the leader of that epoch itself may come back: nobody else has its data."""
    if observed.leader is not None:
        return None
    sync = observed.sync
    if sync is None:
        return "bootstrap"
    if sync.forced:
        return "forced" if sync.forced == node else None
    if sync.members:
        eligible = node in sync.members
    else:
        eligible = node == sync.leader
    if not eligible or promised_epoch != sync.epoch:
        return None
    if sync.handoff == node:
        return "handoff"
    if now - leader_heard_at < ttl_s:
        return None
    return "failover"


def follow_target(observed: Observed, node: str) -> LeaderKey | None:
    """The leader to follow: one that is not this node, whose epoch the sync key confirms (a
    follower accepts a stream only once etcd shows the leader's epoch is the sync set's)."""
    leader = observed.leader
    if leader is None or leader.node == node:
        return None
    if observed.sync is None or observed.sync.epoch != leader.epoch:
        return None
    return leader


def leadership_lost(observed: Observed, node: str, epoch: int) -> str | None:
    """Why a leader (or promoting node) of `epoch` must stop, judging by etcd; None if it still leads."""
    leader = observed.leader
    if leader is None:
        return "leader_key_gone"
    if leader.node != node or leader.epoch != epoch:
        return "another_leader"
    if observed.sync is not None and observed.sync.epoch > epoch:
        return "newer_epoch"
    return None


def fence_due(lease_renewed_at: float, now: float, ttl_s: float, margin_s: float) -> bool:
    """lease_renewed_at: when the last keepalive etcd accepted was sent. etcd counts the ttl from
    when it processed that keepalive, which is later, so the lease lives at least until
    lease_renewed_at + ttl; fencing margin_s before that is always in time."""
    return now >= lease_renewed_at + ttl_s - margin_s


def lease_fresh(lease_renewed_at: float, now: float, ttl_s: float, margin_s: float, keepalive_every_s: float) -> bool:
    """Whether the lease is recent enough to campaign on: the fence is not due before the next
    keepalive. Keepalives that went unanswered (etcd without quorum) may still have kept the lease
    alive, and etcd extends leases when it elects a leader, so a campaign on it can win; but the
    self-fence, which knows only the answered ones, would end that epoch at once."""
    return not fence_due(lease_renewed_at, now + keepalive_every_s, ttl_s, margin_s)


def campaign_members(sync: SyncKey | None, node: str, mode: str) -> frozenset[str]:
    """The sync set a campaign writes: the old sync set's other members. In strict mode, if that
    leaves nobody, the old leader stays listed so that no answer is released on one copy; the sync
    manager swaps in a caught-up follower once it sees that member fail."""
    if sync is None or sync.forced:
        return frozenset()
    members = sync.members - {node}
    if not members and mode == STRICT and sync.leader and sync.leader != node:
        members = frozenset({sync.leader})
    return members


@dataclass
class MemberHealth:
    """How the leader judges a sync member: since when it has shown no progress."""

    acked_version: int = -1
    stalled_since: float | None = None


def plan_sync(members: frozenset[str], followers: list, mode: str, sync_count: int,
              health: dict[str, MemberHealth], now: float, ack_timeout_s: float) -> frozenset[str] | None:
    """The sync set the leader should write next, or None to keep it. Updates `health`.
    A member has failed when it is disconnected, or lags without acking anything new, for
    ack_timeout_s. Degrade drops a failed member; strict drops it only for a caught-up follower
    that takes its place, and at once when the member is not connected at all (a new leader's
    campaign lists the dead old leader as a placeholder: waiting ack_timeout_s for it would only
    delay the first answer). Caught-up followers fill the set up to sync_count: those that have
    every version the log held when their stream began (FollowerStatus.caught_up; from then on
    the answers wait for them too). Lag 0 at a poll is no test under steady writes: it never comes."""
    statuses = {status.node: status for status in followers}
    failed = set()
    absent = set()
    for member in members:
        status = statuses.get(member)
        record = health.setdefault(member, MemberHealth())
        healthy = status is not None and status.connected and (
            status.lag_versions == 0 or status.acked_version > record.acked_version)
        if status is not None:
            record.acked_version = max(record.acked_version, status.acked_version)
        if healthy:
            record.stalled_since = None
            continue
        if status is None or not status.connected:
            absent.add(member)
        if record.stalled_since is None:
            record.stalled_since = now
        if now - record.stalled_since >= ack_timeout_s:
            failed.add(member)
    for gone in set(health) - members:
        del health[gone]
    caught_up = sorted(node for node, status in statuses.items()
                       if status.connected and status.caught_up and node not in members)
    new = set(members)
    if mode == STRICT:
        failed |= absent
    for member in sorted(failed):
        if mode == DEGRADE:
            new.discard(member)
        elif caught_up:
            new.discard(member)
            new.add(caught_up.pop(0))
    while len(new) < sync_count and caught_up:
        new.add(caught_up.pop(0))
    new = frozenset(new)
    return None if new == members else new


def next_ceiling(etcd_ceiling: int, local_last: int, block: int) -> int:
    """A new reservation: above everything handed out or reserved so far, a block ahead."""
    return max(etcd_ceiling, local_last) + block


def lost_estimate(node_last: int | None, old_leader_last: int | None) -> int | None:
    """What a forced promotion may lose: versions the old leader announced beyond the node's."""
    if node_last is None or old_leader_last is None:
        return None
    return max(0, old_leader_last - node_last)


# -- the I/O -------------------------------------------------------------------------------------------

class NotPossible(Exception):
    """A switchover or force-promote that cannot be done now (the message says why)."""


class LeadershipLost(Exception):
    """A leadership txn found this node's leader key gone: it has stepped down."""


class Coordinator:
    """Runs for the server's lifetime in its core nursery. replicator: the Replicator interface
    (queen/cluster/replication.py); writer: its ceiling_allowed / ceiling_wanted are driven here."""

    def __init__(self, settings: Settings, etcd: EtcdClient, replicator, writer, *, clock=trio.current_time,
                 faults: test_faults.Faults = test_faults.NONE, restart=None, on_leading=None):
        """restart(reason): the server's way to run again on the same data dir, when the replicator
        says this node's files were corrected or its memory may differ from them (RestartNeeded).
        on_leading(): awaited once EPOCH is durable, before this node serves (the server refreshes
        what it keeps beside the state, such as tenant pauses)."""
        self.on_leading = on_leading
        self.settings = settings
        self.faults = faults
        self.restart = restart
        self.etcd = etcd
        self.replicator = replicator
        self.writer = writer
        self.clock = clock
        self.keys = Keys(settings.cluster)
        self.role = STARTING
        self.epoch = 0  # the epoch led, or followed
        self.serving = False  # leading and lead() returned: client calls are answered here
        self.observed: Observed | None = None
        self.members_seen: dict[str, dict] = {}  # every node's last members/ document, kept after it vanished
        self.sync: SyncKey | None = None  # the sync key as this leader last wrote it
        self.ceiling = 0  # the ceiling etcd confirmed to this leader
        self.lease = 0
        self.lease_renewed_at = -math.inf  # when the last keepalive etcd accepted was sent
        self.keepalive_paused = False  # tests: a leader whose keepalives stop
        # (time, what, details), the newest EVENTS_KEPT: for tests and status, bounded in a long run.
        self.events: deque[tuple[float, str, dict]] = deque(maxlen=EVENTS_KEPT)
        self._nursery: trio.Nursery | None = None
        self._leading: trio.CancelScope | None = None
        self._following: tuple[int, str] | None = None
        self._follow_scope: trio.CancelScope | None = None
        self._health: dict[str, MemberHealth] = {}
        self._switching = False

    # -- for the HTTP layer ------------------------------------------------------------------------

    @property
    def leader_advertise(self) -> str | None:
        """The URL of the leader clients should go to, if one other than this node is known."""
        observed = self.observed
        if observed is None or observed.leader is None or observed.leader.node == self.settings.node:
            return None
        return observed.leader.advertise or None

    @property
    def sync_unavailable(self) -> bool:
        """This leader's sync set is out of reach (queen/cluster/replication.py); on another node,
        what the leader last announced in etcd (its members/ document, up to members_every_s old)."""
        if self.role in (LEADER, PROMOTING):
            return self.replicator.sync_unavailable
        observed = self.observed
        leader = observed.leader if observed is not None else None
        if leader is None or leader.node == self.settings.node:
            return False
        return bool(observed.members.get(leader.node, {}).get("syncUnavailable"))

    def status(self) -> dict:
        observed = self.observed
        leader = observed.leader if observed is not None else None
        sync = self.sync if self.role == LEADER and self.sync is not None else (observed.sync if observed else None)
        followers = self.replicator.followers() if self.role in (LEADER, PROMOTING) else []
        members = []
        for node, doc in sorted((observed.members if observed else {}).items()):
            members.append({"node": node, "role": doc.get("role"), "epoch": doc.get("epoch"),
                            "lastVersion": doc.get("lastVersion"), "advertise": doc.get("advertise")})
        return {"cluster": self.settings.cluster, "node": self.settings.node, "role": self.role, "epoch": self.epoch,
                "serving": self.serving, "promisedEpoch": self.replicator.promised_epoch,
                "leader": {"node": leader.node, "advertise": leader.advertise, "epoch": leader.epoch} if leader else None,
                "sync": sorted(sync.members) if sync else [], "degraded": bool(sync and sync.degraded),
                "syncUnavailable": self.sync_unavailable, "syncMode": self.settings.sync_mode,
                "lastVersion": self.replicator.log_position()[1],
                "followers": [{"node": f.node, "connected": f.connected, "ackedVersion": f.acked_version,
                               "lagVersions": f.lag_versions} for f in followers],
                "members": members}

    # -- running -------------------------------------------------------------------------------------

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._ensure_lease()
            self._set_role(FOLLOWER)
            nursery.start_soon(self._keepalive_loop)
            nursery.start_soon(self._fence_loop)
            nursery.start_soon(self._members_loop)
            task_status.started(self)
            await self._main_loop()

    def _set_role(self, role: str, **details) -> None:
        if role != self.role:
            # Each detail its own key=%s, so the log formatter quotes each value on its own.
            logger.info("event=cluster_role node=%s role=%s was=%s epoch=%d" + "".join(f" {k}=%s" for k in details),
                        self.settings.node, role, self.role, self.epoch, *details.values())
            self.events.append((self.clock(), role, {"epoch": self.epoch, **details}))
        self.role = role

    async def _ensure_lease(self) -> None:
        while not self.lease:
            try:
                self.lease = await self.etcd.lease_grant(math.ceil(self.settings.leader_ttl_s))
                self.lease_renewed_at = self.clock()
            except (EtcdUnavailable, EtcdError) as error:
                logger.warning("event=etcd_unavailable action=retrying detail=%r", str(error))
                await trio.sleep(self.settings.poll_s * 4)

    async def observe(self) -> Observed:
        """One linearizable read of every key the decisions look at, at one revision."""
        keys = self.keys
        result = await self.etcd.txn([], [e.range_op(keys.leader), e.range_op(keys.sync), e.range_op(keys.ceiling),
                                          e.range_op(keys.members, prefix=True)])
        observed = parse_observed(result.revision, *result.ranges, keys.members)
        self.observed = observed
        self.members_seen.update(observed.members)
        return observed

    async def _main_loop(self) -> None:
        while True:
            try:
                observed = await self.observe()
            except (EtcdUnavailable, EtcdError) as error:
                logger.debug("event=etcd_poll_failed detail=%r", str(error))
                observed = None
            if observed is not None:
                await self._decide(observed)
            await trio.sleep(self.settings.poll_s)

    async def _decide(self, observed: Observed) -> None:
        node = self.settings.node
        if self.role in (LEADER, PROMOTING):
            reason = leadership_lost(observed, node, self.epoch)
            if reason is not None:
                self.step_down(reason)
            return
        if self.role in (CANDIDATE, STARTING):  # STARTING: a restart is under way
            return
        mine = observed.leader
        if mine is not None and mine.node == node:
            # A leader key of this node that it no longer leads by (it fenced itself, or restarted):
            # give it up now rather than keep it alive with our keepalives.
            await self._release_leader_key(mine)
            return
        target = follow_target(observed, node)
        if target is not None:
            await self._follow(target)
            return
        if observed.leader is None:
            if not self.faults.no_epoch_check:  # test-only bug: the old leader's stream stays open
                self._stop_following()
            heard_at = -math.inf if self.faults.no_heard_leader_rule else self.replicator.leader_heard_at
            reason = campaign_reason(observed, node, self.replicator.promised_epoch, heard_at, self.clock(),
                                     self.settings.leader_ttl_s)
            settings = self.settings
            if reason is not None and self.lease and lease_fresh(self.lease_renewed_at, self.clock(), settings.leader_ttl_s,
                                                                 settings.fence_margin_s, settings.keepalive_every_s):
                await self._campaign(observed, reason)

    # -- following ---------------------------------------------------------------------------------

    async def _follow(self, leader: LeaderKey) -> None:
        if self._following == (leader.epoch, leader.node):
            return
        self._stop_following()
        await self.replicator.promise(leader.epoch)  # before the first ack of that epoch
        self.epoch = leader.epoch
        self._following = (leader.epoch, leader.node)
        self._set_role(FOLLOWER, leader=leader.node)
        host, _, port = self.faults.dial(leader.node, leader.replication).rpartition(":")
        self._follow_scope = scope = trio.CancelScope()
        self._nursery.start_soon(self._follow_stream, scope, leader, (host, int(port or 0)))

    async def _follow_stream(self, scope: trio.CancelScope, leader: LeaderKey, address: tuple[str, int]) -> None:
        from queen.cluster.replication import RestartNeeded, StreamEnded

        with scope:
            try:
                await self.replicator.follow(leader.epoch, leader.node, address)
            except RestartNeeded as ended:
                self._restart_needed(str(ended))
                return
            except StreamEnded as ended:
                logger.info("event=follow_ended leader=%s epoch=%d reason=%r", leader.node, leader.epoch, str(ended))
            except OSError as error:
                logger.info("event=follow_failed leader=%s epoch=%d error=%r", leader.node, leader.epoch, str(error))
            await trio.sleep(self.settings.poll_s)  # then the next poll may follow again
        if self._follow_scope is scope:
            self._following = None
            self._follow_scope = None

    def _stop_following(self) -> None:
        if self._follow_scope is not None:
            self._follow_scope.cancel()
        self._follow_scope = None
        self._following = None

    # -- campaigning and leading ---------------------------------------------------------------------

    async def _campaign(self, observed: Observed, reason: str) -> None:
        settings, keys = self.settings, self.keys
        self._set_role(CANDIDATE, reason=reason)
        # Whoever wins from here has an epoch above this read's revision: promising it stops acks
        # to the old leader without refusing the winner.
        await self.replicator.promise(observed.revision + 1)
        sync = observed.sync
        members = campaign_members(sync, settings.node, settings.sync_mode)
        sync_doc = {"epoch": None, "leader": settings.node, "members": sorted(members),
                    "degraded": len(members) < settings.sync_count}
        leader_doc = {"node": settings.node, "advertise": settings.advertise, "replication": settings.replication}
        guard = e.mod_revision_is(keys.sync, sync.mod_revision) if sync else e.create_revision_is(keys.sync, 0)
        try:
            result = await self.etcd.txn(
                [e.create_revision_is(keys.leader, 0), guard],
                [e.put_op(keys.leader, _json(leader_doc), self.lease), e.put_op(keys.sync, _json(sync_doc)),
                 e.range_op(keys.ceiling)])
        except (EtcdUnavailable, EtcdError) as error:
            logger.info("event=campaign_failed reason=%r", str(error))
            if isinstance(error, EtcdError) and error.code == e.NOT_FOUND:
                self.lease = 0
                await self._ensure_lease()
            self._set_role(FOLLOWER)
            return
        if not result.succeeded:
            self._set_role(FOLLOWER, campaign="lost")
            return
        epoch = result.revision  # the leader key's create_revision
        ceiling = int(result.ranges[0][0].value) if result.ranges and result.ranges[0] else 0
        self.epoch = epoch
        self.sync = SyncKey(epoch, settings.node, members, sync_doc["degraded"], epoch)
        self._health = {}
        self._set_role(PROMOTING, reason=reason)
        self._leading = scope = trio.CancelScope()
        self._nursery.start_soon(self._lead, scope, epoch, ceiling)

    async def _lead(self, scope: trio.CancelScope, epoch: int, etcd_ceiling: int) -> None:
        with scope:
            try:
                await self.replicator.promise(epoch)
                self.ceiling = etcd_ceiling
                await self._reserve_ceiling()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._sync_loop)
                    nursery.start_soon(self._ceiling_loop)
                    await self.replicator.lead(epoch, self.sync.members, version_floor=etcd_ceiling,
                                               grace_ms=self.settings.grace_ms)
                    if self.role == PROMOTING and self.on_leading is not None:
                        await self.on_leading()
                    if self.role == PROMOTING:
                        self.serving = True
                        self._set_role(LEADER)
            except BaseException as raised:  # lead() raises once stepped down meanwhile
                # A step-down (a shutdown's, say) cancels this scope while lead() fails: the loops'
                # nursery then raises both. The cancellation is the scope's; the failure is ours.
                if isinstance(raised, BaseExceptionGroup):
                    cancelled, failed = raised.split(trio.Cancelled)
                elif isinstance(raised, trio.Cancelled):
                    cancelled, failed = raised, None
                else:
                    cancelled, failed = None, raised
                if failed is not None:
                    if not isinstance(failed, Exception):
                        raise
                    self._lead_failed(failed)
                if cancelled is not None:
                    raise cancelled from None

    def _lead_failed(self, raised: Exception) -> None:
        from queen.cluster.replication import RestartNeeded, unwrap

        error = unwrap(raised)  # the loops' nursery wraps what they raise
        if isinstance(error, (EtcdError, LeadershipLost)):
            self.step_down(f"etcd: {error}")
        elif isinstance(error, RestartNeeded):  # it led before in this run: start again first
            self.step_down(f"restart needed: {error}")
            self._restart_needed(str(error))
        elif self.role in (LEADER, PROMOTING):
            logger.error("event=lead_failed error=%r", str(error), exc_info=(type(error), error, error.__traceback__))
            self.step_down(f"lead failed: {error!r}")

    def _restart_needed(self, reason: str) -> None:
        logger.warning("event=restart_needed node=%s reason=%r", self.settings.node, reason)
        self._set_role(STARTING, reason="restart")
        if self.restart is not None:
            self.restart(reason)

    async def resign(self) -> None:
        """At shutdown: stop leading and give up the lease, so a follower takes over at once
        rather than after the lease runs out."""
        self.step_down("shutting_down")
        if self.lease:
            try:
                await self.etcd.lease_revoke(self.lease)
            except (EtcdUnavailable, EtcdError):
                pass
            self.lease = 0
        await self.etcd.aclose()

    async def _release_leader_key(self, leader: LeaderKey) -> None:
        try:
            await self.etcd.txn([e.create_revision_is(self.keys.leader, leader.epoch)], [e.delete_op(self.keys.leader)])
        except (EtcdUnavailable, EtcdError) as error:
            logger.info("event=release_leader_key_failed detail=%r", str(error))
            return
        logger.info("event=leader_key_released epoch=%d", leader.epoch)

    def step_down(self, reason: str) -> None:
        """Stop leading at once (answers not released get 503 leader_lost: outcome unknown)."""
        if self.role not in (LEADER, PROMOTING):
            return
        self.serving = False
        self.replicator.step_down(reason)
        if self._leading is not None:
            self._leading.cancel()
            self._leading = None
        self._set_role(FENCED, reason=reason)

    async def _leadership_txn(self, ops: list[dict]) -> None:
        """ops, only while this node's leader key of this epoch exists; else step down."""
        result = await self.etcd.txn([e.create_revision_is(self.keys.leader, self.epoch)], ops)
        if not result.succeeded:
            self.step_down("leadership_lost")
            raise LeadershipLost(f"the leader key of epoch {self.epoch} is gone")

    async def _reserve_ceiling(self) -> None:
        """Retried while etcd is out of reach: writes past the old ceiling wait meanwhile, and the
        fence loop ends the leadership if etcd stays away."""
        while True:
            try:
                return await self._reserve_ceiling_once()
            except EtcdUnavailable:
                await trio.sleep(self.settings.poll_s)

    async def _reserve_ceiling_once(self) -> None:
        new = next_ceiling(self.ceiling, self.replicator.log_position()[1], self.settings.ceiling_block)
        await self._leadership_txn([e.put_op(self.keys.ceiling, str(new).encode())])
        self.ceiling = new
        # A fresh event first: a batch that runs short after the raise sets the new one.
        self.writer.ceiling_wanted = trio.Event()
        self.writer.ceiling_allowed = new

    async def _ceiling_loop(self) -> None:
        while True:
            await self.writer.ceiling_wanted.wait()
            await self._reserve_ceiling()

    async def _write_sync(self, sync: SyncKey) -> None:
        doc = sync.document()
        await self._leadership_txn([e.put_op(self.keys.sync, _json(doc))])
        self.sync = sync

    async def _sync_loop(self) -> None:
        settings = self.settings
        while True:
            await trio.sleep(settings.poll_s)
            if self._switching:
                continue
            members = self.sync.members
            new = plan_sync(members, self.replicator.followers(), settings.sync_mode, settings.sync_count,
                            self._health, self.clock(), settings.ack_timeout_s)
            if new is None:
                continue
            # etcd first: a member is counted only once etcd lists it (it may then campaign), and
            # dropped from etcd before any answer is released without its ack.
            try:
                await self._write_sync(replace(self.sync, epoch=self.epoch, members=new,
                                               degraded=len(new) < settings.sync_count))
            except EtcdUnavailable:
                continue  # answers wait meanwhile; the fence loop ends this if etcd stays away
            self.replicator.set_sync(new)
            logger.info("event=sync_set_changed members=%s was=%s degraded=%s", ",".join(sorted(new)) or "-",
                        ",".join(sorted(members)) or "-", "true" if self.sync.degraded else "false")
            self.events.append((self.clock(), "sync", {"members": sorted(new), "was": sorted(members)}))

    # -- the lease -----------------------------------------------------------------------------------

    async def _keepalive_loop(self) -> None:
        settings = self.settings
        while True:
            await trio.sleep(settings.keepalive_every_s)
            if self.keepalive_paused:
                continue
            sent = self.clock()
            try:
                if not self.lease:
                    self.lease = await self.etcd.lease_grant(math.ceil(settings.leader_ttl_s))
                    self.lease_renewed_at = sent
                    continue
                ttl = await self.etcd.lease_keepalive(self.lease)
            except (EtcdUnavailable, EtcdError) as error:
                logger.debug("event=keepalive_failed detail=%r", str(error))
                continue
            if ttl > 0:
                self.lease_renewed_at = sent
            else:
                self.lease = 0
                self.step_down("lease_expired")

    async def _fence_loop(self) -> None:
        settings = self.settings
        while True:
            now = self.clock()
            if self.role in (LEADER, PROMOTING) and not self.faults.no_self_fence and fence_due(self.lease_renewed_at, now, settings.leader_ttl_s,
                                                               settings.fence_margin_s):
                self.step_down("etcd_unreachable")
            await trio.sleep(min(settings.poll_s, settings.fence_margin_s / 4))

    async def _members_loop(self) -> None:
        while True:
            if self.lease and not self.keepalive_paused:
                doc = {"advertise": self.settings.advertise, "replication": self.settings.replication,
                       "role": self.role, "epoch": self.epoch, "lastVersion": self.replicator.log_position()[1]}
                if self.role == LEADER:
                    doc["syncUnavailable"] = self.replicator.sync_unavailable
                try:
                    await self.etcd.put(self.keys.member(self.settings.node), _json(doc), self.lease)
                except (EtcdUnavailable, EtcdError):
                    pass
            await trio.sleep(self.settings.members_every_s)

    # -- operator actions ----------------------------------------------------------------------------

    async def switchover(self, to: str | None = None, wait_s: float | None = None) -> dict:
        """Hand leadership to `to` (default: the most caught-up follower): list it in sync if it is
        not, stop answering, let it ack what was shipped, then give up the leader key. It
        campaigns at once (sync.handoff)."""
        if self.role != LEADER or not self.serving:
            raise NotPossible(f"this node is {self.role}, not the serving leader")
        if self._switching:
            raise NotPossible("a switchover is already under way")
        settings = self.settings
        wait_s = settings.leader_ttl_s if wait_s is None else wait_s
        followers = {f.node: f for f in self.replicator.followers() if f.connected}
        if to is None:
            candidates = sorted(followers.values(), key=lambda f: (-f.acked_version, f.node not in self.sync.members))
            if not candidates:
                raise NotPossible("no connected follower to hand over to")
            to = candidates[0].node
        if to == settings.node:
            raise NotPossible(f"{to} already leads")
        if to not in followers:
            raise NotPossible(f"{to} is not a connected follower of this leader")
        self._switching = True
        try:
            return await self._hand_over(to, followers, wait_s)
        except (EtcdUnavailable, EtcdError, LeadershipLost) as error:
            raise NotPossible(f"switchover failed: {error}") from None
        finally:
            self._switching = False

    async def _hand_over(self, to: str, followers: dict, wait_s: float) -> dict:
        settings = self.settings
        deadline = self.clock() + wait_s
        # Caught up before it may be listed: to where this log stood when the hand-off began. Lag 0
        # at one instant is no goal under steady writes (each new frame reopens it: the wait could
        # run out with the follower one frame behind all along); what it has not acked since is
        # shipped to it, and acked before the leader key goes (below).
        goal = followers[to].acked_version + followers[to].lag_versions  # this log's last durable version
        while followers[to].acked_version < goal:
            if self.clock() >= deadline:
                raise NotPossible(f"{to} did not catch up within {wait_s} s")
            await trio.sleep(0.02)
            followers = {f.node: f for f in self.replicator.followers()}
        members = self.sync.members | {to}
        await self._write_sync(replace(self.sync, epoch=self.epoch, members=members,
                                       degraded=len(members) < settings.sync_count, handoff=to))
        self.replicator.set_sync(members)
        epoch, last = self.epoch, self.replicator.log_position()[1]
        self.step_down(f"switchover to {to}")
        deadline = self.clock() + min(1.0, wait_s)
        while self.clock() < deadline:  # what was shipped before stepping down, acked
            status = {f.node: f for f in self.replicator.followers()}.get(to)
            if status is None or status.acked_version >= last:
                break
            await trio.sleep(0.01)
        await self.etcd.lease_revoke(self.lease)  # the leader key goes with it
        self.lease = 0
        self.lease_renewed_at = -math.inf
        await self._ensure_lease()
        self.events.append((self.clock(), "switchover", {"to": to, "epoch": epoch}))
        return {"from": settings.node, "to": to, "epoch": epoch, "lastVersion": last}

    async def force_promote(self, node: str) -> dict:
        """Operator: make `node` the only sync member of a new sync epoch and drop the leader key,
        so `node` campaigns at once. Possibly lossy: what the old leader acknowledged and `node`
        never received is gone; the answer says how much that may be (from members/ documents)."""
        observed = await self.observe()
        info = {**self.members_seen, **observed.members}
        if node not in observed.members:
            raise NotPossible(f"{node} is not a live member of cluster {self.settings.cluster} (no members/{node} in etcd)")
        old_leader = observed.leader.node if observed.leader else (observed.sync.leader if observed.sync else None)
        keys = self.keys
        doc = {"epoch": None, "leader": node, "members": [node], "degraded": False, "forced": node}
        guard = (e.mod_revision_is(keys.sync, observed.sync.mod_revision) if observed.sync
                 else e.create_revision_is(keys.sync, 0))
        result = await self.etcd.txn([guard], [e.delete_op(keys.leader), e.put_op(keys.sync, _json(doc))])
        if not result.succeeded:
            raise NotPossible("the sync key changed meanwhile; look again and retry")
        # The node's own log when it is this one (exact); another's from its members/ document.
        node_last = (self.replicator.log_position()[1] if node == self.settings.node
                     else info.get(node, {}).get("lastVersion"))
        old_last = info.get(old_leader, {}).get("lastVersion") if old_leader else None
        report = {"node": node, "syncEpoch": result.revision, "oldLeader": old_leader, "nodeLastVersion": node_last,
                  "oldLeaderLastVersion": old_last, "mayBeLost": lost_estimate(node_last, old_last),
                  "note": "writes the old leader acknowledged above nodeLastVersion are lost; "
                          "oldLeaderLastVersion is what it last announced in etcd, at most a second old"}
        logger.warning("event=force_promote node=%s old_leader=%s node_last_version=%s old_leader_last_version=%s",
                       node, old_leader, node_last, old_last)
        self.events.append((self.clock(), "force_promote", report))
        return report


def _json(document: dict) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()
