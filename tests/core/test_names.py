"""The one rule for what a name may hold (queen/core/names.py), over every code point it is about,
and every parser that reads a name going through it."""

import pytest

from queen.core.kv import parse_kv_op
from queen.core.limits import Limits
from queen.core.locks import parse_lock_op
from queen.core.names import name
from queen.core.queue_ops import group_name, parse_push_item, producer_id, queue_name
from queen.core.timer_ops import parse_timer_op
from queen.errors import BadRequest

REFUSED = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
# Their neighbours, and other characters a name may hold: space, NBSP, LRM/RLM (marks, not
# overrides), the line and paragraph separators, U+202F, U+2065, the inhibitors from U+206A on.
ALLOWED = [0x20, 0x7E, 0xA0, 0xE9, 0x200E, 0x200F, 0x2028, 0x2029, 0x202F, 0x2065, 0x206A, 0xFEFF, 0x1F451]


@pytest.mark.parametrize("code_point", REFUSED, ids=[f"U+{c:04X}" for c in REFUSED])
def test_each_refused_character_is_refused_wherever_it_stands(code_point):
    character = chr(code_point)
    for raw in (character, f"a{character}", f"{character}a", f"ab{character}cd"):
        with pytest.raises(BadRequest) as caught:
            name(raw, "key", "invalid_key", 64, index=3)
        assert caught.value.code == "invalid_key"
        assert caught.value.details == {"character": f"U+{code_point:04X}", "index": 3}


def test_the_characters_around_them_are_names():
    for code_point in ALLOWED:
        assert name(f"a{chr(code_point)}b", "key", "invalid_key", 64) == f"a{chr(code_point)}b"


LIMITS = Limits()
NOW_MS = 1_700_000_000_000
PARSERS = {
    "kv ns": (lambda n: parse_kv_op({"op": "get", "ns": n, "key": "k"}, 0, LIMITS), "invalid_ns"),
    "kv key": (lambda n: parse_kv_op({"op": "get", "ns": "a", "key": n}, 0, LIMITS), "invalid_key"),
    "queue": (lambda n: queue_name(n, LIMITS), "invalid_queue"),
    "partition": (lambda n: parse_push_item({"queue": "q", "partition": n, "payload": 1}, 0, LIMITS),
                  "invalid_partition"),
    "consumer group": (lambda n: group_name(n, LIMITS), "invalid_consumer_group"),
    "transactionId": (lambda n: producer_id(n, LIMITS), "invalid_transaction_id"),
    "lock name": (lambda n: parse_lock_op({"op": "get", "name": n}, 0, LIMITS), "invalid_name"),
    "lock owner": (lambda n: parse_lock_op({"op": "acquire", "name": "l", "ttlSeconds": 1, "owner": n}, 0, LIMITS),
                   "invalid_owner"),
    "timer key": (lambda n: parse_timer_op({"op": "cancel", "queue": "q", "key": n}, 0, LIMITS, NOW_MS),
                  "invalid_key"),
}


@pytest.mark.parametrize("field", list(PARSERS))
def test_every_parser_of_a_name_applies_the_rule(field):
    parse, code = PARSERS[field]
    parse("fine\u00e9")
    for character in ("\x00", "\r", "\n", "\u0085", "\u202e"):
        with pytest.raises(BadRequest) as caught:
            parse(f"x{character}")
        assert caught.value.code == code, field


def test_a_lock_name_still_refuses_the_slot_separator():
    with pytest.raises(BadRequest) as caught:
        parse_lock_op({"op": "get", "name": "a#1"}, 0, LIMITS)
    assert caught.value.code == "invalid_name"
