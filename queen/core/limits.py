"""Every limit a request is checked against, in one object built from Config (queen/config.py,
`Config.limits`). Nothing else hard-codes a limit; each one here says why it is what it is.
"""

from __future__ import annotations

from dataclasses import dataclass

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Limits:
    # KV. Namespaces are few and short; keys are often paths or composite ids.
    ns_bytes_max: int = 128
    key_bytes_max: int = 1024
    # Measured as the value's JSON encoding: what a JSON client sends and reads back.
    value_bytes_max: int = 256 << 10
    ops_per_call_max: int = 1024
    # One page of a listing: big enough to page quickly, small enough to answer in one frame.
    page_items_max: int = 1000
    # Ten years: long enough for "keep", short enough that expiry arithmetic stays in int64.
    kv_ttl_seconds_max: int = 10 * 365 * 86400
    # Locks. A permit is the KV row `<name>#<slot>`, so a name leaves room for the slot in a key.
    lock_name_bytes_max: int = 256
    lock_owner_bytes_max: int = 256
    # A lock that outlives 90 days is a config row, not a lease.
    lock_ttl_seconds_max: int = 90 * 86400
    lock_permits_max: int = 1024
    # Each lock operation of a call names its own lock; 64 keeps one call's answer small.
    lock_ops_per_call_max: int = 64
    # The permits one call's acquires may ask for in all (each is a row looked at).
    lock_slots_per_call_max: int = 4096
    # A parked request holds a connection; a minute is as long as a poll should hang.
    wait_ms_max: int = 60_000
    # Queues. Names are identifiers, not documents; a partition name often embeds an entity id.
    queue_name_bytes_max: int = 128
    partition_name_bytes_max: int = 256
    group_name_bytes_max: int = 128
    transaction_id_bytes_max: int = 256
    trace_id_bytes_max: int = 128
    ack_error_bytes_max: int = 1024
    # One pop's answer: enough to amortize a round trip, small enough for one frame and one read.
    pop_batch_max: int = 1000
    pop_partitions_max: int = 64
    pop_bytes_max: int = 4 << 20
    # A lease outliving a day is a consumer nobody watches.
    lease_seconds_max: int = 86_400
    # Each group costs a floor and a bitmap per partition, and holds retention back.
    groups_per_queue_max: int = 64
    # Everything lives in memory and in snapshots, so every count has a ceiling: reaching one is a
    # normal answer (failed / storage_full), not an error.
    partitions_per_queue_max: int = 100_000
    queues_max: int = 10_000
    queue_bytes_max: int = 1 << 30
    # Timers: a key names an entity's reminder ("order-42:payment-timeout"), a composite like a KV key.
    timer_key_bytes_max: int = 1024
    timers_max: int = 10_000_000
    # Work one tick does at most, so a backlog (timers due after a long downtime, a million producer
    # ids whose windows end together) is worked off in bounded steps, not one long pause.
    timer_fires_per_tick_max: int = 10_000
    producer_ids_per_tick_max: int = 2000  # looked at, per partition

    def problems(self) -> list[str]:
        """Sentences for combinations that cannot work; empty when sound."""
        problems = []
        for name in self.__slots__:
            if getattr(self, name) < 1:
                problems.append(f"{name.replace('_', '-')} must be at least 1")
        # name + "#" + the highest slot must fit in a key.
        permit_key_bytes = self.lock_name_bytes_max + 1 + len(str(self.lock_permits_max - 1))
        if self.key_bytes_max < permit_key_bytes:
            problems.append(f"key-bytes-max must be at least {permit_key_bytes}: a lock permit's key is its name "
                            f"(up to {self.lock_name_bytes_max} bytes), '#' and a slot number")
        return problems
