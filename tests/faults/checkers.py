"""History checkers for the fault suite: what concurrent clients saw from a server that was killed
(SIGKILL) and restarted, checked against the promises the server makes.

Everything here is pure Python over plain records; no server, no clock, no I/O. A recorder builds
the records while the clients run, then hands them to a checker. Each checker returns a list of
violations, each a small dict with a "kind" and the evidence; an empty list means the history is
consistent with the promises. All times are integer milliseconds. The checkers assume the
recording clients' clock and the server's clock are the same clock, give or take `tolerance_ms`.

An operation is recorded with the time it was invoked (`invoked_at`) and the time its answer arrived
(`completed_at`): the server acted somewhere in between. Checks are conservative: they only
report what is a violation for every placement of the server's action inside those intervals.
An operation whose answer never came (a timeout, a connection cut by the kill) is recorded with
answer "unknown" where the record has one, and left out where it does not (lease answers).

Records
-------

Locks and semaphores (`check_leases`):

* `Grant(name, slot, owner, token, fence, invoked_at, completed_at, expires_at, already=False)`:
  an acquire answered acquired:true. `expires_at` is the server's expiresAt (None: a lease
  without an end). `already` marks the answer to an acquire by the owner that already held the
  slot (the server answers the existing permit, same token): it continues that holding.
* `Renewal(name, slot, owner, token, fence, invoked_at, completed_at, expires_at)`: a renew
  answered renewed:true, with the new token and the new expiresAt.
* `Release(name, slot, owner, invoked_at, completed_at, answered)`: a release, however it was
  answered ("released", "lost", "unknown", ...). The holder stopped relying on its lease when it
  invoked the release, so its holding ends there whatever the answer.
* `Loss(name, slot, owner, at)`: the owner learnt its lease was gone (a renew answered lost,
  a guard that failed). It marks the end of a holding for the owner's bookkeeping (the next grant
  to that owner is a new holding) but does not shorten the window: the server promised the slot
  until the last expiresAt it answered, and a loss before it is exactly what P3 looks for.

A holding is one grant of (name, slot) to an owner plus the renewals and `already` grants to that
owner on that slot that follow it, up to a release or a loss. Its window is
[grant completed_at, min(last expiresAt it was told, invoke of its release, invoke of the owner's
next grant of that slot)), shrunk by `tolerance_ms` at the end.

Queues (`check_total_queue`):

* `Push(transaction_id, status, message_id=None)`: status is the answer: "queued", "duplicate"
  (both acknowledged: the message is in the queue) or "unknown" (no answer). `message_id` is the
  id the answer named, if any.
* `Delivery(transaction_id, message_id, offset, partition, retry_count, lease_id, at, group="")`:
  one message of a pop. `at` is the time the pop was invoked.
* `Ack(transaction_id, lease_id, status, answer, at, group="")`: an ack with status "completed"
  or "failed", answered "success", "already" (acked before), "lease_lost" or "unknown". `at` is
  the time the answer arrived.

Timers (`check_timers`):

* `Schedule(queue, key, version, at, marker, answered, invoked_at, completed_at)`: the client
  scheduled (or moved) timer `key` to fire at `at` with a payload carrying the unique `marker`,
  version `version` of that key (the recorder numbers a key's schedules 1, 2, ... in the order it
  sends them, one schedule of a key at a time). answered: "scheduled" or "unknown".
* `Cancel(key, version, answered, invoked_at)`: a cancel of the key while the recorder's latest
  schedule of it was `version`; answered "cancelled", "absent" or "unknown".
* `TimerDelivery(marker, created_at, message_id)`: a message the timer queue delivered, found by
  the marker in its payload; created_at is the message's createdAt (server clock).
* `LostPop(after, until)`: an autoAck pop whose answer never came (the server died under it). It
  may have taken and acknowledged what the queue held: those messages reach nobody, which autoAck
  allows. `after` is when the last answered pop before it was sent (what fired before then, that
  pop took), `until` when it failed.

Recurring timers (`check_recurring`):

* `Recurrence(key, at, every, cancelled_at)`: the client scheduled timer `key` to fire every
  `every` ms from `at` (answered scheduled), and invoked its cancel at `cancelled_at` (answered
  cancelled), the end of its history.
* `PeriodDelivery(key, period, created_at, message_id)`: a message of the timer queue, its
  transactionId `<key>@<period>`; created_at is its createdAt (the fire's time, server clock).

Lock-protected read-modify-write (`check_set_full`):

* `Add(element, answered, invoked_at, completed_at)`: a holder read the list, and wrote it back
  with its element appended, in a transaction guarded by its lock token. answered: "added" (the
  step committed), "refused" (the guard failed: nothing written) or "unknown".
* `Read(elements, invoked_at, completed_at)`: a read of the list (a tuple, in list order).

Multi-section transactions (`check_transactions`):

* `Step(n, answered)`: transaction n of a chain, each of which puts row k<n>, acks source message
  n, pushes outbox message push-<n>, schedules timer t-<n> and cancels t-<n-1>; answered
  "success", "unknown", or the reason it missed.
* `TxnState(rows, source_count, source_left, outbox, pending)`: what the server holds afterwards:
  rows {n: value or None}, the transactionIds of the source messages never acked, those of the outbox
  messages (a list: a duplicate shows twice), the keys of the pending timers.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

# ---------------------------------------------------------------------------------------------
# Locks and semaphores


@dataclass(frozen=True, kw_only=True)
class Grant:
    name: str
    slot: int
    owner: str
    token: int
    fence: int
    invoked_at: int
    completed_at: int
    expires_at: int | None
    already: bool = False


@dataclass(frozen=True, kw_only=True)
class Renewal:
    name: str
    slot: int
    owner: str
    token: int
    fence: int
    invoked_at: int
    completed_at: int
    expires_at: int | None


@dataclass(frozen=True, kw_only=True)
class Release:
    name: str
    slot: int
    owner: str
    invoked_at: int
    completed_at: int
    answered: str = "released"


@dataclass(frozen=True, kw_only=True)
class Loss:
    name: str
    slot: int
    owner: str
    at: int


_FOREVER = float("inf")


class _Holding:
    __slots__ = ("grant", "answers", "end_at", "closed")

    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.answers: list[Grant | Renewal] = [grant]
        self.end_at: float | None = None  # the invoke of its release, if any
        self.closed = False

    def window(self, tolerance_ms: int) -> tuple[float, float]:
        # The latest answer; at one ms, the one recorded last (a renewal answered in the same ms as
        # its grant replaces the grant's expiresAt, even when it is earlier).
        last = max(enumerate(self.answers), key=lambda pair: (pair[1].completed_at, pair[0]))[1]
        told = _FOREVER if last.expires_at is None else last.expires_at
        end = told if self.end_at is None else min(told, self.end_at)
        return self.grant.completed_at, end - tolerance_ms


def _ev(record) -> dict:
    return {"type": type(record).__name__, **asdict(record)}


def _holdings(events: list, violations: list) -> list[_Holding]:
    """Group grants, renewals, releases and losses into holdings, in the order things happened."""
    def order(event):
        # At one instant (times are whole ms: a grant, its renewal and its release can share one),
        # the order the records were given in decides: one holding's events come from one client,
        # which records them in the order it made them. The sort is stable.
        return event.at if isinstance(event, Loss) else event.invoked_at
    current: dict[tuple, _Holding] = {}
    last: dict[tuple, _Holding] = {}
    holdings: list[_Holding] = []
    for event in sorted(events, key=order):
        key = (event.name, event.slot, event.owner)
        holding = current.get(key)
        if isinstance(event, Grant):
            if event.already and holding is not None:
                holding.answers.append(event)
            else:
                previous = last.get(key)
                if previous is not None:  # the owner's own earlier holding ended by now
                    previous.end_at = min(previous.end_at if previous.end_at is not None else _FOREVER,
                                          event.invoked_at)
                current[key] = last[key] = holding = _Holding(event)
                holdings.append(holding)
        elif isinstance(event, Renewal):
            if holding is None:
                violations.append({"kind": "renewal_without_grant", "renewal": _ev(event)})
            else:
                holding.answers.append(event)
        elif holding is not None:
            if isinstance(event, Release):
                holding.end_at = min(holding.end_at if holding.end_at is not None else _FOREVER,
                                     event.invoked_at)
            current.pop(key)
    return holdings


def _rising(answers: list, field: str, strict, kind: str, violations: list) -> None:
    """Every answer's `field` against every answer that completed before it was invoked: greater
    (strict(answer) true) or not smaller."""
    by_completion = sorted(answers, key=lambda answer: answer.completed_at)
    best = None
    index = 0
    for answer in sorted(answers, key=lambda answer: answer.invoked_at):
        while index < len(by_completion) and by_completion[index].completed_at < answer.invoked_at:
            earlier = by_completion[index]
            if best is None or getattr(earlier, field) > getattr(best, field):
                best = earlier
            index += 1
        if best is None:
            continue
        mine, theirs = getattr(answer, field), getattr(best, field)
        if mine < theirs or (mine == theirs and strict(answer)):
            violations.append({"kind": kind, "earlier": _ev(best), "later": _ev(answer)})


def check_leases(events: list, n_permits: int, tolerance_ms: int = 0) -> list[dict]:
    """Check a history of Grant, Renewal, Release and Loss records of any number of names, each
    name with `n_permits` permits (1 for a lock).

    P3, one holder per permit: "too_many_holders" when more than n_permits holdings of a name have
    overlapping windows; "slot_handed_over" when a slot is granted to another owner inside the
    window of its previous holder (handed over before the lease could have ended).
    P2, tokens and fences: "token_not_rising" when a grant or renewal answers a token not greater
    than one answered before it was invoked (an `already` grant may repeat it); "fence_went_back"
    when a (name, slot) answers a fence smaller than one answered before; "fence_changed" when a
    renewal (or an `already` grant) answers a fence other than its holding's grant.
    "renewal_without_grant" when a renewal has no holding to belong to (a recorder bug or a lost
    grant answer that the recorder should have left out with the renewal)."""
    violations: list[dict] = []
    holdings = _holdings(events, violations)
    answers = [event for event in events if isinstance(event, Grant | Renewal)]

    by_name: dict[str, list] = defaultdict(list)
    by_slot: dict[tuple, list] = defaultdict(list)
    for answer in answers:
        by_name[answer.name].append(answer)
        by_slot[answer.name, answer.slot].append(answer)
    for group in by_name.values():
        _rising(group, "token", lambda answer: not getattr(answer, "already", False),
                "token_not_rising", violations)
    for group in by_slot.values():
        _rising(group, "fence", lambda answer: False, "fence_went_back", violations)
    for holding in holdings:
        for answer in holding.answers[1:]:
            if answer.fence != holding.grant.fence:
                violations.append({"kind": "fence_changed", "grant": _ev(holding.grant),
                                   "answer": _ev(answer)})

    windows: dict[str, list] = defaultdict(list)
    for holding in holdings:
        start, end = holding.window(tolerance_ms)
        if start < end:
            windows[holding.grant.name].append((start, end, holding))
    for name, group in windows.items():
        group.sort(key=lambda window: window[0])
        # slot handed over: the previous holding of the same slot still valid at the new grant
        last_of_slot: dict[int, tuple] = {}
        for window in group:
            start, _end, holding = window
            previous = last_of_slot.get(holding.grant.slot)
            if previous is not None and previous[1] > start and previous[2].grant.owner != holding.grant.owner:
                violations.append({"kind": "slot_handed_over", "name": name, "slot": holding.grant.slot,
                                   "previous": _ev(previous[2].grant), "previous_valid_until": previous[1],
                                   "next": _ev(holding.grant)})
            if previous is None or window[1] > previous[1]:
                last_of_slot[holding.grant.slot] = window
        # more holders than permits: sweep the window edges, ends before starts at one instant
        edges = sorted([(start, 1, i) for i, (start, _, _) in enumerate(group)]
                       + [(end, 0, i) for i, (_, end, _) in enumerate(group)])
        open_now: set[int] = set()
        reported = False
        for _time, is_start, i in edges:
            if not is_start:
                open_now.discard(i)
                reported = False
                continue
            open_now.add(i)
            if len(open_now) > n_permits and not reported:
                reported = True  # once per crowding, not once per extra grant inside it
                violations.append({"kind": "too_many_holders", "name": name, "at": group[i][0],
                                   "permits": n_permits,
                                   "holders": [{**_ev(group[j][2].grant), "valid_until": group[j][1]}
                                               for j in sorted(open_now)]})
    return violations


# ---------------------------------------------------------------------------------------------
# Queues


@dataclass(frozen=True, kw_only=True)
class Push:
    transaction_id: str
    status: str  # queued / duplicate / unknown
    message_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class Delivery:
    transaction_id: str
    message_id: str
    offset: int
    partition: str
    retry_count: int
    lease_id: str
    at: int
    group: str = ""


@dataclass(frozen=True, kw_only=True)
class Ack:
    transaction_id: str
    lease_id: str
    status: str  # completed / failed
    answer: str  # success / already / lease_lost / unknown
    at: int
    group: str = ""


# Recording a consumer from its answers, the same way in the real-process workload and the
# simulation. A partition's lease is judged by check_leases as slot 0 of a lock named after the
# partition, held by the lease id: the pop grants it, the consumer's last ack releases it.


def partition_grant(name: str, pop: dict, invoked_at: int, completed_at: int) -> Grant:
    lease_id = pop["leaseId"]
    return Grant(name=name, slot=0, owner=str(lease_id), token=lease_id, fence=lease_id, invoked_at=invoked_at,
                 completed_at=completed_at, expires_at=pop["expiresAt"])


def partition_release(name: str, lease_id, invoked_at: int, completed_at: int, answered: str) -> Release:
    return Release(name=name, slot=0, owner=str(lease_id), invoked_at=invoked_at, completed_at=completed_at,
                   answered=answered)


def pop_deliveries(pop: dict, at: int) -> list[Delivery]:
    """The messages of a pop answered success:true, delivered at `at`."""
    return [Delivery(transaction_id=m["transactionId"], message_id=str(m["messageId"]), offset=m["offset"],
                     partition=m["partition"], retry_count=m["retryCount"], lease_id=str(pop["leaseId"]), at=at)
            for m in pop["messages"]]


def ack_answer(answer: dict | None) -> str:
    """An ack's answer as an Ack record names it; None is an answer that never came."""
    if answer is None:
        return "unknown"
    if answer["success"]:
        return "already" if answer.get("already") else "success"
    return answer.get("reason", "lease_lost")


