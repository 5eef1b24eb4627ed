"""The coordinator: its pure decisions, then several coordinators with fake replicators against a
real single-member etcd (T_l = 2 s real time; conditions polled with deadlines)."""

from __future__ import annotations

import math
import sys

import pytest
import trio

from queen.cluster import coordinator as c
from queen.cluster.coordinator import (
    Coordinator,
    LeaderKey,
    MemberHealth,
    NotPossible,
    Observed,
    Settings,
    SyncKey,
)
from queen.cluster.etcd import EtcdClient, EtcdUnavailable
from tests.cluster.etcd_single import etcd  # noqa: F401 - the fixture
from tests.cluster.fake_replication import FakeNet, FakeReplicator, FakeWriter, FollowerStatus

TTL = 2.0


# -- pure decisions --------------------------------------------------------------------------------

def _sync(members=("b",), epoch=10, leader="a", **more) -> SyncKey:
    return SyncKey(epoch, leader, frozenset(members), False, epoch, **more)


def _observed(leader=None, sync=None) -> Observed:
    return Observed(20, leader, sync, 0)


def test_campaign_rules():
    lead = LeaderKey("a", "http://a", "a:1", 10, 7)
    reason = c.campaign_reason
    assert reason(_observed(lead, _sync()), "b", 10, -math.inf, 100.0, TTL) is None  # a leader exists
    assert reason(_observed(None, None), "x", 0, 99.9, 100.0, TTL) == "bootstrap"
    assert reason(_observed(None, _sync()), "b", 10, 50.0, 100.0, TTL) == "failover"
    assert reason(_observed(None, _sync()), "b", 10, 99.0, 100.0, TTL) is None  # heard a leader recently
    assert reason(_observed(None, _sync()), "b", 9, 50.0, 100.0, TTL) is None  # did not promise the sync epoch
    assert reason(_observed(None, _sync()), "c", 10, 50.0, 100.0, TTL) is None  # not a sync member
    assert reason(_observed(None, _sync()), "a", 10, 50.0, 100.0, TTL) is None  # the old leader, members exist
    assert reason(_observed(None, _sync(members=())), "a", 10, 50.0, 100.0, TTL) == "failover"  # degraded: only it
    assert reason(_observed(None, _sync(members=())), "b", 10, 50.0, 100.0, TTL) is None
    assert reason(_observed(None, _sync(handoff="b")), "b", 10, 99.9, 100.0, TTL) == "handoff"  # at once
    assert reason(_observed(None, _sync(forced="c")), "c", 0, 99.9, 100.0, TTL) == "forced"
    assert reason(_observed(None, _sync(forced="c")), "b", 10, 0.0, 100.0, TTL) is None


def test_follow_and_leadership_checks():
    lead = LeaderKey("a", "http://a", "a:1", 10, 7)
    assert c.follow_target(_observed(lead, _sync()), "b") == lead
    assert c.follow_target(_observed(lead, _sync()), "a") is None
    assert c.follow_target(_observed(lead, _sync(epoch=9)), "b") is None  # etcd does not confirm its epoch
    assert c.leadership_lost(_observed(lead, _sync()), "a", 10) is None
    assert c.leadership_lost(_observed(None, _sync()), "a", 10) == "leader_key_gone"
    assert c.leadership_lost(_observed(LeaderKey("b", "", "", 12, 1), _sync()), "a", 10) == "another_leader"
    assert c.leadership_lost(_observed(lead, _sync(epoch=11)), "a", 10) == "newer_epoch"


def test_fence_is_due_before_the_lease_can_expire():
    assert not c.fence_due(100.0, 101.4, 2.0, 0.5)
    assert c.fence_due(100.0, 101.5, 2.0, 0.5)
    settings = Settings("t", "a", "http://a", "a:1", leader_ttl_s=2.0)
    assert 0 < settings.fence_margin_s < 2.0 and settings.grace_ms == 2000


