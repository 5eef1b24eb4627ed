"""SortedKeys, the ordered key index of a KV namespace, against a sorted list."""

import random
from bisect import bisect_left, bisect_right

import pytest

from queen.core.sorted_keys import CHUNK_MAX, SortedKeys


@pytest.mark.parametrize("seed", range(5))
def test_adds_removals_and_ranges_match_a_sorted_list(seed):
    rng = random.Random(seed)
    start = {f"k{rng.randrange(10_000):05d}" for _ in range(rng.randrange(3 * CHUNK_MAX))}
    index, model = SortedKeys(start), sorted(start)
    for _ in range(6000):
        key = f"k{rng.randrange(10_000):05d}"
        position = bisect_left(model, key)
        if position < len(model) and model[position] == key:
            index.remove(key)
            del model[position]
        else:
            index.add(key)
            model.insert(position, key)
    assert list(index) == model and len(index) == len(model)
    assert all(len(chunk) <= CHUNK_MAX for chunk in index._chunks)
    for _ in range(200):
        start_key = f"k{rng.randrange(10_001):05d}"
        assert list(index.iter_from(start_key)) == model[bisect_left(model, start_key):]
        assert list(index.iter_from(start_key, after=True)) == model[bisect_right(model, start_key):]
        high = f"k{rng.randrange(10_001):05d}"
        assert list(index.irange(start_key, high)) == [k for k in model if start_key <= k <= high]


def test_removing_a_key_it_does_not_hold_raises_and_changes_nothing():
    index = SortedKeys(["a", "c"])
    for absent in ("0", "b", "d"):
        with pytest.raises(KeyError):
            index.remove(absent)
    assert list(index) == ["a", "c"] and len(index) == 2


def test_an_emptied_index_takes_keys_again():
    index = SortedKeys(["a"])
    index.remove("a")
    assert list(index) == [] and list(index.iter_from("")) == []
    index.add("b")
    assert list(index.iter_from("a")) == ["b"]