def check_total_queue(pushes: list[Push], deliveries: list[Delivery], acks: list[Ack], *,
                      drained: bool = True, groups: list[str] | None = None,
                      check_retries: bool = False) -> list[dict]:
    """Check a queue's history.

    "lost": with `drained` (the caller popped until the queue was empty, after the last push), a
    push answered queued or duplicate that no delivery to a group carried (groups: the given list,
    else every group seen in deliveries, else the default group "").
    "duplicated": one transactionId under two different messageIds (pushes' answers and
    deliveries together).
    "delivered_after_completed": a delivery to a group popped after an ack of that transaction
    in that group with status completed answered success (not already, not unknown).
    "retry_not_rising" (only with `check_retries`): a redelivery (a later pop under another
    lease) whose retryCount is not greater than the delivery before it, i.e. a failed ack or an
    expired lease that did not count."""
    violations: list[dict] = []

    ids: dict[str, dict[str, object]] = defaultdict(dict)
    for push in pushes:
        if push.message_id is not None:
            ids[push.transaction_id].setdefault(push.message_id, _ev(push))
    for delivery in deliveries:
        ids[delivery.transaction_id].setdefault(delivery.message_id, _ev(delivery))
    for transaction_id, seen in ids.items():
        if len(seen) > 1:
            violations.append({"kind": "duplicated", "transaction_id": transaction_id,
                               "message_ids": sorted(seen), "evidence": list(seen.values())})

    if drained:
        wanted = groups if groups is not None else sorted({d.group for d in deliveries} or {""})
        delivered = {(d.group, d.transaction_id) for d in deliveries}
        for push in pushes:
            if push.status not in ("queued", "duplicate"):
                continue
            for group in wanted:
                if (group, push.transaction_id) not in delivered:
                    violations.append({"kind": "lost", "group": group, "push": _ev(push)})

    completed: dict[tuple, Ack] = {}
    for ack in acks:
        if ack.status == "completed" and ack.answer == "success":
            key = (ack.group, ack.transaction_id)
            if key not in completed or ack.at < completed[key].at:
                completed[key] = ack
    for delivery in deliveries:
        ack = completed.get((delivery.group, delivery.transaction_id))
        if ack is not None and delivery.at > ack.at:
            violations.append({"kind": "delivered_after_completed", "ack": _ev(ack),
                               "delivery": _ev(delivery)})

    if check_retries:
        per_message: dict[tuple, list[Delivery]] = defaultdict(list)
        for delivery in deliveries:
            per_message[delivery.group, delivery.transaction_id].append(delivery)
        for group in per_message.values():
            group.sort(key=lambda delivery: delivery.at)
            for before, after in zip(group, group[1:], strict=False):
                if after.lease_id != before.lease_id and after.retry_count <= before.retry_count:
                    violations.append({"kind": "retry_not_rising", "before": _ev(before),
                                       "after": _ev(after)})
    return violations


