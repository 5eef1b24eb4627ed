"""A namespace's keys in order, kept where CPython's cyclic GC does not look.

The keys sit in chunks of at most CHUNK_MAX sorted strings, each chunk a tuple. A tuple of strings
is untracked by the collector the first time a collection sees it, so however many keys the index
holds, a full collection walks only the short list of chunks. (sortedcontainers.SortedList keeps
its chunks as lists, which the collector walks item by item: about 17 ms a full collection per
million keys.) An insert or a removal rebuilds one chunk: a copy of at most CHUNK_MAX pointers.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from itertools import islice

CHUNK_MAX = 1024


class SortedKeys:
    __slots__ = ("_chunks", "_maxes", "_len")

    def __init__(self, keys: Iterable[str] = ()):
        ordered = sorted(keys)
        self._chunks: list[tuple[str, ...]] = [tuple(ordered[i:i + CHUNK_MAX // 2]) for i in range(0, len(ordered), CHUNK_MAX // 2)]
        self._maxes: list[str] = [chunk[-1] for chunk in self._chunks]  # each chunk's last key, for bisecting
        self._len = len(ordered)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        for chunk in self._chunks:
            yield from chunk

    def add(self, key: str) -> None:
        """key, which the index does not hold yet."""
        chunks, maxes = self._chunks, self._maxes
        self._len += 1
        if not chunks:
            chunks.append((key,))
            maxes.append(key)
            return
        i = bisect_left(maxes, key)
        if i == len(maxes):
            i -= 1
        chunk = chunks[i]
        at = bisect_left(chunk, key)
        chunk = chunk[:at] + (key,) + chunk[at:]
        if len(chunk) > CHUNK_MAX:
            half = len(chunk) // 2
            chunks[i:i + 1] = [chunk[:half], chunk[half:]]
            maxes[i:i + 1] = [chunk[half - 1], chunk[-1]]
        else:
            chunks[i] = chunk
            maxes[i] = chunk[-1]

    def update(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.add(key)

    def remove(self, key: str) -> None:
        """key, which the index holds."""
        chunks, maxes = self._chunks, self._maxes
        i = bisect_left(maxes, key)
        if i == len(chunks):
            raise KeyError(key)
        chunk = chunks[i]
        at = bisect_left(chunk, key)
        if chunk[at] != key:  # at < len(chunk): the chunk's last key is at least key
            raise KeyError(key)
        self._len -= 1
        chunk = chunk[:at] + chunk[at + 1:]
        if chunk:
            chunks[i] = chunk
            maxes[i] = chunk[-1]
        else:
            del chunks[i]
            del maxes[i]

    def iter_from(self, start: str, after: bool = False) -> Iterator[str]:
        """The keys from start on (after start only, when after), in order."""
        chunks, maxes = self._chunks, self._maxes
        i = bisect_right(maxes, start) if after else bisect_left(maxes, start)
        if i == len(chunks):
            return
        chunk = chunks[i]
        yield from islice(chunk, bisect_right(chunk, start) if after else bisect_left(chunk, start), None)
        for chunk in islice(chunks, i + 1, None):
            yield from chunk

    def irange(self, low: str, high: str) -> Iterator[str]:
        """The keys from low to high, both included, in order."""
        for key in self.iter_from(low):
            if key > high:
                return
            yield key