def test_a_lease_is_fresh_enough_to_campaign_on_until_the_fence_is_due_by_the_next_keepalive():
    assert c.lease_fresh(100.0, 101.0, 2.0, 0.5, 0.4)
    assert not c.lease_fresh(100.0, 101.1, 2.0, 0.5, 0.4)  # the fence is due at 101.5, before a keepalive at 101.5
    assert not c.lease_fresh(-math.inf, 100.0, 2.0, 0.5, 0.4)  # never renewed
    settings = Settings("t", "a", "http://a", "a:1", leader_ttl_s=2.0)
    assert settings.keepalive_every_s == 0.4


def test_campaign_members():
    assert c.campaign_members(None, "a", c.STRICT) == frozenset()
    assert c.campaign_members(_sync(("b", "c")), "b", c.STRICT) == {"c"}
    assert c.campaign_members(_sync(("b",)), "b", c.STRICT) == {"a"}  # nobody else: the old leader stays listed
    assert c.campaign_members(_sync(("b",)), "b", c.DEGRADE) == frozenset()
    assert c.campaign_members(_sync(("c",), forced="c"), "c", c.STRICT) == frozenset()


def _status(node, acked, lag, connected=True, caught_up=None):
    return FollowerStatus(node, connected, acked, lag, lag == 0 if caught_up is None else caught_up)


def test_plan_sync_adds_caught_up_followers_up_to_the_count():
    health = {}
    assert c.plan_sync(frozenset(), [_status("b", 5, 2)], c.STRICT, 1, health, 0.0, 1.0) is None  # lagging
    assert c.plan_sync(frozenset(), [_status("c", 7, 0), _status("b", 7, 0)], c.STRICT, 1, health, 0.0, 1.0) == {"b"}
    assert c.plan_sync(frozenset({"b"}), [_status("b", 7, 0), _status("c", 7, 0)], c.DEGRADE, 1, health, 0.0,
                       1.0) is None


def test_plan_sync_degrade_drops_a_failed_member_after_the_ack_timeout():
    health: dict[str, MemberHealth] = {}
    members = frozenset({"b"})
    assert c.plan_sync(members, [_status("b", 5, 3, connected=False)], c.DEGRADE, 1, health, 10.0, 1.0) is None
    assert c.plan_sync(members, [], c.DEGRADE, 1, health, 10.9, 1.0) is None
    assert c.plan_sync(members, [], c.DEGRADE, 1, health, 11.0, 1.0) == frozenset()
    # a member that lags but keeps acking new versions is not failed
    health = {}
    for step in range(5):
        assert c.plan_sync(members, [_status("b", 10 + step, 3)], c.DEGRADE, 1, health, 10.0 + step, 1.0) is None


def test_plan_sync_strict_swaps_only_for_a_caught_up_follower():
    health: dict[str, MemberHealth] = {}
    members = frozenset({"b"})
    lagging_c = [_status("c", 3, 4)]
    assert c.plan_sync(members, lagging_c, c.STRICT, 1, health, 0.0, 1.0) is None
    assert c.plan_sync(members, lagging_c, c.STRICT, 1, health, 5.0, 1.0) is None  # stalls: nobody to swap in
    assert c.plan_sync(members, [_status("c", 7, 0)], c.STRICT, 1, health, 6.0, 1.0) == {"c"}


def test_plan_sync_adds_a_follower_that_reached_where_the_log_stood_when_its_stream_began_though_it_lags():
    # Under steady writes a live follower is always a frame or two behind at a poll: lag 0 never
    # comes, and it must join anyway once it holds what the log held when its stream began.
    health = {}
    assert c.plan_sync(frozenset(), [_status("b", 900, 3, caught_up=True)], c.STRICT, 1, health, 0.0, 1.0) == {"b"}
    assert c.plan_sync(frozenset(), [_status("b", 900, 3, caught_up=False)], c.STRICT, 1, health, 0.0, 1.0) is None
    assert c.plan_sync(frozenset(), [_status("b", 900, 0, caught_up=False)], c.STRICT, 1, health, 0.0, 1.0) is None
    assert c.plan_sync(frozenset({"b"}), [_status("b", 5, 3, connected=False), _status("c", 900, 2, caught_up=True)],
                       c.STRICT, 1, health, 0.0, 1.0) == {"c"}  # strict swaps in the caught-up one at once