# ---------------------------------------------------------------------------------------------
# Timers


@dataclass(frozen=True, kw_only=True)
class Schedule:
    queue: str
    key: str
    version: int
    at: int
    marker: str
    answered: str  # scheduled / unknown
    invoked_at: int
    completed_at: int


@dataclass(frozen=True, kw_only=True)
class Cancel:
    key: str
    version: int
    answered: str  # cancelled / absent / unknown
    invoked_at: int


@dataclass(frozen=True, kw_only=True)
class TimerDelivery:
    marker: str
    created_at: int
    message_id: str


@dataclass(frozen=True)
class LostPop:
    after: int
    until: int


# How late a timer may fire after its `at` and still be taken by a lost pop: one due while the
# server was down fires when it is back (a crash's downtime here is under a second).
LATE_FIRE_MS = 3000


def check_timers(schedules: list[Schedule], cancels: list[Cancel], deliveries: list[TimerDelivery],
                 *, end_ms: int | None = None, tolerance_ms: int = 0, lost_pops: tuple = ()) -> list[dict]:
    """Check a timer history.

    "early": a version fired (createdAt) before its `at` (less tolerance).
    "twice": one schedule (marker) delivered as two different messageIds.
    "fired_after_cancel": a version fired at or after the invoke of a cancel of that version that
    answered cancelled.
    "moved_fired_old": a version fired after a later version of its key was answered scheduled
    (createdAt after that schedule's completion, plus tolerance).
    "never_fired" (with `end_ms`): the key's latest version answered scheduled, due by end_ms
    (less tolerance), neither cancelled (a cancel of it answered cancelled or unknown) nor
    possibly moved (a later version answered unknown), nor possibly taken by a lost pop (due
    between LATE_FIRE_MS before what the pop before it took and the lost pop's end), and never
    delivered.
    "unexplained": a delivery whose marker no schedule carried."""
    violations: list[dict] = []
    by_marker = {schedule.marker: schedule for schedule in schedules}
    versions: dict[str, list[Schedule]] = defaultdict(list)
    for schedule in schedules:
        versions[schedule.key].append(schedule)

    fired: dict[str, dict[str, TimerDelivery]] = defaultdict(dict)
    for delivery in deliveries:
        schedule = by_marker.get(delivery.marker)
        if schedule is None:
            violations.append({"kind": "unexplained", "delivery": _ev(delivery)})
            continue
        fired[delivery.marker].setdefault(delivery.message_id, delivery)
        if delivery.created_at < schedule.at - tolerance_ms:
            violations.append({"kind": "early", "schedule": _ev(schedule), "delivery": _ev(delivery)})
        for cancel in cancels:
            if (cancel.key == schedule.key and cancel.version == schedule.version
                    and cancel.answered == "cancelled"
                    and delivery.created_at >= cancel.invoked_at + tolerance_ms):
                violations.append({"kind": "fired_after_cancel", "schedule": _ev(schedule),
                                   "cancel": _ev(cancel), "delivery": _ev(delivery)})
        for later in versions[schedule.key]:
            if (later.version > schedule.version and later.answered == "scheduled"
                    and delivery.created_at > later.completed_at + tolerance_ms):
                violations.append({"kind": "moved_fired_old", "schedule": _ev(schedule),
                                   "moved_to": _ev(later), "delivery": _ev(delivery)})
                break

    for marker, messages in fired.items():
        if len(messages) > 1:
            violations.append({"kind": "twice", "schedule": _ev(by_marker[marker]),
                               "deliveries": [_ev(d) for d in messages.values()]})

    if end_ms is not None:
        for key, group in versions.items():
            known = [s for s in group if s.answered == "scheduled"]
            if not known:
                continue
            latest = max(known, key=lambda schedule: schedule.version)
            if any(s.version > latest.version for s in group):
                continue  # an unanswered later schedule may have moved it
            if latest.at > end_ms - tolerance_ms:
                continue
            if any(c.key == key and c.version >= latest.version and c.answered in ("cancelled", "unknown")
                   for c in cancels):
                continue
            if any(pop.after - LATE_FIRE_MS <= latest.at <= pop.until + tolerance_ms for pop in lost_pops):
                continue  # an autoAck pop that was never answered may have taken it
            if latest.marker not in fired:
                violations.append({"kind": "never_fired", "schedule": _ev(latest), "end_ms": end_ms})
    return violations


