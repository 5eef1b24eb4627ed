"""The failover checks, over the workers' JSON-line histories (tests/cluster/harness/workers.py).

Pure functions over plain events; each returns a list of violations (dicts with a "kind" and the
evidence), empty when the history keeps the promise. The register and lock models are the fault
suite's (tests/faults/linearizability.py: Wing-Gong with Lowe's cache; tests/faults/checkers.py:
the fenced mutex `check_leases`, `check_total_queue`, `check_timers`); this module turns the
workers' events into their records and adds what failover brings: epochs.

  C1 check_acked_writes    every ok write is in the final state, or superseded by a higher version;
                           no two ok increments of a counter answered the same value
  C2 check_registers       W1 registers and W3 counters are linearizable per key
  C3 check_epochs          ok answers of epoch e carry versions below the first version of e+1, and
                           none comes from an epoch already superseded when it was invoked
  C4 check_versions_unique every version an ok write handed out is unique; per lock, fences rise
  C5 check_fenced_mutex    the fenced mutex (holders within permits, fences rising), guarded
                           transactions committed in fence order, the fenced store never went back,
                           no guard failed while the holder's lease was still promised
  C6 check_leases_kept     a lease granted before a failover's fault and live at the promotion is not
                           handed to another owner before max(expiresAt, promotion + grace) - ε
  C7 check_timers_once     each timer fired once, never early (within ε); queue: no acked push lost
  C8 failover_time_ms      from the fault to the first ok write of a later epoch (a measurement)
  C9 check_convergence     the nodes' logs hold the same versioned records up to the commit point

Times: `t` is time.monotonic() in ms (ordering across processes); `wall` is ms since the epoch,
for comparisons with the server's expiresAt, timer `at` and createdAt.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zlib
from collections import defaultdict
from dataclasses import dataclass

from tests.faults.checkers import (
    Ack,
    Grant,
    Push,
    Release,
    Schedule,
    TimerDelivery,
    ack_answer,
    check_leases,
    check_timers,
    check_total_queue,
    pop_deliveries,
)
from tests.faults.linearizability import Op, check_history

WRITES = frozenset({"put", "incr", "acquire", "release", "guarded", "push", "ack", "schedule", "pop", "configure"})


@dataclass
class Call:
    """One call: its invoke event and its outcome event (None: the worker died before one came)."""

    invoke: dict
    outcome: dict | None

    @property
    def f(self) -> str:
        return self.invoke["f"]

    @property
    def status(self) -> str:
        return self.outcome["type"] if self.outcome else "info"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def result(self):
        return self.outcome.get("result") if self.outcome else None

    @property
    def first(self) -> dict:
        """The first result of a batch answer ({"results": [...]}), or the answer itself."""
        result = self.result
        if isinstance(result, dict) and isinstance(result.get("results"), list) and result["results"]:
            return result["results"][0]
        return result if isinstance(result, dict) else {}

    @property
    def epoch(self) -> int | None:
        return self.outcome.get("epoch") if self.outcome else None

    def get(self, name, default=None):
        return self.invoke.get(name, default)


def calls_of(events: list[dict]) -> list[Call]:
    """Pair each invoke with its outcome, in invoke order."""
    invokes: dict[tuple, dict] = {}
    outcomes: dict[tuple, dict] = {}
    for event in events:
        kind = event.get("type")
        if kind == "invoke":
            invokes[event["w"], event["op"]] = event
        elif kind in ("ok", "fail", "info"):
            outcomes[event["w"], event["op"]] = event
    calls = [Call(invoke, outcomes.get(key)) for key, invoke in invokes.items()]
    calls.sort(key=lambda call: call.invoke["t"])
    return calls


def new_versions(call: Call) -> list[int]:
    """The versions an ok write took (a read's versions are others')."""
    if not call.ok:
        return []
    first = call.first
    if call.f in ("put", "incr") and first.get("applied"):
        return [first["version"]]
    if call.f == "acquire" and first.get("acquired") and not first.get("already"):
        return [first["token"]]
    return []


def _all_versions(value, into: list) -> list:
    """Every `version` and `token` in an answer, at any depth."""
    if isinstance(value, dict):
        for name, item in value.items():
            if name in ("version", "token") and type(item) is int:
                into.append(item)
            else:
                _all_versions(item, into)
    elif isinstance(value, list):
        for item in value:
            _all_versions(item, into)
    return into


# -- C1 ------------------------------------------------------------------------------------------


def check_acked_writes(calls: list[Call], final_rows: dict[str, dict | None]) -> list[dict]:
    """final_rows: {key: {"value", "version"} or None (absent)} read from the final leader after
    healing. "lost_write": an ok put/incr of key at version v, and the final row is absent or
    older than v, or at v with another value."""
    violations = []
    for call in calls:
        if call.f not in ("put", "incr") or not call.ok or not call.first.get("applied"):
            continue
        version = call.first["version"]
        row = final_rows.get(call.get("key"))
        value = call.get("value") if call.f == "put" else call.first.get("value")
        if row is None or row["version"] < version or (row["version"] == version and row["value"] != value):
            violations.append({"kind": "lost_write", "key": call.get("key"), "version": version, "value": value,
                               "final": row, "worker": call.invoke["w"], "epoch": call.epoch})
    return violations + check_increments_kept(calls)


def check_increments_kept(calls: list[Call]) -> list[dict]:
    """"lost_increment": two ok incr of one key answered the same value. Each applied incr by a
    positive step moves the counter up, so a value answered twice means the first increment was
    rolled back (lost) and the counter came to that value again: unlike a lost put, later writes
    cannot hide it."""
    violations = []
    seen: dict[tuple, Call] = {}
    for call in calls:
        if call.f != "incr" or not call.ok or not call.first.get("applied") or (call.get("by") or 0) <= 0:
            continue
        key = (call.get("key"), call.first.get("value"))
        if key in seen:
            violations.append({"kind": "lost_increment", "key": key[0], "value": key[1],
                               "first": seen[key].outcome, "again": call.outcome})
        else:
            seen[key] = call
    return violations


def check_queue(calls: list[Call], drained: bool = True) -> list[dict]:
    """W4's queue: no acknowledged push lost, none twice, nothing delivered after its completion
    (the fault suite's total-queue checker)."""
    pushes, deliveries, acks = [], [], []
    for call in calls:
        if call.f == "push" and call.get("transaction_id"):
            if call.ok:
                answer = call.result[0]
                pushes.append(Push(transaction_id=call.get("transaction_id"), status=answer["status"],
                                   message_id=str(answer.get("messageId"))))
            elif call.status == "info":
                pushes.append(Push(transaction_id=call.get("transaction_id"), status="unknown"))
        elif call.f == "pop" and call.get("queue") == "hq" and call.ok and call.result.get("success"):
            deliveries += pop_deliveries(call.result, int(call.invoke["wall"]))
        elif call.f == "ack" and call.status != "fail":
            text = ack_answer(call.result if call.ok else None)
            acks.append(Ack(transaction_id=str(call.get("transaction_id")), lease_id=str(call.get("lease_id")),
                            status="completed", answer=text, at=int(call.outcome["wall"] if call.outcome else 0)))
    return check_total_queue(pushes, deliveries, acks, drained=drained)


# -- C2 ------------------------------------------------------------------------------------------


def register_ops(calls: list[Call]) -> list[Op]:
    """W1 and W3 calls as the linearizability checker's ops; a fail (nothing applied) is left out,
    a write of unknown outcome stays open, a read of unknown outcome is dropped."""
    ops = []
    workers: dict[str, int] = {}
    for call in calls:
        if call.f not in ("get", "put", "incr") or call.status == "fail":
            continue
        process = workers.setdefault(call.invoke["w"], len(workers))
        if call.f == "get":
            args = {}
        elif call.f == "put":
            args = {"value": call.get("value"), "expect": call.get("expect")}
        else:
            args = {"by": call.get("by", 1), "max": call.get("max")}
        if not call.ok:
            if call.f != "get":
                ops.append(Op(process, call.f, call.get("key"), args, call.invoke["t"], None, None))
            continue
        ops.append(Op(process, call.f, call.get("key"), args, call.invoke["t"], call.outcome["t"], call.first))
    return ops


def check_registers(calls: list[Call], budget: int = 200_000) -> list[dict]:
    violations = []
    for key, result in check_history(register_ops(calls), budget=budget).items():
        if not (result.ok and result.decided):
            violations.append({"kind": "not_linearizable", "key": key, "reason": result.reason,
                               "decided": result.decided})
    return violations


# -- C3 ------------------------------------------------------------------------------------------


def check_epochs(calls: list[Call], first_versions: dict[int, int]) -> list[dict]:
    """first_versions: {epoch: first version of that epoch} (the EPOCH records of the final log).
    "version_from_later_epoch": an ok answer tagged e carries a version at or above the first
    version of the next epoch after e. "answer_from_ended_epoch": an ok answer tagged e was
    invoked after an ok answer tagged e' > e had completed (a zombie leader answered)."""
    violations = []
    epochs = sorted(first_versions)
    tagged = [call for call in calls if call.ok and call.epoch is not None]
    for call in tagged:
        later = [e for e in epochs if e > call.epoch]
        if later:
            bound = first_versions[later[0]]
            seen = [v for v in _all_versions(call.result, []) if v >= bound]
            if seen:
                violations.append({"kind": "version_from_later_epoch", "epoch": call.epoch, "next_epoch": later[0],
                                   "first_version": bound, "versions": seen, "call": call.invoke,
                                   "outcome": call.outcome})
    by_completion = sorted(tagged, key=lambda call: call.outcome["t"])
    newest, index = None, 0
    for call in tagged:  # in invoke order
        while index < len(by_completion) and by_completion[index].outcome["t"] < call.invoke["t"]:
            if newest is None or by_completion[index].epoch > newest.epoch:
                newest = by_completion[index]
            index += 1
        if newest is not None and call.epoch < newest.epoch:
            violations.append({"kind": "answer_from_ended_epoch", "epoch": call.epoch, "call": call.invoke,
                               "outcome": call.outcome, "newer": newest.outcome})
    return violations


# -- C4 ------------------------------------------------------------------------------------------


def check_versions_unique(calls: list[Call]) -> list[dict]:
    """"version_reused": two ok writes took the same version. "fence_not_rising": an acquire of a
    lock answered a fence not above one answered before it was invoked (any slot of the name:
    every fence is a fresh version)."""
    violations = []
    owner: dict[int, Call] = {}
    for call in calls:
        for version in new_versions(call):
            if version in owner:
                violations.append({"kind": "version_reused", "version": version, "first": owner[version].outcome,
                                   "second": call.outcome})
            else:
                owner[version] = call
    grants = [c for c in calls if c.f == "acquire" and c.ok and c.first.get("acquired") and not c.first.get("already")]
    by_name: dict[str, list[Call]] = defaultdict(list)
    for call in grants:
        by_name[call.get("name")].append(call)
    for group in by_name.values():
        for later in group:
            for earlier in group:
                if earlier.outcome["t"] < later.invoke["t"] and later.first["fence"] <= earlier.first["fence"]:
                    violations.append({"kind": "fence_not_rising", "name": later.get("name"),
                                       "earlier": earlier.outcome, "later": later.outcome})
    return violations


# -- C5 ------------------------------------------------------------------------------------------


def lock_records(calls: list[Call]) -> list:
    """W2 calls as the fault suite's Grant and Release records (wall-clock ms)."""
    records = []
    for call in calls:
        wall_in = int(call.invoke["wall"])
        wall_out = int(call.outcome["wall"]) if call.outcome else wall_in
        if call.f == "acquire" and call.ok and call.first.get("acquired"):
            answer = call.first
            records.append(Grant(name=call.get("name"), slot=answer["slot"], owner=call.get("owner"),
                                 token=answer["token"], fence=answer["fence"], invoked_at=wall_in,
                                 completed_at=wall_out, expires_at=answer.get("expiresAt"),
                                 already=bool(answer.get("already"))))
        elif call.f == "release" and call.status != "fail":
            answered = "unknown" if not call.ok else "released" if call.first.get("released") else str(
                call.first.get("reason"))
            records.append(Release(name=call.get("name"), slot=call.get("slot"), owner=call.get("owner"),
                                   invoked_at=wall_in, completed_at=wall_out, answered=answered))
    return records


def check_fenced_mutex(calls: list[Call], store_log: list[dict], limits: dict[str, int],
                       tolerance_ms: int = 10) -> list[dict]:
    """The fenced mutex model per lock (limits: name -> permits); then:
    "guard_fence_went_back": a guarded transaction committed with a fence below one committed
    (on the same permit) before it was invoked. "store_fence_went_back": the fenced store accepted
    a fence below one it accepted before. "guard_failed_inside_lease": a holder's guarded
    transaction was refused although it was answered before the expiresAt its grant was told (less
    tolerance) and before it released: its lease was taken away early."""
    violations = []
    records = lock_records(calls)
    for name, permits in limits.items():
        violations += check_leases([r for r in records if r.name == name], permits, tolerance_ms=tolerance_ms)
    committed: dict[str, list[Call]] = defaultdict(list)
    grants = {(c.get("owner")): c for c in calls if c.f == "acquire" and c.ok and c.first.get("acquired")}
    for call in calls:
        if call.f != "guarded":
            continue
        permit = f"{call.get('name')}#{call.get('slot')}"
        if call.ok and call.result.get("success"):
            committed[permit].append(call)
        elif call.ok:
            grant = grants.get(call.get("owner"))
            expires = grant.first.get("expiresAt") if grant else None
            # Judged by the answer, not the invoke: the refusal was applied somewhere between the
            # two, and a call held up by a failover (a zombie leader kept it until it stepped
            # down, N3b) may be applied after a lease that ended on time. Only a whole call inside
            # the lease proves the lease was taken away early.
            answered = call.outcome["wall"] if call.outcome else call.invoke["wall"]
            if expires is not None and answered < expires - tolerance_ms:
                violations.append({"kind": "guard_failed_inside_lease", "permit": permit, "grant": grant.outcome,
                                   "guarded": call.invoke, "answer": call.result})
    for permit, group in committed.items():
        for later in group:
            for earlier in group:
                if earlier.outcome["t"] < later.invoke["t"] and later.get("fence") < earlier.get("fence"):
                    violations.append({"kind": "guard_fence_went_back", "permit": permit,
                                       "earlier": earlier.invoke, "later": later.invoke})
    highest: dict[str, int] = {}
    for entry in store_log:
        if not entry["accepted"]:
            continue
        if entry["fence"] < highest.get(entry["permit"], 0):
            violations.append({"kind": "store_fence_went_back", "entry": entry,
                               "highest": highest[entry["permit"]]})
        highest[entry["permit"]] = max(highest.get(entry["permit"], 0), entry["fence"])
    return violations


# -- C6 ------------------------------------------------------------------------------------------


def check_leases_kept(calls: list[Call], failovers: list[tuple[int, int, int]], eps_ms: int = 50) -> list[dict]:
    """failovers: (fault wall ms, clock_floor_ms, lease_grace_until_ms) of the EPOCH that ended
    it. The server's rule: a lease granted before the fault and still live at the new epoch's
    clock_floor_ms (told expiresAt x > floor) is not ended by the failover: it lasts until
    max(x, grace_until) unless its holder released it first. A lease that ended between the fault
    and the promotion is promised nothing more. "lease_shortened": another owner was granted that
    slot before then, less ε."""
    violations = []
    grants = [c for c in calls if c.f == "acquire" and c.ok and c.first.get("acquired")]
    released: dict[str, int] = {}
    for call in calls:
        if call.f == "release":
            owner = call.get("owner")
            released[owner] = min(released.get(owner, 1 << 62), int(call.invoke["wall"]))
    for holder in grants:
        expires = holder.first.get("expiresAt")
        granted = int(holder.outcome["wall"])
        if expires is None:
            continue
        for fault, floor, grace_until in failovers:
            if not (granted <= fault and floor < expires):
                continue
            promised = min(max(expires, grace_until), released.get(holder.get("owner"), 1 << 62))
            for other in grants:
                if (other.get("name") == holder.get("name") and other.first["slot"] == holder.first["slot"]
                        and other.get("owner") != holder.get("owner")
                        and granted <= other.outcome["wall"] < promised - eps_ms):
                    violations.append({"kind": "lease_shortened", "holder": holder.outcome, "fault": fault,
                                       "floor": floor, "promised_until": promised, "other": other.outcome})
    return violations


def lease_promises(records: list, grace_ms: int) -> dict[int, tuple[int, int]]:
    """{epoch: (clock_floor_ms, grace_until)} from the EPOCH records of a log, where grace_until is
    the larger of what the record holds and clock_floor_ms + grace_ms (the configured grace: the
    leader ttl, or --lease-grace). Equal in a sound run; a record that lost its grace still owes it."""
    return {record.epoch: (record.clock_floor_ms, max(record.lease_grace_until_ms, record.clock_floor_ms + grace_ms))
            for record in records if type(record).__name__.lower() == "epoch" and hasattr(record, "clock_floor_ms")}


# -- C7 ------------------------------------------------------------------------------------------


def check_timers_once(calls: list[Call], eps_ms: int = 50, end_wall: int | None = None) -> list[dict]:
    """Each W4 timer (one schedule per key) fired exactly once, never before at - ε (the fault
    suite's timer checker); with end_wall, every acknowledged one due by then fired."""
    schedules, fired = [], []
    for call in calls:
        if call.f == "schedule" and call.status != "fail":
            answered = "scheduled" if call.ok and call.first.get("scheduled") else "unknown"
            schedules.append(Schedule(queue="ht", key=call.get("key"), version=1, at=call.get("at"),
                                      marker=call.get("marker"), answered=answered,
                                      invoked_at=int(call.invoke["wall"]),
                                      completed_at=int(call.outcome["wall"] if call.outcome else call.invoke["wall"])))
        elif call.f == "pop" and call.get("queue") == "ht" and call.ok and call.result.get("success"):
            fired += [TimerDelivery(marker=m["data"]["m"], created_at=m["createdAt"], message_id=str(m["messageId"]))
                      for m in call.result.get("messages", [])]
    return check_timers(schedules, [], fired, end_ms=end_wall, tolerance_ms=eps_ms)


def check_created_at_rising(calls: list[Call]) -> list[dict]:
    """The clock floor (N7): messageId is the version, so in messageId order the createdAt the
    nodes stamped never goes back, across failovers too (a new leader whose clock is behind the
    old one's starts at the latest time the old one showed). "created_at_went_back": the pair."""
    stamped: dict[int, int] = {}
    for call in calls:
        if not call.ok or call.f not in ("push", "pop"):
            continue
        result = call.result  # a push answers a list of items, a pop {"messages": [...]}
        items = result if isinstance(result, list) else result.get("messages") or [] if isinstance(result, dict) else []
        for item in items:
            if isinstance(item, dict) and "messageId" in item and "createdAt" in item:
                stamped[int(item["messageId"])] = int(item["createdAt"])
    violations = []
    highest = None
    for message_id in sorted(stamped):
        created = stamped[message_id]
        if highest is not None and created < highest[1]:
            violations.append({"kind": "created_at_went_back", "earlier": {"messageId": highest[0], "createdAt": highest[1]},
                               "later": {"messageId": message_id, "createdAt": created}})
        if highest is None or created >= highest[1]:
            highest = (message_id, created)
    return violations


# -- C8 ------------------------------------------------------------------------------------------


def failover_time_ms(calls: list[Call], fault_t: float, epoch_before: int | None) -> float | None:
    """From the fault (monotonic ms) to the first ok write answered in a later epoch than
    epoch_before (or, without epochs, the first ok write after the fault). None: never."""
    firsts = [c.outcome["t"] for c in calls
              if c.ok and c.f in WRITES and c.outcome["t"] > fault_t
              and (epoch_before is None or (c.epoch is not None and c.epoch > epoch_before))]
    return min(firsts) - fault_t if firsts else None


# -- C9 ------------------------------------------------------------------------------------------


def log_records(data_dir: str) -> tuple[list, int]:
    """(every record of a node's log in order, the snapshot's version), read by recovery's reader
    on a copy of the directory (recovery tidies what it reads; the node's own files stay as they are)."""
    from queen.wal.recovery import recover

    records: list = []
    with tempfile.TemporaryDirectory() as copy:
        target = os.path.join(copy, "data")
        shutil.copytree(data_dir, target, ignore=shutil.ignore_patterns("*.lock"))
        result = recover(target, records.append)
    return records, result.snapshot_version


def versioned(records: list, after: int, upto: int) -> list[tuple[int, str]]:
    """(version, record as text) of the versioned records in (after, upto]."""
    out = []
    for record in records:
        version = getattr(record, "version", None)
        if type(version) is int and after < version <= upto:
            out.append((version, f"{type(record).__name__}{tuple(record)!r}"))
    return out


def epoch_grace_until(records: list) -> dict[int, int]:
    """{epoch: lease_grace_until_ms} from the EPOCH records of a log."""
    return {record.epoch: record.lease_grace_until_ms for record in records
            if type(record).__name__.lower() == "epoch" and hasattr(record, "lease_grace_until_ms")}


def epoch_first_versions(records: list) -> dict[int, int]:
    """{epoch: first version} from the EPOCH records of a log (any record type named Epoch with
    `epoch` and `first_version` fields)."""
    return {record.epoch: record.first_version for record in records
            if type(record).__name__.lower() == "epoch" and hasattr(record, "first_version")}


def check_convergence(logs: dict[str, tuple[list, int]], commit_version: int) -> list[dict]:
    """logs: {node: (records, snapshot version)}. Every node's versioned records above the highest
    snapshot version of all and up to commit_version must be the same (hash compare).
    "diverged" names the nodes and the first version where they differ."""
    floor = max((snapshot for _, snapshot in logs.values()), default=0)
    digests, lists = {}, {}
    for node, (records, _snapshot) in logs.items():
        items = versioned(records, floor, commit_version)
        lists[node] = items
        digests[node] = hashlib.sha256(repr(items).encode()).hexdigest()
    violations = []
    reference = next(iter(lists), None)
    for node, digest in digests.items():
        if digest != digests[reference]:
            mine, theirs = lists[node], lists[reference]
            at = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                      min(len(mine), len(theirs)))
            violations.append({"kind": "diverged", "nodes": [reference, node], "above": floor, "upto": commit_version,
                               "first_difference": (theirs[at] if at < len(theirs) else None,
                                                    mine[at] if at < len(mine) else None),
                               "crc": [zlib.crc32(repr(theirs).encode()), zlib.crc32(repr(mine).encode())]})
    return violations


def check_all(calls: list[Call], *, final_rows: dict, store_log: list[dict], limits: dict[str, int],
              first_versions: dict[int, int] | None = None, failovers: list[tuple[int, int, int]] = (),
              eps_ms: int = 50, queue_drained: bool = True) -> dict[str, list[dict]]:
    """Every history check at once: {"C1": [...], ..., "C7": [...]} (C8 and C9 take the nodes)."""
    return {
        "C1": check_acked_writes(calls, final_rows) + check_queue(calls, queue_drained),
        "C2": check_registers(calls),
        "C3": check_epochs(calls, first_versions or {}),
        "C4": check_versions_unique(calls),
        "C5": check_fenced_mutex(calls, store_log, limits),
        "C6": check_leases_kept(calls, list(failovers), eps_ms),
        "C7": check_timers_once(calls, eps_ms),
    }