def test_ceiling_and_loss_estimate():
    assert c.next_ceiling(100, 40, 50) == 150
    assert c.next_ceiling(100, 140, 50) == 190
    assert c.lost_estimate(90, 100) == 10 and c.lost_estimate(100, 90) == 0 and c.lost_estimate(None, 5) is None


# -- coordinators against etcd -------------------------------------------------------------------------

class Node:
    def __init__(self, net: FakeNet, etcd_url: str, name: str, mode: str = c.STRICT, block: int = 1 << 20):
        self.writer = FakeWriter()
        self.replicator = FakeReplicator(net, name, self.writer)
        settings = Settings("t", name, f"http://{name}.test:6632", f"{name}.test:6642", leader_ttl_s=TTL,
                            sync_mode=mode, poll_s=0.1, ceiling_block=block, members_every_s=0.3)
        self.etcd = EtcdClient([etcd_url], timeout_s=0.5)
        self.coordinator = Coordinator(settings, self.etcd, self.replicator, self.writer)
        self.scope = trio.CancelScope()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED):
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.coordinator.run)
                    nursery.start_soon(self.replicator.write_forever)
                    task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await self.etcd.aclose()

    def kill(self):
        """The process dies: its replicator stops answering, its coordinator stops."""
        self.replicator.alive = False
        self.replicator.serving = False
        self.scope.cancel()


async def until(condition, timeout_s: float = 15.0, what: str = ""):
    with trio.fail_after(timeout_s):
        while not condition():
            await trio.sleep(0.02)


def leaders(nodes):
    return [n for n in nodes if n.coordinator.role == c.LEADER and n.replicator.alive]


async def start(nursery, net, etcd_url, names, **kw):
    nodes = [Node(net, etcd_url, name, **kw) for name in names]
    for node in nodes:
        await nursery.start(node.run)
    return nodes


async def settled(nodes, sync_size=1):
    """One serving leader with sync_size members, everyone else following it."""
    await until(lambda: len(leaders(nodes)) == 1 and len(leaders(nodes)[0].coordinator.sync.members) == sync_size
                and all(n.coordinator.role == c.FOLLOWER and n.coordinator.epoch == leaders(nodes)[0].coordinator.epoch
                        for n in nodes if n not in leaders(nodes) and n.replicator.alive))
    return leaders(nodes)[0]


async def test_three_nodes_elect_exactly_one_leader(etcd):  # noqa: F811
    net = FakeNet()
    async with trio.open_nursery() as nursery:
        nodes = await start(nursery, net, etcd.url, ["a", "b", "c"])
        leader = await settled(nodes)
        coordinator = leader.coordinator
        assert leader.replicator.lead_calls[0][0] == coordinator.epoch > 0
        # the sync key in etcd lists the member the leader counts
        observed = await coordinator.observe()
        assert observed.leader.node == leader.replicator.node and observed.leader.epoch == coordinator.epoch
        assert observed.sync.members == coordinator.sync.members == leader.replicator.sync
        assert observed.sync.epoch == coordinator.epoch
        assert observed.ceiling == coordinator.ceiling == leader.writer.ceiling_allowed
        await until(lambda: len(coordinator.observed.members) == 3)
        for _ in range(3):  # stays so, through several renewals of the leader's lease
            renewed = coordinator.lease_renewed_at
            await until(lambda renewed=renewed: coordinator.lease_renewed_at > renewed)
            assert len(leaders(nodes)) == 1
        status = coordinator.status()
        assert status["role"] == "leader" and status["sync"] == sorted(coordinator.sync.members)
        assert {f["node"] for f in status["followers"]} == {n.replicator.node for n in nodes} - {leader.replicator.node}
        nursery.cancel_scope.cancel()