# ---------------------------------------------------------------------------------------------
# Recurring timers


@dataclass(frozen=True, kw_only=True)
class Recurrence:
    key: str
    at: int
    every: int
    cancelled_at: int


@dataclass(frozen=True, kw_only=True)
class PeriodDelivery:
    key: str
    period: int
    created_at: int
    message_id: str


def check_recurring(recurrences: list[Recurrence], deliveries: list[PeriodDelivery], *, tolerance_ms: int = 0,
                    margin_ms: int = 0) -> list[dict]:
    """Check the history of recurring timers with fixed periods. A fire re-arms its timer for the
    first period after the fire (its message's createdAt), so a late fire (a downtime) stands for
    every period it passed, and the periods a key's messages name are a chain: the first is `at`,
    each next one is the first period after the previous message's createdAt.

    "unexplained": a delivery of a key never scheduled.
    "off_period": a period not at + n * every.
    "early": a message created before its period (less tolerance).
    "twice": one period of a key delivered as two messageIds (a period fired twice).
    "skipped": the chain's next period, or its first (`at`), is missing while a later one came (a
    period lost: neither fired nor merged into a late fire).
    "extra": a period between a message and the first period after it (a burst of catch-up fires,
    or a re-arm to the wrong time).
    "fired_after_cancel": a message created after the invoke of its key's cancel (plus tolerance).
    "never_fired": the chain's next period after the last message was due more than margin_ms
    before the key's cancel, yet never came."""
    violations: list[dict] = []
    schedules = {recurrence.key: recurrence for recurrence in recurrences}
    by_period: dict[str, dict[int, dict[str, PeriodDelivery]]] = defaultdict(lambda: defaultdict(dict))
    for delivery in deliveries:
        schedule = schedules.get(delivery.key)
        if schedule is None:
            violations.append({"kind": "unexplained", "delivery": _ev(delivery)})
            continue
        by_period[delivery.key][delivery.period].setdefault(delivery.message_id, delivery)
        if delivery.period < schedule.at or (delivery.period - schedule.at) % schedule.every:
            violations.append({"kind": "off_period", "delivery": _ev(delivery), "schedule": _ev(schedule)})
        if delivery.created_at < delivery.period - tolerance_ms:
            violations.append({"kind": "early", "delivery": _ev(delivery)})
        if delivery.created_at > schedule.cancelled_at + tolerance_ms:
            violations.append({"kind": "fired_after_cancel", "delivery": _ev(delivery), "schedule": _ev(schedule)})

    for schedule in recurrences:
        periods = by_period.get(schedule.key, {})
        for messages in periods.values():
            if len(messages) > 1:
                violations.append({"kind": "twice", "deliveries": [_ev(d) for d in messages.values()]})
        expected, after = schedule.at, None  # the chain's next period, and the message it follows
        for period in sorted(periods):
            if period > expected:
                violations.append({"kind": "skipped", "key": schedule.key, "expected": expected, "got": period,
                                   "after": after and _ev(after)})
            elif period < expected:
                violations.append({"kind": "extra", "key": schedule.key, "expected": expected, "got": period,
                                   "after": after and _ev(after)})
            after = min(periods[period].values(), key=lambda d: d.created_at)
            expected = period + max(1, (after.created_at - period) // schedule.every + 1) * schedule.every
        if expected < schedule.cancelled_at - margin_ms:
            violations.append({"kind": "never_fired", "key": schedule.key, "expected": expected,
                               "cancelled_at": schedule.cancelled_at, "after": after and _ev(after)})
    return violations


# ---------------------------------------------------------------------------------------------
# Lock-protected read-modify-write (Jepsen's set-full, for one list rewritten under a lock)


@dataclass(frozen=True, kw_only=True)
class Add:
    element: str
    answered: str  # added / refused / unknown
    invoked_at: int
    completed_at: int


@dataclass(frozen=True, kw_only=True)
class Read:
    elements: tuple
    invoked_at: int
    completed_at: int


def check_set_full(adds: list[Add], reads: list[Read]) -> list[dict]:
    """Check appends made under a lock's guard.

    "lost": a read invoked after an add answered added completed lacks its element (two holders
    overwrote each other's appends, or an acknowledged step was lost).
    "unexpected": a read holds an element no add carried, or one whose add was refused (a step
    whose guard failed wrote anyway).
    "twice": a read holds an element more than once (an append applied twice)."""
    violations: list[dict] = []
    by_element = {add.element: add for add in adds}
    for read in reads:
        present = set(read.elements)
        for element in present:
            add = by_element.get(element)
            if add is None or add.answered == "refused":
                violations.append({"kind": "unexpected", "element": element, "add": add and _ev(add),
                                   "read": _ev(read)})
            if read.elements.count(element) > 1:
                violations.append({"kind": "twice", "element": element, "read": _ev(read)})
        for add in adds:
            if add.answered == "added" and add.completed_at < read.invoked_at and add.element not in present:
                violations.append({"kind": "lost", "add": _ev(add), "read": _ev(read)})
    return violations


# ---------------------------------------------------------------------------------------------
# Multi-section transactions


@dataclass(frozen=True, kw_only=True)
class Step:
    n: int
    answered: str


@dataclass(frozen=True, kw_only=True)
class TxnState:
    rows: dict
    source_count: int  # source messages src-0 .. src-<count - 1>, all held by the chain's lease
    source_left: frozenset
    outbox: tuple
    pending: frozenset


def check_transactions(steps: list[Step], state: TxnState) -> list[dict]:
    """Check a chain of four-section transactions after crashes.

    Whether transaction n applied is read from its KV row. "lost": a transaction answered
    success did not apply. "applied_after_miss": one answered a miss applied. "partial": a section's
    effect disagrees with its row (its ack, its push, its timer, or the previous one's cancel; a row
    with a value the transaction never wrote). "twice": an outbox message more than once."""
    violations: list[dict] = []
    sent = len(steps)
    applied = {}
    for step in steps:
        value = state.rows.get(step.n)
        done = value is not None
        applied[step.n] = done
        if value is not None and value != f"v{step.n}":
            violations.append({"kind": "partial", "n": step.n, "section": "kv", "value": value})
        if step.answered == "success" and not done:
            violations.append({"kind": "lost", "n": step.n})
        if step.answered not in ("success", "unknown") and done:
            violations.append({"kind": "applied_after_miss", "n": step.n, "answered": step.answered})
    outbox = defaultdict(int)
    for transaction_id in state.outbox:
        outbox[transaction_id] += 1
    for transaction_id, count in outbox.items():
        if count > 1:
            violations.append({"kind": "twice", "message": transaction_id, "count": count})
    for n in range(sent):
        done = applied[n]
        cancelled_by_next = n + 1 < sent and applied[n + 1]
        expected = {"ack": done, "push": done, "timers": done and not cancelled_by_next}
        seen = {"ack": f"src-{n}" not in state.source_left, "push": f"push-{n}" in outbox,
                "timers": f"t-{n}" in state.pending}
        for section, effect in expected.items():
            if seen[section] != effect:
                violations.append({"kind": "partial", "n": n, "section": section, "applied": done,
                                   "seen": seen[section]})
    sent_pushes = {f"push-{n}" for n in range(sent)}
    sent_timers = {f"t-{n}" for n in range(sent)}
    violations += [{"kind": "partial", "section": "push", "message": m, "sent": False}
                   for m in outbox if m not in sent_pushes]
    violations += [{"kind": "partial", "section": "timers", "timer": key, "sent": False}
                   for key in state.pending if key not in sent_timers]
    violations += [{"kind": "partial", "section": "ack", "message": f"src-{n}", "sent": False}
                   for n in range(sent, state.source_count) if f"src-{n}" not in state.source_left]
    return violations

