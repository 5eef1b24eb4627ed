"""Placement: stable across runs and builds (a data directory replays onto the same shards), every
slot of a lock on its name's shard, everything of a queue on its queue's shard, unknown ids on 0."""

from queen.core.placement import (
    shard_of,
    shard_of_lease,
    shard_of_lock,
    shard_of_partition,
    shard_of_queue,
)
from queen.core.queues import Shared


def test_the_hash_is_stable_across_runs_and_builds():
    # crc32, not the salted hash(): these values must never change, or a restart with the same shard
    # count would look for rows on other shards than their actors own.
    assert [shard_of("app", "k", 8), shard_of("app", "customer-42", 8), shard_of_queue("orders", 8)] == [4, 4, 6]
    assert shard_of_lock("queen-locks", "billing", 8) == 6


def test_every_slot_of_a_lock_lives_on_its_name_s_shard_in_every_tenant():
    for ns in ("queen-locks", "acme\x1fqueen-locks"):
        for count in (1, 2, 3, 8, 16):
            for name in ("billing", "é", "x" * 200):  # a name never holds "#": it is refused
                shards = {shard_of(ns, f"{name}#{slot}", count) for slot in range(50)}
                assert shards == {shard_of_lock(ns, name, count)}, (ns, name, count)


def test_acks_and_lease_calls_go_to_their_queue_s_shard_and_unknown_ids_to_shard_0():
    shared = Shared()
    shared.partition_queue[11] = "orders"
    shared.lease_queue[15] = "orders"
    for count in (1, 4, 16):
        assert shard_of_partition(shared, 11, count) == shard_of_queue("orders", count)
        assert shard_of_lease(shared, 15, count) == shard_of_queue("orders", count)
        assert shard_of_partition(shared, 12, count) == 0
        assert shard_of_lease(shared, 16, count) == 0


def test_keys_spread_over_the_shards():
    counts = [0] * 8
    for n in range(8000):
        counts[shard_of("app", f"key-{n}", 8)] += 1
    assert min(counts) > 800, counts