async def test_a_lapsed_lease_elects_a_sync_member_and_the_old_leader_fences_first(etcd):  # noqa: F811
    net = FakeNet()
    async with trio.open_nursery() as nursery:
        nodes = await start(nursery, net, etcd.url, ["a", "b", "c"])
        old = await settled(nodes)
        epoch = old.coordinator.epoch
        [member] = old.coordinator.sync.members
        outsider = next(n for n in nodes if n.replicator.node not in (member, old.replicator.node))
        seen_before = len(outsider.coordinator.events)  # a bootstrap race may have made it a candidate
        old.coordinator.keepalive_paused = True
        renewed_at = old.coordinator.lease_renewed_at
        await until(lambda: old.coordinator.role == c.FENCED)
        fenced_at = old.coordinator.events[-1][0]
        assert fenced_at < renewed_at + TTL  # before etcd could have dropped its key
        assert old.replicator.stepped_down == ["etcd_unreachable"]
        await until(lambda: any(n.coordinator.role == c.LEADER and n.coordinator.epoch > epoch for n in nodes))
        [new] = [n for n in nodes if n.coordinator.role == c.LEADER]
        assert new.replicator.node == member
        assert all(role != c.CANDIDATE for _, role, _ in list(outsider.coordinator.events)[seen_before:]), [  # never campaigned
            (n.replicator.node, n.coordinator.events) for n in nodes]
        assert new.coordinator.epoch > epoch
        old.coordinator.keepalive_paused = False
        await settled(nodes)  # the old leader follows the new one
        assert old.coordinator.epoch == new.coordinator.epoch
        nursery.cancel_scope.cancel()


async def test_a_node_whose_keepalives_went_unanswered_waits_for_one_before_campaigning(etcd):  # noqa: F811
    """etcd without quorum (N5): keepalives time out, yet their lease may live on (etcd extends
    leases when it elects a leader again). A sync member that then finds no leader key must not
    campaign on that lease: it would win an epoch its own fence ends at once. It campaigns once a
    keepalive is answered."""
    net = FakeNet()
    async with trio.open_nursery() as nursery:
        nodes = await start(nursery, net, etcd.url, ["a", "b", "c"])
        old = await settled(nodes)
        [member] = old.coordinator.sync.members
        heir = next(n for n in nodes if n.replicator.node == member)
        keepalive = heir.etcd.lease_keepalive

        async def answer_lost(lease):
            await keepalive(lease)  # etcd renews the lease; the answer never comes back
            raise EtcdUnavailable("no answer in time")

        heir.etcd.lease_keepalive = answer_lost
        seen_before = len(heir.coordinator.events)
        old.kill()

        def may_campaign_but_for_the_lease():
            observed, replicator = heir.coordinator.observed, heir.replicator
            return observed.leader is None and c.campaign_reason(
                observed, member, replicator.promised_epoch, replicator.leader_heard_at, trio.current_time(),
                TTL) == "failover"

        await until(may_campaign_but_for_the_lease)
        for _ in range(3):  # three more polls that found no leader key
            polled = heir.coordinator.observed
            await until(lambda polled=polled: heir.coordinator.observed is not polled)
        roles = [role for _, role, _ in list(heir.coordinator.events)[seen_before:]]
        assert c.CANDIDATE not in roles and heir.replicator.stepped_down == [], roles
        heir.etcd.lease_keepalive = keepalive  # answered again
        await until(lambda: heir.coordinator.role == c.LEADER)
        assert heir.replicator.stepped_down == []  # led, and was not fenced on the way
        nursery.cancel_scope.cancel()


