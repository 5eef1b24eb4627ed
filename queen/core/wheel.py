"""A hashed timing wheel: which items fall due when time reaches now_ms.

Items are any hashable; each has one due time. `add` replaces an item's earlier entry, `remove`
forgets it, `advance(now_ms)` returns the items whose due time has passed, once each. An entry due
further out than one revolution stays in its slot and is looked at again on the next revolution;
that costs a scan per revolution, which is cheap next to a heap operation per write.

The wheel only frees memory: readers never rely on it for exactness (an expired row is absent
the moment its time passes, whether the wheel has visited it or not).
"""

from __future__ import annotations

TICK_MS = 50


class TimingWheel:
    __slots__ = ("tick_ms", "slot_count", "_slots", "_slot_of", "_tick")

    def __init__(self, now_ms: int, tick_ms: int = TICK_MS, slot_count: int = 4096):
        assert tick_ms > 0 and slot_count > 0
        self.tick_ms = tick_ms
        self.slot_count = slot_count
        self._slots: list[dict] = [{} for _ in range(slot_count)]
        self._slot_of: dict = {}
        self._tick = now_ms // tick_ms  # the last tick whose slot was visited

    def __len__(self) -> int:
        return len(self._slot_of)

    def add(self, item, due_ms: int) -> None:
        old = self._slot_of.get(item)
        if old is not None:
            del self._slots[old][item]
        # The first tick boundary at or after due_ms, so a visited slot's items of this lap are all
        # due; never a slot already visited, where the item would wait a whole lap.
        tick = max(-(-due_ms // self.tick_ms), self._tick + 1)
        index = tick % self.slot_count
        self._slots[index][item] = due_ms
        self._slot_of[item] = index

    def schedule(self, item, due_ms: int) -> None:
        """Make sure item is looked at no later than due_ms. An entry already due earlier is kept:
        when it fires, the owner finds the later expiry and files it again. That makes a rewrite
        of a row (the common case) a dict lookup instead of a move between slots."""
        index = self._slot_of.get(item)
        if index is not None and self._slots[index][item] <= due_ms:
            return
        self.add(item, due_ms)

    def remove(self, item) -> None:
        index = self._slot_of.pop(item, None)
        if index is not None:
            del self._slots[index][item]

    def advance(self, now_ms: int) -> list:
        """Items due at or before now_ms, removed from the wheel."""
        target = now_ms // self.tick_ms
        if target <= self._tick:
            return []
        # After a long pause one revolution visits every slot; more laps would find nothing new.
        first = max(self._tick + 1, target - self.slot_count + 1)
        due = []
        slots, slot_of = self._slots, self._slot_of
        for tick in range(first, target + 1):
            slot = slots[tick % self.slot_count]
            if not slot:
                continue
            ready = [item for item, due_ms in slot.items() if due_ms <= now_ms]
            for item in ready:
                del slot[item]
                del slot_of[item]
            due.extend(ready)
        self._tick = target
        return due
