"""A Hypothesis stateful test of the queue core: random pushes, pops (grouped, wildcard and by
partition, batched, auto-acked), acks of every status, extends, releases, requeues, purges, group
deletions and time passing, checked after every step against what the queues promise:

- a message completed for a group is never delivered to that group again;
- a partition is leased to at most one live lease per group, and a pop delivers each partition's
  messages in offset order, never past an unresolved one;
- a delivery's retryCount is the number of earlier deliveries that ended without completion;
- a message failed by an ack is not delivered to that group again before the retry backoff
  (retryDelayMs, doubled for each earlier failure, at most retryDelayMaxMs) has passed;
- every message pushed is eventually accounted for: delivered, in a DLQ, or still waiting;
- replaying the records and loading a snapshot both rebuild the same queues.
"""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from queen.core import records as rec
from queen.core.state import State
from tests.core.queue_harness import T0, Queues, dlq, info, partitions, wire

GROUPS = st.sampled_from(["__QUEUE_MODE__", "g2"])
# A backoff short next to the steps' times (0-7 s), so messages are sometimes held back and
# sometimes not, and replay and snapshots must hold them back alike.
RETRY_DELAY_MS, RETRY_DELAY_MAX_MS = 300, 1_000
PARTITIONS = st.sampled_from(["p0", "p1", "p2"])


class QueueModel(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.q = Queues()
        self.q.configure(leaseTimeSeconds=5, retryLimit=2, retryDelayMs=RETRY_DELAY_MS, retryDelayMaxMs=RETRY_DELAY_MAX_MS)
        self.held = []  # (group, message) delivered under a lease, not yet acked by us
        self.completed = {}  # (group, messageId) -> True once an ack answered success (not already)
        self.ended_without_completion = {}  # (group, messageId) -> count
        self.pushed = set()
        self.last_offset = {}  # (group, partitionId) -> highest offset delivered in the current lease run
        self.not_before = {}  # (group, messageId) -> when a failed ack lets it be delivered again

    # -- actions -----------------------------------------------------------------------------------

    @rule(partition=PARTITIONS, count=st.integers(1, 3), tid=st.sampled_from([None, "t1", "t2"]))
    def push(self, partition, count, tid):
        items = [{"payload": n, **({"transactionId": tid} if tid else {})} for n in range(count)]
        for result in self.q.push(*items, partition=partition):
            assert result["status"] in ("queued", "duplicate")
            self.pushed.add(result["messageId"])

    @rule(group=GROUPS, batch=st.integers(1, 4), partitions=st.integers(1, 3), auto=st.booleans(),
          partition=st.one_of(st.none(), PARTITIONS))
    def pop(self, group, batch, partitions, auto, partition):
        answer = self.q.pop(partition=partition, consumerGroup=group, batch=batch, partitions=partitions, autoAck=auto)
        if not answer["success"]:
            assert answer["reason"] in ("empty", "lease_held")
            return
        by_partition = {}
        for m in answer["messages"]:
            key = (group, m["messageId"])
            assert key not in self.completed, f"completed message {m['messageId']} delivered again to {group}"
            assert m["retryCount"] == self.ended_without_completion.get(key, 0), m
            assert self.q.now >= self.not_before.get(key, 0), f"{m['messageId']} delivered before its retry time"
            by_partition.setdefault(m["partitionId"], []).append(m["offset"])
            if auto:
                self.completed[key] = True
            else:
                self.held.append((group, m))
        for offsets in by_partition.values():
            assert offsets == sorted(offsets)

    @rule(data=st.data(), status=st.sampled_from(["completed", "completed", "failed", "dlq"]))
    def ack(self, data, status):
        if not self.held:
            return
        group, message = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        result = self.q.ack(message, status=status)
        key = (group, message["messageId"])
        if not result["success"]:
            assert result["reason"] == "lease_lost"
            return
        if result.get("already"):
            assert key in self.completed
            return
        if status == "completed":
            self.completed[key] = True
        else:
            self.ended_without_completion[key] = self.ended_without_completion.get(key, 0) + 1
            if status == "failed":
                count = self.ended_without_completion[key]
                self.not_before[key] = self.q.now + min(RETRY_DELAY_MS * 2 ** (count - 1), RETRY_DELAY_MAX_MS)
            # the lease ended on that partition: its other messages there return, unchanged
            self.held = [(g, m) for g, m in self.held
                         if not (g == group and m["leaseId"] == message["leaseId"] and m["partitionId"] == message["partitionId"])]
            if result["dlq"]:
                self.completed[key] = True  # resolved: never delivered again (unless requeued)

    @rule(data=st.data(), release=st.booleans())
    def extend_or_release(self, data, release):
        if not self.held:
            return
        group, message = self.held[data.draw(st.integers(0, len(self.held) - 1))]
        if release:
            if self.q.release(message["leaseId"])["success"]:
                self.held = [(g, m) for g, m in self.held if m["leaseId"] != message["leaseId"]]
        else:
            self.q.extend(message["leaseId"], 5)

    @rule(ms=st.integers(0, 7_000))
    def time_passes(self, ms):
        before = self.q.now
        self.q.tick(ms)
        expired = [(g, m) for g, m in self.held if not self._lease_live(g, m, before + ms)]
        for group, message in expired:
            key = (group, message["messageId"])
            self.ended_without_completion[key] = self.ended_without_completion.get(key, 0) + 1
            if self.ended_without_completion[key] > 2:
                self.completed[key] = True  # moved to the DLQ past retryLimit 2
        self.held = [(g, m) for g, m in self.held if (g, m) not in expired]

    def _lease_live(self, group, message, now):
        for item in self.q.state.shards[0].queues.leases.values():
            if item[2].lease_id == message["leaseId"]:
                return item[2].expires_at_ms > now and message["offset"] in item[2].held.get(message["partitionId"], ())
        return False

    @rule(group=GROUPS)
    def purge(self, group):
        self.q.admin("purge", group=group)

    # -- checks --------------------------------------------------------------------------------------

    @invariant()
    def one_live_lease_per_partition_and_group(self):
        table = self.q.state.shards[0].queues
        for queue in table.queues.values():
            for partition in queue.partitions.values():
                for name, state in partition.groups.items():
                    holders = [lease for _, group, lease in table.leases.values()
                               if group.name == name and partition.id in lease.held and lease.expires_at_ms > self.q.now]
                    assert len(holders) <= 1
                    if holders:
                        assert state.lease is holders[0]

    @invariant()
    def replay_and_snapshot_rebuild_the_same_queues(self):
        live = self.q.state.shards[0].queues
        views = wire((info(live, "orders", self.q.now), partitions(live, "orders", None, "", None, 100, self.q.now),
                      dlq(live, "orders", None, None, None, 0, 1000)))
        replayed = self.q.replayed().shards[0].queues
        assert wire((info(replayed, "orders", self.q.now),
                     partitions(replayed, "orders", None, "", None, 100, self.q.now),
                     dlq(replayed, "orders", None, None, None, 0, 1000))) == views
        copy = State(1, T0)
        for record in rec.decode(self.q.state.snapshot_capture()()["queues"]):
            copy.replay(record)
        restored = copy.shards[0].queues
        assert wire((info(restored, "orders", self.q.now),
                     partitions(restored, "orders", None, "", None, 100, self.q.now),
                     dlq(restored, "orders", None, None, None, 0, 1000))) == views


TestQueueModel = QueueModel.TestCase
TestQueueModel.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