async def test_switchover_hands_over_within_a_second(etcd):  # noqa: F811
    net = FakeNet()
    async with trio.open_nursery() as nursery:
        nodes = await start(nursery, net, etcd.url, ["a", "b", "c"])
        old = await settled(nodes)
        epoch = old.coordinator.epoch
        target = next(n for n in nodes if n is not old and n.replicator.node not in old.coordinator.sync.members)
        started = trio.current_time()
        report = await old.coordinator.switchover(target.replicator.node)
        assert report["to"] == target.replicator.node and report["epoch"] == epoch
        await until(lambda: target.coordinator.role == c.LEADER, 5.0)
        took = trio.current_time() - started
        # A measurement, not an assertion (timing goals live in the suite's C8 report): the aim is
        # < 1 s; a loaded machine took 1.58 s once. `until` bounds it at 5 s.
        print(f"switchover took {took:.3f} s", file=sys.stderr)
        assert target.coordinator.epoch > epoch
        assert old.replicator.stepped_down and old.coordinator.role in (c.FENCED, c.FOLLOWER)
        await settled(nodes)
        with pytest.raises(NotPossible):
            await old.coordinator.switchover()  # no longer the leader
        nursery.cancel_scope.cancel()


async def test_force_promote_an_async_follower_reports_what_may_be_lost(etcd):  # noqa: F811
    net = FakeNet()
    async with trio.open_nursery() as nursery:
        nodes = await start(nursery, net, etcd.url, ["a", "b", "c"])
        old = await settled(nodes)
        epoch = old.coordinator.epoch
        [member] = old.coordinator.sync.members
        sync_node = next(n for n in nodes if n.replicator.node == member)
        target = next(n for n in nodes if n not in (old, sync_node))
        net.deaf.add(target.replicator.node)  # it falls behind
        await until(lambda: old.replicator.last_version > target.replicator.last_version + 20)
        # The report reads the gap from members/ documents: wait until the target has seen one carry it.
        await until(lambda: target.coordinator.members_seen.get(old.replicator.node, {}).get("lastVersion", 0)
                    > target.replicator.last_version + 20)
        old.kill()
        sync_node.kill()  # every sync member lost: only an operator can go on
        report = await target.coordinator.force_promote(target.replicator.node)
        assert report["node"] == target.replicator.node and report["oldLeader"] == old.replicator.node
        assert report["mayBeLost"] > 0
        assert report["nodeLastVersion"] == target.replicator.log_position()[1]  # asked of itself: its own log
        assert report["oldLeaderLastVersion"] - report["nodeLastVersion"] == report["mayBeLost"]
        await until(lambda: target.coordinator.role == c.LEADER)
        assert target.coordinator.epoch > report["syncEpoch"] > epoch
        # versions still never repeat: the new leader starts above the ceiling the old one had
        assert target.replicator.lead_calls[-1][2] >= old.coordinator.ceiling
        with pytest.raises(NotPossible):
            await target.coordinator.force_promote("nobody")
        nursery.cancel_scope.cancel()


async def test_epochs_rise_and_no_version_is_handed_out_twice_across_failovers(etcd):  # noqa: F811
    net = FakeNet()
    async with trio.open_nursery() as nursery:
        nodes = await start(nursery, net, etcd.url, ["a", "b", "c"], block=64)  # many small reservations
        epochs = []
        for _ in range(2):
            alive = [n for n in nodes if n.replicator.alive]
            leader = await settled(alive)
            epochs.append(leader.coordinator.epoch)
            await until(lambda leader=leader: leader.coordinator.ceiling > 200)  # several blocks reserved and used
            # the followers stop receiving: the leader's last versions exist only on it
            net.deaf.update(n.replicator.node for n in alive if n is not leader)
            start_at = leader.replicator.last_version
            await until(lambda leader=leader, start_at=start_at: leader.replicator.last_version > start_at + 10)
            leader.kill()
            net.deaf.clear()
            if len(alive) == 2:
                break
            # the surviving sync member takes over
            await until(lambda: any(n.coordinator.role == c.LEADER for n in nodes if n.replicator.alive))
        versions = [v for v, _, _ in net.handed]
        assert len(versions) == len(set(versions)), "a version was handed out twice"
        by_epoch: dict[int, list[int]] = {}
        for version, epoch, _ in net.handed:
            by_epoch.setdefault(epoch, []).append(version)
        ordered = sorted(by_epoch)
        for before, after in zip(ordered, ordered[1:], strict=False):
            assert max(by_epoch[before]) < min(by_epoch[after])
        assert epochs == sorted(set(epochs)) and len(epochs) == 2
        nursery.cancel_scope.cancel()


async def test_etcd_down_makes_the_leader_fence_itself(etcd):  # noqa: F811
    net = FakeNet()
    async with trio.open_nursery() as nursery:
        nodes = await start(nursery, net, etcd.url, ["a", "b"], mode=c.DEGRADE)
        leader = await settled(nodes)
        etcd.stop()
        renewed_at = leader.coordinator.lease_renewed_at
        await until(lambda: leader.coordinator.role == c.FENCED, 10.0)
        assert leader.coordinator.events[-1][0] < renewed_at + TTL
        assert leader.replicator.stepped_down == ["etcd_unreachable"]
        assert not any(n.coordinator.role == c.LEADER for n in nodes)
        nursery.cancel_scope.cancel()


async def test_degrade_mode_drops_a_dead_member_before_answering_without_it(etcd):  # noqa: F811
    net = FakeNet()
    async with trio.open_nursery() as nursery:
        nodes = await start(nursery, net, etcd.url, ["a", "b"], mode=c.DEGRADE)
        leader = await settled(nodes)
        [member] = leader.coordinator.sync.members
        follower = next(n for n in nodes if n is not leader)
        follower.kill()
        await until(lambda: not leader.replicator.sync)
        observed = await leader.coordinator.observe()
        assert observed.sync.members == frozenset() and observed.sync.degraded
        _, what, details = next(ev for ev in reversed(leader.coordinator.events) if ev[1] == "sync")
        assert details == {"members": [], "was": [member]}
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("mode", [c.STRICT, c.DEGRADE])
async def test_a_leader_is_degraded_until_its_sync_set_is_full(etcd, mode):  # noqa: F811
    net = FakeNet()
    async with trio.open_nursery() as nursery:
        [a] = await start(nursery, net, etcd.url, ["a"], mode=mode)
        await until(lambda: a.coordinator.role == c.LEADER and a.coordinator.serving)
        # Bootstrap: nobody to copy to, so answers rest on the leader's disk alone: it says so.
        assert a.coordinator.status()["degraded"] is True and a.coordinator.sync.members == frozenset()
        assert (await a.coordinator.observe()).sync.degraded
        [b] = await start(nursery, net, etcd.url, ["b"], mode=mode)
        await until(lambda: a.coordinator.sync.members == {"b"})
        assert a.coordinator.status()["degraded"] is False and not (await a.coordinator.observe()).sync.degraded
        await until(lambda: b.coordinator.status()["degraded"] is False)  # a follower shows what etcd says
        nursery.cancel_scope.cancel()


async def test_every_node_shows_when_the_leaders_sync_set_is_out_of_reach(etcd):  # noqa: F811
    net = FakeNet()
    async with trio.open_nursery() as nursery:
        nodes = await start(nursery, net, etcd.url, ["a", "b"])
        leader = await settled(nodes)
        follower = next(n for n in nodes if n is not leader)
        assert follower.coordinator.status()["syncUnavailable"] is False
        leader.replicator.sync_unavailable = True  # what the real replicator says past --sync-timeout
        assert leader.coordinator.status()["syncUnavailable"] is True
        # The leader announces it in its members/ document; the follower reads it at its next poll.
        await until(lambda: follower.coordinator.status()["syncUnavailable"] is True)
        leader.replicator.sync_unavailable = False
        await until(lambda: follower.coordinator.status()["syncUnavailable"] is False)
        nursery.cancel_scope.cancel()
